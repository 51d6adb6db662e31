"""Issue 25's equality spot check with cases the other tests do not use: the Llama-style model
against Hugging Face's LlamaForCausalLM with odd sizes, multi-query attention (num_kv_heads=1) and
both of the RoPE bases in use (10,000: Llama 1-2; 500,000: Llama 3), both ways, with the KV cache;
and token ids of every integer dtype through the port."""

from __future__ import annotations

import pytest
import torch

from _helpers import seeded  # noqa: F401
from course_lib.gpt import GPT, GPTConfig
from course_lib.llama import from_hf_llama, hf_llama_config, load_into_hf_llama

transformers = pytest.importorskip("transformers")
from transformers import LlamaForCausalLM  # noqa: E402

TOL = 1e-5
# odd sizes: vocabulary 37, 19 positions, 5 heads of 8 (one KV head), d_ff 70, 3 layers
ODD = dict(vocab_size=37, max_len=19, d_model=40, num_heads=5, num_kv_heads=1, num_layers=3, d_ff=70)


def _sharp(model: GPT) -> GPT:
    """Scale the query and key matrices by 30: at N(0, 0.02) the scores are near 0 and attention
    near uniform, so the positions (RoPE's angles) would hardly move the logits; sharp scores make
    a wrong angle show."""
    with torch.no_grad():
        for layer in model.blocks.layers:
            layer.self_attn.q_proj.weight.mul_(30)
            layer.self_attn.k_proj.weight.mul_(30)
    return model


@pytest.mark.parametrize("rope_base", [10_000.0, 500_000.0], ids=["theta-10k", "theta-500k"])
@pytest.mark.parametrize("num_kv_heads", [1, 5], ids=["mqa", "mha"])
def test_odd_sizes_equal_llama_for_causal_lm_both_ways(rope_base, num_kv_heads, seeded):
    config = GPTConfig.llama_style(**{**ODD, "num_kv_heads": num_kv_heads}, rope_base=rope_base)
    ours = _sharp(GPT(config).eval())
    theirs = LlamaForCausalLM(hf_llama_config(config)).eval()
    load_into_hf_llama(ours, theirs)
    ids = torch.randint(0, config.vocab_size, (2, config.max_len))
    with torch.no_grad():
        expected = theirs(ids).logits
        assert (ours(ids) - expected).abs().max() <= TOL
        assert (from_hf_llama(theirs)(ids) - expected).abs().max() <= TOL
        # the cache gives the rows of the full forward, one position at a time
        cache = ours.start_cache(2)
        rows = torch.stack([ours.step(ids[:, t], cache) for t in range(config.max_len)], dim=1)
        assert (rows - expected).abs().max() <= TOL


def test_the_two_bases_give_different_models(seeded):
    """Guards the test above: rope_theta is not a weight, so only the config can carry it; with the
    same weights, 10,000 and 500,000 give logits that differ by far more than the tolerance."""
    config = GPTConfig.llama_style(**ODD)
    ours = _sharp(GPT(config).eval())
    other = GPT(GPTConfig.llama_style(**ODD, rope_base=500_000.0)).eval()
    other.load_state_dict(ours.state_dict())
    ids = torch.randint(0, config.vocab_size, (2, config.max_len))
    with torch.no_grad():
        assert (ours(ids) - other(ids)).abs().max() > 100 * TOL


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16], ids=["uint8", "int16"])
def test_ids_of_any_integer_dtype_give_hugging_faces_logits(dtype, seeded):
    config = GPTConfig.llama_style(**ODD)
    ours = GPT(config).eval()
    theirs = LlamaForCausalLM(hf_llama_config(config)).eval()
    load_into_hf_llama(ours, theirs)
    ids = torch.randint(0, config.vocab_size, (2, 11))
    with torch.no_grad():
        assert (ours(ids.to(dtype)) - theirs(ids).logits).abs().max() <= TOL
