"""`fabricbench study`: a counterbalanced schedule, each run its own process group, the
study cell in every record, resume without duplicates, then compare and report.

The pure parts (schedule, spec, the command of a run) are checked directly; two studies
run for real: an A/A study on loopback (CPU, anywhere) and the A/B study of docs/studies.md on
emulated links (root: network namespaces and tc), which must call 100 Mbit/s slower.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import numpy as np
import pytest

from helpers import REPO, child_env, tmpfs
from workloads import CONF_DIR
from workloads.core.errors import UsageError
from workloads.study.run import Job, cell_argv, plan, study_field, study_override
from workloads.study.schedule import Cell, schedule
from workloads.study.spec import load_spec

STUDY = [sys.executable, "-m", "workloads.commands.cli", "study"]


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# --- schedule ---------------------------------------------------------------------------

def test_abba_reverses_every_other_block():
    cells = schedule(["A", "B"], 4, "abba")
    assert "".join(c.arm for c in cells) == "ABBAABBA"
    assert [c.position for c in cells] == list(range(8))
    assert [(c.block, c.trial) for c in cells][:4] == [(0, 0), (0, 0), (1, 1), (1, 1)]
    # Linear drift adds the same total to each arm: equal sums of positions.
    assert sum(c.position for c in cells if c.arm == "A") == sum(c.position for c in cells if c.arm == "B")
    # three arms: ABBA's reversal (ABC CBA) would leave B never first and A, C following
    # themselves; abba there is the Williams design
    assert schedule(["A", "B", "C"], 6, "abba", seed=1) == schedule(["A", "B", "C"], 6, "williams", seed=1)


@pytest.mark.parametrize("arms", [3, 4, 5])
def test_williams_balances_first_order_carry_over(arms):
    from collections import Counter

    from workloads.study.schedule import williams_rows

    names = [f"a{i}" for i in range(arms)]
    rows = williams_rows(arms)
    pairs = Counter((r[i], r[i + 1]) for r in rows for i in range(arms - 1))
    # every ordered pair of different arms is adjacent equally often within the square's blocks
    assert len(pairs) == arms * (arms - 1) and len(set(pairs.values())) == 1
    for seed in range(10):
        seq = [c.arm for c in schedule(names, 3 * len(rows), "williams", seed)]
        assert all(x != y for x, y in zip(seq, seq[1:]))  # no arm ever follows itself, across blocks too
        firsts = Counter(seq[b * arms] for b in range(3 * len(rows)))
        assert set(firsts.values()) == {3 * len(rows) // arms}  # each arm opens as many blocks

def test_permuted_is_seeded_and_each_block_holds_every_arm_once():
    a = schedule(["A", "B", "C"], 6, "permuted", seed=3)
    assert a == schedule(["A", "B", "C"], 6, "permuted", seed=3)
    assert a != schedule(["A", "B", "C"], 6, "permuted", seed=4)
    for b in range(6):
        assert sorted(c.arm for c in a if c.block == b) == ["A", "B", "C"]
    assert len({tuple(c.arm for c in a if c.block == b) for b in range(6)}) > 1  # not one fixed order


# --- spec -------------------------------------------------------------------------------

AA = """
name: aa
arms:
  - {label: loopback, fabric: loopback}
control: true
workloads:
  - name: ar
    entry: collectives
    overrides: ["collectives.ops=[all_reduce]", collectives.minbytes=64K, collectives.maxbytes=64K,
                collectives.iters=5, collectives.warmup_iters=1]
blocks: 2
detect: 500%                   # a smoke test of the machinery: 2 blocks can only call a 5x difference
"""


def test_spec_control_arm_baseline_and_sweep_expansion(tmp_path):
    s = load_spec(write(tmp_path, AA))
    assert [(a.label, a.fabric, a.baseline, a.control) for a in s.arms] == [
        ("loopback", "loopback", True, False), ("loopback~aa", "loopback", False, True)]
    s = load_spec(write(tmp_path, AA.replace("collectives.maxbytes=64K", "'collectives.maxbytes=64K,128K'")))
    assert [w.name for w in s.workloads] == ["ar-p0", "ar-p1"]
    assert [w.argv[0] for w in s.workloads] == ["workload=collectives"] * 2
    every = [load_spec(p) for p in sorted(Path(REPO, "conf", "study").glob("*.yaml"))]  # the shipped examples load
    assert {x.name for x in every} >= {"emu-ab", "loopback-aa"}
    assert load_spec("emu-ab").arm("emu-100m").emulated and not load_spec("loopback-aa").arms[0].emulated


def test_resuming_on_other_code_is_refused_before_anything_runs(tmp_path, monkeypatch):
    """The commit is identity (analysis/guard.py): runs added on new code would have no
    counterpart among the old, so a resume on another commit is refused with the fix; a
    study already split over commits is named with its runs per commit. The records here are
    written by hand (the real resume is in the loopback A/A test below)."""
    from workloads.core import fingerprint
    from workloads.study.run import _same_code

    spec = load_spec(write(tmp_path, AA), output_root=str(tmp_path / "out"))
    jobs = plan(spec)

    def recorded(job, commit):
        d = job.records_dir(spec)
        d.mkdir(parents=True, exist_ok=True)
        (d / "collectives-000.json").write_text(json.dumps({
            "status": "ok", "run_id": job.run_id(spec), "config": {"trial": job.cell.trial},
            "study": {"id": spec.id, "arm": job.arm.label, "workload": job.workload.name},
            "fingerprint": {"git": {"commit": commit}}}))

    here = "c" * 40
    monkeypatch.setattr(fingerprint, "git_commit", lambda: {"commit": here, "dirty": False})
    _same_code(spec, jobs)  # nothing recorded yet
    recorded(jobs[0], here)
    _same_code(spec, jobs)  # resumed on its own commit
    recorded(jobs[1], "a" * 40)
    with pytest.raises(UsageError, match="already holds runs of 2 versions of the code"):
        _same_code(spec, jobs)
    recorded(jobs[0], "a" * 40)
    with pytest.raises(UsageError) as e:
        _same_code(spec, jobs)
    assert str(e.value).startswith(f"study aa was measured on commit {'a' * 12} and this checkout is commit {'c' * 12}: ")
    assert f"git checkout {'a' * 40}" in str(e.value)
    for j in jobs[2:]:
        recorded(j, "a" * 40)
    _same_code(spec, jobs)  # finished: nothing would run, so a rerun only re-analyses


@pytest.mark.parametrize("edit,message", [
    (("blocks: 2", "blocks: 1"), "blocks=1 must be an integer >= 2"),
    (("detect: 500%", "detect: big"), "detect='big': write a percentage such as 5%"),
    (("control: true", "control: true\nmargin: 0"), "margin=0: write a percentage"),
    (("entry: collectives", "entry: collectives\n    primary: {metric: samples_per_sec, point: c8}"),
     "workloads[0].primary.point: only inference sweeps have load points"),
    (("entry: collectives", "entry: collectives\n    primary: {metric: wibble}"), "--metric wibble: no known direction"),
    (("name: aa", "name: aa\ncolour: red"), "unknown field(s) colour"),
    (("fabric: loopback}", "fabric: nosuch}"), "fabric=nosuch has no profile conf/fabric/nosuch.yaml; present:"),
    (("collectives.iters=5", "trial=3"), "sets trial, which the study decides per cell"),
    (("entry: collectives", "entry: bench"), "workloads[0].entry must be one of pretrain, finetune, collectives, inference"),
    (("control: true", "control: false"), "a study needs two arms"),
    (("blocks: 2", "blocks: 2\ndesign: latin"), "design='latin'; use abba (2 arms; Williams for 3 or more)"),
    (("blocks: 2", "blocks: 2\ntimeout_s: soon"), "timeout_s='soon' must be a positive number of seconds"),
    (("blocks: 2", "blocks: 2\ntimeout_s: -5"), "timeout_s=-5 must be a positive number of seconds"),
    (("blocks: 2", "blocks: 2\ntimeout_s: 0"), "timeout_s=0 must be a positive number of seconds"),
])
def test_spec_errors_name_the_field_and_the_fix(tmp_path, edit, message):
    with pytest.raises(UsageError) as e:
        load_spec(write(tmp_path, AA.replace(*edit)))
    assert message in str(e.value)


# The spec's words are the record's (study.blocks, study.margin, workload); the words a spec wrote
# before load for a release. One worked spec in both vocabularies:
NEW_WORDS = AA.replace("control: true", "control: true\nmargin: 3%").replace(
    "blocks: 2", "  - {name: tr, entry: pretrain}\n  - {entry: inference, primary: {point: c1}}\nblocks: 2")
OLD_WORDS = (NEW_WORDS.replace("blocks: 2", "trials: 2").replace("margin: 3%", "equivalence: 3%")
             .replace("entry: pretrain", "entry: train").replace("entry: inference", "entry: infer"))


def test_old_words_load_to_the_same_plan_with_one_deprecation_line(tmp_path, capsys):
    from workloads.study.plan import make_plan

    new = load_spec(write(tmp_path, NEW_WORDS.replace("detect: 500%", "detect: 900%"), "new.yaml"))
    assert capsys.readouterr().err == ""
    old_file = write(tmp_path, OLD_WORDS.replace("detect: 500%", "detect: 900%"), "old.yaml")
    old = load_spec(old_file)
    # the record's words: blocks, margin, the catalog's workload names
    assert (old.blocks, old.margin, [w.entry for w in old.workloads]) == (2, 0.03, ["collectives", "pretrain", "inference"])
    # a workload without a name keeps the word it was named by, so a study started before keeps its run ids
    assert [w.name for w in new.workloads] == ["ar", "tr", "inference"]
    assert [w.name for w in old.workloads] == ["ar", "tr", "infer"]
    as_new = {**old.as_dict(), "workloads": [{**w, "name": n} for w, n in zip(old.as_dict()["workloads"],
                                                                                  ["ar", "tr", "inference"])]}
    assert as_new == new.as_dict()
    assert [x.replace("  infer (", "  inference (") for x in make_plan(old).lines()] == make_plan(new).lines()
    load_spec(old_file)  # read again (a study whose tunes ran first reloads its spec): no second line
    # a study started before the rename saved entry: train; the same study resumes (not refused as another)
    from workloads.study.run import definition

    before = old.as_dict()
    before["workloads"][1]["entry"] = "train"
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "study.json").write_text(json.dumps(before))
    definition(tmp_path / "old", "study", old.as_dict(), str(tmp_path))
    err = capsys.readouterr().err.splitlines()
    assert err == [f"{old_file}: deprecated word(s), read for this release: trials: is now blocks:, equivalence: is "
                   "now margin:, entry: train is now entry: pretrain, entry: infer is now entry: inference (the "
                   "record's words)"], err


@pytest.mark.parametrize("text,message", [
    (NEW_WORDS.replace("blocks: 2", "blocks: 2\ntrials: 3"), "both trials: 3 and blocks: 2 are given"),
    (OLD_WORDS.replace("equivalence: 3%", "equivalence: 3%\nmargin: 2%"), "both equivalence: 3% and margin: 2% are given"),
], ids=["blocks", "margin"])
def test_a_field_under_its_old_and_its_new_word_is_refused(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as e:
        load_spec(path)
    new = message.split(" and ")[1].split(":")[0]
    assert str(e.value) == f"{path}: {message}, one field under its old and its new name; keep {new}: only"


def test_max_trials_is_max_blocks_by_its_old_name(tmp_path, capsys):
    """--max-trials still works for a release (one deprecation line), is not shown by --help,
    and given with --max-blocks is one error."""
    import argparse

    from workloads.commands import cli
    from workloads.commands import study as command

    spec = str(write(tmp_path, AA))
    assert cli.main(["study", spec, "--until-decided", "--max-blocks", "6", "--plan"]) == 0
    new = capsys.readouterr()
    assert new.out.startswith("plan of study aa: 2 arms x 1 workload point(s) x 6 blocks") and new.err == ""
    assert cli.main(["study", spec, "--until-decided", "--max-trials", "6", "--plan"]) == 0
    old = capsys.readouterr()
    assert old.out == new.out and old.err == "--max-trials is deprecated, read for this release: write --max-blocks\n"
    assert cli.main(["study", spec, "--until-decided", "--max-trials", "6", "--max-blocks", "8", "--plan"]) == 2
    assert capsys.readouterr().err == ("error: --max-blocks 8 and --max-trials 6 are one option (--max-trials is its "
                                       "name before); give --max-blocks only\n")
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    assert "--max-blocks" in parser.format_help() and "--max-trials" not in parser.format_help()


def test_bad_study_is_one_line_exit_2(tmp_path):
    r = subprocess.run([*STUDY, str(tmp_path / "none.yaml")], cwd=REPO, env=child_env(), capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: no study file") and "Traceback" not in r.stderr
    bad = write(tmp_path, AA.replace("collectives.iters=5", "collectives.nosuch=5"))
    r = subprocess.run([*STUDY, str(bad), "--output-root", str(tmp_path)], cwd=REPO, env=child_env(),
                       capture_output=True, text=True)
    assert r.returncode == 2 and "collectives.nosuch" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "aa").exists()  # refused before anything ran or was written


def test_plan_is_printed_and_a_study_that_cannot_call_is_refused_before_it_runs(tmp_path):
    """The family, the noise and where it came from, the detectable difference, the blocks; a
    study whose blocks cannot call its `detect` is one line, exit 2, and nothing written."""
    r = subprocess.run([*STUDY, str(write(tmp_path, AA)), "--plan", "--output-root", str(tmp_path / "o")], cwd=REPO,
                       env=child_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "plan of study aa: 2 arms x 1 workload point(s) x 2 blocks = 4 runs, design abba"
    assert "ar (collectives): primary all_reduce bus bandwidth at the largest size; expected CV 5.0% (default" in r.stdout
    assert "can call: >= " in r.stdout and "(asked: 500.0%)" in r.stdout and not (tmp_path / "o").exists()
    tight = write(tmp_path, AA.replace("detect: 500%", "detect: 10%"))
    r = subprocess.run([*STUDY, str(tight), "--output-root", str(tmp_path / "o")], cwd=REPO, env=child_env(),
                       capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: study aa cannot call a 10.0% difference: with 2 blocks and 1 A/A control test "
                               "at CV 5.0% the smallest it can call (80% power) is ")
    assert "set blocks: 7 (or leave blocks out to let the plan choose)" in r.stderr and not (tmp_path / "o").exists()
    # left out, the plan chooses; earlier runs of the same workload set the noise (below, in the real study)
    r = subprocess.run([*STUDY, str(write(tmp_path, AA.replace("blocks: 2\ndetect: 500%", ""))), "--plan"], cwd=REPO,
                       env=child_env(), capture_output=True, text=True)
    assert "x 7 blocks = 14 runs, design abba (blocks chosen by this plan)" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([*STUDY, str(tight), "--until-decided"], cwd=REPO, env=child_env(), capture_output=True, text=True)
    assert r.returncode == 2 and "--until-decided and --max-blocks N go together" in r.stderr
    r = subprocess.run([*STUDY, str(tight), "--until-decided", "--max-blocks", "16", "--stop-on", "futile", "--plan"],
                       cwd=REPO, env=child_env(), capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip() == ("error: --stop-on futile: a comma-separated subset of difference, "
                                                      "equivalence, futility (the default is difference,equivalence)")
    r = subprocess.run([*STUDY, str(write(tmp_path, AA)), "--until-decided", "--max-blocks", "16", "--plan"], cwd=REPO,
                       env=child_env(), capture_output=True, text=True)
    assert r.stdout.startswith("plan of study aa: 2 arms x 1 workload point(s) x 16 blocks = 32 runs, design abba, "
                               "sequential: looks after 3, 4, 6, 8, 12, 16 blocks (alpha x 3/49, 4/49, 6/49, 8/49, "
                               "12/49, 16/49: in proportion to the blocks)"), r.stdout + r.stderr


def test_a_cell_the_workload_would_refuse_is_refused_before_the_study_runs(tmp_path):
    """The workload's own checks run for every arm x workload before the first cell (a batch
    that does not divide the world), not in every cell as a failure."""
    bad = write(tmp_path, AA.split("workloads:")[0] + "workloads:\n  - {name: tr, entry: pretrain, overrides: "
                          "[train.micro_batch_size=3, train.global_batch_size=8]}\nblocks: 2\ndetect: 500%\n")
    r = subprocess.run([*STUDY, str(bad), "--output-root", str(tmp_path / "o")], cwd=REPO, env=child_env(),
                       capture_output=True, text=True)
    assert r.returncode == 2 and "is not divisible by micro_batch_size (3)" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


@pytest.mark.requires("root")
def test_a_read_only_output_root_is_one_line(tmp_path):
    with tmpfs(tmp_path / "ro", "ro,size=1m") as ro:
        r = subprocess.run([*STUDY, str(write(tmp_path, AA)), "--output-root", str(ro / "x")], cwd=REPO,
                           env=child_env(), capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == (f"error: --output-root {ro / 'x'}: cannot write the study's folder {ro / 'x' / 'aa'} "
                                "(Read-only file system); give a writable folder")


# --- one run's command ------------------------------------------------------------------

def test_cell_command_carries_the_study_cell_in_one_override(tmp_path):
    from workloads.core.config import compose

    s = load_spec(write(tmp_path, AA), output_root=str(tmp_path / "my out"))
    jobs = plan(s)
    assert [(j.arm.label, j.cell.position) for j in jobs] == [("loopback", 0), ("loopback~aa", 1),
                                                              ("loopback~aa", 2), ("loopback", 3)]
    job = jobs[1]
    argv = cell_argv(s, job, "local", python="py", env={})
    assert argv[:2] == ["py", str(REPO / "launch" / "collectives.py")]
    assert "fabric=loopback" in argv and "trial=0" in argv and "run_id=aa-loopback-aa-t0-ar" in argv
    study = [a for a in argv if a.startswith("study=")]
    assert len(study) == 1
    cfg = compose(CONF_DIR, [a for a in argv[2:]], "config")
    assert dict(cfg.study) == {"name": "aa", "id": "aa", "arm": "loopback~aa", "baseline": "loopback",
                               "control": True, "block": 0, "position": 1, "design": "abba", "seed": 0,
                               "blocks": 2, "workload": "ar", "margin": 0.02, "detect": 5.0, "looks": 1,
                               "alpha": 0.05}
    assert cfg.output_root == str(tmp_path / "my out" / "aa") and cfg.trial == 0


def test_slurm_runs_are_steps_on_the_allocation_and_name_its_nodes(tmp_path):
    s = load_spec(write(tmp_path, AA))
    job = plan(s)[0]
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-2]"}
    argv = cell_argv(s, job, "slurm", env=env)
    assert argv[:2] == ["bash", "-c"] and "fb_srun_per_node" in argv[2] and "torchrun_node.sh" in argv[2]
    assert argv[4] == str(REPO / "launch" / "collectives.py")
    assert study_field(s, job, env) | {} == study_field(s, job, {}) | {"slurm_job": "77", "nodes": "n[1-2]"}
    assert "nodes:'n[1-2]'" in study_override(study_field(s, job, env))


def test_emulated_arms_run_through_the_emulator(tmp_path):
    s = load_spec("emu-ab", output_root=str(tmp_path))
    job = Job(Cell("emu-100m", 0, 0, 1), s.arm("emu-100m"), s.workloads[0], ("",))
    argv = cell_argv(s, job, "local", python="py", env={})
    assert argv[:2] == ["py", str(REPO / "launch" / "emulate.py")] and "fabric=emu-100m" in argv


# --- real studies -----------------------------------------------------------------------

def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"}


def records(root: Path) -> list[dict]:
    out = []
    for p in sorted(root.rglob("records/*.json")):
        rec = json.loads(p.read_text())
        rec["_path"] = p
        out.append(rec)
    return out


def study(path: Path, out: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*STUDY, str(path), "--output-root", str(out)], cwd=REPO, env=child_env(),
                          capture_output=True, text=True, timeout=timeout)


# Not `timing`: nothing here depends on how fast the runs were. The records, their order, the
# resume and the refusals are the machinery's; the A/A control may say NOT quiet on a loaded
# machine and that wording is allowed (below); the plan of each rerun sizes its 2 blocks on the
# default CV (2 blocks of one control are too few to measure the noise from, plan.measured_cv).
@pytest.mark.slow
@pytest.mark.timeout(1200)  # 5 runs, 4 study invocations at the default weight: 476 s here beside make check at load 16
def test_aa_study_on_loopback_interleaves_records_and_resumes(tmp_path):
    out = tmp_path / "results"
    r = study(write(tmp_path, AA), out)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = records(out / "aa")
    assert len(recs) == 4 and all(x["status"] == "ok" for x in recs)
    for x in recs:
        st = x["study"]
        assert {k: st[k] for k in ("name", "id", "baseline", "design", "blocks", "workload")} == {
            "name": "aa", "id": "aa", "baseline": "loopback", "design": "abba", "blocks": 2, "workload": "ar"}
        assert st["control"] == (st["arm"] == "loopback~aa") and x["config"]["trial"] == st["block"]
        assert x["run_id"] == f"aa-{st['arm'].replace('~', '-')}-t{st['block']}-ar"
    # The order they ran in, from the records alone: positions ABBA, and the records'
    # creation times follow the positions.
    by_pos = sorted(recs, key=lambda x: x["study"]["position"])
    assert [x["study"]["arm"] for x in by_pos] == ["loopback", "loopback~aa", "loopback~aa", "loopback"]
    assert [x["created"] for x in by_pos] == sorted(x["created"] for x in by_pos)
    # Progress per run, a summary table, and compare's verdicts per arm label.
    assert "[1/4] block 0 · loopback · trial 0 · ar (1/1)" in r.stdout and "ETA" in r.stdout
    assert "Study aa" in r.stdout and "loopback~aa  2/2" in r.stdout
    assert "loopback~aa" in (out / "aa" / "compare.txt").read_text() and "interleaved ABBA, 2 blocks" in r.stdout
    # the plan came first, and the A/A control says what it can and cannot tell: never "quiet".
    # It may find a bias: both blocks of one run here (load from the other worker at positions
    # 0 and 3 only) measured the control 179% faster, which ABBA cannot cancel, and the study
    # said so ("A/A control NOT quiet ... treat every verdict with suspicion"): the control
    # doing its job, so that wording is allowed, a bare claim of quiet is not.
    assert r.stdout.startswith("plan of study aa: 2 arms x 1 workload point(s) x 2 blocks = 4 runs, design abba")
    assert "A/A control" in r.stdout and not re.search(r"(?<!NOT )quiet", r.stdout), r.stdout
    if "A/A control NOT quiet" in r.stdout:
        assert "treat every verdict with suspicion" in r.stdout, r.stdout
    assert (out / "aa" / "report" / "report.md").is_file()

    # A rerun of a finished study writes nothing.
    before = digest(out)
    r = study(write(tmp_path, AA), out)
    assert r.returncode == 0 and "nothing was run" in r.stdout, r.stdout[-2000:]
    assert digest(out) == before

    # A lost run is measured again, and only that one.
    lost = next(x for x in recs if x["study"]["arm"] == "loopback~aa" and x["study"]["block"] == 1)
    lost["_path"].unlink()
    r = study(write(tmp_path, AA), out)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "3 of 4 runs already recorded" in r.stdout and "[4/4] block 1 · loopback~aa · trial 1" in r.stdout
    after = records(out / "aa")
    assert len(after) == 4 and all(x["status"] == "ok" for x in after)
    assert {str(x["_path"]) for x in after} == {str(x["_path"]) for x in recs}
    untouched = {k: v for k, v in before.items() if "records" in k and k != str(lost["_path"].relative_to(out))}
    assert all(digest(out)[k] == v for k, v in untouched.items())

    # Resumed on other code (a `git pull` between sessions): refused before anything runs, naming
    # both commits, since compare would not pool the new runs with the old.
    for x in records(out / "aa"):
        path = x.pop("_path")
        x["fingerprint"]["git"]["commit"] = "0" * 40
        path.write_text(json.dumps(x))
    gone = next(x for x in recs if x["study"]["arm"] == "loopback" and x["study"]["block"] == 1)
    gone["_path"].unlink()
    r = study(write(tmp_path, AA), out)
    assert r.returncode == 2 and "study aa was measured on commit 000000000000 and this checkout is " in r.stderr, r.stderr
    assert "git checkout " + "0" * 40 in r.stderr and "Traceback" not in r.stderr and not gone["_path"].exists()

    # The same id with another study is refused, not mixed in (more blocks is the same study, extended).
    r = study(write(tmp_path, AA.replace("blocks: 2", "blocks: 2\ndesign: permuted")), out)
    assert r.returncode == 2 and "holds study 'aa' with other design" in r.stderr


@pytest.mark.slow
def test_sequential_study_stops_at_the_first_look_that_decides(tmp_path):
    """`--until-decided --max-blocks 4 --stop-on difference,equivalence,futility`: looks after 3
    and 4 blocks, alpha x 3/7 and 4/7 there. An A/A pair with a (deliberately wide) 900% `detect`
    is usually settled at the first look (900% ruled out: futility, asked for here), so block 4
    never runs; on a loaded machine its noise can keep it open to the cap. Either way the
    console says what each look found, the records match it, and carry the looks, so the
    verdict is judged at the spent alpha."""
    out = tmp_path / "results"
    spec = write(tmp_path, AA.replace("blocks: 2\n", "margin: 900%\n").replace("detect: 500%", "detect: 900%"))
    r = subprocess.run([*STUDY, str(spec), "--output-root", str(out), "--until-decided", "--max-blocks", "4",
                        "--stop-on", "difference,equivalence,futility"], cwd=REPO,
                       env=child_env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "sequential: looks after 3, 4 blocks (alpha x 3/7, 4/7: in proportion to the blocks)" in r.stdout.splitlines()[0]
    recs = records(out / "aa")
    assert {x["study"]["looks"] for x in recs} == {2}
    if "look after 3 blocks: 1 of 1 primary verdict(s) decided; stopping" in r.stdout:
        assert len(recs) == 6 and "look after 4 blocks" not in r.stdout
        level = "97.86% CI"  # 1 - 0.05 x 3/7
    else:
        assert "look after 3 blocks: 0 of 1 primary verdict(s) decided; adding blocks" in r.stdout, r.stdout
        assert len(recs) == 8 and "look after 4 blocks: " in r.stdout
        level = "97.14% CI"  # 1 - 0.05 x 4/7
    text = (out / "aa" / "compare.txt").read_text()
    assert level in text and "sequential: alpha spent over 2 looks in proportion to their blocks" in text, text
    # the plan of a rerun reads the noise these runs measured
    r = subprocess.run([*STUDY, str(spec), "--output-root", str(out), "--plan"], cwd=REPO, env=child_env(),
                       capture_output=True, text=True)
    # ... as the spread of the block log-ratio the verdict tests, from its own fabric's blocks
    assert f"(sd of the block log-ratio / sqrt 2 over {len(recs) // 2} earlier blocks (loopback); blocks sized on its " \
        "80% upper limit " in r.stdout and "wall time: about " in r.stdout, r.stdout


@pytest.mark.timing  # a study's verdict
@pytest.mark.requires("root")
@pytest.mark.slow
def test_ab_study_on_emulated_links_calls_100mbit_slower(emu_ab):
    """docs/studies.md's example (conf/study/emu-ab.yaml: training and an all_reduce) as a user runs
    it, asked to call a 50% difference (the session's emu_ab fixture, tests/conftest.py): its plan
    chooses 3 blocks."""
    out, r = emu_ab
    assert r.stdout.startswith("plan of study emu-ab: 2 arms x 2 workload point(s) x 3 blocks = 12 runs"), r.stdout[:500]
    recs = records(out / "emu-ab")
    assert len(recs) == 12 and all(x["status"] == "ok" for x in recs)
    by_pos = sorted(recs, key=lambda x: (x["study"]["position"], x["workload"]))
    assert [x["study"]["arm"] for x in by_pos[::2]] == ["emu-veth", "emu-100m", "emu-100m", "emu-veth", "emu-veth", "emu-100m"]
    link = 100e6 / 8 * 1448 / 1514 / 1e9  # GB/s: 100 Mbit/s of frames, payload share
    for x in recs:
        assert x["world"]["nodes"] == 2 and x["fabric"]["env"]["GLOO_SOCKET_IFNAME"] == "emu0"
    # each arm's runs in a block say which kept topology they ran on: built for the first, then counted
    on: dict[str, list[dict]] = {}
    for x in sorted(recs, key=lambda x: x["study"]["started"]):  # in the order they ran
        on.setdefault(x["fabric"]["kept"]["topology"], []).append(x)
    assert len(on) == 2 * 3, list(on)  # one per arm and block: an instance's offsets vary as any noise does
    for topology, xs in on.items():
        assert len({x["study"]["arm"] for x in xs}) == 1, topology  # arms never share one
        assert len({x["study"]["block"] for x in xs}) == 1, topology  # nor blocks
        assert [x["fabric"]["kept"]["runs_on_it"] for x in xs] == list(range(1, len(xs) + 1)), topology
        assert {x["fabric"]["kept"]["built_at_run"] for x in xs} == {xs[0]["run_id"]}, topology
    # The shaped arm runs at the link's rate: never faster, and so in the median. One trial of
    # five 1 MiB all_reduces may lose a scheduling slice on a loaded 2-core machine (one run here
    # measured 80% of the link, its five siblings 99-100%): the study's design absorbs that.
    shaped = [x["metrics"]["avg_busbw(GB/s)"] for x in recs if x["study"]["arm"] == "emu-100m" and x["workload"] == "collectives"]
    assert max(shaped) <= 1.05 * link and abs(median(shaped) - link) <= 0.1 * link, (shaped, link)
    verdicts = (out / "emu-ab" / "compare.txt").read_text()
    # both primary verdicts are called, each in words with its interval, on the design the study ran
    head = [ln for ln in verdicts.splitlines() if ln.startswith("headline: ")]
    assert len(head) == 2, verdicts
    assert any(h.startswith("headline: Collectives, all_reduce bus bandwidth: emu-veth is") for h in head), verdicts
    assert any(h.startswith("headline: Pre-training, samples/s: emu-veth is") for h in head), verdicts
    assert all("faster than emu-100m [" in h and "interleaved ABBA, 3 blocks" in h for h in head), verdicts
    assert "not significant" not in verdicts and "inconclusive" not in "\n".join(head), verdicts


@pytest.mark.requires("root", "slurm")
@pytest.mark.slow
def test_study_in_a_slurm_allocation_runs_steps_on_its_nodes(tmp_path):
    """Inside one allocation of 2 nodes, every run is one step over both nodes (one torchrun
    agent per node), and each record names the job and the nodes."""
    from helpers.slurm_cluster import SlurmCluster

    spec = write(tmp_path, AA.replace("collectives.iters=5", "collectives.iters=3"))
    out = tmp_path / "results"
    with SlurmCluster(tmp_path, nodes=2) as c:
        r = subprocess.run(["sbatch", "--parsable", "--wait", "--nodes=2", "--time=15", f"--output={tmp_path}/job.out",
                            "--wrap", f"{sys.executable} -m workloads.commands.cli study {spec} --output-root {out}"],
                           cwd=REPO, env=c.env(child_env()), capture_output=True, text=True, timeout=900)
        log = (tmp_path / "job.out").read_text(errors="replace") if (tmp_path / "job.out").exists() else ""
        assert r.returncode == 0, r.stderr + log[-4000:]
    job = r.stdout.strip().split(";")[0]
    recs = records(out / "aa")
    assert len(recs) == 4 and all(x["status"] == "ok" for x in recs), log[-4000:]
    for x in recs:
        assert x["world"]["nodes"] == 2 and x["world"]["world_size"] == 2
        assert x["study"]["slurm_job"] == job and x["study"]["nodes"] == "n[1-2]"
    assert "slurm; records in" in log and "[4/4]" in log


@pytest.mark.slow
def test_inference_study_resumes_by_load_point(tmp_path):
    """An inference sweep per run (against the scripted server: the client side is what a
    study adds); one record per load point, and a run missing one point is completed."""
    from workloads.testing.scripted_server import Running

    out = tmp_path / "results"
    with Running(ttft_ms=2, itl_ms=1) as url:
        spec = write(tmp_path, f"""name: inf
arms:
  - {{label: loopback, fabric: loopback}}
control: true
workloads:
  - name: ext
    entry: inference
    overrides: [server=external, "server.url={url}", "load.points=[1,2]", load.num_requests=10,
                load.warmup_requests=1, load.dataset.input_len=8, load.dataset.output_len=4]
blocks: 2
detect: 900%
""")
        assert [j.points for j in plan(load_spec(spec, output_root=str(out)))] == [("c1", "c2")] * 4
        r = study(spec, out)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        recs = records(out / "inf")
        assert sorted((x["study"]["arm"], x["point"]) for x in recs) == sorted(
            [("loopback", "c1"), ("loopback", "c2"), ("loopback~aa", "c1"), ("loopback~aa", "c2")] * 2)
        assert "ext       c2     loopback~aa  2/2" in r.stdout
        assert re.search(r"clock: \d+ s measured of \d+ s of runs \(duty cycle \d+%\)", r.stdout), r.stdout[-3000:]
        lost = next(x for x in recs if x["study"]["arm"] == "loopback~aa" and x["point"] == "c2" and x["config"]["trial"] == 0)
        lost["_path"].unlink()
        r = study(spec, out)
        assert r.returncode == 0 and "3 of 4 runs already recorded" in r.stdout, r.stdout[-3000:]
        assert "point c1: already recorded" in (out / "inf" / "logs" / "inf-loopback-aa-t0-ext.log").read_text()
        assert len(records(out / "inf")) == 8
    # what `window: auto` reads of these runs (workloads/study/served.py): one more request at both
    # points adds their durations / 10; O is the run (timings.jsonl) less that window. Two blocks
    # measure no CV of blocks yet (the plan then says it guesses): given one, the costs are these
    from workloads.study import plan as study_plan

    auto = write(tmp_path, spec.read_text().replace(" load.num_requests=10,", "").replace("name: inf", "name: inf2")
                 .replace("blocks: 2", "window: auto"), name="auto.yaml")
    auto_spec = load_spec(auto, output_root=str(out))
    assert "guessing: its own window (no measured CV of earlier blocks)" in "\n".join(study_plan.make_plan(auto_spec).lines())
    costs, why, _ = study_plan._window_costs(study_plan._earlier(auto_spec), auto_spec.workloads[0], 0.05)
    assert why == "" and costs.steps_before == 10, why
    runs: dict[tuple, float] = {}
    for x in records(out / "inf"):
        key = (x["study"]["arm"], x["config"]["trial"])
        runs[key] = runs.get(key, 0.0) + x["metrics"]["duration"] / 10
    assert costs.step_s == pytest.approx(median(runs.values()))
    seconds = [json.loads(t)["seconds"] for t in (out / "inf" / "timings.jsonl").read_text().splitlines()
               if json.loads(t).get("ok")]
    assert costs.overhead_s == pytest.approx(median(seconds) - 10 * median(runs.values()))
    assert costs.within > 0 and costs.overhead_s > 1  # a run is mostly its start, not its 20 requests


@pytest.mark.slow
def test_sigterm_stops_the_running_cell_and_keeps_what_is_done(tmp_path):
    import signal
    import time

    out = tmp_path / "results"
    p = subprocess.Popen([*STUDY, str(write(tmp_path, AA)), "--output-root", str(out)], cwd=REPO, env=child_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    logs = out / "aa" / "logs"
    deadline = time.monotonic() + 120
    while not (logs.is_dir() and any(logs.iterdir())) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.2)
    time.sleep(2)  # the run's processes are up
    # the same study a second time, while the first runs: refused, one line, nothing touched
    twin = subprocess.run([*STUDY, str(tmp_path / "s.yaml"), "--output-root", str(out)], cwd=REPO, env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert twin.returncode == 2 and "error: study aa is already running in " in twin.stderr, twin.stderr
    assert f"(pid {p.pid})" in twin.stderr and "Traceback" not in twin.stderr
    p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=90)
    assert p.returncode == 143 and "rerun the same command to continue" in stderr, stdout + stderr
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"output_root={out / 'aa'}" not in ps  # no run of ours outlived the study


def _blocked_folder(folder: Path, blocks: int, planned: int) -> None:
    """Hand-written records of a two-arm study `s` (ib, roce) over `blocks` blocks, planned for `planned`."""
    from helpers.records import train_record
    from workloads.core.records import write_record

    for b in range(blocks):
        for arm, v in (("ib", 100.0), ("roce", 100.0 * (1 + 0.01 * (b % 3)))):
            rec = train_record("loopback", v, trial=b, run_id=f"{arm}-{b}")
            rec["study"] = {"id": "s", "arm": arm, "baseline": "ib", "control": False, "block": b, "position": 2 * b,
                            "design": "abba", "blocks": planned, "looks": 1}
            write_record(folder / f"{arm}-{b}" / "records", rec, "r")


def test_a_study_whose_verdicts_were_printed_is_not_extended(tmp_path):
    """Raising `blocks:` after compare.txt was written would judge the study again at full alpha
    (optional stopping: 9.1% A/A false calls extending 8 -> 16, the statistics review): refused,
    with the valid alternatives named. A resume to the same size is not an extension."""
    from workloads.study.run import extension_refusal

    folder = tmp_path / "s"
    _blocked_folder(folder, 4, 4)
    assert extension_refusal(folder, "s", 8) is None  # no verdict printed yet: the plan may still grow
    (folder / "compare.txt").write_text("verdicts\n")
    assert extension_refusal(folder, "s", 4) is None
    why = extension_refusal(folder, "s", 8)
    assert why.startswith("study s printed its verdicts after 4 blocks (compare.txt): adding blocks") and \
        "(--id <new id>) with blocks: 8" in why and "--until-decided" in why, why


def test_a_sequential_look_judges_only_its_own_blocks(tmp_path):
    """A sequential study resumed after a failure may already hold later blocks; its look after 3
    blocks judges blocks 0-2 only, or it would be a look the plan spent no alpha on."""
    from types import SimpleNamespace

    from workloads.study.run import decided

    folder = tmp_path / "s"
    _blocked_folder(folder, 6, 6)
    spec = SimpleNamespace(dir=folder, baseline=SimpleNamespace(label="ib"), alpha=0.05, allow=[])
    (_, n, (line,)) = decided(spec, 3)
    assert n == 1 and "3 blocks" in line, line
    assert "6 blocks" in decided(spec)[2][0]


def test_two_arm_abba_start_is_counterbalanced_across_studies():
    """Which arm opens a two-arm ABBA study is a coin drawn from its id: before, the baseline
    always ran first, and a first run 15% slower (a cold cache) biased every study in the other
    arm's favour (+2.5% at 6 blocks; the statistics review). Over 1,000 study ids (CV 1%, 6
    blocks, seed 53): the baseline opens 54.2% of them, and the mean bias of the log-ratio is
    +0.21% (before: +2.69%), while each study stays ABBA (equal position sums at even k)."""
    from helpers.binomial import at_least, at_most

    rng = np.random.default_rng(53)
    n, first, bias = 1000, 0, []
    for i in range(n):
        cells = schedule(["ib", "roce"], 6, "abba", salt=f"study-{i}")
        first += cells[0].arm == "ib"
        assert sum(c.position for c in cells if c.arm == "ib") == sum(c.position for c in cells if c.arm == "roce")
        v = {(c.arm, c.block): rng.normal(0, 0.01) + math.log(0.85) * (c.position == 0) for c in cells}
        bias.append(np.mean([v[("roce", b)] - v[("ib", b)] for b in range(6)]))
    assert at_least(first, n, 0.45) and at_most(first, n, 0.55), first
    assert abs(np.mean(bias)) < 0.006, np.mean(bias)  # 2.7% x |2 p - 1|: a fair coin leaves ~0.1%


def test_plan_says_when_a_williams_square_is_incomplete(tmp_path):
    """Three arms (with the A/A control): the Williams square has 6 rows, and its balance of
    positions holds only over whole squares; 8 blocks are said to leave it incomplete, 12 not."""
    from workloads.study.plan import make_plan

    three = AA.replace("  - {label: loopback, fabric: loopback}", "  - {label: loopback, fabric: loopback}\n"
                       "  - {label: other, fabric: loopback}")
    for blocks, incomplete in ((8, True), (12, False)):
        spec = load_spec(str(write(tmp_path, three.replace("blocks: 2", f"blocks: {blocks}"))), None, str(tmp_path / "o"))
        lines = make_plan(spec).lines()
        assert any("a Williams square of 6 rows; 8 blocks leave its balance incomplete" in x for x in lines) == incomplete


def _earlier_study(folder: Path, blocks: int, rng, block_sd: float, run_sd: float, first_slow: float) -> tuple[Path, dict]:
    """An earlier two-arm ABBA study of workload `t` (pretrain), as records and its manifest (saved
    before the rename, so its entry says train: it still counts as the same workload): a
    run's samples/s is 100 x exp(block effect + run noise - first_slow x [first run of its block])."""
    from helpers.records import train_record
    from workloads.core.records import write_record

    manifest = {"workloads": [{"name": "t", "entry": "train", "overrides": []}],
                "arms": [{"label": "ib", "fabric": "ib"}, {"label": "roce", "fabric": "roce"}]}
    for b in range(blocks):
        shared = rng.normal(0, block_sd)
        for pos, arm in enumerate(("ib", "roce") if b % 2 == 0 else ("roce", "ib")):
            v = 100 * math.exp(shared + rng.normal(0, run_sd) - first_slow * (pos == 0))
            rec = train_record(arm, v, trial=b, run_id=f"{arm}-{b}")
            rec["study"] = {"id": folder.name, "arm": arm, "block": b, "workload": "t", "design": "abba"}
            write_record(folder / f"{arm}-{b}" / "records", rec, "r")
    return folder, manifest


def test_the_plan_sizes_on_the_spread_of_the_block_log_ratio():
    """The plan's noise is sd(d)/sqrt(2) of earlier blocked studies, the variance the paired test
    uses, not the between-run spread of one arm, which holds the drift that pairing removes
    (seed 7, earlier studies of 120 blocks, block effect 3%, run noise 1%, a true sd(d)/sqrt(2)
    of 1.0%):
    - the within-arm CV it used was 3.0%: 10 blocks planned for detect 5% over 2 tests where 4
      suffice, and a true difference at the printed 8-block MDE called in 100% of 400 studies,
      not 80%; now CV 0.99% (upper limit 1.05%), 4 blocks, and 78.0% at the printed MDE;
    - the first run of each block 3% slower (ABBA): the order effect enters sd(d) and, balanced
      in the mean, makes the plan conservative (93% power at its MDE here);
    - the block count is sized on an 80% upper limit of the estimate (x1.06 at 119 df)."""
    import tempfile

    from analysis import stats
    from helpers.binomial import at_least, at_most
    from workloads.study.plan import measured_cv
    from workloads.study.spec import StudyWorkload

    rng = np.random.default_rng(7)
    w = StudyWorkload("t", "pretrain")
    with tempfile.TemporaryDirectory() as tmp:
        drift = measured_cv([_earlier_study(Path(tmp) / "a", 120, rng, 0.03, 0.01, 0.0)], w, {"ib", "roce"})
    assert 0.009 < drift.cv < 0.011 and "sd of the block log-ratio" in drift.source and "(ib, roce)" in drift.source, drift
    assert drift.cv < drift.upper < 1.1 * drift.cv and stats.blocks_for(0.05, 2, drift.upper) <= 5
    mde = math.log1p(stats.plan_mde(8, 1, drift.cv))
    hits = 0
    for _ in range(400):
        shared = rng.normal(0, 0.03, 8)  # the block effect, the same for both arms of a block: it cancels in d
        d = (mde + shared + rng.normal(0, 0.01, 8)) - (shared + rng.normal(0, 0.01, 8))
        hits += stats.paired_t(d)[3] < 0.05
    assert at_least(hits, 400, 0.75) and at_most(hits, 400, 0.85), (hits, drift)


def test_no_cell_starts_while_a_run_of_an_earlier_attempt_lives(tmp_path, monkeypatch):
    """A cell's processes share the study's cell lock (their environment names it): a study
    resumed while one lives waits for it, saying for whom, and refuses in one line, naming the
    pid, when it outlives the wait. The processes here take the lock as a cell's ranks do."""
    from workloads.core import celllock
    from workloads.study import run as study_run

    spec = load_spec(write(tmp_path, AA), output_root=str(tmp_path / "out"))
    spec.dir.mkdir(parents=True)
    env = child_env(**{celllock.CELL_LOCK_ENV: str(spec.dir / celllock.NAME)})
    take = "from workloads.core import celllock; import time; celllock.hold_shared(); print('held', flush=True); time.sleep({})"

    def orphan(seconds):
        p = subprocess.Popen([sys.executable, "-c", take.format(seconds)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                             text=True)
        assert p.stdout.readline() == "held\n"
        return p

    p = orphan(1.5)
    said, start = [], time.monotonic()
    held = study_run._cells_lock(spec, said.append)
    assert time.monotonic() - start > 1.0  # it waited for the orphan to end (its lock goes as it exits)
    p.wait()
    assert len(said) == 1 and said[0].startswith("waiting up to 60 s for the run(s) of an earlier attempt of this study "
                                                 f"to end: pid {p.pid} ({sys.executable} -c"), said
    celllock.release(held)

    p = orphan(60)
    monkeypatch.setattr(study_run, "ORPHAN_WAIT_S", 0.5)
    try:
        with pytest.raises(UsageError) as e:
            study_run._cells_lock(spec, said.append)
        assert f"wait for them to end or stop them (kill {p.pid}), then rerun" in str(e.value), e.value
    finally:
        p.kill()
        p.wait()
    celllock.release(study_run._cells_lock(spec, said.append))  # once it is gone, at once


TRAIN = AA.replace("""  - name: ar
    entry: collectives
    overrides: ["collectives.ops=[all_reduce]", collectives.minbytes=64K, collectives.maxbytes=64K,
                collectives.iters=5, collectives.warmup_iters=1]""", """  - name: tr
    entry: pretrain
    overrides: [model=neox-tiny, train.steps=100, train.warmup_steps=2]""").replace("name: aa", "name: tr")


def _ours(out: Path) -> list[int]:
    """Pids of the processes of a study's cells: launch/train.py exec'd, its command line naming the
    study's folder, or a fork of the study, which keeps the study's command line (that names the
    output root) under a name of its own in /proc/<pid>/comm (forkrank's: fb-train, fb-rank0)."""
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            argv = d.joinpath("cmdline").read_bytes().decode(errors="replace")
            comm = d.joinpath("comm").read_text().strip()
        except OSError:
            continue
        if ("launch/train.py" in argv and str(out) in argv) or (comm.startswith("fb-") and str(out.parent) in argv):
            pids.append(int(d.name))
    return pids


def _measuring(out: Path) -> bool:
    """Whether a rank of the study's cell measures a point: its in-flight copy of the point's
    record exists (a self-launch keeps it in its launcher's temporary folder)."""
    import tempfile

    for p in Path(tempfile.gettempdir()).glob("fabricbench-inflight-*/*.inflight"):
        try:
            if str(out) in p.read_text():
                return True
        except OSError:
            continue
    return False


@pytest.mark.slow
def test_a_study_killed_mid_cell_takes_its_cell_with_it_and_resumes_alone(tmp_path):
    """`kill -9` of the study during a training cell, then the same command at once: the cell's
    launcher and ranks die with the study (their interrupted point's record says so), and the
    resumed study measures that cell again alone; no verdict holds a run measured beside
    another. Without the parent-death signal the orphan trained on beside the resumed study's
    first cell and its record was a second "ok" trial."""
    import time

    out = tmp_path / "results"
    cmd = [*STUDY, str(write(tmp_path, TRAIN)), "--output-root", str(out)]
    p = subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while not _measuring(out / "tr") and time.monotonic() < deadline:
        assert p.poll() is None
        time.sleep(0.2)
    time.sleep(1)  # the ranks are training (100 steps: about 4 s here)
    orphans = _ours(out / "tr")
    assert len(orphans) >= 3, "the cell's processes"
    p.kill()
    p.wait()
    r = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert not set(orphans) & set(_ours(out / "tr"))
    recs = records(out / "tr")
    ok = [x for x in recs if x["status"] == "ok"]
    assert len(ok) == 4 and len({(x["study"]["arm"], x["config"]["trial"]) for x in ok}) == 4, \
        [(x["run_id"], x["status"]) for x in recs]
    killed = [x for x in recs if x["status"] != "ok"]
    assert len(killed) == 1 and "interrupted" in killed[0]["error"], [(x["run_id"], x["status"], x["error"]) for x in recs]
    assert "overlapped" not in r.stdout + r.stderr


def test_an_edit_to_a_tracked_file_is_other_code(tmp_path, monkeypatch):
    """Uncommitted edits are code identity beside the commit: measured in a clone of this
    repository before and after a real edit to a tracked file, the two fingerprints differ in
    git.dirty_hash alone; compare keeps them apart (`--allow fingerprint.git.dirty_hash` pools
    them) and a study resumed on the edited tree is refused in one line, as on another commit."""
    from analysis import guard
    from workloads.core import fingerprint
    from workloads.study.run import _same_code

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    probe = "import json; from workloads.core.fingerprint import git_commit; print(json.dumps(git_commit()))"

    def code() -> dict:  # the clone's own package: `python -c` puts its working folder first on sys.path
        r = subprocess.run([sys.executable, "-c", probe], cwd=clone, env=child_env(), capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout)

    clean = code()
    assert clean["dirty"] is False and clean["dirty_hash"] is None
    readme = clone / "README.md"
    readme.write_text(readme.read_text() + "\nan uncommitted line\n")
    edited = code()
    assert edited["commit"] == clean["commit"] and edited["dirty"] is True and edited["dirty_hash"]
    readme.write_text(readme.read_text() + "another\n")
    assert code()["dirty_hash"] not in (None, edited["dirty_hash"])  # the content, not only "dirty"

    a, b = ({"workload": "collectives", "fingerprint": {"git": g}} for g in (clean, edited))
    assert set(guard.differences(a, b)) == {"fingerprint.git.dirty_hash"}
    assert not guard.differences(a, b, allow=["fingerprint.git.dirty_hash"])

    spec = load_spec(write(tmp_path, AA), output_root=str(tmp_path / "out"))
    jobs = plan(spec)
    d = jobs[0].records_dir(spec)
    d.mkdir(parents=True)
    (d / "collectives-000.json").write_text(json.dumps({
        "status": "ok", "run_id": jobs[0].run_id(spec), "config": {"trial": jobs[0].cell.trial},
        "study": {"id": spec.id, "arm": jobs[0].arm.label, "workload": jobs[0].workload.name},
        "fingerprint": {"git": clean}}))
    monkeypatch.setattr(fingerprint, "git_commit", lambda: edited)
    with pytest.raises(UsageError) as e:
        _same_code(spec, jobs)
    assert str(e.value).startswith(f"study aa was measured on commit {clean['commit'][:12]} and this checkout is commit "
                                   f"{clean['commit'][:12]} with uncommitted changes (diff hash {edited['dirty_hash']}): ")
    assert "with no uncommitted edits (git stash)" in str(e.value)
    monkeypatch.setattr(fingerprint, "git_commit", lambda: clean)
    _same_code(spec, jobs)  # the edit undone: the same code again


def test_runs_of_one_study_that_overlapped_are_flagged_and_left_out(tmp_path, capsys):
    """Two runs of one study measured at the same time by two processes (an earlier attempt's
    orphan, whatever code it runs): the later record names the earlier in its file, analysis
    leaves both out with one warning, and the study measures both cells again."""
    from analysis.load import load_dirs
    from workloads.core.records import write_record
    from workloads.study.run import complete

    spec = load_spec(write(tmp_path, AA), output_root=str(tmp_path / "out"))
    jobs = plan(spec)

    def rec(job, pid, start, end=None):
        st = {"id": spec.id, "arm": job.arm.label, "workload": job.workload.name, "host": "h", "pid": pid,
              "started": start} | ({"ended": end} if end else {})
        return {"schema": "fabricbench.record/1", "workload": "collectives", "status": "ok",
                "config": {"trial": job.cell.trial}, "study": st}

    now = time.time()
    first = write_record(jobs[0].records_dir(spec), rec(jobs[0], 1, now - 100, now - 10), "c")  # the orphan
    second = write_record(jobs[1].records_dir(spec), rec(jobs[1], 2, now - 50), "c")  # beside it
    after = write_record(jobs[2].records_dir(spec), rec(jobs[2], 3, time.time()), "c")  # once both had ended
    assert json.loads(second.read_text())["study"]["overlapped"] == [str(first)]
    assert "overlapped" not in json.loads(after.read_text())["study"]
    assert [complete(spec, j) for j in jobs[:3]] == [False, False, True]
    recs = load_dirs([str(spec.dir)])
    assert sorted(r["_path"] for r in recs if r["status"] == "overlapped") == sorted([str(first), str(second)])
    err = capsys.readouterr().err
    assert "warning: 2 record(s) of a study were measured while another run of the same study was running" in err, err


def test_a_full_disk_during_analysis_is_one_line_naming_the_disk_and_the_records(tmp_path):
    """compare.txt refused by a full disk (records already safe): one error line naming the disk
    and where the records are, exit 1, and no half-written compare.txt to be taken for verdicts."""
    from helpers import need

    need("root")
    from workloads.study.run import analyse

    with tmpfs(tmp_path / "disk") as disk:
        spec = load_spec(write(tmp_path, AA), output_root=str(disk))
        spec.dir.mkdir()
        with open(disk / "filler", "wb") as f:  # the disk, full
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        said = []
        assert analyse(spec, refresh=True, say=said.append) == 1
        errors = [line for line in said if line.startswith("error: cannot write")]  # compare's own: no records here
        assert errors == [f"error: cannot write {spec.dir / 'compare.txt'} (No space left on device) on the disk mounted "
                          f"at {disk}: the records are kept in {spec.dir}/*/records; free space there and rerun the same "
                          "command (it measures nothing again, and writes compare.txt and the report)"], said
        assert not (spec.dir / "compare.txt").exists()


def test_a_lost_rendezvous_is_read_from_the_runs_own_part_of_its_log(tmp_path):
    """The words a study retries a cell on are torch's own: a rendezvous backend whose store
    server dies under it (tests/helpers/lose_rendezvous.py) ends with RendezvousConnectionError.
    Only this run's part of the cell's log counts: the log is appended to by every attempt."""
    from workloads.study.run import rendezvous_lost

    log = tmp_path / "cell.log"
    log.write_text("# an earlier attempt\nok\n")
    offset = log.stat().st_size
    with open(log, "a") as out:
        p = subprocess.run([sys.executable, str(REPO / "tests" / "helpers" / "lose_rendezvous.py")], stdout=out,
                           stderr=subprocess.STDOUT, timeout=120)
    assert p.returncode != 0
    line = rendezvous_lost(log, offset)
    assert line is not None and "RendezvousConnectionError: The connection to the C10d store has failed" in line, \
        log.read_text()[-2000:]
    assert rendezvous_lost(log, log.stat().st_size) is None  # a later attempt's part holds no such line
    with open(log, "a") as out:
        out.write("RuntimeError: a rank's own failure\n")
    assert rendezvous_lost(log, log.stat().st_size - 40) is None


def test_a_retried_cell_says_why_in_its_record(tmp_path):
    from workloads.core.config import compose

    s = load_spec(write(tmp_path, AA), output_root=str(tmp_path / "out"))
    job = plan(s)[0]
    why = ("aa-loopback-t0-ar lost its rendezvous (exit 1): torch.distributed.elastic.rendezvous.api."
           "RendezvousConnectionError: The connection to the C10d store has failed. See inner exception for details.")
    argv = cell_argv(s, job, "local", python="py", env={}, retry=why)
    cfg = compose(CONF_DIR, argv[2:], "config")
    assert cfg.study.retry_of == why and cfg.study.arm == "loopback"
    assert "retry_of" not in study_field(s, job, env={})
