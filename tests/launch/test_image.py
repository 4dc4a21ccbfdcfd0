"""make image (tools/image.sh): a missing tool, a missing base that cannot be made, and a step
that fails are each one line naming the command and the fix, with the step's log kept; an image
of other source than the checkout's is a failure under CI; and the image itself (the one .ci/run
built, or `make image` left, or built here with FB_BUILD_IMAGE=1: helpers/image.py): `make train`
runs inside it as a user runs it and writes a record, and two containers on emulated nodes match
the run without them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from helpers import REPO
from helpers.image import PODMAN_RUN, assert_same_but_container, cpu_image

SCRIPT = REPO / "tools" / "image.sh"


def image(tmp_path, **env):
    e = os.environ | {"IMAGE_CACHE": str(tmp_path / "cache")} | env
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=300, env=e, cwd=tmp_path)


def one_line(p, code: int = 2) -> str:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    return lines[0]


def test_no_container_tool(tmp_path):
    # IMAGE_TOOL set to a path that is not there: that path is the problem, not a missing podman
    line = one_line(image(tmp_path, IMAGE_TOOL=str(tmp_path / "podman")))
    assert line == (f"error: IMAGE_TOOL={tmp_path / 'podman'}: no such program; set IMAGE_TOOL to podman, docker or "
                    "the path of one, or unset it"), line
    # neither podman nor docker on PATH (a PATH holding only what the script needs before it looks)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "dirname").symlink_to(shutil.which("dirname"))
    e = {k: v for k, v in os.environ.items() if k != "IMAGE_TOOL"} | {"IMAGE_CACHE": str(tmp_path / "cache"),
                                                                     "PATH": str(tmp_path / "bin"), "IMAGE_UV_CACHE": ""}
    p = subprocess.run(["/bin/bash", str(SCRIPT)], capture_output=True, text=True, timeout=60, env=e, cwd=tmp_path)
    assert "make image needs podman or docker: apt-get install -y podman buildah runc" in one_line(p)


def test_missing_base_without_mmdebstrap(tmp_path):
    """A fresh machine that has a container tool but cannot make the base."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for t in ("bash", "dirname", "mkdir", "flock", "true"):
        (bin_ / t).symlink_to(shutil.which(t))
    line = one_line(image(tmp_path, IMAGE_TOOL="true", PATH=str(bin_)))
    assert "the base" in line and "bookworm.tar is missing and mmdebstrap is not installed" in line
    assert "apt-get install -y mmdebstrap" in line


@pytest.mark.requires("root", "podman")
def test_failed_step_names_its_command_and_keeps_the_log(tmp_path):
    """A base tarball that is not one: podman's import fails, and the line says which command
    failed, how, and where its whole output is."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "bookworm.tar").write_text("not a tar\n")
    line = one_line(image(tmp_path, IMAGE_TOOL="podman", IMAGE_BASE="localhost/fabricbench-test-notatar:x"), code=1)
    assert line.startswith(f"error: `podman import {cache}/bookworm.tar localhost/fabricbench-test-notatar:x` "
                           "failed (exit "), line
    assert line.endswith(f"the whole log: {cache}/import.log")
    assert (cache / "import.log").read_text().strip()


@pytest.mark.requires("root", "podman")
def test_an_image_of_other_source_fails_under_ci(tmp_path, monkeypatch):
    """The image .ci/run names (FB_IMAGE_TAG) labelled with other source than this checkout's, then
    gone: under CI=true each is a failure in one line naming the command that fixes it (a CI run
    whose build failed must not quietly test less), outside CI the same line as a skip."""
    tag = f"localhost/fabricbench-test-stale:{os.getpid()}"
    (tmp_path / "f").write_text("x\n")
    subprocess.run(["tar", "-cf", str(tmp_path / "t.tar"), "-C", str(tmp_path), "f"], check=True)
    subprocess.run(["podman", "import", "--change", "LABEL org.fabricbench.source=0123abc", str(tmp_path / "t.tar"),
                    tag], check=True, capture_output=True, timeout=120)
    monkeypatch.setenv("FB_IMAGE_TAG", tag)
    monkeypatch.delenv("FB_BUILD_IMAGE", raising=False)
    monkeypatch.delenv("FB_REQUIRE", raising=False)
    def outcome() -> tuple[str, str]:
        # caught here, both: a Skipped escaping the test would make it skip, not fail
        try:
            cpu_image()
        except (pytest.fail.Exception, pytest.skip.Exception) as e:
            return type(e).__name__, str(e)
        return "returned", ""

    try:
        monkeypatch.setenv("CI", "true")
        kind, line = outcome()
        assert kind == "Failed" and line.startswith(f"{tag} holds source 0123abc, this checkout is "), (kind, line)
        assert f"run IMAGE_TAG={tag} make image (seconds after a source edit)" in line and "\n" not in line, line
        monkeypatch.setenv("CI", "false")
        assert outcome() == ("Skipped", line)
    finally:
        subprocess.run(["podman", "rmi", "-f", tag], capture_output=True, timeout=120)
    monkeypatch.setenv("CI", "true")
    kind, line = outcome()
    assert kind == "Failed" and line.startswith(f"{tag} is not built: run IMAGE_TAG={tag} make image first"), line


@pytest.fixture(scope="module")
def image_tag() -> str:
    return cpu_image()


@pytest.mark.slow
@pytest.mark.requires("root", "podman")
def test_make_train_in_the_cpu_image(image_tag, tmp_path):
    """`make train` in the container through tools/image_run.sh, as docs/cluster.md runs it: the
    folder it mounts is made, the record lands there and names the container, the image (tag
    and id) and the commit it was built from (no .git in the image: tools/image.sh bakes it in).
    A limit above this host's hard one (podman's default nofile here) is runc's "rlimit type 7",
    which becomes one line naming the flag."""
    out = tmp_path / "out"            # not made: the script makes it
    env = os.environ | {"IMAGE_TAG": image_tag, "IMAGE_RESULTS": str(out)}
    p = subprocess.run([str(REPO / "tools" / "image_run.sh"), "make", "train", "ARGS=output_root=/out"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    records = sorted(out.rglob("records/*.json"))
    assert len(records) == 1, p.stdout[-2000:]
    rec = json.loads(records[0].read_text())
    assert rec["status"] == "ok" and rec["workload"] == "pretrain", (rec["status"], rec["error"])
    box = rec["fingerprint"]["container"]
    image_id = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", image_tag], capture_output=True,
                              text=True, timeout=60).stdout.strip()
    assert box["runtime"].startswith("podman") and box["image"] == image_tag and box["image_id"] == image_id, box
    assert re.fullmatch(r"[0-9a-f]{40}", rec["fingerprint"]["git"]["commit"] or ""), rec["fingerprint"]["git"]
    p = subprocess.run([str(REPO / "tools" / "image_run.sh"), "true"], cwd=REPO, capture_output=True, text=True,
                       timeout=300, env=env | {"IMAGE_RUN_FLAGS": "--ulimit nofile=1048576:1048576"})
    last = p.stderr.strip().splitlines()[-1]
    if int(subprocess.run(["sh", "-c", "ulimit -Hn"], capture_output=True, text=True).stdout) < 1048576:
        assert p.returncode == 2 and last.startswith("image-run: the runtime could not set RLIMIT_NOFILE"), p.stderr
        assert "--ulimit nofile=4096:4096" in last


COLLECTIVES = ["workload=collectives", "fabric=emu-100m", "collectives.maxbytes=64K", "collectives.iters=5",
               "collectives.warmup_iters=2"]


@pytest.mark.slow
@pytest.mark.requires("root", "podman")
def test_two_containers_on_emulated_nodes_match_the_run_without(image_tag, tmp_path):
    """Each emulated node is a container joined to the node's namespace (`--network
    ns:/run/netns/<node>`), the records on a shared volume; the same 2-node collectives run
    without containers writes a record of the same shape, the same software, and a fingerprint
    that differs in `container`."""
    import yaml

    from workloads.commands.emulate import agent_argv, run_agents
    from workloads.fabric.netns import EmuSpec, Topology

    spec = EmuSpec.from_config(yaml.safe_load((REPO / "conf/fabric/emu-100m.yaml").read_text())["emulate"])
    out_c, out_h = tmp_path / "containers", tmp_path / "host"
    out_c.mkdir()
    with Topology(spec, tag=f"{os.getpid()}ct") as topo:
        procs = []
        for i, node in enumerate(topo.nodes):
            argv = agent_argv("python", spec, i, 1, "launch/collectives.py", [*COLLECTIVES, "output_root=/out"])
            procs.append(subprocess.Popen(
                [*PODMAN_RUN, "--network", f"ns:/run/netns/{node}", "-v", f"{out_c}:/out",
                 "-e", "FABRICBENCH_RUN_ID=containers", "-e", "OMP_NUM_THREADS=1", "-e", "GLOO_SOCKET_IFNAME=emu0",
                 image_tag, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs = [p.communicate(timeout=400)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], "\n".join(x[-3000:] for x in logs)
    with Topology(spec, tag=f"{os.getpid()}ht") as topo:
        code = run_agents(topo, 1, "launch/collectives.py", [*COLLECTIVES, f"output_root={out_h}"], 400,
                          env=os.environ | {"FABRICBENCH_RUN_ID": "host", "OMP_NUM_THREADS": "1"})
        assert code == 0
    recs = {}
    for name, out in (("containers", out_c), ("host", out_h)):
        found = sorted(out.rglob("records/*.json"))
        assert len(found) == 1, (name, found)
        recs[name] = json.loads(found[0].read_text())
    assert_same_but_container(recs["containers"], recs["host"], "podman")
    assert recs["containers"]["fabric"]["name"] == "emu-100m"
