"""Tiny Hugging Face model directories for the real engines (vLLM) on CPU, built here from
a model config's shape: random weights (transformers, seeded) and a local word-level
tokenizer whose vocabulary is exactly the model's, so every id the model can emit decodes
to a non-empty word (TTFT and ITL count chunks with content). Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping


def tokenizer_dir(path: Path, vocab_size: int) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "<unk>": 1} | {f"w{i}": i for i in range(2, vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>", bos_token="<eos>",
                            model_max_length=4096).save_pretrained(path)
    return path


def model_dir(path: Path, arch: str, shape: Mapping[str, Any], vocab_size: int = 1024, seed: int = 0) -> Path:
    """`arch` "gpt_neox" or "llama"; `shape` a conf/model/*.yaml mapping (layers, hidden, heads ...)."""
    import torch
    from transformers import (
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
    )

    h, heads = int(shape["hidden_size"]), int(shape["num_attention_heads"])
    common = dict(vocab_size=vocab_size, hidden_size=h, num_hidden_layers=int(shape["num_layers"]),
                  num_attention_heads=heads, intermediate_size=int(shape.get("intermediate_size") or 4 * h),
                  max_position_embeddings=int(shape["max_position_embeddings"]), eos_token_id=0, bos_token_id=0,
                  tie_word_embeddings=False, torch_dtype="float32")
    if arch == "gpt_neox":
        cfg = GPTNeoXConfig(**common, rotary_pct=float(shape.get("rotary_pct", 0.25)),
                            use_parallel_residual=bool(shape.get("gpt_j_residual", True)))
        cls = GPTNeoXForCausalLM
    elif arch == "llama":
        # head_dim may exceed hidden/heads: more KV bytes a token for the same compute
        cfg = LlamaConfig(**common, num_key_value_heads=int(shape.get("num_key_value_heads") or heads),
                          head_dim=int(shape.get("head_dim") or h // heads))
        cls = LlamaForCausalLM
    else:
        raise ValueError(f"arch {arch!r}: gpt_neox or llama")
    torch.manual_seed(seed)
    cls(cfg).save_pretrained(path, safe_serialization=True)
    tokenizer_dir(path, vocab_size)
    return path
