"""Our GPT-NeoX against Hugging Face's GPTNeoXForCausalLM on random local models."""

import pytest
import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

from workloads.core.errors import UsageError
from workloads.models.hf import load_hf, save_hf
from workloads.models.neox import GPTNeoX, NeoXConfig

# fp32 on CPU; the two implementations order a few reductions differently.
ATOL = 1e-5


def hf_model(parallel_residual: bool, rotary_pct: float) -> GPTNeoXForCausalLM:
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(
        vocab_size=384, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=256,
        max_position_embeddings=128, use_parallel_residual=parallel_residual,
        rope_parameters={"rope_type": "default", "partial_rotary_factor": rotary_pct, "rope_theta": 10000.0},
        attn_implementation="eager",
    )
    return GPTNeoXForCausalLM(cfg).eval()


@pytest.mark.parametrize(
    "parallel_residual,rotary_pct",
    [(False, 1.0), (True, 0.25)],  # GPT-NeoX configs (sequential, full rotary); Pythia-style
    ids=["gpt-neox", "pythia"],
)
def test_logit_parity_both_directions(tmp_path, parallel_residual, rotary_pct):
    hf = hf_model(parallel_residual, rotary_pct)
    hf.save_pretrained(tmp_path / "hf")
    ours = load_hf(tmp_path / "hf").eval()
    assert ours.cfg.gpt_j_residual is parallel_residual
    assert ours.cfg.rotary_ndims == int(16 * rotary_pct)
    x = torch.randint(0, 384, (2, 37))
    with torch.no_grad():
        ref = hf(x).logits
        mine = ours(x)
    assert torch.allclose(mine, ref, atol=ATOL), (mine - ref).abs().max()

    save_hf(ours, tmp_path / "ours")
    back = GPTNeoXForCausalLM.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        assert torch.allclose(back(x).logits, mine, atol=ATOL)


def test_shape_errors_are_clear():
    with pytest.raises(UsageError, match="does not divide"):
        NeoXConfig(num_layers=1, hidden_size=60, num_attention_heads=7)
    model = GPTNeoX(NeoXConfig(num_layers=1, hidden_size=32, num_attention_heads=4, max_position_embeddings=16, vocab_size=100))
    assert model.embed_out.weight.shape[0] == 128  # vocabulary padded to a multiple of 128
    with pytest.raises(UsageError, match="exceeds"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_checkpointing_gives_same_gradients():
    torch.manual_seed(1)
    cfg = NeoXConfig(num_layers=2, hidden_size=32, num_attention_heads=4, max_position_embeddings=32, vocab_size=100)
    a = GPTNeoX(cfg)
    b = GPTNeoX(cfg)
    b.load_state_dict(a.state_dict())
    b.checkpoint_activations = True
    x = torch.randint(0, 100, (2, 16))
    for m in (a, b):
        m(x).sum().backward()
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-6), n
