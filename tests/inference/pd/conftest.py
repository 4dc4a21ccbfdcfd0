"""What the real-vLLM P/D tests share: the engine venv with nixl (tests/inference/pd/test_vllm_pd.py,
test_slurm_pd.py, test_emulated_pd.py) and the tiny Llamas built here (random weights, local tokenizer)."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from helpers import REPO
from helpers.hf_tiny import model_dir

VLLM = REPO / ".engines" / "vllm"


@pytest.fixture(scope="module")
def vllm_python():
    """The engine venv with nixl; `make engines` only when nixl is missing (a no-op when current)."""
    python = VLLM / "bin" / "python"
    have = python.exists() and subprocess.run([str(python), "-c", "import nixl._api"], capture_output=True).returncode == 0
    if not have:
        r = subprocess.run(["make", "engines"], cwd=REPO, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"make engines failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return python


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """conf/model/llama-tiny.yaml as a Hugging Face directory: 2 layers, 2 KV heads of 32, 1 KiB of fp32 KV a token."""
    shape = yaml.safe_load((REPO / "conf" / "model" / "llama-tiny.yaml").read_text())
    return model_dir(tmp_path_factory.mktemp("llama-tiny"), "llama", shape)


@pytest.fixture(scope="module")
def kv_llama(tmp_path_factory):
    """conf/model/llama-kv.yaml as a Hugging Face directory: 4 layers, 16 KV heads of 256, 128 KiB of fp32 KV a token."""
    shape = yaml.safe_load((REPO / "conf" / "model" / "llama-kv.yaml").read_text())
    return model_dir(tmp_path_factory.mktemp("llama-kv"), "llama", shape)
