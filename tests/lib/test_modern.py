"""Lesson 11's parts against Hugging Face's Llama: RMSNorm, RoPE (both layouts), SwiGLU, grouped-query
attention (readable and fused, with the KV cache) and the whole model, both ways."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from course_lib.attention import MultiHeadAttention
from course_lib.gpt import GPT, GPTConfig
from course_lib.layers import LayerKVCache, cached_self_attention
from course_lib.llama import from_hf_llama, hf_llama_config, llama_name_map, load_into_hf_llama
from course_lib.masks import causal_mask
from course_lib.modern import RMSNorm, SwiGLU, kv_cache_bytes, swiglu_d_ff
from course_lib.rope import RotaryEmbedding, apply_rotary, rotate_half, rotate_pairs

warnings.filterwarnings("ignore", message="IProgress not found")
llama = pytest.importorskip("transformers.models.llama.modeling_llama")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

TOL = 1e-5


def small_llama_config(**kw) -> LlamaConfig:
    sizes = dict(vocab_size=50, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                 num_attention_heads=6, num_key_value_heads=6, max_position_embeddings=40)
    return LlamaConfig(**{**sizes, **kw})


# --- RMSNorm ---------------------------------------------------------------------------------------

def test_rmsnorm_equals_llama_rmsnorm_with_random_weights():
    torch.manual_seed(0)
    ours, theirs = RMSNorm(48, eps=1e-5), llama.LlamaRMSNorm(48, eps=1e-5)
    with torch.no_grad():
        ours.weight.normal_()
        theirs.weight.copy_(ours.weight)
    x = torch.randn(3, 7, 48) * 5 + 2
    torch.testing.assert_close(ours(x), theirs(x), atol=TOL, rtol=0)
    assert sum(p.numel() for p in ours.parameters()) == 48  # LayerNorm has 96


def test_rmsnorm_keeps_its_dtype_and_refuses_the_wrong_width():
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    assert RMSNorm(8).to(torch.bfloat16)(x).dtype == torch.bfloat16  # computed in float32 inside
    with pytest.raises(ValueError, match="d_model=8"):
        RMSNorm(8)(torch.randn(2, 3, 9))


# --- RoPE ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("head_dim, base", [(8, 10000.0), (16, 500000.0)])
def test_rotary_tables_and_rotation_equal_hugging_face(head_dim, base):
    config = small_llama_config(hidden_size=head_dim * 6, rope_parameters={"rope_type": "default",
                                                                          "rope_theta": base})
    hf_rope = llama.LlamaRotaryEmbedding(config)
    positions = torch.arange(40).unsqueeze(0)  # (1, 40)
    hf_cos, hf_sin = hf_rope(torch.zeros(1), positions)  # (1, 40, hd)
    ours = RotaryEmbedding(head_dim, 40, base)
    cos, sin = ours.cos_sin(40)
    torch.testing.assert_close(cos, hf_cos[0], atol=0, rtol=0)
    torch.testing.assert_close(sin, hf_sin[0], atol=0, rtol=0)
    q, k = torch.randn(2, 6, 40, head_dim), torch.randn(2, 3, 40, head_dim)
    hf_q, hf_k = llama.apply_rotary_pos_emb(q, k, hf_cos, hf_sin)
    torch.testing.assert_close(ours(q), hf_q, atol=TOL, rtol=0)
    torch.testing.assert_close(ours(k), hf_k, atol=TOL, rtol=0)
    # an offset: rows 10..19 of the table
    torch.testing.assert_close(ours(q[:, :, 10:20], start=10), hf_q[:, :, 10:20], atol=TOL, rtol=0)


def test_rotate_half_equals_hugging_face_and_rotate_pairs_is_the_same_turn_in_another_order():
    x = torch.randn(3, 5, 8)
    torch.testing.assert_close(rotate_half(x), llama.rotate_half(x), atol=0, rtol=0)
    # pairs layout = halves layout after permuting the numbers (0, 2, 4, 6, 1, 3, 5, 7)
    perm = torch.cat([torch.arange(0, 8, 2), torch.arange(1, 8, 2)])
    halves, pairs = RotaryEmbedding(8, 5, layout="halves"), RotaryEmbedding(8, 5, layout="pairs")
    torch.testing.assert_close(pairs(x)[..., perm], halves(x[..., perm]), atol=TOL, rtol=0)
    assert not torch.allclose(pairs(x), halves(x), atol=1e-3)  # mixing them is a silent bug
    torch.testing.assert_close(rotate_pairs(rotate_pairs(x)), -x)  # a quarter turn twice


@pytest.mark.parametrize("layout", ["halves", "pairs"])
def test_rope_scores_depend_only_on_the_offset_and_keep_lengths(layout):
    rope = RotaryEmbedding(16, 64, layout=layout)
    q, k = torch.randn(16), torch.randn(16)
    cos, sin = rope.cos_sin(64)

    def turned(v: torch.Tensor, pos: int) -> torch.Tensor:
        return apply_rotary(v, cos[pos], sin[pos], layout)

    for offset in (0, 3, 17):
        scores = torch.stack([turned(q, m + offset) @ turned(k, m) for m in range(40)])
        torch.testing.assert_close(scores, scores[:1].expand(40), atol=1e-4, rtol=0)
    torch.testing.assert_close(turned(q, 29).norm(), q.norm())


def test_rotary_errors_say_what_to_fix():
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(7, 10)
    with pytest.raises(ValueError, match="beyond the rotary table of max_len=10"):
        RotaryEmbedding(8, 10)(torch.randn(1, 1, 4, 8), start=8)
    with pytest.raises(ValueError, match="layout"):
        RotaryEmbedding(8, 10, layout="interleaved")
    with pytest.raises(ValueError, match="num_heads must be even, got 42 // 6 = 7"):
        GPTConfig.llama_style(d_model=42, num_heads=6)  # head_dim 7
    with pytest.raises(ValueError, match="self-attention only"):
        attn = MultiHeadAttention(16, 2, rotary=RotaryEmbedding(8, 10))
        attn(torch.randn(1, 3, 16), torch.randn(1, 3, 16), torch.randn(1, 3, 16))
    with pytest.raises(ValueError, match="max_len=8 positions"):
        GPT(GPTConfig.llama_style(vocab_size=10, max_len=8, d_model=16, num_heads=2, num_layers=1))(
            torch.zeros(1, 9, dtype=torch.long))


# --- SwiGLU ----------------------------------------------------------------------------------------

def test_swiglu_equals_llama_mlp_and_matches_gelu_parameter_count():
    torch.manual_seed(0)
    config = small_llama_config(hidden_size=48, intermediate_size=swiglu_d_ff(48))
    theirs = llama.LlamaMLP(config)
    ours = SwiGLU(48, swiglu_d_ff(48))
    with torch.no_grad():
        ours.gate.weight.copy_(theirs.gate_proj.weight)
        ours.up.weight.copy_(theirs.up_proj.weight)
        ours.linear2.weight.copy_(theirs.down_proj.weight)
    x = torch.randn(2, 5, 48)
    torch.testing.assert_close(ours(x), theirs(x), atol=TOL, rtol=0)
    for d in (48, 128, 768, 4096):
        swiglu = 3 * d * swiglu_d_ff(d)
        gelu = 2 * d * 4 * d
        assert abs(swiglu - gelu) <= 3 * d  # within one hidden unit of equal
    assert swiglu_d_ff(4096, multiple_of=256) == 11008  # Llama-7B's intermediate_size


# --- grouped-query attention -----------------------------------------------------------------------

def test_gqa_with_as_many_kv_heads_as_heads_is_multi_head_attention():
    torch.manual_seed(0)
    mha = MultiHeadAttention(48, 6)
    torch.manual_seed(0)
    gqa = MultiHeadAttention(48, 6, num_kv_heads=6)
    x = torch.randn(2, 7, 48)
    assert torch.equal(mha(x, x, x), gqa(x, x, x))


@pytest.mark.parametrize("num_kv_heads", [1, 2, 3])
def test_gqa_shares_each_kv_head_with_its_group(num_kv_heads):
    """GQA = MHA whose K/V projections repeat each KV head's rows for its group (i // group)."""
    torch.manual_seed(1)
    gqa = MultiHeadAttention(48, 6, num_kv_heads=num_kv_heads).eval()
    mha = MultiHeadAttention(48, 6).eval()
    group, hd = 6 // num_kv_heads, 8
    with torch.no_grad():
        for name in ("q_proj", "out_proj"):
            getattr(mha, name).load_state_dict(getattr(gqa, name).state_dict())
        for name in ("k_proj", "v_proj"):
            w = getattr(gqa, name).weight.view(num_kv_heads, hd, 48).repeat_interleave(group, 0)
            b = getattr(gqa, name).bias.view(num_kv_heads, hd).repeat_interleave(group, 0)
            getattr(mha, name).weight.copy_(w.reshape(48, 48))
            getattr(mha, name).bias.copy_(b.reshape(48))
    x = torch.randn(2, 7, 48)
    mask = causal_mask(7)
    torch.testing.assert_close(gqa(x, x, x, mask), mha(x, x, x, mask), atol=TOL, rtol=0)
    assert gqa.k_proj.weight.shape == (num_kv_heads * hd, 48)


@pytest.mark.parametrize("num_kv_heads", [6, 2, 1])
@pytest.mark.parametrize("rotary", [False, True])
def test_gqa_fused_equals_readable_forward_and_backward(num_kv_heads, rotary):
    torch.manual_seed(2)
    rope = RotaryEmbedding(8, 16) if rotary else None
    attn = MultiHeadAttention(48, 6, num_kv_heads=num_kv_heads, rotary=rope)
    x = torch.randn(2, 9, 48, requires_grad=True)
    outs, grads = [], []
    for fused, is_causal in ((False, False), (True, False), (True, True)):
        attn.fused = fused
        out = attn(x, x, x, causal_mask(9), is_causal=is_causal)
        (g,) = torch.autograd.grad(out.square().sum(), x)
        outs.append(out)
        grads.append(g)
    for out, g in zip(outs[1:], grads[1:]):
        torch.testing.assert_close(out, outs[0], atol=TOL, rtol=0)
        torch.testing.assert_close(g, grads[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_gqa_cache_is_smaller_and_equals_recomputation(num_kv_heads):
    torch.manual_seed(3)
    attn = MultiHeadAttention(32, 4, num_kv_heads=num_kv_heads, rotary=RotaryEmbedding(8, 12)).eval()
    x = torch.randn(2, 10, 32)
    full = attn(x, x, x, causal_mask(10))
    cache = LayerKVCache.empty(2, attn, x)
    steps = torch.cat([cached_self_attention(attn, x[:, t : t + 1], cache, None) for t in range(10)], 1)
    torch.testing.assert_close(steps, full, atol=TOL, rtol=0)
    assert cache.self_k.shape == (2, num_kv_heads, 10, 8)
    stored = sum(t.numel() * t.element_size() for t in (cache.self_k, cache.self_v))
    assert stored == kv_cache_bytes(1, num_kv_heads, 8, tokens=10, batch_size=2)


def test_gqa_errors_say_what_to_fix():
    with pytest.raises(ValueError, match="num_heads=6 is not divisible by num_kv_heads=4"):
        MultiHeadAttention(48, 6, num_kv_heads=4)
    with pytest.raises(ValueError, match="not divisible by num_kv_heads"):
        GPTConfig(num_heads=4, num_kv_heads=3)
    attn = MultiHeadAttention(48, 6, num_kv_heads=2)
    with pytest.raises(ValueError, match="num_kv_heads=2"):
        attn.attend(torch.randn(1, 3, 48), torch.randn(1, 6, 3, 8), torch.randn(1, 6, 3, 8))


# --- the whole model -------------------------------------------------------------------------------

LLAMA_CONFIGS = {
    "course": dict(vocab_size=83, max_len=64, d_model=128, num_heads=4, num_layers=2),
    "gqa 8:2": dict(vocab_size=83, max_len=64, d_model=128, num_heads=8, num_kv_heads=2, num_layers=2),
    "tied, biases, mqa": dict(vocab_size=40, max_len=32, d_model=64, num_heads=4, num_kv_heads=1,
                              num_layers=3, tie_embeddings=True, bias=True, rope_base=500.0),
}


@pytest.mark.parametrize("name", list(LLAMA_CONFIGS))
def test_llama_style_model_equals_llama_for_causal_lm_both_ways(name):
    torch.manual_seed(4)
    config = GPTConfig.llama_style(**LLAMA_CONFIGS[name])
    ours = GPT(config).eval()
    theirs = LlamaForCausalLM(hf_llama_config(config)).eval()
    load_into_hf_llama(ours, theirs)
    ids = torch.randint(0, config.vocab_size, (3, config.max_len))
    with torch.no_grad():
        expected = theirs(ids).logits
        torch.testing.assert_close(ours(ids), expected, atol=TOL, rtol=0)
        back = from_hf_llama(theirs)
        torch.testing.assert_close(back(ids), expected, atol=TOL, rtol=0)
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters())
    assert len(llama_name_map(config)) == len(dict(ours.named_parameters()))


def test_llama_style_generation_with_cache_equals_recomputation():
    torch.manual_seed(5)
    model = GPT(GPTConfig.llama_style(vocab_size=30, max_len=24, d_model=32, num_heads=4,
                                      num_kv_heads=2, num_layers=2)).eval()
    prompt = torch.randint(0, 30, (3, 4))
    for kwargs in (dict(greedy=True), dict(temperature=0.8, top_k=10)):
        a = model.generate(prompt, 30, generator=torch.Generator().manual_seed(0), **kwargs)
        b = model.generate(prompt, 30, use_cache=False, generator=torch.Generator().manual_seed(0),
                           **kwargs)
        assert torch.equal(a, b)  # 34 > max_len: both slide the window at the end
    cache = model.start_cache(3)
    logits = torch.stack([model.step(prompt[:, t], cache) for t in range(4)], 1)
    torch.testing.assert_close(logits, model(prompt), atol=TOL, rtol=0)


def test_gpt2_rows_are_unchanged_by_the_new_options():
    """GPTConfig's defaults still build lesson 09's GPT-2: the same parameters, names and outputs."""
    torch.manual_seed(6)
    config = GPTConfig(vocab_size=30, max_len=16, d_model=32, num_heads=4, num_layers=2)
    model = GPT(config)
    assert config.d_ff == 128 and config.num_kv_heads == 4
    assert model.lm_head.weight is model.embed.token.embedding.weight
    assert {type(m).__name__ for m in model.modules()} >= {"LayerNorm", "FeedForward"}
    assert model.rotary is None


def test_hf_llama_config_refuses_a_gpt2_block():
    with pytest.raises(ValueError, match="llama_style"):
        hf_llama_config(GPTConfig())


def test_positional_none_and_sinusoidal_models_run_and_refuse_unknown_names():
    for positional in ("none", "sinusoidal"):
        model = GPT(GPTConfig(vocab_size=20, max_len=12, d_model=16, num_heads=2, num_layers=1,
                              positional=positional))
        assert model(torch.zeros(2, 12, dtype=torch.long)).shape == (2, 12, 20)
    with pytest.raises(ValueError, match="positional must be one of"):
        GPTConfig(positional="alibi")
    with pytest.raises(ValueError, match="norm must be"):
        GPTConfig(norm="batchnorm")


def test_fused_rope_training_step_is_finite():
    torch.manual_seed(7)
    model = GPT(GPTConfig.llama_style(vocab_size=20, max_len=16, d_model=32, num_heads=4,
                                      num_kv_heads=2, num_layers=1, fused_attention=True))
    ids = torch.randint(0, 20, (2, 16))
    loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())
