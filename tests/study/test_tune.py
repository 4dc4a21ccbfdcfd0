"""`fabricbench tune`'s pieces without running a workload: the spec and its plan, successive
halving, the outcome's words, the derived arm file and NCCL's tuner CSV, a study naming tuned
arms, and simulated tunes through the verdict code (tests/helpers/tunesim.py): a planted null
names no winner in >= 95% of tunes, a real difference is called, and judging the winner on the
blocks that chose it (no fresh confirmation) is biased, which is why the confirmation is separate."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from analysis import stats
from helpers import REPO, child_env
from helpers.binomial import at_least, at_most
from helpers.tunesim import simulate
from workloads import CONF_DIR
from workloads.core.config import compose
from workloads.core.errors import UsageError
from workloads.study import halving, tuned
from workloads.study.tunespec import DEFAULT, load_tune, round_blocks, rounds, search_runs_needed

TUNE = """\
name: t
arm: {fabric: loopback, overrides: [collectives.iters=5]}
workloads:
  - {name: ar, entry: collectives, overrides: ["collectives.ops=[all_reduce]"]}
space:
  env: {NCCL_ALGO: [Ring, Tree]}
  overrides: {collectives.warmup_iters: [1, 2]}
candidates:
  - {name: same, env: {NCCL_PROTO: Simple}}
detect: 30%
cv: 5%
"""


def write(tmp_path, text: str = TUNE, name: str = "t.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


# --- the spec and its plan ------------------------------------------------------------------

def test_the_space_is_every_combination_beside_the_default_and_the_named_ones(tmp_path):
    t = load_tune(write(tmp_path), output_root=str(tmp_path / "o"))
    assert [c.name for c in t.candidates] == [DEFAULT, "NCCL_ALGO-Ring.warmup_iters-1", "NCCL_ALGO-Ring.warmup_iters-2",
                                              "NCCL_ALGO-Tree.warmup_iters-1", "NCCL_ALGO-Tree.warmup_iters-2", "same"]
    assert t.default.settings == {}
    assert t.candidate("NCCL_ALGO-Tree.warmup_iters-2").settings == {"env": {"NCCL_ALGO": "Tree"},
                                                                    "overrides": {"collectives.warmup_iters": 2}}
    # 6 candidates: 6 -> 3 -> 2 -> 1, one block each a round by default: 3 x 6 runs
    assert rounds(6) == [6, 3, 2] and t.search_runs == search_runs_needed(6, 1) == 18
    assert round_blocks(6, 1, 18) == [1, 2, 3]       # the budget split equally: the survivors measured longest
    assert round_blocks(6, 2, 36) == [1, 2, 3]
    # the confirmation: the fewest blocks whose plan calls detect (30% at CV 5%, one primary test)
    assert t.confirm_blocks == stats.blocks_for(0.30, 1, 0.05) == 3


def test_a_candidate_arm_carries_its_settings_and_composes(tmp_path):
    t = load_tune(write(tmp_path), output_root=str(tmp_path / "o"))
    arm = t.candidate("NCCL_ALGO-Tree.warmup_iters-2").arm(t.arm, t.id)
    assert arm.overrides[0] == "collectives.iters=5"           # the arm's own first, then the settings
    cfg = compose(CONF_DIR, ["workload=collectives", *arm.overrides, f"fabric={arm.fabric}"])
    assert cfg.fabric.env.NCCL_ALGO == "Tree" and cfg.collectives.warmup_iters == 2
    assert dict(cfg.tuned.settings.env) == {"NCCL_ALGO": "Tree"} and cfg.tuned.candidate == arm.label
    assert cfg.tuned.tune == "t"


def test_the_plan_states_the_runs_before_anything_runs(tmp_path):
    r = subprocess.run([sys.executable, "-m", "workloads.commands.cli", "tune", str(write(tmp_path)), "--plan",
                        "--output-root", str(tmp_path / "o")], cwd=REPO, env=child_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # search 6x1 + 3x2 + 2x3 = 18 runs, confirmation 2 x 3 blocks = 6
    assert lines[0].startswith("plan of tune t: 24 runs = search 18 + confirmation 6"), lines[0]
    assert "round 1: 6 candidates x 1 block(s) x 1 workload(s) = 6 runs; round 2: 3 candidates x 2 block(s)" in r.stdout
    assert "the search's scores choose, they are never the gain" in r.stdout
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("path", sorted((REPO / "conf" / "tune").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_tune_loads(path):
    t = load_tune(path)
    assert len(t.candidates) >= 2 and t.candidates[0].name == DEFAULT


@pytest.mark.parametrize("edit,needle", [
    (lambda s: s.replace("NCCL_ALGO: [Ring, Tree]", "NCCL_ALGO: []"), "space.env.NCCL_ALGO: an empty list"),
    (lambda s: s.replace("candidates:\n  - {name: same, env: {NCCL_PROTO: Simple}}\n", "")
     .replace("space:\n  env: {NCCL_ALGO: [Ring, Tree]}\n  overrides: {collectives.warmup_iters: [1, 2]}\n", ""),
     "the search space is empty"),
    (lambda s: s.replace("name: same,", "name: default,"), "names must be unique and not 'default'"),
    (lambda s: s.replace("{NCCL_PROTO: Simple}", "{NCCL_PROTO: [Simple, LL]}"), "a named candidate takes one value"),
    (lambda s: s + "search: {runs: 17}\n", "search.runs=17 is too small"),
    (lambda s: s + "confirm: {blocks: 2}\n", "confirm.blocks=2 is too small to confirm anything"),
    (lambda s: s.replace("overrides: {collectives.warmup_iters", "overrides: {fabric.backend"),
     "tuned through env: and sysctls:"),
    (lambda s: s.replace("NCCL_ALGO:", "MY_VAR:"), "fabricbench checks only NCCL_*, GLOO_* names"),
    (lambda s: s + "space_typo: 1\n", "unknown field(s) space_typo"),
    # NCCL's grammar (workloads/fabric/ncclvalues.py): the broadcast behind average=rank0 has Ring only
    (lambda s: s.replace("ops=[all_reduce]\"]", "ops=[all_reduce]\", collectives.average=rank0]"),
     "candidate NCCL_ALGO-Tree.warmup_iters-1: NCCL_ALGO=Tree leaves Broadcast no algorithm"),
    (lambda s: s.replace("NCCL_ALGO: [Ring, Tree]", "NCCL_ALGO: [Ring, nvls_tree]"), "Unrecognized element token"),
    (lambda s: s.replace("NCCL_ALGO: [Ring, Tree]", "NCCL_LL_THRESHOLD: [0, 16384]"),
     "space.env.NCCL_LL_THRESHOLD: NCCL 2.30.7 does not read it"),
    (lambda s: s.replace("entry: collectives, overrides: [\"collectives.ops=[all_reduce]\"]", "entry: link")
     .replace("overrides: {collectives.warmup_iters: [1, 2]}", "overrides: {link.streams: [1, 2]}"),
     "no workload of this tune calls an NCCL collective (link): a no-op axis"),
])
def test_bad_specs_are_one_line_before_anything_runs(tmp_path, edit, needle):
    with pytest.raises(UsageError, match=None) as e:
        load_tune(write(tmp_path, edit(TUNE)), output_root=str(tmp_path / "o"))
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_deliberate_unchecked_name_is_allowed_and_exported_unchecked(tmp_path):
    text = TUNE.replace("NCCL_ALGO: [Ring, Tree]", "UCX_TLS: [tcp]").replace("space:\n", "space:\n  env_unchecked: [UCX_TLS]\n")
    t = load_tune(write(tmp_path, text), output_root=str(tmp_path / "o"))
    arm = t.candidates[1].arm(t.arm, t.id)
    cfg = compose(CONF_DIR, ["workload=collectives", *arm.overrides, f"fabric={arm.fabric}"])
    assert cfg.fabric.env.UCX_TLS == "tcp" and list(cfg.fabric.env_unchecked) == ["UCX_TLS"]


# --- successive halving and the outcome ------------------------------------------------------

def test_block_scores_remove_each_blocks_drift():
    # block 1 ran 50% slower for everyone: the drift is gone from the scores; b is 10% ahead of a
    logs = {"a": [0.0, math.log(0.5)], "b": [math.log(1.1), math.log(0.55)]}
    s = halving.block_scores(logs, higher_is_better=True)
    assert s["b"] - s["a"] == pytest.approx(math.log(1.1))
    assert halving.block_scores(logs, higher_is_better=False)["a"] == pytest.approx(-s["a"])
    # a block missing a candidate is left out for all of them
    assert halving.block_scores({"a": [0.0, None], "b": [0.1, 5.0]}, True)["b"] == pytest.approx(0.05)


def test_halving_keeps_the_better_half_each_round():
    true = {"a": 0.0, "b": 0.3, "c": 0.1, "d": 0.2, "e": -0.1}
    asked = []

    def measure(r, alive, blocks):
        asked.append((r, list(alive), blocks))
        return halving.block_scores({n: [true[n]] * blocks for n in alive}, True)

    winner, history = halving.successive_halving(list(true), round_blocks(5, 1, 15), measure)
    assert winner == "b" and [a for _, a, _ in asked] == [["a", "b", "c", "d", "e"], ["b", "c", "d"], ["b", "d"]]
    assert [b for *_, b in asked] == [1, 1, 2]
    assert halving.keep({"x": 0.0, "y": 0.0, "z": -1.0}, ["x", "y", "z"]) == ["x", "y"]  # ties: the earlier


def _cmp(d, effect_word=True):
    c = stats.compare(np.exp(d), np.ones(len(d)), "w", DEFAULT, "samples_per_sec", design=stats.Design(blocks=d, name="sim"))
    return stats.correct([c], "holm", 0.05)[0]


def test_the_outcome_says_the_confirmations_interval_and_among_how_many():
    win = halving.outcome("w", DEFAULT, 4, [_cmp(np.log([1.20, 1.22, 1.19, 1.21]))])
    assert win.kind == halving.WINNER and win.adopted
    assert win.sentence.startswith("winner w: samples_per_sec at least +18.5% (estimate +20.5% [+18.5%, +22.6%])")
    assert win.sentence.endswith("chosen among 4") and "near this test's MDE" not in win.sentence
    behind = halving.outcome("w", DEFAULT, 4, [_cmp(np.log([0.80, 0.82, 0.79, 0.81]))])
    assert behind.kind == halving.DEFAULT_AHEAD and not behind.adopted
    same = halving.outcome("w", DEFAULT, 3, [_cmp(np.log([1.001, 0.999, 1.0005, 0.9995, 1.0, 1.001, 0.999, 1.0]))])
    assert same.kind == halving.EQUIVALENT and same.sentence.startswith("default equivalent within ±2.0%")
    noisy = halving.outcome("w", DEFAULT, 3, [_cmp(np.log([1.2, 0.8, 1.1]))])
    assert noisy.kind == halving.INCONCLUSIVE and not noisy.adopted
    kept = halving.outcome(DEFAULT, DEFAULT, 5, [])
    assert kept.kind == halving.KEPT and "nothing to confirm" in kept.sentence


# --- simulated tunes through the verdict code ---------------------------------------------------

CONFIRM = stats.blocks_for(0.10, 1, 0.05)  # the confirmation the plan sizes for detect 10% at CV 5%: 7 blocks


def test_a_planted_null_names_no_winner_in_95_percent_of_tunes():
    """Four candidates that are one setting under four names (the default among them), CV 5% and a
    drift of 5% between blocks: the confirmation names a winner in at most 5% of tunes (measured:
    2.2% of 1000), though the search's figure for its winner averages +4%."""
    rng = np.random.default_rng(46)
    tunes = [simulate(rng, {"a": 0.0, "b": 0.0, "c": 0.0}, confirm_blocks=CONFIRM) for _ in range(300)]
    named = sum(t.outcome.kind == halving.WINNER for t in tunes)
    assert at_most(named, len(tunes), 0.05), named
    searched = [t.search_gain for t in tunes if t.outcome.winner != DEFAULT]
    confirmed = [t.confirmed_gain for t in tunes if t.outcome.winner != DEFAULT]
    assert np.mean(searched) > 0.02                      # the winner's curse: the search's figure is biased up
    assert abs(np.mean(confirmed)) < 0.01                # fresh blocks are not


def test_judging_the_winner_on_its_own_search_blocks_is_biased():
    """The control that shows the confirmation's fresh blocks matter: the same nulls judged on the
    blocks that chose the winner report a gain that is not there."""
    rng = np.random.default_rng(7)
    tunes = [simulate(rng, {"a": 0.0, "b": 0.0, "c": 0.0}, confirm_blocks=CONFIRM, reuse=True) for _ in range(150)]
    reused = [t.confirmed_gain for t in tunes if t.outcome.winner != DEFAULT]
    assert np.mean(reused) > 0.02, np.mean(reused)


def test_a_real_difference_is_called_and_the_right_candidate_named():
    """One candidate 15% faster among four: named, with the confirmation's interval, in >= 90% of
    tunes (measured: 99% of 1000)."""
    rng = np.random.default_rng(3)
    tunes = [simulate(rng, {"a": 0.0, "b": math.log1p(0.15), "c": 0.0}, confirm_blocks=CONFIRM) for _ in range(100)]
    right = sum(t.outcome.kind == halving.WINNER and t.outcome.winner == "b" for t in tunes)
    assert at_least(right, len(tunes), 0.90), right


# --- the derived arm ------------------------------------------------------------------------------

def test_nccl_tuner_lines_follow_the_example_plugins_csv():
    """NVIDIA/nccl ext-tuner/example/nccl_tuner.conf: colltype,minbytes,maxbytes,algorithm,protocol,
    channels,nNodes,nRanks,numPipeOps,regBuff; lower-case names; -1 = any (channels: NCCL's own)."""
    lines = tuned.nccl_tuner_lines({"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL128"}, ["all_reduce", "all_gather"])
    assert [x for x in lines if not x.startswith("#")] == ["allreduce,0,4294967295,ring,ll128,-1,-1,-1,-1,-1",
                                                           "allgather,0,4294967295,ring,ll128,-1,-1,-1,-1,-1"]
    pinned = tuned.nccl_tuner_lines({"NCCL_ALGO": "tree", "NCCL_PROTO": "simple", "NCCL_MIN_NCHANNELS": 4,
                                     "NCCL_MAX_NCHANNELS": 4})
    assert len([x for x in pinned if not x.startswith("#")]) == 5 and pinned[5] == "broadcast,0,4294967295,tree,simple,4,-1,-1,-1,-1"
    # NCCL's choice per call, which the CSV cannot say: no file
    assert tuned.nccl_tuner_lines({"NCCL_ALGO": "Ring,Tree", "NCCL_PROTO": "Simple"}) == []
    assert tuned.nccl_tuner_lines({"NCCL_ALGO": "Ring"}) == []
    assert tuned.nccl_tuner_lines({"NCCL_BUFFSIZE": "4194304"}) == []
    # NCCL's own names (src/init.cc ncclAlgoStr) in the plugin's spellings (plugin.c parseAlgorithm),
    # and a function prefix pins that function only
    nvls = tuned.nccl_tuner_lines({"NCCL_ALGO": "AllReduce:NVLSTree", "NCCL_PROTO": "Simple"}, ["all_reduce", "all_gather"])
    assert [x for x in nvls if not x.startswith("#")] == ["allreduce,0,4294967295,nvls_tree,simple,-1,-1,-1,-1,-1"]
    assert tuned.nccl_tuner_lines({"NCCL_ALGO": "collnet_direct", "NCCL_PROTO": "Simple"}) == []  # NCCL rejects it


def test_the_tuned_arm_file_round_trips_into_a_study_arm(tmp_path):
    from workloads.study.run import cell_argv, plan
    from workloads.study.spec import load_spec

    settings = {"env": {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}, "overrides": {"collectives.warmup_iters": 2}}
    for name, s in (("a", settings), ("b", {})):
        (tmp_path / name).mkdir()
        written = tuned.write(tmp_path / name, {"name": name, "id": name, "source": "x.yaml", "outcome": "winner",
                                                "candidate": "c" if s else DEFAULT}, f"{name}-tuned", "loopback",
                              ["collectives.iters=5"], s, ["all_reduce"])
        assert [p.name for p in written] == (["tuned.yaml", "nccl-tuner.conf"] if s else ["tuned.yaml"])
    study = write(tmp_path, f"name: two\narms:\n  - {{tuned: {tmp_path / 'a'}, label: ta}}\n"
                  f"  - {{tuned: {tmp_path / 'b' / 'tuned.yaml'}, baseline: true}}\nworkloads:\n"
                  "  - {name: ar, entry: collectives}\nblocks: 3\ndetect: 50%\ncv: 5%\n", "s.yaml")
    spec = load_spec(study, output_root=str(tmp_path / "o"))
    assert [a.label for a in spec.arms] == ["ta", "b-tuned"] and spec.baseline.label == "b-tuned"
    # the override where the config holds it and where the record's collectives section repeats it
    assert spec.allow == ["collectives.warmup_iters", "config.collectives.warmup_iters", "config.tuned"]
    job = next(j for j in plan(spec) if j.arm.label == "ta")
    argv = cell_argv(spec, job, "local", python="py", env={})
    cfg = compose(CONF_DIR, argv[2:])
    assert cfg.fabric.env.NCCL_ALGO == "Ring" and cfg.collectives.warmup_iters == 2 and cfg.collectives.iters == 5
    assert cfg.tuned.tune == "a" and dict(cfg.tuned.settings.env) == settings["env"]
    with pytest.raises(UsageError, match="a tuned arm has tuned:, label: and baseline: only"):
        load_spec(write(tmp_path, study.read_text().replace("label: ta}", "label: ta, fabric: ib}"), "s2.yaml"))


def test_node_sysctls_are_checked_and_named_by_the_emulator():
    from workloads.fabric.netns import EmuSpec, Topology

    spec = EmuSpec.from_config({"rate": "100mbit", "sysctls": {"net.ipv4.tcp_rmem": "4096  16384 16384",
                                                                "net.ipv4.tcp_congestion_control": "reno"}})
    assert spec.sysctls == (("net.ipv4.tcp_congestion_control", "reno"), ("net.ipv4.tcp_rmem", "4096 16384 16384"))
    assert Topology(spec, tag="x").describe().endswith(
        "; in every node net.ipv4.tcp_congestion_control=reno, net.ipv4.tcp_rmem=4096 16384 16384")
    with pytest.raises(UsageError, match="net.core.rmem_max: not a per-namespace TCP setting"):
        EmuSpec.from_config({"sysctls": {"net.core.rmem_max": 1}})
    with pytest.raises(UsageError, match="give a mapping"):
        EmuSpec.from_config({"sysctls": ["net.ipv4.tcp_rmem=1"]})


def test_a_study_naming_tune_specs_plans_the_tunes_first(tmp_path):
    """Tuned arms may name tune specs: `fabricbench study` runs each tune not yet run under the
    study's output root, then the study (one command); --plan prints the tunes' plans."""
    from workloads.study.spec import TuneFirst, load_spec

    tune = write(tmp_path, TUNE, "tune-a.yaml")
    study = write(tmp_path, f"name: two\narms:\n  - {{tuned: {tune}, label: a}}\n  - {{tuned: {tune}, label: b}}\n"
                  "workloads:\n  - {name: ar, entry: collectives}\nblocks: 3\ndetect: 50%\ncv: 5%\n", "s.yaml")
    with pytest.raises(TuneFirst) as e:
        load_spec(study, output_root=str(tmp_path / "o"))
    assert e.value.tunes == [(str(tune), str(tmp_path / "o"))]          # two arms, one tune: tuned once
    r = subprocess.run([sys.executable, "-m", "workloads.commands.cli", "study", str(study), "--plan", "--output-root",
                        str(tmp_path / "o")], cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("plan of tune t: 24 runs") == 1 and "once its tunes have run" in r.stdout, r.stdout
    # once the tune has written its arm, the study loads it from <output root>/<tune id>
    (tmp_path / "o" / "t").mkdir(parents=True)
    tuned.write(tmp_path / "o" / "t", {"id": "t", "candidate": DEFAULT}, "t-tuned", "loopback", [], {})
    assert [a.label for a in load_spec(study, output_root=str(tmp_path / "o")).arms] == ["a", "b"]


def test_a_tune_already_running_is_refused_before_any_run(tmp_path):
    import fcntl
    import os

    folder = tmp_path / "o" / "t"
    folder.mkdir(parents=True)
    with open(folder / ".lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write(f"pid {os.getpid()}\n")
        held.flush()
        r = subprocess.run([sys.executable, "-m", "workloads.commands.cli", "tune", str(write(tmp_path)), "--output-root",
                            str(tmp_path / "o")], cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr
    assert r.stderr.strip() == (f"error: tune t is already running in {folder} (pid {os.getpid()}); wait for it to finish, "
                                "or pass --id <new id> for a separate tune")
    assert "] block " not in r.stdout and not list(folder.glob("search-*"))


def test_every_kind_of_setting_is_let_through_the_guard_and_nothing_else(tmp_path):
    """The confirmation's allowed keys (tuned.varied_keys) against the guard's own identity, on
    two runs that differ as a candidate and the default do: a Hydra override lands both in the
    config and in the record's collectives section; env and sysctls in the fabric block. Any
    other difference is still refused."""
    from analysis import guard

    spec = load_tune(write(tmp_path, TUNE.replace("warmup_iters: [1, 2]", "op: [max]")),
                     output_root=str(tmp_path / "o"))
    cand = next(c for c in spec.candidates if c.settings.get("overrides"))
    assert cand.settings["overrides"] == {"collectives.op": "max"}  # the space builds what a named one holds
    default = {"workload": "collectives", "config": {"collectives": {"op": "sum", "iters": 5}, "tuned": {},
                                                     "fabric": {"env": {}, "emulate": {"sysctls": {}}}},
               "collectives": {"op": "sum", "iters": 5}}
    mine = {"workload": "collectives", "config": {"collectives": {"op": "max", "iters": 5},
                                                  "tuned": {"candidate": cand.name, "settings": cand.settings},
                                                  "fabric": {"env": {"NCCL_ALGO": "Ring"},
                                                             "emulate": {"sysctls": {"net.ipv4.tcp_rmem": "1 2 3"}}}},
            "collectives": {"op": "max", "iters": 5}}
    allow = tuned.varied_keys({**cand.settings, "env": {"NCCL_ALGO": "Ring"}})
    assert guard.differences(default, mine, allow) == {}
    keys = set(guard.differences(default, mine))  # without them: the override twice, and the stamp
    assert {"collectives.op", "config.collectives.op"} <= keys
    assert all(k.startswith("config.tuned") for k in keys - {"collectives.op", "config.collectives.op"}), keys
    other = {**mine, "collectives": {"op": "max", "iters": 6}}
    assert guard.differences(default, other, allow) == {"collectives.iters": (5, 6)}


CC_TUNE = """\
name: cc
arm: {fabric: emu-100m}
workloads:
  - {name: iperf, entry: link, overrides: [link.duration_s=2]}
space:
  sysctls: {net.ipv4.tcp_rmem: ["4096 8192 8192", "lots"]}
detect: 30%
cv: 5%
"""


@pytest.mark.requires("root")
def test_sysctl_values_are_the_kernels_parse_and_the_plan_names_the_default(tmp_path):
    """The value is written by the emulator's own `sysctl -qw` in a throwaway network namespace:
    `lots` for tcp_rmem is the kernel's EINVAL before any run. The default the plan prints is
    read from a new namespace (the host's congestion control, the kernel's buffer sizes)."""
    import subprocess as sp

    from workloads.study.tune import plan_lines

    with pytest.raises(UsageError) as e:
        load_tune(write(tmp_path, CC_TUNE), output_root=str(tmp_path / "o"))
    assert str(e.value).startswith("space.sysctls.net.ipv4.tcp_rmem=lots: the kernel refuses it (setting key"), e.value
    t = load_tune(write(tmp_path, CC_TUNE.replace(', "lots"', "").replace("tcp_rmem", "tcp_congestion_control")
                        .replace('"4096 8192 8192"', "reno")), output_root=str(tmp_path / "o"))
    cc = sp.run(["unshare", "--net", "cat", "/proc/sys/net/ipv4/tcp_congestion_control"], capture_output=True,
                text=True).stdout.strip()
    default = next(line for line in plan_lines(t) if line.strip().startswith("default:"))
    assert default.endswith(f"(tcp_congestion_control={cc}, read from a new namespace)"), default


def test_a_finished_tune_is_reprinted_without_measuring_and_another_definition_is_one_line(tmp_path):
    from workloads.study.tune import RECORDS_DIGEST, _finished_earlier, records_digest, run_tune

    t = load_tune(write(tmp_path), output_root=str(tmp_path / "o"))
    t.dir.mkdir(parents=True)
    (t.dir / "tune.json").write_text(__import__("json").dumps(t.as_dict()))
    (t.dir / "tune.txt").write_text("inconclusive: same faster than default by 0.2% [-1.4, +1.7]\n")
    (t.dir / tuned.FILE).write_text("label: t-tuned\n")
    rec = t.dir / "search-1" / "r1" / "records" / "x.json"
    rec.parent.mkdir(parents=True)
    rec.write_text("{}")
    (t.dir / RECORDS_DIGEST).write_text(records_digest(t.dir))
    said: list[str] = []
    assert run_tune(t, say=said.append) == 0
    assert said[0] == f"tune t: finished earlier, nothing to run ({t.dir}/tune.txt): inconclusive: same faster than " \
                      "default by 0.2% [-1.4, +1.7]" and len(said) == 2, said
    # a record changed (or a run's folder removed) since the verdict: not finished, judged again
    rec.write_text('{"status": "ok"}')
    assert not _finished_earlier(t, False, said.append) and len(said) == 2
    other = load_tune(write(tmp_path, TUNE.replace("detect: 30%", "detect: 40%")), output_root=str(tmp_path / "o"))
    said.clear()
    with pytest.raises(UsageError, match="holds tune 't' with other detect"):
        run_tune(other, say=said.append)
    assert said == []    # refused before the plan
