"""benchmarks/loadgen_vs_vllm.py's --vllm-python: a relative path is taken from where the user
typed it (its client runs in another folder: it was a FileNotFoundError traceback there), and a
missing one is one line."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from helpers import REPO


def _bench():
    sys.path.insert(0, str(REPO / "benchmarks"))  # its sibling modules, as running the script does
    spec = importlib.util.spec_from_file_location("loadgen_vs_vllm", REPO / "benchmarks" / "loadgen_vs_vllm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_relative_vllm_python_is_made_absolute_not_resolved(tmp_path, monkeypatch, capsys):
    bench = _bench()
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    os.symlink(sys.executable, tmp_path / "venv" / "bin" / "python")  # a venv's python is a link
    monkeypatch.chdir(tmp_path)
    assert bench.find_vllm_python("venv/bin/python") == tmp_path / "venv" / "bin" / "python"
    with pytest.raises(SystemExit) as e:
        bench.find_vllm_python("nope/bin/python")
    assert e.value.code == 2
    assert capsys.readouterr().err == ("--vllm-python nope/bin/python: no such file; give the python of a venv with "
                                       "vLLM installed\n")
