"""A study's plan checks every arm x workload config before any allocation (workloads/study/precheck.py):
the shipped conf/study/ib-vs-roce.yaml on a node holding both fabrics (tests/fixtures/sysfs/dual_host)
passes for both arms once the site settings are filled in and fails at --plan with a typo; the
fairness line names the tuning knobs the arms differ in; the plan's sbatch --time comes from earlier
runs, or from a pilot block (`--pilot`) of an emulated study."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

import workloads
from helpers import FIXTURES, REPO, child_env
from workloads.core.errors import UsageError
from workloads.study import precheck
from workloads.study.plan import make_plan
from workloads.study.spec import load_spec

STUDY = [sys.executable, "-m", "workloads.commands.cli", "study"]
DUAL = FIXTURES / "sysfs" / "dual_host"
SHIPPED = REPO / "conf" / "study" / "ib-vs-roce.yaml"
# what `fabricbench doctor fabric=ib` / `fabric=roce` print for the dual_host fixture (tests/commands/test_doctor_fix.py)
SITE = {"ib": 'env:\n  NCCL_IB_HCA: "=mlx5_0,mlx5_1"\n  NCCL_SOCKET_IFNAME: "=eno1"\n  GLOO_SOCKET_IFNAME: eno1\n',
        "roce": 'env:\n  NCCL_IB_HCA: "=mlx5_2,mlx5_3"\n  NCCL_IB_GID_INDEX: "3"\n  NCCL_SOCKET_IFNAME: "=eno1"\n'
                '  GLOO_SOCKET_IFNAME: eno1\n'}


def trimmed(tmp_path, *keep: str, edit=lambda text: text):
    """The shipped study with only the workloads `keep` (each check composes every arm x workload)."""
    raw = yaml.safe_load(edit(SHIPPED.read_text()))
    raw["workloads"] = [w for w in raw["workloads"] if w["name"] in keep]
    p = tmp_path / "trimmed.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A copy of conf/ whose conf/local holds the given site files, read by every compose of this
    process; sysfs is the dual-fabric node's."""
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    for f in (conf / "local").glob("*.yaml"):
        f.unlink()
    monkeypatch.setattr(workloads, "CONF_DIR", str(conf))
    monkeypatch.setattr(precheck, "CONF_DIR", str(conf))  # job_points composes with it
    monkeypatch.setenv("FABRICBENCH_SYSFS_ROOT", str(DUAL))

    def write(files: dict[str, str]):
        for name, text in files.items():
            (conf / "local" / f"{name}.yaml").write_text(text)
        return conf
    return write


def test_shipped_study_passes_on_both_fabrics_once_site_settings_are_filled_in(site, tmp_path):
    spec = load_spec(SHIPPED, output_root=str(tmp_path / "out"))
    site({})
    with pytest.raises(UsageError) as e:
        precheck.check(spec)  # the profiles' prefix `mlx5` selects the other fabric's ports
    msg = str(e.value)
    assert "arm ib (fabric=ib): NCCL_IB_HCA=mlx5 selects mlx5_2:1, whose link layer is Ethernet" in msg
    assert "arm roce (fabric=roce): NCCL_IB_HCA=mlx5 selects mlx5_0:1, whose link layer is InfiniBand" in msg
    assert "ib~aa" not in msg  # the control runs the baseline's profile: said once
    for fabric, text in SITE.items():  # doctor's suggestion for this node, as it prints it
        from workloads.commands.doctor import load_profile
        from workloads.fabric import sitefix

        got = sitefix.suggest(load_profile([f"fabric={fabric}"]), DUAL, FIXTURES / "sysfs" / "dual_host_proc")
        assert yaml.safe_load(text) == {"env": got.env}
    site(SITE)
    lines = precheck.check(spec)
    assert lines[0] == ("  configs: all 10 arm x workload configs compose and pass their checks (the A/A control's are "
                        "its baseline's)")
    assert lines[1] == f"  host checks: every arm's devices and interfaces are present and up ({__import__('socket').gethostname()}, sysfs {DUAL})"
    # the fairness line names every knob the arms differ in, and nothing they share or that places them
    assert lines[2].startswith("  fairness: the arms differ in 2 tuning knob(s)")
    assert lines[3:5] == ["    NCCL_IB_QPS_PER_CONNECTION: ib unset, roce 4", "    NCCL_IB_TC: ib unset, roce 106"]
    assert not any("NCCL_IB_HCA" in x or "GID_INDEX" in x for x in lines)


def test_a_typo_in_a_site_setting_fails_at_the_plan(site, tmp_path):
    site({**SITE, "roce": SITE["roce"].replace("NCCL_SOCKET_IFNAME", "NCCL_SOCKT_IFNAME")})
    spec = load_spec(trimmed(tmp_path, "allreduce-1g"), output_root=str(tmp_path / "out"))
    with pytest.raises(UsageError) as e:
        precheck.check(spec)
    assert ("arm roce x every workload: fabric.env.NCCL_SOCKT_IFNAME: NCCL reads no such variable (did you mean "
            "NCCL_SOCKET_IFNAME?)") in str(e.value)
    assert "arm ib " not in str(e.value)  # the ib arm's own site file is fine
    # a site value that selects a port that is down is the host check's, named for its arm
    site({**SITE, "ib": SITE["ib"].replace("=mlx5_0,mlx5_1", "=mlx5_0,mlx5_4")})
    with pytest.raises(UsageError, match=r"arm ib \(fabric=ib\): NCCL_IB_HCA==mlx5_0,mlx5_4 selects mlx5_4:1, whose "
                                         r"port state is DOWN"):
        precheck.check(spec)


def test_a_typo_fails_at_plan_from_the_command_line_and_nothing_is_written(tmp_path):
    """Through the command, as a user meets it: exit 2, one problem per line, no traceback, no folder."""
    spec = trimmed(tmp_path, "allreduce-1g", edit=lambda t: t.replace(
        "{label: roce, fabric: roce}", "{label: roce, fabric: roce, overrides: ['+fabric.env.NCCL_SOCKT_IFNAME=eno1']}"))
    r = subprocess.run([*STUDY, str(spec), "--plan", "--output-root", str(tmp_path / "out")], cwd=REPO,
                       env=child_env(FABRICBENCH_SYSFS_ROOT=str(DUAL)), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert ("arm roce x every workload: fabric.env.NCCL_SOCKT_IFNAME: NCCL reads no such variable (did you mean "
            "NCCL_SOCKET_IFNAME?)") in r.stderr
    assert r.stdout == "" and not (tmp_path / "out").exists()


def test_a_workload_checked_at_the_world_of_its_runs(site, tmp_path):
    """`world:` is the ranks each run has: an expert-parallel degree that does not divide it is the plan's."""
    site(SITE)
    spec = trimmed(tmp_path, "neox-moe-125m-ep16", edit=lambda t: t.replace("world: 16", "world: 24"))
    with pytest.raises(UsageError, match="parallel.expert_parallel=16 x tensor_parallel=1 does not divide the world "
                                         "size 24"):
        precheck.check(load_spec(spec, output_root=str(tmp_path / "out")))


def test_on_a_host_without_rdma_the_host_checks_are_said_not_made(site, tmp_path, monkeypatch):
    site(SITE)
    monkeypatch.delenv("FABRICBENCH_SYSFS_ROOT")
    monkeypatch.setattr(precheck, "_rdma_here", lambda: [])  # the login node: no /sys/class/infiniband
    lines = precheck.check(load_spec(trimmed(tmp_path, "allreduce-1g"), output_root=str(tmp_path / "out")))
    assert lines[1].startswith("  host checks: not made on ") and "no RDMA devices here" in lines[1]
    # nothing ran under the output root: no wall time, and the pilot that would measure it
    plan = make_plan(load_spec(trimmed(tmp_path, "allreduce-1g"), output_root=str(tmp_path / "out")))
    no, resume = precheck.time_lines(plan)
    assert no.startswith("  sbatch --time: no estimate (allreduce-1g never ran under ") and "--plan --pilot" in no
    assert resume.startswith("  resume: resubmitting the same command resumes")


@pytest.mark.parametrize("seconds,want", [(0, "0:15:00"), (1800, "1:00:00"), (4 * 3600, "5:15:00"),
                                          (20 * 3600, "1-01:15:00")])
def test_slurm_time_pads_and_rounds_up_to_a_quarter_hour(seconds, want):
    # 1800 s x 1.25 + 600 = 2850 s -> 3600; 14400 x 1.25 + 600 = 18600 -> 18900 (5:15)
    assert precheck.slurm_time(seconds) == want


EMU = """name: pilot-emu
arms:
  - {label: veth, fabric: emu-veth, baseline: true}
  - {label: slow, fabric: emu-100m}
workloads:
  - name: ar
    entry: collectives
    overrides: ["collectives.ops=[all_reduce]", collectives.minbytes=256K, collectives.maxbytes=256K,
                collectives.iters=5, collectives.warmup_iters=1]
detect: 500%
blocks: 2
"""


@pytest.mark.requires("root")
@pytest.mark.slow
def test_pilot_of_an_emulated_study_gives_the_wall_time_and_a_later_plan_reuses_it(tmp_path):
    spec, out = tmp_path / "s.yaml", tmp_path / "out"
    spec.write_text(EMU)
    r = subprocess.run([*STUDY, str(spec), "--pilot", "--output-root", str(out)], cwd=REPO, env=child_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    timings = [json.loads(x) for x in (out / "pilot-emu-pilot" / "timings.jsonl").read_text().splitlines()]
    assert sorted(t["arm"] for t in timings) == ["slow", "veth"] and all(t["ok"] for t in timings)
    assert not (out / "pilot-emu").exists()  # the pilot is not the study: nothing of the study is written
    run_s = sorted(t["seconds"] for t in timings)
    median = (run_s[0] + run_s[1]) / 2
    wall = median * 2 * 2  # 2 blocks x 2 arms x 1 workload at the median run
    line = next(x for x in r.stdout.splitlines() if x.startswith("  sbatch --time="))
    assert line == (f"  sbatch --time={precheck.slurm_time(wall)} (the wall time {wall / 3600:.2f} h from the pilot "
                    "block and earlier runs, x1.25 + 10 min)"), r.stdout
    assert "  resume: resubmitting the same command resumes" in r.stdout
    # a later plan finds the pilot's runs as earlier runs of the same workload
    r = subprocess.run([*STUDY, str(spec), "--plan", "--output-root", str(out)], cwd=REPO, env=child_env(),
                       capture_output=True, text=True, timeout=300)
    assert f"  sbatch --time={precheck.slurm_time(wall)} (the wall time {wall / 3600:.2f} h from earlier runs" in r.stdout


@pytest.mark.slow
def test_doctor_output_pasted_into_the_site_files_makes_the_shipped_plan_pass(site, tmp_path):
    """End to end, as the quickstart says it: `fabricbench doctor fabric=<f>` on the node (the
    command, its stdout), its suggestion pasted as it prints it into conf/local/<f>.yaml, then the
    shipped study's plan checks pass for both arms."""
    doctor = [sys.executable, "-m", "workloads.commands.cli", "doctor"]
    spec = load_spec(SHIPPED, output_root=str(tmp_path / "out"))
    conf = site({})
    for fabric in ("ib", "roce"):
        r = subprocess.run([*doctor, f"fabric={fabric}", "--sysfs-root", str(DUAL), "--proc-root",
                            str(FIXTURES / "sysfs" / "dual_host_proc")],
                           cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stdout + r.stderr  # the profile as shipped does not fit this node
        lines = r.stdout.splitlines()
        at = next(i for i, x in enumerate(lines) if x.startswith("Suggested site settings, from this node (paste into "))
        path = lines[at].split("paste into ")[1].rstrip("):")
        assert path == f"conf/local/{fabric}.yaml"
        (conf.parent / path).write_text("\n".join(lines[at + 1:]) + "\n")  # the text itself, comments and all
    lines = precheck.check(spec)
    assert lines[0].startswith("  configs: all 10 arm x workload configs compose and pass their checks")
    assert lines[1].startswith("  host checks: every arm's devices and interfaces are present and up")
