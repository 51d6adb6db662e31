"""Lesson-11 checkers: correct answers in several styles pass, each named mistake is caught."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _helpers import assert_checkers_keep_random_state, passes

from course_lib import MultiHeadAttention, scaled_dot_product_attention
from course_lib.checks import check_gqa, check_kv_bytes, check_rope_layout
from course_lib.checks._common import CheckFailure
from course_lib.checks.modern import KV_BATCH, KV_CONFIG, KV_TOKENS, kv_bytes_factors, kv_bytes_mistakes
from course_lib.gpt import GPT
from course_lib.modern import kv_cache_bytes
from course_lib.rope import apply_rotary, rotate_half
from course_lib.solutions import predicted_answer, solution_source


def _solution(key: str) -> dict:
    """The names a solution block defines (run with the solution file's header imports)."""
    module = importlib.import_module("course_lib.solutions.lesson11")
    namespace: dict = dict(vars(module))
    exec(solution_source(key), namespace)  # noqa: S102  (our own solution file)
    return namespace


# ----------------------------------------------------------------------------------------------
# predict: the bytes of a KV cache
# ----------------------------------------------------------------------------------------------

RIGHT = kv_cache_bytes(KV_CONFIG.num_layers, KV_CONFIG.num_kv_heads, KV_CONFIG.head_dim, KV_TOKENS,
                       KV_BATCH, 4)


def test_kv_bytes_solution_passes(capsys):
    assert passes(check_kv_bytes, _solution("11.kv_bytes")["predicted_kv_bytes"])
    assert "check_kv_bytes: right" in capsys.readouterr().out


@torch.no_grad()
def test_kv_bytes_answer_is_what_a_real_cache_holds():
    """The reveal cell's measurement: a Llama-style GPT fed KV_TOKENS tokens, one step at a time."""
    torch.manual_seed(0)
    model = GPT(KV_CONFIG).eval()
    cache = model.start_cache(KV_BATCH)
    ids = torch.randint(0, KV_CONFIG.vocab_size, (KV_BATCH, KV_TOKENS))
    for t in range(KV_TOKENS):
        model.step(ids[:, t], cache)
    measured = sum(t.numel() * t.element_size() for layer in cache.layers
                   for t in (layer.self_k, layer.self_v))
    assert measured == predicted_answer("11.kv_bytes") == RIGHT


@pytest.mark.parametrize("answer", [RIGHT, float(RIGHT), 1.92e5, torch.tensor(RIGHT),
                                    torch.tensor(float(RIGHT)), np.int64(RIGHT), np.float32(RIGHT)])
def test_kv_bytes_any_number_form_passes(answer):
    assert passes(check_kv_bytes, lambda: answer)


def test_kv_bytes_mistakes_give_different_numbers():
    values = [value for value, _ in kv_bytes_mistakes()]
    assert len(set(values)) == len(values) and RIGHT not in values
    singles = [RIGHT * factor for factor, _, _ in kv_bytes_factors()]
    assert len(set(singles)) == len(singles) and all(value == int(value) for value in singles)


@pytest.mark.parametrize(
    "answer, words",
    [
        (2 * 3 * 8 * 16 * 50 * 5 * 4, "all num_heads = 8 heads"),  # num_heads, not num_kv_heads
        (2 * 3 * 128 * 50 * 5 * 4, "all num_heads = 8 heads"),  # d_model per position
        (2 * 3 * 2 * 128 * 50 * 5 * 4, "d_model = 128 numbers per KV head"),
        (3 * 2 * 16 * 50 * 5 * 4, "keys AND values"),  # only the keys
        (2 * 3 * 2 * 16 * 50 * 5 * 2, "2 bytes per number"),  # bfloat16
        (2 * 2 * 16 * 50 * 5 * 4, "one layer"),
        (2 * 3 * 2 * 16 * 50 * 5, "number of stored numbers, not bytes"),
        (2 * 3 * 2 * 16 * 50 * 4, "one sequence"),
        (2 * 3 * 2 * 16 * 5 * 4, "the cache per token"),
        (2 * 3 * 2 * 16 * 64 * 5 * 4, "max_len = 64 positions"),
        (2 * 3 * 2 * 16 * 50 * 5 * 8, "float64"),
        (2 * 2 * 2 * 16 * 50 * 5 * 4, "you counted 2 layers"),
        (3 * 8 * 16 * 50 * 5 * 4, "all 8 heads and only the keys"),  # x2: named with float64
        (2 * 3 * 8 * 16 * 50 * 4, "two miscounts at once: all 8 heads, and one sequence"),
        (2 * 8 * 16 * 50 * 5 * 4, "two miscounts at once: all 8 heads, and one layer"),
        (2 * 3 * 2 * 16 * 50 * 5, "number of stored numbers"),
        (3 * 2 * 16 * 50 * 5, r"two miscounts at once: only the keys \(or 2 bytes per number\), "
                              "and numbers, not bytes"),
        (2 * 3 * 2 * 16 * 51 * 5 * 4, "51 positions"),
        (2 * 3 * 2 * 16 * 49 * 5 * 4, "49 positions"),
        (RIGHT + 1, "exact number of bytes"),
        (RIGHT / 1024, "kilobytes"),
        (RIGHT / 1e6, "kilobytes or megabytes"),
        (1000, "too small"),
        (10 ** 9, "too large"),
        (-RIGHT, "never negative"),
    ],
)
def test_kv_bytes_mistakes(answer, words):
    with pytest.raises(CheckFailure, match=words):
        check_kv_bytes(lambda: answer)


@pytest.mark.parametrize("answer, words", [("192000", "one number"), (None, "one number"),
                                           (True, "one number"), ((1, 2), "one number"),
                                           (float("nan"), "finite"), (float("inf"), "finite")])
def test_kv_bytes_bad_input(answer, words):
    with pytest.raises(CheckFailure, match=words):
        check_kv_bytes(lambda: answer)


def test_kv_bytes_refuses_course_lib():
    with pytest.raises(CheckFailure, match="course_lib's own functions"):
        check_kv_bytes(kv_cache_bytes)

    def predicted_kv_bytes():
        return kv_cache_bytes(3, 2, 16, 50, 5, 4)

    with pytest.raises(CheckFailure, match="calls course_lib's kv_cache_bytes"):
        check_kv_bytes(predicted_kv_bytes)


def test_kv_bytes_stub(capsys):
    def predicted_kv_bytes():
        raise NotImplementedError

    check_kv_bytes(predicted_kv_bytes)
    assert "not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# debug: the rotary layout (pairs against Hugging Face's halves)
# ----------------------------------------------------------------------------------------------


def apply_rotary_ported(x, cos, sin):
    """The lesson's broken function, as the learner finds it (without the stub's raise)."""
    a, b = x[..., 0::2], x[..., 1::2]  # (B, h, L, hd/2) each
    turned = torch.stack([-b, a], dim=-1).flatten(-2)  # (B, h, L, hd)
    return x * cos + turned * sin


def _rope(first="-x2", second="x1", split="halves", swap=False, unrotated=True, rotated=True):
    """A learner's fix with one chosen mistake (the defaults are right)."""

    def apply_rotary_fixed(x, cos, sin):
        if split == "halves":
            x1, x2 = x.chunk(2, dim=-1)
        elif split == "interleaved":
            x1, x2 = x[..., ::2], x[..., 1::2]
        elif split == "heads":
            x1, x2 = x.chunk(2, dim=1)
        else:  # along the positions
            x1, x2 = x.chunk(2, dim=-2)
        parts = {"x1": x1, "-x1": -x1, "x2": x2, "-x2": -x2}
        axis = {"positions": -2, "heads": 1}.get(split, -1)
        turned = torch.cat([parts[first], parts[second]], dim=axis)
        c, s = (sin, cos) if swap else (cos, sin)
        out = torch.zeros_like(x)
        if unrotated:
            out = out + x * c
        if rotated:
            out = out + turned * s
        return out

    return apply_rotary_fixed


def test_rope_solution_passes(capsys):
    assert passes(check_rope_layout, _solution("11.rope_layout")["apply_rotary_fixed"])
    assert "check_rope_layout: right" in capsys.readouterr().out


def _by_complex(x, cos, sin):
    half = x.size(-1) // 2
    z = torch.complex(x[..., :half], x[..., half:])  # plane i: number i + i * number (i + hd/2)
    turned = z * torch.complex(cos[..., :half], sin[..., :half])
    return torch.cat([turned.real, turned.imag], dim=-1)


def _by_library_rotate_half(x, cos, sin):
    return x * cos + rotate_half(x) * sin


def _by_hf_rotate_half(x, cos, sin):
    from transformers.models.llama.modeling_llama import rotate_half as hf_rotate_half

    return (x * cos) + (hf_rotate_half(x) * sin)


def _by_flip_and_sign(x, cos, sin):
    half = x.shape[-1] // 2
    sign = torch.cat([-torch.ones(half), torch.ones(half)])
    return x * cos + torch.roll(x, half, dims=-1) * sign * sin


@pytest.mark.parametrize("fn", [_rope(), _by_complex, _by_library_rotate_half, _by_hf_rotate_half,
                                _by_flip_and_sign])
def test_rope_other_styles_pass(fn):
    assert passes(check_rope_layout, fn)


def test_rope_the_broken_function_is_named():
    with pytest.raises(CheckFailure, match="still the pairs layout"):
        check_rope_layout(apply_rotary_ported)


def _pairs_with_reordered_tables(x, cos, sin):
    half = x.size(-1) // 2
    cos_p, sin_p = cos[..., :half].repeat_interleave(2, -1), sin[..., :half].repeat_interleave(2, -1)
    a, b = x[..., 0::2], x[..., 1::2]
    return x * cos_p + torch.stack([-b, a], dim=-1).flatten(-2) * sin_p


@pytest.mark.parametrize(
    "fn, words",
    [
        (_pairs_with_reordered_tables, "pairs layout with the tables reordered"),
        (_rope(first="x2", second="-x1"), "rotating backwards"),
        (_rope(first="x2", second="x1"), "the minus sign is missing"),
        (_rope(first="-x1", second="x2"), "the halves are not swapped"),
        (_rope(swap=True), "cos and sin swapped"),
        (_rope(split="interleaved"), "halves split the wrong way"),
        (_rope(split="positions"), "split along the wrong axis"),
        (_rope(split="heads"), "split along the heads axis"),
        (_rope(rotated=False), "the rotation is missing"),
        (_rope(unrotated=False), "the unrotated part is missing"),
    ],
)
def test_rope_mistakes(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_rope_layout(fn)


def test_rope_in_place_is_caught():
    def apply_rotary_fixed(x, cos, sin):
        turned = torch.cat([-x[..., x.size(-1) // 2:], x[..., : x.size(-1) // 2]], dim=-1)
        x.mul_(cos)  # right numbers, but the caller's x is overwritten
        return x.add_(turned * sin)

    with pytest.raises(CheckFailure, match="changes its input in place"):
        check_rope_layout(apply_rotary_fixed)

    def by_slices(x, cos, sin):
        out = x * cos + rotate_half(x) * sin
        x[...] = out
        return x

    with pytest.raises(CheckFailure, match="in place"):
        check_rope_layout(by_slices)


@pytest.mark.parametrize("half", [4, 8])
def test_rope_hard_coded_head_dim_is_caught(half):
    def apply_rotary_fixed(x, cos, sin):
        x1, x2 = x[..., :half], x[..., half:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    with pytest.raises(CheckFailure, match="Only works for one head_dim"):
        check_rope_layout(apply_rotary_fixed)


def test_rope_reshaped_tables_are_caught():
    def apply_rotary_fixed(x, cos, sin):
        return x * cos[None, None] + rotate_half(x) * sin[None, None]  # only right for (L, hd)

    with pytest.raises(CheckFailure, match="works with \\(L, head_dim\\) tables but"):
        check_rope_layout(apply_rotary_fixed)

    def by_view(x, cos, sin):
        cos, sin = cos.view(1, 1, *cos.shape[-2:]), sin.view(1, 1, *sin.shape[-2:])
        return x * cos + rotate_half(x) * sin

    with pytest.raises(CheckFailure, match="Do not reshape cos and sin"):
        check_rope_layout(by_view)


def test_rope_wrong_shape_is_caught():
    with pytest.raises(CheckFailure, match="Wrong output shape"):
        check_rope_layout(lambda x, cos, sin: (x * cos + rotate_half(x) * sin)[..., : x.size(-1) // 2])


def test_rope_refuses_the_references():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    with pytest.raises(CheckFailure, match="handed in a library's rotary function"):
        check_rope_layout(apply_rotary)
    with pytest.raises(CheckFailure, match="handed in a library's rotary function"):
        check_rope_layout(apply_rotary_pos_emb)

    def by_course_lib(x, cos, sin):
        return apply_rotary(x, cos, sin, "halves")

    def by_hf(x, cos, sin):
        return apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=0)[0]

    for fn in (by_course_lib, by_hf):
        with pytest.raises(CheckFailure, match="calls a library's rotary function"):
            check_rope_layout(fn)


def test_rope_stub(capsys):
    def apply_rotary_fixed(x, cos, sin):
        raise NotImplementedError

    check_rope_layout(apply_rotary_fixed)
    assert "not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# build: grouped-query attention
# ----------------------------------------------------------------------------------------------


def _gqa(pairing="interleave", scale="sqrt", mask_mode="normal", softmax_dim=-1):
    """A learner's grouped-query attention with one chosen mistake (the defaults are right)."""

    def grouped_query_attention(q, k, v, mask=None):
        group = q.size(1) // k.size(1)
        if pairing == "interleave":
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        elif pairing == "repeat":
            k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
        elif pairing == "k_only":
            k = k.repeat_interleave(group, 1)
        d = q.size(-1)
        divisor = {"sqrt": math.sqrt(d), "none": 1.0, "d": d, "d_model": math.sqrt(d * q.size(1))}[scale]
        scores = q @ k.transpose(-2, -1) / divisor
        if mask is not None and mask_mode == "normal":
            scores = scores.masked_fill(~mask, float("-inf"))
        elif mask is not None and mask_mode == "inverted":
            scores = scores.masked_fill(mask, float("-inf"))
        elif mask is not None and mask_mode == "float":
            scores = scores.masked_fill(mask == 0, -1e9)
        elif mask is not None and mask_mode == "zero":
            scores = scores.masked_fill(~mask, 0)
        weights = scores.softmax(dim=softmax_dim)
        if mask is not None and mask_mode == "after":
            weights = weights * mask
        return weights @ v

    return grouped_query_attention


def test_gqa_solution_passes(capsys):
    assert passes(check_gqa, _solution("11.gqa")["grouped_query_attention"])
    assert "check_gqa: all 5 cases match" in capsys.readouterr().out


def _by_expand(q, k, v, mask=None):
    B, kv, L_k, hd = k.shape
    g = q.size(1) // kv
    k = k[:, :, None].expand(B, kv, g, L_k, hd).reshape(B, kv * g, L_k, hd)
    v = v[:, :, None].expand(B, kv, g, L_k, hd).reshape(B, kv * g, L_k, hd)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _by_groups(q, k, v, mask=None):
    B, h, L_q, hd = q.shape
    kv = k.size(1)
    qg = q.view(B, kv, h // kv, L_q, hd)  # heads grouped by KV head: i = g * group + j
    scores = torch.einsum("bgjqd,bgkd->bgjqk", qg, k) * hd ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e30)
    out = torch.einsum("bgjqk,bgkd->bgjqd", scores.softmax(-1), v)
    return out.reshape(B, h, L_q, hd)


def _by_loop(q, k, v, mask=None):
    heads = []
    group = q.shape[1] // k.shape[1]
    for i in range(q.shape[1]):
        out, _ = scaled_dot_product_attention(q[:, i], k[:, i // group], v[:, i // group], mask)
        heads.append(out)
    return torch.stack(heads, dim=1)


@pytest.mark.parametrize("fn", [_gqa(), _gqa(mask_mode="float"), _by_expand, _by_groups, _by_loop])
def test_gqa_other_styles_pass(fn):
    assert passes(check_gqa, fn)


def _by_groups_wrong_order(q, k, v, mask=None):
    B, h, L_q, hd = q.shape
    kv = k.size(1)
    qg = q.view(B, h // kv, kv, L_q, hd)  # i = j * kv + g: head i gets KV head i % kv
    scores = torch.einsum("bjgqd,bgkd->bjgqk", qg, k) / math.sqrt(hd)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("bjgqk,bgkd->bjgqd", scores.softmax(-1), v).reshape(B, h, L_q, hd)


def _causal_instead(q, k, v, mask=None):
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=mask is not None)


def _per_kv_head(q, k, v, mask=None):
    B, h, L_q, hd = q.shape
    kv = k.size(1)
    q = q.view(B, kv, h // kv, L_q, hd).mean(2)  # one query per group
    return _gqa()(q, k, v, mask)


@pytest.mark.parametrize(
    "fn, words",
    [
        (_gqa(pairing="repeat"), "heads paired as i % num_kv_heads"),
        (_by_groups_wrong_order, "heads paired as i % num_kv_heads"),
        (_gqa(scale="none"), "no 1/sqrt\\(head_dim\\) scaling"),
        (_gqa(scale="d"), "divided by head_dim"),
        (_gqa(scale="d_model"), "scaled with the number of heads"),
        (_gqa(mask_mode="ignored"), "the mask is ignored"),
        (_gqa(mask_mode="inverted"), "the mask is inverted"),
        (_gqa(softmax_dim=-2), "softmax over the wrong dim"),
        (_gqa(softmax_dim=1), "softmax over the heads"),
        (_gqa(mask_mode="zero"), "0 instead of -inf"),
        (_gqa(mask_mode="after"), "applied after the softmax"),
        (_gqa(pairing="none"), "KV heads \\(of k, v or both\\) were not repeated"),
        (_gqa(pairing="k_only"), "were not repeated along dim 1"),
        (_causal_instead, "a causal mask instead of the mask given"),
        (_per_kv_head, "one row per KV head"),
        (lambda q, k, v, mask=None: (_gqa()(q, k, v, mask), None), "not a tuple"),
        (lambda q, k, v, mask=None: _gqa()(q, k, v, mask)[:, :, -1], "Wrong output shape"),
    ],
)
def test_gqa_mistakes(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_gqa(fn)


def test_gqa_in_place_is_caught():
    def grouped_query_attention(q, k, v, mask=None):
        q.mul_(1.0 / math.sqrt(q.size(-1)))  # scales the caller's q
        group = q.size(1) // k.size(1)
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = q @ k.transpose(-2, -1)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(-1) @ v

    with pytest.raises(CheckFailure, match="in place"):
        check_gqa(grouped_query_attention)


def test_gqa_refuses_sdpa_with_enable_gqa():
    def grouped_query_attention(q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    with pytest.raises(CheckFailure, match="enable_gqa=True"):
        check_gqa(grouped_query_attention)

    from torch.nn.functional import scaled_dot_product_attention as sdpa

    def by_alias(q, k, v, mask=None):
        return sdpa(q, k, v, attn_mask=mask, enable_gqa=q.size(1) != k.size(1))

    with pytest.raises(CheckFailure, match="enable_gqa=True"):
        check_gqa(by_alias)


def test_gqa_refuses_course_lib():
    with pytest.raises(CheckFailure, match="course_lib's own functions"):
        check_gqa(MultiHeadAttention)

    def grouped_query_attention(q, k, v, mask=None):
        B, h, L_q, hd = q.shape
        mha = MultiHeadAttention(h * hd, h, num_kv_heads=k.size(1), bias=False)
        mha.split_heads = lambda x, n=None: x  # noqa: ARG005 (a hack to feed heads directly)
        return mha.attend(q, k, v, mask)

    with pytest.raises(CheckFailure, match="MultiHeadAttention"):
        check_gqa(grouped_query_attention)


def test_gqa_stub(capsys):
    def grouped_query_attention(q, k, v, mask=None):
        raise NotImplementedError

    check_gqa(grouped_query_attention)
    assert "not implemented yet" in capsys.readouterr().out


def test_checkers_leave_the_global_random_state_alone():
    solutions = [(check_kv_bytes, _solution("11.kv_bytes")["predicted_kv_bytes"]),
                 (check_rope_layout, _solution("11.rope_layout")["apply_rotary_fixed"]),
                 (check_gqa, _solution("11.gqa")["grouped_query_attention"])]
    assert_checkers_keep_random_state(solutions)


def test_unknown_mistakes_get_the_difference_and_the_reference():
    rope = _solution("11.rope_layout")["apply_rotary_fixed"]
    with pytest.raises(CheckFailure,
                       match="differs from Hugging Face's apply_rotary_pos_emb .*largest difference"):
        check_rope_layout(lambda x, cos, sin: rope(x, cos, sin) * 2)
    gqa = _solution("11.gqa")["grouped_query_attention"]
    with pytest.raises(CheckFailure,
                       match="differs from F.scaled_dot_product_attention.*largest difference"):
        check_gqa(lambda q, k, v, mask=None: gqa(q, k, v, mask) * 2)


def test_rope_checker_tables_are_hugging_faces():
    """The checker's cos/sin at random positions are what LlamaRotaryEmbedding gives."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from course_lib.checks.modern import _tables

    for head_dim, base in ((8, 10000.0), (12, 500.0)):
        config = LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, rope_theta=base,
                             max_position_embeddings=256)
        positions = torch.randint(0, 200, (3, 7), generator=torch.Generator().manual_seed(0))
        cos, sin = LlamaRotaryEmbedding(config)(torch.zeros(1), positions)  # (3, 7, head_dim)
        ours_cos, ours_sin = _tables(positions, head_dim, base)
        torch.testing.assert_close(ours_cos, cos, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours_sin, sin, atol=1e-6, rtol=0)
