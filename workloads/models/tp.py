"""What tensor parallelism asks of a model's shapes: the degree must split its heads and MLP.
One check for every engine (the reference engine, vLLM, SGLang) and for the launcher's
validation, so that a TP a model cannot take is refused the same way everywhere."""

from __future__ import annotations

from typing import Any, Mapping

from workloads.core.errors import UsageError


def check_tp_divides(tp: int, model: Mapping[str, Any]) -> None:
    """Tensor parallelism splits attention heads (and, where the model says, the MLP) across
    ranks; the degree must divide them. KV heads (grouped-query attention) may be fewer than
    tp if tp is a multiple of them (engines then replicate KV heads), as vLLM and SGLang
    allow. The one check for every engine, the reference one included."""
    if tp <= 0:
        raise UsageError(f"server.tp must be positive, got {tp}")
    heads, ffn = model.get("num_attention_heads"), model.get("ffn_size")
    if heads and int(heads) % tp:
        ok = [d for d in range(1, int(heads) + 1) if int(heads) % d == 0 and (not ffn or int(ffn) % d == 0)]
        raise UsageError(f"server.tp={tp} does not divide model.num_attention_heads={heads} "
                         f"({model.get('name')}); use a tp in {ok}")
    if ffn and int(ffn) % tp:
        raise UsageError(f"server.tp={tp} does not divide the MLP size {ffn} ({model.get('name')})")
    kv = model.get("num_key_value_heads")
    if kv and int(kv) % tp and tp % int(kv):
        raise UsageError(f"server.tp={tp} and model.num_key_value_heads={kv} ({model.get('name')}): one must "
                         "divide the other; choose another tp")
