"""Hugging Face `GPTNeoXForCausalLM` checkpoints <-> our GPTNeoX.

Reads and writes the on-disk format (config.json + model.safetensors or
pytorch_model.bin) directly, so it works with checkpoints written by any transformers
version: older ones say `rotary_pct`/`rotary_emb_base` and `embed_out`, transformers 5
says `rope_parameters` and `lm_head`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from workloads.core.errors import UsageError
from workloads.models.neox import GPTNeoX, NeoXConfig

# Buffers that HF versions kept in state dicts; they are recomputed, never learned.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq", ".attention.bias", ".attention.masked_bias")


_REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")


def config_from_hf(hf: dict) -> NeoXConfig:
    missing = [k for k in _REQUIRED if k not in hf]
    if missing:
        raise UsageError(f"config.json lacks {', '.join(missing)}; it is not a complete GPT-NeoX config "
                         "(re-download the checkpoint or point at its directory)")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if hf.get("tie_word_embeddings"):
        raise UsageError("tied input/output embeddings are not GPT-NeoX; this checkpoint is not supported")
    return NeoXConfig(
        num_layers=hf["num_hidden_layers"],
        hidden_size=hf["hidden_size"],
        num_attention_heads=hf["num_attention_heads"],
        # HF's vocab_size is already the padded embedding size (Pythia: 50304); keep it
        # exactly by padding to a multiple of 1.
        vocab_size=hf["vocab_size"],
        make_vocab_size_divisible_by=1,
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        intermediate_size=hf.get("intermediate_size"),
        rotary_pct=rope.get("partial_rotary_factor", hf.get("rotary_pct", 1.0)),
        rotary_emb_base=rope.get("rope_theta", hf.get("rotary_emb_base", 10000.0)),
        gpt_j_residual=hf.get("use_parallel_residual", True),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-5),
    )


def config_to_hf(cfg: NeoXConfig) -> dict:
    return {
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "num_hidden_layers": cfg.num_layers,
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_attention_heads,
        "intermediate_size": cfg.ffn_size,
        "vocab_size": cfg.padded_vocab,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rotary_pct": cfg.rotary_pct,
        "rotary_emb_base": cfg.rotary_emb_base,
        "use_parallel_residual": cfg.gpt_j_residual,
        "layer_norm_eps": cfg.layer_norm_eps,
        "hidden_act": "gelu",
        "tie_word_embeddings": False,
        "attention_bias": True,
        "bos_token_id": 0,
        "eos_token_id": 0,
    }


def check_checkpoint_dir(path: str | Path) -> Path:
    p = Path(path).expanduser()
    if not p.is_dir():
        raise UsageError(
            f"checkpoint directory {p} does not exist; point init.checkpoint at a local "
            "Hugging Face GPT-NeoX directory (config.json + weights)"
        )
    if not (p / "config.json").is_file():
        raise UsageError(f"{p} has no config.json; it is not a Hugging Face model directory")
    return p


class CheckpointWeights:
    """A local HF GPT-NeoX directory, the one reader of its weights, read slice by slice: safetensors slices are read
    lazily (only this rank's bytes); pytorch_model*.bin files are memory-mapped."""

    def __init__(self, path: str):
        p = check_checkpoint_dir(path)
        self.handles: dict[str, object] = {}
        files = sorted(p.glob("*.safetensors"))
        if files:
            from safetensors import safe_open

            for f in files:
                h = safe_open(str(f), framework="pt")
                for k in h.keys():
                    self.handles[k] = h
            self.tensors = None
        else:
            bins = sorted(p.glob("pytorch_model*.bin"))
            if not bins:
                raise UsageError(f"no model.safetensors or pytorch_model.bin in {p}")
            self.tensors = {}
            for f in bins:
                self.tensors.update(torch.load(f, map_location="cpu", weights_only=True, mmap=True))
        names = self.handles.keys() if self.tensors is None else self.tensors.keys()
        self.names = {("embed_out.weight" if k == "lm_head.weight" else k): k for k in names
                      if not k.endswith(_IGNORED_SUFFIXES)}
        self.path = p

    def get(self, name: str, spec) -> torch.Tensor:
        if name not in self.names:
            raise UsageError(f"checkpoint {self.path} has no tensor {name}; it is not a GPT-NeoX checkpoint")
        key = self.names[name]
        if self.tensors is not None:
            t = self.tensors[key]
            return (t if spec is None else t.narrow(spec[0], spec[1], spec[2] - spec[1])).clone()
        sl = self.handles[key].get_slice(key)
        if spec is None:
            return sl[:]
        dim, a, b = spec
        return sl[a:b] if dim == 0 else sl[:, a:b]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every tensor, under GPTNeoX's names."""
        return {name: self.get(name, None) for name in self.names}


def check_weights(p: Path) -> None:
    """Weights present, and every safetensors header readable (cheap: the header only), so a
    corrupt or truncated download is one line before any rank starts, not a rank's traceback."""
    st = sorted(p.glob("*.safetensors"))
    if not st and not sorted(p.glob("pytorch_model*.bin")):
        raise UsageError(f"no model.safetensors or pytorch_model.bin in {p}; the checkpoint needs its weights")
    from safetensors import safe_open

    for f in st:
        try:
            with safe_open(str(f), framework="pt") as h:
                h.keys()
        except Exception as e:  # SafetensorError and OSError; the library has no narrower base
            raise UsageError(f"{f} is not a readable safetensors file ({str(e).splitlines()[0][:120]}); "
                             "the download is corrupt or truncated: fetch it again") from None


def load_hf_config(path: str | Path) -> NeoXConfig:
    p = check_checkpoint_dir(path)
    try:
        hf = json.loads((p / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{p / 'config.json'} is not valid JSON ({e}); re-download the checkpoint's config.json") \
            from None
    if not isinstance(hf, dict):
        raise UsageError(f"{p / 'config.json'} holds a {type(hf).__name__}, not a config object")
    if hf.get("model_type") not in (None, "gpt_neox"):
        raise UsageError(f"{p} holds a '{hf.get('model_type')}' model; fabricbench trains GPT-NeoX")
    cfg = config_from_hf(hf)
    check_weights(p)
    return cfg


def load_hf(path: str | Path) -> GPTNeoX:
    """A GPTNeoX with the weights of a local HF GPT-NeoX directory."""
    cfg = load_hf_config(path)
    model = GPTNeoX(cfg)
    missing, unexpected = model.load_state_dict(CheckpointWeights(str(path)).state_dict(), strict=False)
    if missing or unexpected:
        raise UsageError(
            f"checkpoint {path} does not match GPT-NeoX: missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
    return model


def save_hf(model: GPTNeoX, path: str | Path) -> Path:
    """Write config.json + model.safetensors in the classic GPT-NeoX on-disk layout."""
    from safetensors.torch import save_file

    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    (p / "config.json").write_text(json.dumps(config_to_hf(model.cfg), indent=2))
    sd = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(sd, str(p / "model.safetensors"), metadata={"format": "pt"})
    return p

