"""What the serving side (adapters, orchestrator) and the reference engine agree on, in a module
light enough for both: the engine imports nothing from adapters/, and adapters never import
the engine (which needs torch) to check a model before a launch."""

from __future__ import annotations

from workloads.core.errors import UsageError

# A per-run token the orchestrator gives the engine it starts; the reference engine
# echoes it in /v1/models, so a server left on the port by someone else is not measured.
IDENTITY_ENV = "FABRICBENCH_SERVER_IDENTITY"


def dense_only(model: dict) -> None:
    """The reference engine's tensor parallelism splits GPT-NeoX's dense MLP; it has no expert layer."""
    if model.get("moe"):
        raise UsageError(f"model={model.get('name')} is a mixture of experts; the reference engine serves dense "
                         "GPT-NeoX only: train it with launch/train.py, or serve MoE models with server=vllm/sglang")
