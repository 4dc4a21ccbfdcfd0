"""Tensor-parallel GPT-NeoX for inference (Megatron-style, as vLLM's GPTNeoX does it).

Per layer, on each of `tp` ranks:

    query_key_value   column-split by HEADS: rank r keeps heads [r·nh/tp, (r+1)·nh/tp).
                      GPT-NeoX packs q, k, v per head, (nh, 3·hd) rows, so the split is
                      taken on that (nh, 3·hd, h) view, never on the flat 3·h rows.
    attention.dense   row-split (its input columns follow the local heads); partial sums
                      are all_reduced, then the (replicated) bias is added once.
    dense_h_to_4h     column-split (ffn/tp rows with their bias slice).
    dense_4h_to_h     row-split, all_reduce, then the replicated bias.

So every layer does two all_reduces of (tokens, h) activations, for prefill and for every
decode step, parallel residual or not (vLLM's RowParallelLinear reduces each; GPT-NeoX's
training code fuses the two under gpt_j_residual, an inference engine does not).

Embeddings and the output layer are REPLICATED, not vocabulary-split: every rank holds
`embed_in` (it needs the input activations), and only rank 0 runs the final norm and
`embed_out`, because only rank 0 samples. This keeps the communication per step at
exactly 2·L all_reduces plus the plan broadcast.

The KV cache is paged: one pool of `num_blocks·block_size` token slots per layer holding
this rank's heads, (slots, nh/tp, hd) for K and for V. A step is a flat list of tokens
from any mix of prefilling and decoding sequences; each sequence names its block table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from workloads.core.errors import UsageError
from workloads.models.hf import CheckpointWeights  # noqa: F401  (a weight source, as RandomWeights)
from workloads.models.neox import MLP, Attention, GPTNeoX, NeoXConfig, apply_rotary, rotary_cos_sin
from workloads.models.tp import check_tp_divides


def check_tp(cfg: NeoXConfig, tp: int) -> None:
    check_tp_divides(tp, {"name": "the served model", "num_attention_heads": cfg.num_attention_heads,
                          "ffn_size": cfg.ffn_size})


def shard_slice(name: str, cfg: NeoXConfig, rank: int, tp: int) -> tuple[int, int, int] | None:
    """(dim, start, stop) of rank `rank`'s part of the full parameter `name`; None = replicated.

    query_key_value: GPT-NeoX packs rows per head, head i owning rows [i·3·hd, (i+1)·3·hd)
    as q|k|v, so a range of heads is one contiguous row range. (A (3, nh, hd) layout, as in
    Megatron's GPT-2, would need three separate slices; splitting NeoX's rows at 3·h/tp
    boundaries without this per-head view would hand a rank other heads' k and v.)
    """
    nl, hd, fl = cfg.num_attention_heads // tp, cfg.head_dim, cfg.ffn_size // tp
    if name.endswith(("attention.query_key_value.weight", "attention.query_key_value.bias")):
        return 0, rank * nl * 3 * hd, (rank + 1) * nl * 3 * hd
    if name.endswith("attention.dense.weight"):
        return 1, rank * nl * hd, (rank + 1) * nl * hd  # its input columns follow the local heads
    if name.endswith(("mlp.dense_h_to_4h.weight", "mlp.dense_h_to_4h.bias")):
        return 0, rank * fl, (rank + 1) * fl
    if name.endswith("mlp.dense_4h_to_h.weight"):
        return 1, rank * fl, (rank + 1) * fl
    return None  # layer norms, row-parallel biases (added once after the all_reduce), embeddings


def shard_state_dict(sd: dict[str, torch.Tensor], cfg: NeoXConfig, rank: int, tp: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s slice of a full (our / HF naming) GPT-NeoX state dict."""
    check_tp(cfg, tp)
    out = {}
    for k, v in sd.items():
        spec = shard_slice(k, cfg, rank, tp)
        if spec is not None:
            dim, a, b = spec
            v = v.narrow(dim, a, b - a)
        out[k] = v.contiguous().clone()
    return out


class RandomWeights:
    """GPT-NeoX's init (small_init normal, zero biases, unit norms), generated one full
    parameter at a time from a per-parameter seed: any TP degree slices the same model,
    and no rank ever holds more than one full tensor."""

    def __init__(self, cfg: NeoXConfig, seed: int):
        with torch.device("meta"):
            self.shapes = {k: tuple(v.shape) for k, v in GPTNeoX(cfg).state_dict().items()}
        self.cfg, self.seed = cfg, seed
        self.index = {k: i for i, k in enumerate(self.shapes)}

    def full(self, name: str) -> torch.Tensor:
        shape = self.shapes[name]
        if "layernorm" in name or "layer_norm" in name:
            return torch.ones(shape) if name.endswith("weight") else torch.zeros(shape)
        if name.endswith("bias"):
            return torch.zeros(shape)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.index[name])
        std = math.sqrt(2.0 / (5.0 * self.cfg.hidden_size))  # as GPTNeoX._init_weights
        return torch.empty(shape).normal_(0.0, std, generator=g)

    def get(self, name: str, spec) -> torch.Tensor:
        t = self.full(name)
        return t if spec is None else t.narrow(spec[0], spec[1], spec[2] - spec[1]).clone()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: self.full(k) for k in self.shapes}


class TPLayer(nn.Module):
    """One GPT-NeoX layer holding this rank's heads and MLP columns (HF names)."""

    def __init__(self, cfg: NeoXConfig, tp: int):
        super().__init__()
        self.parallel_residual = cfg.gpt_j_residual
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.attention = Attention(cfg, num_heads=cfg.num_attention_heads // tp)
        self.mlp = MLP(cfg, ffn_size=cfg.ffn_size // tp)


class TPBody(nn.Module):
    def __init__(self, cfg: NeoXConfig, tp: int):
        super().__init__()
        self.embed_in = nn.Embedding(cfg.padded_vocab, cfg.hidden_size)
        self.layers = nn.ModuleList(TPLayer(cfg, tp) for _ in range(cfg.num_layers))
        self.final_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)


@dataclass
class StepInput:
    """One forward over a flat list of N tokens from S sequences (built by the engine).

    tokens, positions, slots: (N,)  token ids, their positions, their KV slot
    q_index:   (S, Qmax) index into the N tokens (padding points at row N, a zero row)
    q_pos:     (S, Qmax) position of each query (padding: 0)
    ctx_slots: (S, Cmax) KV slots of positions 0..ctx-1 of each sequence (padding: 0)
    last:      (S,) index into the N tokens of each sequence's last token
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    q_index: torch.Tensor
    q_pos: torch.Tensor
    ctx_slots: torch.Tensor
    last: torch.Tensor


class TPNeoX(nn.Module):
    """The rank-local GPT-NeoX with a paged KV cache. `group` is the TP process group
    (None: the default group); tp=1 never communicates."""

    def __init__(self, cfg: NeoXConfig, tp: int, rank: int, group=None):
        super().__init__()
        check_tp(cfg, tp)
        self.cfg, self.tp, self.rank, self.group = cfg, tp, rank, group
        self.local_heads = cfg.num_attention_heads // tp
        self.gpt_neox = TPBody(cfg, tp)
        self.embed_out = nn.Linear(cfg.hidden_size, cfg.padded_vocab, bias=False) if rank == 0 else None
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []

    @classmethod
    def load(cls, source, cfg: NeoXConfig, tp: int, rank: int, device: torch.device, dtype: torch.dtype,
             group=None) -> TPNeoX:
        """This rank's shard, read from `source` (RandomWeights or CheckpointWeights) one
        parameter at a time and moved to `device`/`dtype` as it arrives."""
        with torch.device("meta"):
            m = cls(cfg, tp, rank, group)
        sd = {}
        for name, meta in m.state_dict().items():
            t = source.get(name, shard_slice(name, cfg, rank, tp))
            if tuple(t.shape) != tuple(meta.shape):
                raise UsageError(f"{name}: the checkpoint's shard has shape {tuple(t.shape)}, the model expects "
                                 f"{tuple(meta.shape)}; config.json and the weights disagree")
            sd[name] = t.to(device=device, dtype=dtype)
        m.load_state_dict(sd, strict=True, assign=True)
        return m.eval()

    def allocate_cache(self, num_slots: int) -> None:
        p = self.gpt_neox.embed_in.weight
        shape = (num_slots, self.local_heads, self.cfg.head_dim)  # (slots, nh/tp, hd)
        self.k_cache = [torch.zeros(shape, device=p.device, dtype=p.dtype) for _ in range(self.cfg.num_layers)]
        self.v_cache = [torch.zeros(shape, device=p.device, dtype=p.dtype) for _ in range(self.cfg.num_layers)]

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        if self.tp > 1:
            dist.all_reduce(partial, group=self.group)  # looked up at call time: CommTimer sees it
        return partial

    def _attention(self, i: int, attn: Attention, x: torch.Tensor, cos, sin, s: StepInput) -> torch.Tensor:
        N = x.shape[0]
        nh, hd = self.local_heads, self.cfg.head_dim
        qkv = attn.query_key_value(x).view(N, nh, 3 * hd)  # per-head packed, as model.Attention
        q, k, v = qkv.chunk(3, dim=-1)  # each (N, nh, hd)
        q = apply_rotary(q, cos, sin, attn.rotary_ndims)
        k = apply_rotary(k, cos, sin, attn.rotary_ndims)
        self.k_cache[i][s.slots] = k
        self.v_cache[i][s.slots] = v
        kc = self.k_cache[i][s.ctx_slots].transpose(1, 2)  # (S, nh, Cmax, hd)
        vc = self.v_cache[i][s.ctx_slots].transpose(1, 2)
        qp = torch.cat((q, q.new_zeros(1, nh, hd)))[s.q_index].transpose(1, 2)  # (S, nh, Qmax, hd)
        key_pos = torch.arange(s.ctx_slots.shape[1], device=x.device)
        mask = (key_pos[None, None, :] <= s.q_pos[:, :, None])[:, None]  # (S, 1, Qmax, Cmax)
        y = F.scaled_dot_product_attention(qp, kc, vc, attn_mask=mask)  # (S, nh, Qmax, hd)
        S, _, Q, _ = y.shape
        y = y.transpose(1, 2).reshape(S * Q, nh * hd)
        # Back to the flat token order: token n sits at row (seq, j) with q_index[seq, j] == n.
        valid = s.q_index.reshape(-1) < N
        flat = torch.empty(N, nh * hd, device=x.device, dtype=x.dtype)
        flat[s.q_index.reshape(-1)[valid]] = y[valid]
        out = self._reduce(F.linear(flat, attn.dense.weight))  # (N, h) partial sums -> full
        return out + attn.dense.bias

    def _mlp(self, mlp: MLP, x: torch.Tensor) -> torch.Tensor:
        hidden = F.gelu(mlp.dense_h_to_4h(x))  # (N, ffn/tp)
        return self._reduce(F.linear(hidden, mlp.dense_4h_to_h.weight)) + mlp.dense_4h_to_h.bias

    @torch.inference_mode()
    def forward(self, s: StepInput) -> torch.Tensor | None:
        """Last-token logits (S, padded_vocab) on rank 0; None elsewhere."""
        x = self.gpt_neox.embed_in(s.tokens)  # (N, h)
        cos, sin = rotary_cos_sin(s.positions, self.cfg.rotary_ndims, self.cfg.rotary_emb_base, x.dtype)
        cos, sin = cos[:, None], sin[:, None]  # (N, 1, rot): broadcast over heads
        for i, layer in enumerate(self.gpt_neox.layers):
            attn = self._attention(i, layer.attention, layer.input_layernorm(x), cos, sin, s)
            if layer.parallel_residual:
                x = x + attn + self._mlp(layer.mlp, layer.post_attention_layernorm(x))
            else:
                x = x + attn
                x = x + self._mlp(layer.mlp, layer.post_attention_layernorm(x))
        if self.embed_out is None:
            return None
        return self.embed_out(self.gpt_neox.final_layer_norm(x[s.last]))


def weight_source(cfg: NeoXConfig, seed: int, checkpoint: str | None):
    return CheckpointWeights(checkpoint) if checkpoint else RandomWeights(cfg, seed)
