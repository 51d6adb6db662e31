"""course_lib.gpt (lesson 09): GPT-2's architecture from the course's parts, proven equal to Hugging
Face's GPT2LMHeadModel both ways; the KV cache equal to recomputation; clear errors; train_lm."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import GPT2LMHeadModel

from _helpers import seeded  # noqa: F401
from course_lib.gpt import GPT, GPTConfig, from_hf_gpt2, hf_gpt2_config, lm_loss, load_into_hf_gpt2
from course_lib.layers import EncoderLayer, LayerKVCache
from course_lib.lm_training import (
    COURSE,
    NANOGPT_CPU,
    LMRecipe,
    bits_per_char,
    evaluate_lm,
    lm_optimizer,
    train_lm,
    warmup_cosine,
)
from course_lib.model import count_parameters
from course_lib.data.shakespeare import Play, ShakespeareCorpus


def _hf(config: GPTConfig) -> GPT2LMHeadModel:
    return GPT2LMHeadModel(hf_gpt2_config(config)).eval()


@pytest.mark.parametrize("config", [GPTConfig(), GPTConfig(vocab_size=11, max_len=16, d_model=24,
                                                             num_heads=3, num_layers=2, d_ff=40),
                                    # odd sizes (issue 25): 7 heads of 3, d_ff 53, 19 positions
                                    GPTConfig(vocab_size=37, max_len=19, d_model=21, num_heads=7,
                                              num_layers=3, d_ff=53, layer_norm_eps=1e-6)])
def test_equal_to_hf_gpt2_both_ways(config, seeded):
    model = GPT(config).eval()
    hf = _hf(config)
    load_into_hf_gpt2(model, hf)
    ids = torch.randint(0, config.vocab_size, (3, config.max_len))
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits
    assert (ours - theirs).abs().max() <= 1e-5
    back = from_hf_gpt2(hf)
    with torch.no_grad():
        assert (back(ids) - theirs).abs().max() <= 1e-5
    assert count_parameters(model) == sum(p.numel() for p in hf.parameters())


def test_gpt2_small_shape_count_and_equality(seeded):
    config = GPTConfig.gpt2_small()
    model = GPT(config).eval()
    assert count_parameters(model) == 124_439_808
    assert model.lm_head.weight is model.embed.token.embedding.weight  # tied, counted once
    hf = _hf(config)
    assert sum(p.numel() for p in hf.parameters()) == 124_439_808
    load_into_hf_gpt2(model, hf)
    ids = torch.randint(0, config.vocab_size, (1, 24))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() <= 1e-5


def test_conv1d_stores_weights_transposed(seeded):
    """GPT-2's Conv1D is (in, out): copying nn.Linear's (out, in) without .t() is the porting bug."""
    config = GPTConfig(vocab_size=11, max_len=8, d_model=16, num_heads=2, num_layers=1, d_ff=32)
    model, hf = GPT(config).eval(), _hf(config)
    assert hf.transformer.h[0].mlp.c_fc.weight.shape == (16, 32)
    assert model.blocks.layers[0].feed_forward.linear1.weight.shape == (32, 16)
    load_into_hf_gpt2(model, hf)
    assert torch.equal(hf.transformer.h[0].attn.c_proj.weight,
                       model.blocks.layers[0].self_attn.out_proj.weight.t())


def test_gpt2_details(seeded):
    model = GPT(GPTConfig(num_layers=2))
    assert model.blocks.layers[0].norm_first and model.blocks.norm is not None  # pre-LN + ln_f
    x = torch.linspace(-3, 3, 7)
    ff = model.blocks.layers[0].feed_forward
    assert torch.allclose(ff.activation(x), torch.nn.functional.gelu(x, approximate="tanh"))
    assert model.embed.position.__class__.__name__ == "LearnedPositionalEmbedding"
    assert model.embed.token.scale == 1.0  # no sqrt(d_model) scaling
    std = model.blocks.layers[0].self_attn.q_proj.weight.std().item()
    out_std = model.blocks.layers[0].self_attn.out_proj.weight.std().item()
    assert abs(std - 0.02) < 0.002 and abs(out_std - 0.02 / math.sqrt(4)) < 0.002


def test_causal_no_position_sees_the_future(seeded):
    model = GPT(GPTConfig(vocab_size=20, max_len=12, d_model=32, num_heads=4, num_layers=2)).eval()
    ids = torch.randint(0, 20, (2, 12))
    changed = ids.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 20
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:], atol=1e-3)


def test_cache_equals_recomputation(seeded):
    model = GPT(GPTConfig(vocab_size=30, max_len=20, d_model=32, num_heads=4, num_layers=3)).eval()
    ids = torch.randint(0, 30, (3, 20))
    cache = model.start_cache(3)
    with torch.no_grad():
        steps = torch.stack([model.step(ids[:, t], cache) for t in range(20)], dim=1)  # (B, T, V)
        full = model(ids)
    assert (steps - full).abs().max() <= 1e-5
    assert cache.length == 20 and cache.layers[0].self_k.shape == (3, 4, 20, 8)
    with pytest.raises(ValueError, match="already holds max_len=20"):
        model.step(ids[:, 0], cache)


@pytest.mark.parametrize("kwargs", [dict(greedy=True), dict(top_k=5), dict(top_p=0.9, temperature=0.7)])
def test_generate_with_cache_equals_without(kwargs, seeded):
    model = GPT(GPTConfig(vocab_size=30, max_len=16, d_model=32, num_heads=4, num_layers=2)).eval()
    prompt = torch.randint(0, 30, (2, 5))
    a = model.generate(prompt, 30, generator=torch.Generator().manual_seed(3), **kwargs)
    b = model.generate(prompt, 30, generator=torch.Generator().manual_seed(3), use_cache=False, **kwargs)
    assert a.shape == (2, 35) and torch.equal(a, b) and torch.equal(a[:, :5], prompt)


def test_encoder_layer_step_matches_causal_forward_post_ln(seeded):
    layer = EncoderLayer(16, 2, 32, dropout=0.0, norm_first=False).eval()
    x = torch.randn(2, 6, 16)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    cache = LayerKVCache.empty(2, layer.self_attn, x)
    rows = torch.cat([layer.step(x[:, t : t + 1], cache) for t in range(6)], dim=1)
    assert (rows - layer(x, mask)).abs().max() <= 1e-5


def test_bad_input_errors(seeded):
    model = GPT(GPTConfig(vocab_size=10, max_len=8, d_model=16, num_heads=2, num_layers=1))
    with pytest.raises(ValueError, match="9 positions but the model has max_len=8.*ids\\[:, -8:\\]"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids must lie in \\[0, 9\\]"):
        model(torch.full((1, 4), 10))
    with pytest.raises(TypeError, match="integer tensor"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), -1)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 3, temperature=0)
    with pytest.raises(ValueError, match="not divisible"):
        GPTConfig(d_model=10, num_heads=3)
    with pytest.raises(ValueError, match="logits must be"):
        lm_loss(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def test_warmup_cosine_matches_nanogpt():
    lr, min_lr = 1e-3, 1e-4
    assert warmup_cosine(0, 100, 2000, 0.1) * lr == pytest.approx(lr * 1 / 101)
    assert warmup_cosine(99, 100, 2000, 0.1) * lr == pytest.approx(lr * 100 / 101)
    assert warmup_cosine(100, 100, 2000, 0.1) * lr == pytest.approx(lr)
    assert warmup_cosine(1050, 100, 2000, 0.1) * lr == pytest.approx((lr + min_lr) / 2)
    assert warmup_cosine(2000, 100, 2000, 0.1) * lr == pytest.approx(min_lr)
    with pytest.raises(ValueError):
        warmup_cosine(0, 10, 10, 0.1)


def test_weight_decay_only_on_matrices(seeded):
    model = GPT(GPTConfig(vocab_size=10, max_len=8, d_model=16, num_heads=2, num_layers=1))
    opt = lm_optimizer(model, 1e-3, (0.9, 0.99), 0.1)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and all(p.dim() == 2 for p in decayed["params"])
    assert plain["weight_decay"] == 0.0 and all(p.dim() == 1 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))


def test_recipes():
    assert (NANOGPT_CPU.num_layers, NANOGPT_CPU.num_heads, NANOGPT_CPU.d_model) == (4, 4, 128)
    assert (NANOGPT_CPU.block_size, NANOGPT_CPU.batch_size, NANOGPT_CPU.num_steps) == (64, 12, 2000)
    assert (NANOGPT_CPU.lr, NANOGPT_CPU.min_lr, NANOGPT_CPU.warmup) == (1e-3, 1e-4, 100)
    assert (NANOGPT_CPU.betas, NANOGPT_CPU.weight_decay, NANOGPT_CPU.max_grad_norm) == ((0.9, 0.99), 0.1, 1.0)
    assert NANOGPT_CPU.dropout == 0.0 and COURSE.num_steps < NANOGPT_CPU.num_steps


def test_train_lm_learns_a_tiny_corpus():
    text = "to be, or not to be, that is the question.\n" * 40
    corpus = ShakespeareCorpus(validation_plays=("B",), plays=[Play("A", "a", text), Play("B", "b", text)])
    recipe = LMRecipe(num_layers=1, num_heads=2, d_model=32, block_size=16, batch_size=16, num_steps=60,
                      lr=1e-2, min_lr=1e-3, warmup=5)
    run = train_lm(corpus, recipe, seed=0, eval_every=20, val_windows=32, train_windows=32,
                   sample_prompt="to be", sample_length=20, progress=False)
    assert [s for s, _, _ in run.curve] == [0, 20, 40, 60]
    assert run.curve[0][2] == pytest.approx(math.log(len(corpus.vocab)), abs=0.05)  # ln(V) at step 0
    assert run.curve[-1][2] < 0.5 * run.curve[0][2] and len(run.losses) == 60
    assert len(run.train_curve) == 4 and sorted(run.samples) == [0, 20, 40, 60]
    assert all(len(s) == 20 for s in run.samples.values())
    assert run.first_reaching(run.curve[-1][2])[0] <= 60 and run.train_seconds > 0
    assert not run.model.training and run.model.blocks.layers[0].self_attn.fused is False
    assert evaluate_lm(run.model, corpus.fixed_batches("val", 32, 16)) == pytest.approx(run.curve[-1][2])
    assert bits_per_char(math.log(2)) == pytest.approx(1.0)


def test_fused_causal_kernel_equals_the_readable_path(seeded):
    """GPT passes is_causal=True: the fused kernel skips the mask and gives the same numbers."""
    from course_lib.attention import set_fused_attention

    model = GPT(GPTConfig(vocab_size=30, max_len=16, d_model=32, num_heads=4, num_layers=2))
    ids = torch.randint(0, 30, (4, 16))
    readable = model(ids)
    grads = torch.autograd.grad(readable.square().mean(), list(model.parameters()))
    set_fused_attention(model, True)
    fused = model(ids)
    fused_grads = torch.autograd.grad(fused.square().mean(), list(model.parameters()))
    assert (fused - readable).abs().max() <= 1e-5
    assert all((a - b).abs().max() <= 1e-5 for a, b in zip(grads, fused_grads))
    with pytest.raises(ValueError, match="is_causal needs as many queries as keys"):
        model.blocks.layers[0].self_attn(torch.zeros(1, 3, 32), torch.zeros(1, 4, 32),
                                         torch.zeros(1, 4, 32), is_causal=True)
