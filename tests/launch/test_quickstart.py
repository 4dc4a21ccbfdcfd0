"""docs/quickstart-cluster.md's commands still parse: each fabricbench command by its own parser (a
study or tune file loads, doctor's and the batch files' Hydra overrides compose), the Makefile
variables it names exist, and every other program is one the page is known to use, so a new or
renamed command fails here until this test learns it.

Where each step runs: the install (step 1) bootstraps uv with the named PYTHON, here; the doctor steps (step 2) under the tests' private Slurm, here; the 2-node
collectives lines under Slurm shims up to torchrun, which needs GPUs (tests/launch/test_slurm_files.py,
every documented sbatch line); the shipped study's plan on a node holding both fabrics
(tests/study/test_precheck.py), its pilot on an emulated study there; a study under
`sbatch --wrap` (tests/study/test_study.py); the report (tests/analysis/test_report_e2e.py)."""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO
from workloads import CONF_DIR
from workloads.commands.cli import COMMANDS
from workloads.core.config import compose

PAGE = REPO / "docs" / "quickstart-cluster.md"
# programs the page runs that are not this project's: only their presence is checked
OTHERS = {"git", "cd", "export", "enroot"}
BATCH = {"collectives.sbatch": "workload=collectives", "train.sbatch": None, "inference.sbatch": "workload=inference"}


def commands() -> list[list[str]]:
    out, fence = [], None
    for line in PAGE.read_text().splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
            continue
        if fence == "sh" and line.strip() and not line.lstrip().startswith("#"):
            out.append(shlex.split(line, comments=True))
    return out


def unwrap(argv: list[str]) -> list[list[str]]:
    """The commands a line runs: past environment assignments, srun's options, sbatch's --wrap and
    bash -c."""
    while argv and re.match(r"^[A-Z_]+=", argv[0]):
        argv = argv[1:]
    if argv[:1] in (["srun"], ["sbatch"]):
        wrapped = [a.split("=", 1)[1] for a in argv if a.startswith("--wrap=")]
        if "--wrap" in argv:
            wrapped.append(argv[argv.index("--wrap") + 1])
        if wrapped:
            return [c for w in wrapped for c in unwrap(shlex.split(w))]
        rest = argv[1:]
        while rest and rest[0].startswith("-"):
            rest = rest[1:]
        return unwrap(rest)
    if argv[:2] == ["bash", "-c"]:
        return [c for part in argv[2].split("&&") for c in unwrap(shlex.split(part.split(">")[0]))]
    return [argv]


def check(argv: list[str]) -> None:
    prog = argv[0]
    if prog.endswith("fabricbench"):
        if argv[1:2] == ["--help"]:
            return
        module = importlib.import_module(COMMANDS[argv[1]][0])
        parser = argparse.ArgumentParser(prog=f"fabricbench {argv[1]}", exit_on_error=False)
        module.add_arguments(parser)
        args = parser.parse_args(argv[2:])
        if argv[1] == "study":
            from workloads.study.spec import load_spec

            load_spec(REPO / args.study)
        if argv[1] == "doctor" and args.overrides:
            compose(CONF_DIR, args.overrides)
        if argv[1] == "report":
            assert args.baseline
        return
    if prog == "make":
        text = (REPO / "Makefile").read_text()
        for a in argv[1:]:
            if "=" in a:
                assert re.search(rf"^{a.split('=')[0]} \?=", text, re.M), f"the Makefile has no {a.split('=')[0]} ?="
            else:
                assert re.search(rf"^{a}:", text, re.M), f"the Makefile has no target {a}"
        return
    if prog.startswith("launch/slurm/"):
        assert (REPO / prog).is_file(), prog
        pick = BATCH[prog.rsplit("/", 1)[1]]
        compose(CONF_DIR, [*([pick] if pick else []), *argv[1:]])
        return
    assert prog in OTHERS, f"{shlex.join(argv)}: a program this test does not know; teach it to check it"


CASES = [c for line in commands() for c in unwrap(line)]


def test_the_page_has_the_commands_it_promises():
    progs = [(c[0].rsplit("/", 1)[-1], c[1] if len(c) > 1 else "") for c in CASES]
    for want in [("fabricbench", "doctor"), ("fabricbench", "study"), ("fabricbench", "report"),
                 ("collectives.sbatch", "fabric=ib"), ("collectives.sbatch", "fabric=roce"), ("enroot", "import")]:
        assert want in progs, want


@pytest.mark.parametrize("argv", CASES, ids=lambda c: " ".join(c)[:60])
def test_every_quickstart_command_parses(argv):
    check(argv)


def test_a_command_that_stops_parsing_fails_here():
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        check([".venv/bin/fabricbench", "study", "conf/study/ib-vs-roce.yaml", "--plann"])
    with pytest.raises(AssertionError, match="no PYTHON3"):
        check(["make", "sync", "PYTHON3=python3"])
    with pytest.raises(Exception, match="fabric"):
        check(["launch/slurm/collectives.sbatch", "fabric=infiniband"])


def test_every_glossary_word_is_linked_where_it_first_appears():
    """Each word the glossary defines is, at its first use before the glossary, a link to it."""
    text = PAGE.read_text()
    body, glossary = text.split("\n## Glossary\n")
    terms = re.findall(r"^- \*\*(.+?)\*\*:", glossary, re.M)
    assert {"arm", "block", "primary", "look", "window", "duty cycle", "A/A", "MDE", "TOST"} <= set(terms)
    # a command or a heading is not where a reader is told what a word means
    prose = re.sub(r"^#.*$", "", re.sub(r"```.*?```", "", body, flags=re.S), flags=re.M)
    for term in terms:
        first = re.search(rf"(?<![\w/]){re.escape(term)}", prose, re.I)
        assert first, f"the glossary defines {term!r} but the page never uses it"
        links = [m.span() for m in re.finditer(r"\[[^\]]*\]\(#glossary\)", prose)]
        assert any(a <= first.start() < b for a, b in links), \
            f"{term!r} first appears unlinked: ...{prose[max(0, first.start() - 40):first.end() + 40]}..."


@pytest.mark.requires("root", "slurm")
@pytest.mark.slow
def test_the_doctor_steps_run_under_slurm(tmp_path_factory):
    """Step 2 as the page writes it, on the tests' private 2-node Slurm, on the sysfs of a node
    holding both fabrics (FABRICBENCH_SYSFS_ROOT: this machine has no HCAs) and without
    --gpus-per-node (it has no GPUs: the one option left out): doctor fails the shipped profile and
    prints the site settings; every node writes its JSON; --compare reads them back."""
    from helpers import FIXTURES, child_env
    from helpers.slurm_cluster import SlurmCluster

    page = [ln for ln in commands() if ln[:1] == ["srun"] and "doctor" in " ".join(ln)]
    one = next(ln for ln in page if "fabric=roce" in ln)
    every = next(ln for ln in page if "--json" in " ".join(ln))
    compare = next(ln for line in commands() for ln in unwrap(line) if "--compare" in ln)
    drop = lambda argv: [a for a in argv if not a.startswith("--gpus-per-node")]  # noqa: E731
    venv = REPO / ".venv" / "bin" / "fabricbench"
    # a short root: slurmd's step sockets under it must fit in 108 bytes (this test's own tmp_path does not)
    tmp_path = tmp_path_factory.mktemp("qs")
    with SlurmCluster(tmp_path / "slurm", nodes=2) as c:
        env = c.env(child_env(FABRICBENCH_SYSFS_ROOT=str(FIXTURES / "sysfs" / "dual_host")))
        work = tmp_path / "work"
        work.mkdir()
        (work / ".venv").symlink_to(venv.parent.parent)
        r = subprocess.run(drop(one), cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 1 and "FAIL: NCCL_IB_HCA=mlx5 selects mlx5_0:1" in r.stdout, r.stdout + r.stderr
        assert "Suggested site settings, from this node (paste into conf/local/roce.yaml):" in r.stdout
        r = subprocess.run(drop(every), cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr + c.logs()
        files = sorted(p.name for p in work.glob("doctor-*.json"))
        assert len(files) == 2, files  # one per node: SLURMD_NODENAME, not the (shared) hostname
        r = subprocess.run(["bash", "-c", shlex.join(compare).replace("'doctor-*.json'", "doctor-*.json")], cwd=work,
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and r.stdout.startswith("Compared 2 nodes: "), r.stdout + r.stderr


@pytest.mark.slow
def test_make_bootstraps_uv_with_the_python_it_is_given(tmp_path):
    """Step 1's `make sync PYTHON=...` for real, up to the project's own venv: the Makefile alone in
    an empty folder, uv not on PATH, a named interpreter that is not the one on PATH first; `.tools/`
    is that interpreter's venv and holds a uv that runs (pip installs it from the package index)."""
    named = shutil.which("python3.11", path="/usr/bin") or sys.executable
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    p = subprocess.run(["make", ".tools/bin/uv", f"PYTHON={named}"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"{named} -m venv .tools" in p.stdout
    home = dict(line.split(" = ", 1) for line in (tmp_path / ".tools" / "pyvenv.cfg").read_text().splitlines() if " = " in line)
    assert home["home"] == str(Path(named).resolve().parent)
    v = subprocess.run([str(tmp_path / ".tools" / "bin" / "uv"), "--version"], capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and v.stdout.startswith("uv "), v.stdout + v.stderr
