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

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from workloads.errors import UsageError
from workloads.model import MLP, Attention, GPTNeoX, NeoXConfig, apply_rotary, rotary_cos_sin


def check_tp(cfg: NeoXConfig, tp: int) -> None:
    if tp <= 0:
        raise UsageError(f"server.tp must be positive, got {tp}")
    if cfg.num_attention_heads % tp:
        raise UsageError(
            f"tensor parallel degree {tp} does not divide model.num_attention_heads="
            f"{cfg.num_attention_heads}; choose tp in "
            f"{[d for d in range(1, cfg.num_attention_heads + 1) if cfg.num_attention_heads % d == 0 and cfg.ffn_size % d == 0]}"
        )
    if cfg.ffn_size % tp:
        raise UsageError(f"tensor parallel degree {tp} does not divide the MLP size {cfg.ffn_size}")


def shard_state_dict(sd: dict[str, torch.Tensor], cfg: NeoXConfig, rank: int, tp: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s slice of a full (our / HF naming) GPT-NeoX state dict."""
    check_tp(cfg, tp)
    nh, hd, h = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
    nl, fl = nh // tp, cfg.ffn_size // tp
    heads = slice(rank * nl, (rank + 1) * nl)
    cols = slice(rank * nl * hd, (rank + 1) * nl * hd)
    ffn = slice(rank * fl, (rank + 1) * fl)
    out = {}
    for k, v in sd.items():
        if k.endswith("attention.query_key_value.weight"):
            v = v.view(nh, 3 * hd, h)[heads].reshape(nl * 3 * hd, h)  # (3·hd·nh/tp, h)
        elif k.endswith("attention.query_key_value.bias"):
            v = v.view(nh, 3 * hd)[heads].reshape(-1)
        elif k.endswith("attention.dense.weight"):
            v = v[:, cols]  # (h, hd·nh/tp)
        elif k.endswith("mlp.dense_h_to_4h.weight") or k.endswith("mlp.dense_h_to_4h.bias"):
            v = v[ffn]
        elif k.endswith("mlp.dense_4h_to_h.weight"):
            v = v[:, ffn]  # (h, ffn/tp)
        out[k] = v.contiguous().clone()
    return out


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
    def from_full(cls, full_sd: dict[str, torch.Tensor], cfg: NeoXConfig, tp: int, rank: int,
                  device: torch.device, dtype: torch.dtype, group=None) -> TPNeoX:
        with torch.device("meta"):
            m = cls(cfg, tp, rank, group)
        sd = shard_state_dict(full_sd, cfg, rank, tp)
        if rank != 0:
            sd.pop("embed_out.weight", None)
        m.load_state_dict(sd, strict=True, assign=True)
        return m.to(device=device, dtype=dtype).eval()

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


def full_state_dict(cfg: NeoXConfig, seed: int, checkpoint: str | None) -> dict[str, torch.Tensor]:
    """The whole model's weights on CPU: a local HF directory, or a seeded random init that
    every rank reproduces exactly (so TP=1 and TP=2 shard the same model)."""
    if checkpoint:
        from workloads.hf import _read_state_dict, check_checkpoint_dir, to_our_names

        return to_our_names(_read_state_dict(check_checkpoint_dir(checkpoint)))
    torch.manual_seed(seed)
    return GPTNeoX(cfg).state_dict()
