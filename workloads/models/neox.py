"""GPT-NeoX in plain PyTorch, read like the paper (Black et al., 2022).

    x = embed_in(tokens)
    for each layer:
        parallel residual (gpt_j_residual):  x = x + attn(ln1(x)) + mlp(ln2(x))
        sequential residual:                 x = x + attn(ln1(x)); x = x + mlp(ln2(x))
    logits = embed_out(final_layer_norm(x))      # untied from embed_in

Attention is causal, through `scaled_dot_product_attention`, with rotary position
embeddings on the first `rotary_pct` of each head's dimensions. Module and parameter
names follow Hugging Face's `GPTNeoXForCausalLM`, so its state dicts load unchanged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from workloads.core.errors import UsageError
from workloads.models.moe import ExpertGroups, MoEConfig, MoEMLP


def pad_vocab_size(vocab_size: int, divisible_by: int = 128, tp: int = 1) -> int:
    """GPT-NeoX's `_vocab_size_with_padding`: round up to a multiple of divisible_by·tp,
    so the output layer splits evenly across tensor-parallel ranks and matmuls stay
    aligned. 50257 (GPT-2 BPE) -> 50304."""
    multiple = divisible_by * tp
    return int(math.ceil(vocab_size / multiple) * multiple)


# The precisions a model runs in (train.precision, server.dtype); fp16 needs a GPU.
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class NeoXConfig:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    # Tokenizer vocabulary; the embedding is padded up to `padded_vocab` so that the
    # output layer splits evenly under tensor parallelism (GPT-NeoX pads to 128·tp).
    vocab_size: int = 50257
    make_vocab_size_divisible_by: int = 128
    max_position_embeddings: int = 2048
    intermediate_size: int | None = None  # None -> 4·h, as GPT-NeoX
    rotary_pct: float = 1.0
    rotary_emb_base: float = 10000.0
    gpt_j_residual: bool = False  # "parallel residual": attention and MLP read the same input
    layer_norm_eps: float = 1e-5
    # Mixture of experts (models/moe.py): every layer's MLP becomes a routed set of experts.
    moe: MoEConfig | None = None

    def __post_init__(self) -> None:
        if self.moe is not None and not isinstance(self.moe, MoEConfig):
            object.__setattr__(self, "moe", MoEConfig.from_dict(self.moe))
        for name in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"):
            if getattr(self, name) <= 0:
                raise UsageError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise UsageError(
                f"model.num_attention_heads={self.num_attention_heads} does not divide "
                f"model.hidden_size={self.hidden_size}; choose heads that divide the hidden size"
            )
        if not 0.0 <= self.rotary_pct <= 1.0:
            raise UsageError(f"model.rotary_pct must be in [0, 1], got {self.rotary_pct}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    @property
    def padded_vocab(self) -> int:
        return pad_vocab_size(self.vocab_size, self.make_vocab_size_divisible_by)

    @property
    def rotary_ndims(self) -> int:
        return int(self.head_dim * self.rotary_pct)

    @classmethod
    def from_dict(cls, d: dict) -> NeoXConfig:
        fields = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in fields})

    def to_dict(self) -> dict:
        return asdict(self)


def rotary_cos_sin(
    positions: torch.Tensor, ndims: int, base: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for `positions` (T,) -> (T, ndims) each, GPT-NeoX's non-interleaved layout."""
    inv_freq = 1.0 / (base ** (torch.arange(0, ndims, 2, device=positions.device).float() / ndims))
    freqs = positions.float()[:, None] * inv_freq[None, :]  # (T, ndims/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, ndims)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ndims: int) -> torch.Tensor:
    """Rotate the first `ndims` dims of each head; x: (B, nh, T, hd), cos/sin: (T, ndims)."""
    if ndims == 0:
        return x
    rot, passthrough = x[..., :ndims], x[..., ndims:]
    half = ndims // 2
    rotated_half = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    return torch.cat((rot * cos + rotated_half * sin, passthrough), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: NeoXConfig, num_heads: int | None = None):
        super().__init__()
        # num_heads < cfg.num_attention_heads when tensor parallelism splits heads.
        self.num_heads = num_heads or cfg.num_attention_heads
        self.head_dim = cfg.head_dim
        self.rotary_ndims = cfg.rotary_ndims
        self.query_key_value = nn.Linear(cfg.hidden_size, 3 * self.num_heads * self.head_dim)
        self.dense = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        B, T, _ = x.shape
        # GPT-NeoX packs q, k, v per head: (B, T, nh, 3·hd), not (B, T, 3, nh, hd).
        qkv = self.query_key_value(x).view(B, T, self.num_heads, 3 * self.head_dim)
        q, k, v = qkv.transpose(1, 2).chunk(3, dim=-1)  # each (B, nh, T, hd)
        q = apply_rotary(q, cos, sin, self.rotary_ndims)
        k = apply_rotary(k, cos, sin, self.rotary_ndims)
        return q, k, v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hd)
        return self.dense(y.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: NeoXConfig, ffn_size: int | None = None):
        super().__init__()
        ffn = ffn_size or cfg.ffn_size
        self.dense_h_to_4h = nn.Linear(cfg.hidden_size, ffn)
        self.dense_4h_to_h = nn.Linear(ffn, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))


class Layer(nn.Module):
    def __init__(self, cfg: NeoXConfig, groups: ExpertGroups | None = None):
        super().__init__()
        self.parallel_residual = cfg.gpt_j_residual
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.attention = Attention(cfg)
        self.mlp = MoEMLP(cfg.hidden_size, cfg.ffn_size, cfg.moe, groups) if cfg.moe else MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        attn = self.attention(self.input_layernorm(x), cos, sin)
        if self.parallel_residual:
            return x + attn + self.mlp(self.post_attention_layernorm(x))
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x))


class NeoXBody(nn.Module):
    """`gpt_neox.*` in Hugging Face's naming: embeddings, layers, final norm."""

    def __init__(self, cfg: NeoXConfig, groups: ExpertGroups | None = None):
        super().__init__()
        self.embed_in = nn.Embedding(cfg.padded_vocab, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg, groups) for _ in range(cfg.num_layers))
        self.final_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)


class GPTNeoX(nn.Module):
    def __init__(self, cfg: NeoXConfig, groups: ExpertGroups | None = None):
        """`groups`: where an MoE model's experts live (None: all of them here)."""
        super().__init__()
        self.cfg = cfg
        self.gpt_neox = NeoXBody(cfg, groups)
        self.embed_out = nn.Linear(cfg.hidden_size, cfg.padded_vocab, bias=False)
        self.checkpoint_activations = False
        self.apply(self._init_weights)

    def _init_weights(self, m: nn.Module) -> None:
        # GPT-NeoX's "small_init": std = sqrt(2 / (5·h)) (Nguyen & Salazar, 2019).
        std = math.sqrt(2.0 / (5.0 * self.cfg.hidden_size))
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) int64 -> logits (B, T, padded_vocab)."""
        T = tokens.shape[1]
        if T > self.cfg.max_position_embeddings:
            raise UsageError(
                f"sequence length {T} exceeds model.max_position_embeddings="
                f"{self.cfg.max_position_embeddings}"
            )
        x = self.gpt_neox.embed_in(tokens)  # (B, T, h)
        positions = torch.arange(T, device=tokens.device)
        cos, sin = rotary_cos_sin(positions, self.cfg.rotary_ndims, self.cfg.rotary_emb_base, x.dtype)
        for layer in self.gpt_neox.layers:
            if self.checkpoint_activations and self.training:
                x = checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin)
        return self.embed_out(self.gpt_neox.final_layer_norm(x))
