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
from course_lib.modern import RMSNorm, kv_cache_bytes, swiglu_d_ff
from course_lib.rope import RotaryEmbedding, apply_rotary, rotate_half
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
    with pytest.raises(CheckFailure, match="the port's, unchanged"):
        check_rope_layout(apply_rotary_ported)


def test_rope_layout_first_message_says_what_is_observed_not_the_fix():
    """Issue 38: the untouched stub (raise removed) is told what its numbers show, not the fix;
    a second failed attempt gets one more look, and the fix stays behind show_solution."""
    check_rope_layout(_solution("11.rope_layout")["apply_rotary_fixed"])  # a clean count
    messages = []
    for _ in range(2):
        with pytest.raises(CheckFailure) as failure:
            check_rope_layout(apply_rotary_ported)
        messages.append(str(failure.value))
    for n, message in enumerate(messages):
        assert "differs from Hugging Face's" in message and "keep lengths" in message
        assert "show_solution" in message
        for fix in ("rotate_half", "-x2", "x1, x2", "x[..., :", "i + head_dim/2", "cat"):
            assert fix not in message, fix
        assert n == 1 or "halves" not in message  # the second look may name the layout to print
    assert "find the columns" in messages[1] and "find the columns" not in messages[0]


def _pairs_with_reordered_tables(x, cos, sin):
    half = x.size(-1) // 2
    cos_p, sin_p = cos[..., :half].repeat_interleave(2, -1), sin[..., :half].repeat_interleave(2, -1)
    a, b = x[..., 0::2], x[..., 1::2]
    return x * cos_p + torch.stack([-b, a], dim=-1).flatten(-2) * sin_p


@pytest.mark.parametrize(
    "fn, words",
    [
        (_pairs_with_reordered_tables, "pairs layout with the tables reordered"),
        (_rope(first="x2", second="-x1"), "each plane turns backwards"),
        (_rope(first="x2", second="x1"), "not a rotation: lengths change"),
        (_rope(first="-x1", second="x2"), "each number stays in its half"),
        (_rope(swap=True), "position 0 is not left alone"),
        (_rope(split="interleaved"), "paired with the wrong partners"),
        (_rope(split="positions"), "mixed across positions"),
        (_rope(split="heads"), "mixed across heads"),
        (_rope(rotated=False), "only scaled"),
        (_rope(unrotated=False), "x itself is missing"),
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


# ----------------------------------------------------------------------------------------------
# every checker: no raw error, float64 compared (issue #24's defect classes)
# ----------------------------------------------------------------------------------------------

from torch import nn  # noqa: E402

from course_lib.checks import (  # noqa: E402
    check_apply_rope, check_rmsnorm, check_rope_decode, check_swiglu,
)


def test_rope_layout_float64_answers_are_compared_not_refused():
    right = _solution("11.rope_layout")["apply_rotary_fixed"]
    assert passes(check_rope_layout, lambda x, c, s: right(x.double(), c.double(), s.double()))
    with pytest.raises(CheckFailure, match="the port's, unchanged"):
        check_rope_layout(lambda x, c, s: apply_rotary_ported(x.double(), c.double(), s.double()))


@pytest.mark.parametrize("check, answer", [
    (check_rope_layout, lambda x, c, s: "not a tensor"),
    (check_gqa, lambda q, k, v, mask=None: [q]),
    (check_apply_rope, lambda x, p, base=10000.0: torch.zeros(2, 2, dtype=torch.long)),
    (check_rmsnorm, lambda d, eps=1e-6: nn.Identity()),
    (check_swiglu, lambda d: 5),
    (check_rope_decode, lambda layer, x_t, t, cache: (x_t, None)),
])
def test_checkers_answer_with_a_check_failure_never_a_raw_error(check, answer):
    with pytest.raises(CheckFailure):
        check(answer)


# ----------------------------------------------------------------------------------------------
# check_rmsnorm
# ----------------------------------------------------------------------------------------------


def _rmsnorm(formula, bias=False, init=torch.ones):
    """A learner's RMSNorm whose forward is ``formula(x, weight, eps)``."""

    class MyRMSNorm(nn.Module):
        def __init__(self, d_model, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(init(d_model))
            if bias:
                self.bias = nn.Parameter(torch.zeros(d_model))
            self.eps = eps

        def forward(self, x):
            return formula(x, self.weight, self.eps)

    return MyRMSNorm


def _rms_float32_inside(x, w, eps):  # Hugging Face's style: float32 inside, rsqrt
    x32 = x.float()
    return (w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


def _rms_loop(x, w, eps):  # one vector at a time
    flat = x.reshape(-1, x.size(-1))
    rows = [v / math.sqrt(sum(float(a) ** 2 for a in v) / len(v) + eps) for v in flat]
    return (torch.stack(rows) * w).reshape(x.shape)


def _rms_norm_fn(x, w, eps):  # through the vector norm
    return x / (torch.linalg.vector_norm(x, dim=-1, keepdim=True) ** 2 / x.size(-1) + eps).sqrt() * w


def test_rmsnorm_solution_passes(capsys):
    assert passes(check_rmsnorm, _solution("11.rmsnorm")["MyRMSNorm"])
    assert "check_rmsnorm: right" in capsys.readouterr().out


def _rms_einsum_float64(x, w, eps):  # float64 inside, the mean square by einsum
    x64 = x.double()
    ms = torch.einsum("...d,...d->...", x64, x64)[..., None] / x.size(-1)
    return (x64 / (ms + eps).sqrt() * w.double()).to(x.dtype)


def _decorated(decorator, formula):
    @decorator
    def forward(x, w, eps):
        return formula(x, w, eps)

    return forward


@pytest.mark.parametrize("formula", [_rms_float32_inside, _rms_loop, _rms_norm_fn, _rms_einsum_float64,
                                     _decorated(torch.no_grad(), _rms_float32_inside),
                                     _decorated(torch.inference_mode(), _rms_float32_inside)])
def test_rmsnorm_other_styles_pass(formula):
    assert passes(check_rmsnorm, _rmsnorm(formula))


@pytest.mark.parametrize("formula, words", [
    (lambda x, w, e: F.rms_norm(x, (x.size(-1),), w, e), "calls F.rms_norm, PyTorch's own RMSNorm"),
    (lambda x, w, e: torch.rms_norm(x, (x.size(-1),), w, e), "calls torch.rms_norm"),
    (lambda x, w, e: nn.functional.rms_norm(x, [x.size(-1)], eps=e) * w, "calls F.rms_norm"),
])
def test_rmsnorm_refuses_pytorchs_ready_made_one_kindly(formula, words):
    """Issue 38: PyTorch's RMSNorm, as a function or a module, refused with one friendly message;
    its building blocks stay welcome (the styles above use rsqrt, einsum, vector_norm)."""
    with pytest.raises(CheckFailure, match=words) as failure:
        check_rmsnorm(_rmsnorm(formula))
    assert "the very thing this exercise builds" in str(failure.value)

    class Wrapped(nn.Module):
        def __init__(self, d_model, eps=1e-6):
            super().__init__()
            self.norm = nn.RMSNorm(d_model, eps=eps)

        def forward(self, x):
            return self.norm(x)

    class Subclass(nn.RMSNorm):
        pass

    for cls in (Wrapped, Subclass, nn.RMSNorm):
        with pytest.raises(CheckFailure, match="the very thing this exercise builds"):
            check_rmsnorm(cls)


def _ms(x):
    return x.pow(2).mean(-1, keepdim=True)


RMS_MISTAKES = [
    (lambda x, w, e: x / torch.sqrt(x.var(-1, keepdim=True) + e) * w, "torch.var instead of the mean"),
    (lambda x, w, e: x / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + e) * w,
     r"torch.var\(unbiased=False\)"),
    (lambda x, w, e: (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False)
                                                                 + e) * w, "that is LayerNorm"),
    (lambda x, w, e: (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + e) * w,
     "subtracted, with torch.var's unbiased"),
    (lambda x, w, e: x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) / (x.size(-1) - 1) + e) * w,
     "divided by d - 1"),
    (lambda x, w, e: x / (_ms(x).sqrt() + e) * w, "eps outside the square root"),
    (lambda x, w, e: x / _ms(x).sqrt() * w, "eps is missing"),
    (lambda x, w, e: x / (_ms(x) + e) * w, "square root is missing"),
    (lambda x, w, e: x / torch.sqrt(_ms(x) + e), "gain is not applied"),
    (lambda x, w, e: x / torch.sqrt(_ms(x) + e) / w, "gain divides"),
    (lambda x, w, e: x / torch.sqrt(x.pow(2).mean(0, keepdim=True) + e) * w, r"wrong axis \(dim 0"),
    (lambda x, w, e: x / torch.sqrt(x.pow(2).mean(-2, keepdim=True) + e) * w, r"wrong axis \(dim -2"),
    (lambda x, w, e: x / torch.sqrt(x.pow(2).mean() + e) * w, "whole tensor"),
    (lambda x, w, e: x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + e) * w, "the norm instead"),
    # issue 38: a raw size error before; the module's eps replaced by a number
    (lambda x, w, e: x / torch.sqrt(x.pow(2).mean(-1) + e) * w, "without keepdim"),
    (lambda x, w, e: x * torch.rsqrt(x.pow(2).mean(dim=-1) + e) * w, "without keepdim"),
    (lambda x, w, e: x / torch.sqrt(_ms(x) + 1e-6) * w, r"eps written in as a number \(1e-06\)"),
    (lambda x, w, e: x / torch.sqrt(_ms(x) + 1e-5) * w, r"eps written in as a number \(1e-05\)"),
    # a blind tryout's (2026-11-27): computed in float32 "for stability", never cast back
    (lambda x, w, e: x.float() / torch.sqrt(_ms(x.float()) + e) * w, "torch.float32 for a torch.float64 input"),
]


@pytest.mark.parametrize("formula, words", RMS_MISTAKES)
def test_rmsnorm_mistakes_are_named(formula, words):
    with pytest.raises(CheckFailure, match=words):
        check_rmsnorm(_rmsnorm(formula))


def test_rmsnorm_module_mistakes_are_named():
    right = _rms_float32_inside
    with pytest.raises(CheckFailure, match="No bias"):
        check_rmsnorm(_rmsnorm(right, bias=True))
    with pytest.raises(CheckFailure, match="start at ones"):
        check_rmsnorm(_rmsnorm(right, init=torch.randn))

    class NoWeight(nn.Module):
        def __init__(self, d_model, eps=1e-6):
            super().__init__()
            self.eps = eps

        def forward(self, x):
            return x / torch.sqrt(_ms(x) + self.eps)

    with pytest.raises(CheckFailure, match="no parameters"):
        check_rmsnorm(NoWeight)

    class Gain(nn.Module):
        def __init__(self, d_model, eps=1e-6):
            super().__init__()
            self.gain, self.eps = nn.Parameter(torch.ones(d_model)), eps

    with pytest.raises(CheckFailure, match="Name the gain self.weight"):
        check_rmsnorm(Gain)
    with pytest.raises(CheckFailure, match="library's RMSNorm"):
        check_rmsnorm(RMSNorm)


# ----------------------------------------------------------------------------------------------
# check_swiglu
# ----------------------------------------------------------------------------------------------


def _swiglu(width=lambda d: round(8 * d / 3), wiring=None, bias=False, names=("gate", "up", "down")):
    class MySwiGLU(nn.Module):
        def __init__(self, d_model):
            super().__init__()
            d_ff = width(d_model)
            for name, shape in zip(names, ((d_model, d_ff), (d_model, d_ff), (d_ff, d_model))):
                setattr(self, name, nn.Linear(*shape, bias=bias))

        def forward(self, x):
            g, u, o = (getattr(self, n) for n in names)
            return wiring(x, g, u, o) if wiring else o(F.silu(g(x)) * u(x))

    return MySwiGLU


def test_swiglu_solution_passes(capsys):
    assert passes(check_swiglu, _solution("11.swiglu")["MySwiGLU"])
    assert "check_swiglu: right" in capsys.readouterr().out


@pytest.mark.parametrize("module", [
    _swiglu(width=lambda d: int(2 / 3 * 4 * d + 0.5)),
    _swiglu(width=lambda d: -(-8 * d // 3) if (8 * d) % 3 == 2 else 8 * d // 3,
            wiring=lambda x, g, u, o: o(g(x) * torch.sigmoid(g(x)) * u(x))),  # SiLU written out
    _swiglu(wiring=lambda x, g, u, o: F.linear(F.silu(F.linear(x, g.weight)) * F.linear(x, u.weight),
                                               o.weight)),
])
def test_swiglu_other_styles_pass(module):
    assert passes(check_swiglu, module)


@pytest.mark.parametrize("module, words", [
    (_swiglu(width=lambda d: 4 * d), "GELU's width"),
    (_swiglu(width=lambda d: 8 * d // 3), "rounded DOWN"),
    (_swiglu(width=lambda d: round(2 * d / 3)), "2/3 of d_model"),
    (_swiglu(width=lambda d: round(4 * d / 3)), "one GELU matrix"),
    (_swiglu(width=lambda d: 8 * d / 3), "must be an int"),
    (_swiglu(bias=True), "no biases"),
    (_swiglu(names=("w1", "w3", "w2")), "no nn.Linear named 'gate'"),
    (_swiglu(wiring=lambda x, g, u, o: o(F.silu(u(x)) * g(x))), "gate and up swapped"),
    (_swiglu(wiring=lambda x, g, u, o: o(F.silu(g(x) * u(x)))), "SiLU on the product"),
    (_swiglu(wiring=lambda x, g, u, o: o(F.silu(g(x)) * F.silu(u(x)))), "SiLU on both"),
    (_swiglu(wiring=lambda x, g, u, o: o(torch.sigmoid(g(x)) * u(x))), "that is GLU"),
    (_swiglu(wiring=lambda x, g, u, o: o(F.gelu(g(x)) * u(x))), "GEGLU"),
    (_swiglu(wiring=lambda x, g, u, o: o(F.relu(g(x)) * u(x))), "ReGLU"),
    (_swiglu(wiring=lambda x, g, u, o: o(F.silu(g(x)) + u(x))), "added, not multiplied"),
    (_swiglu(wiring=lambda x, g, u, o: o(F.silu(g(x)))), "up is not used"),
    (_swiglu(wiring=lambda x, g, u, o: F.silu(g(x)) * u(x)), "down maps back"),
])
def test_swiglu_mistakes_are_named(module, words):
    with pytest.raises(CheckFailure, match=words):
        check_swiglu(module)


def test_swiglu_refuses_the_sizing_function():
    with pytest.raises(CheckFailure, match="swiglu_d_ff"):
        check_swiglu(_swiglu(width=lambda d: swiglu_d_ff(d)))


# ----------------------------------------------------------------------------------------------
# check_apply_rope
# ----------------------------------------------------------------------------------------------


def _rope_by_complex(x, positions, base=10000.0):
    half = x.size(-1) // 2
    theta = 1.0 / base ** (torch.arange(0, x.size(-1), 2).double() / x.size(-1))
    turn = torch.polar(torch.ones(len(positions), half, dtype=torch.float64),
                       positions[:, None].double() * theta)  # (L, hd/2) unit complex numbers
    z = torch.complex(x[..., :half].double(), x[..., half:].double()) * turn
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)


def _rope_by_loops(x, positions, base=10000.0):
    out = x.clone()
    hd = x.size(-1)
    for j, m in enumerate(positions.tolist()):
        for i in range(hd // 2):
            a = m * base ** (-2 * i / hd)
            u, v = x[..., j, i], x[..., j, i + hd // 2]
            out[..., j, i] = u * math.cos(a) - v * math.sin(a)
            out[..., j, i + hd // 2] = u * math.sin(a) + v * math.cos(a)
    return out


def _rope_by_rotate_half_float32(x, positions, base=10000.0):
    hd = x.size(-1)
    theta = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    angles = positions[:, None].float() * theta
    angles = torch.cat([angles, angles], dim=-1)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * angles.cos() + torch.cat([-x2, x1], dim=-1) * angles.sin()  # float64 in: float64 out


def test_apply_rope_solution_passes(capsys):
    assert passes(check_apply_rope, _solution("11.apply_rope")["apply_rope"])
    assert "check_apply_rope: right" in capsys.readouterr().out


def _rope_by_einsum(x, positions, base=10000.0):
    hd = x.size(-1)
    theta = base ** (-2 * torch.arange(hd // 2, dtype=torch.float64) / hd)
    angles = torch.einsum("l,i->li", positions.double(), theta)  # the outer product, by einsum
    c, s_ = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return torch.cat([x1 * c - x2 * s_, x1 * s_ + x2 * c], dim=-1)


def _rope_decorated(decorator):
    right = _solution("11.apply_rope")["apply_rope"]

    @decorator
    def apply_rope(x, positions, base=10000.0):
        return right(x, positions, base)

    return apply_rope


@pytest.mark.parametrize("fn", [_rope_by_complex, _rope_by_loops, _rope_by_rotate_half_float32,
                                _rope_by_einsum, _rope_decorated(torch.no_grad()),
                                _rope_decorated(torch.inference_mode())])
def test_apply_rope_other_styles_pass(fn):
    """Issue 38: code under @torch.no_grad() or @torch.inference_mode() shares the decorator's
    wrapper code with Hugging Face's decorated LlamaRotaryEmbedding.forward, and passes."""
    assert passes(check_apply_rope, fn)


def test_apply_rope_still_refuses_hugging_faces_decorated_rotary():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    @torch.no_grad()
    def apply_rope(x, positions, base=10000.0):
        config = LlamaConfig(hidden_size=2 * x.size(-1), num_attention_heads=2, rope_theta=base,
                             max_position_embeddings=64)
        cos, sin = LlamaRotaryEmbedding(config)(x, positions[None])  # (1, L, hd)
        x1, x2 = x[..., : x.size(-1) // 2], x[..., x.size(-1) // 2:]
        return x * cos[0].to(x.dtype) + torch.cat([-x2, x1], -1) * sin[0].to(x.dtype)

    with pytest.raises(CheckFailure, match="library's rotary code"):
        check_apply_rope(apply_rope)


def _rope_table_variant(table="cat", rotation="halves", outer=True, exponent=lambda i, hd: -2 * i / hd):
    """A learner's apply_rope building the (L, hd) table first, then ``x cos + rotate(x) sin``."""

    def apply_rope(x, positions, base=10000.0):
        hd = x.size(-1)
        theta = base ** exponent(torch.arange(hd // 2), hd)
        angles = positions[:, None] * theta[None, :] if outer else positions * theta
        angles = torch.cat([angles, angles], -1) if table == "cat" else angles.repeat_interleave(2, -1)
        if rotation == "halves":
            turned = torch.cat([-x[..., hd // 2:], x[..., : hd // 2]], dim=-1)
        else:
            turned = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
        return x * angles.cos().to(x.dtype) + turned * angles.sin().to(x.dtype)

    return apply_rope


def _rope_variant(shift=0, two=2.0, sign=-1.0, flip=1.0, layout="halves", swap=False,
                  own_positions=False, first_half_only=False, head_dim=None):
    def apply_rope(x, positions, base=10000.0):
        hd = head_dim or x.size(-1)
        p = torch.arange(len(positions)) if own_positions else positions
        i = torch.arange(hd // 2, dtype=torch.float64)
        angles = (p.double() + shift)[:, None] * base ** (sign * two * i / hd)
        c, s = angles.cos().to(x.dtype), (flip * angles).sin().to(x.dtype)
        if swap:
            c, s = s, c
        if layout == "pairs":
            a, b = x[..., 0::2], x[..., 1::2]
            return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        if first_half_only:
            return torch.cat([x1 * c - x2 * s, x2], dim=-1)
        return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)

    return apply_rope


@pytest.mark.parametrize("fn, words", [
    (_rope_variant(shift=1), "1-based positions"),
    (_rope_variant(own_positions=True), "0..L-1 instead of the positions given"),
    (_rope_variant(layout="pairs"), "pairs layout"),
    (_rope_variant(flip=-1.0), "sign is flipped"),
    (_rope_variant(two=1.0), "the 2 is missing"),
    (_rope_variant(sign=1.0), "the minus is missing"),
    (_rope_variant(two=4.0), "-4i"),
    (_rope_variant(swap=True), "cos and sin swapped"),
    (_rope_variant(first_half_only=True), "only the first half"),
    (_rope_variant(head_dim=8), "Only right for another head_dim"),
    # issue 38: a raw size error before; the interleaved table; floor division in the exponent
    (_rope_table_variant(outer=False), "without an outer product"),
    (_rope_table_variant(table="interleave"), "an interleaved table with the halves rotation"),
    (_rope_table_variant(rotation="pairs"), "the halves table with the pairs rotation"),
    (_rope_table_variant(exponent=lambda i, hd: -(2 * i // hd)), "every plane turns at 1 radian"),
    (_rope_table_variant(exponent=lambda i, hd: -2 * i // hd), "rounded down to -1"),
    (_rope_table_variant(exponent=lambda i, hd: -torch.arange(0, hd, 2) // hd), "rounded down to -1"),
    (_rope_table_variant(exponent=lambda i, hd: -(torch.arange(0, hd, 2) // hd)),
     "every plane turns at 1 radian"),
])
def test_apply_rope_mistakes_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_apply_rope(fn)


def test_apply_rope_refuses_the_library():
    with pytest.raises(CheckFailure, match="library's rotary"):
        check_apply_rope(lambda x, p, base=10000.0: apply_rotary(x, torch.ones(x.size(-1)),
                                                                  torch.zeros(x.size(-1))))


# ----------------------------------------------------------------------------------------------
# check_rope_decode (★★★)
# ----------------------------------------------------------------------------------------------


def _decode_solution():
    namespace = _solution("11.apply_rope")
    exec(solution_source("11.gqa"), namespace)  # noqa: S102
    namespace["rope_at"], namespace["attend"] = namespace["apply_rope"], namespace["grouped_query_attention"]
    exec(solution_source("11.rope_decode"), namespace)  # noqa: S102
    return namespace


def _decode_variant(knob=""):
    ns = _decode_solution()
    apply_rope, attend = ns["apply_rope"], ns["grouped_query_attention"]

    def rope_decode_step(layer, x_t, t, cache):
        kv = layer.num_kv_heads
        q = layer.split_heads(layer.q_proj(x_t))
        k = layer.split_heads(layer.k_proj(x_t), kv)
        v = layer.split_heads(layer.v_proj(x_t), kv)
        pos = torch.tensor([{"pos0": 0, "one_based": t + 1}.get(knob, t)])
        if knob == "q_prev":  # the query one position behind its own key
            q = apply_rope(q, torch.tensor([max(t - 1, 0)]))
        elif knob != "q_unturned":
            q = apply_rope(q, pos)
        if knob not in ("k_unturned", "unturned_cache", "whole_at_t", "cache_unturned"):
            k = apply_rope(k, pos)
        if knob == "turn_v":
            v = apply_rope(v, pos)
        past = cache
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        keys, values = k, v
        if knob in ("unturned_cache", "turned_twice"):  # turn the whole cache by 0..t each step
            keys = apply_rope(k, torch.arange(t + 1))
        if knob == "whole_at_t":  # the whole cache turned at t, and kept so
            keys = k = apply_rope(k, torch.tensor([t]))
        if knob == "cache_unturned":  # the new key turned for attending, stored unturned
            keys = torch.cat([k[:, :, :-1], apply_rope(k[:, :, -1:], pos)], dim=2)
        if knob == "past_only":
            if past is None:
                return layer.out_proj(layer.merge_heads(torch.zeros_like(q))), (k, v)
            keys, values = past
        if knob == "new_only":
            keys, values = keys[:, :, -1:], values[:, :, -1:]
        mask = None
        if knob == "tril_mask":  # a (1, t + 1) causal mask: only column 0 is True
            mask = torch.ones(1, t + 1, dtype=torch.bool).tril()
        if knob == "modulo":
            group = layer.num_heads // kv
            heads = F.scaled_dot_product_attention(q, keys.repeat(1, group, 1, 1),
                                                   values.repeat(1, group, 1, 1))
        elif knob == "no_scale":
            group = layer.num_heads // kv
            heads = F.scaled_dot_product_attention(q, keys.repeat_interleave(group, 1),
                                                   values.repeat_interleave(group, 1), scale=1.0)
        else:
            heads = attend(q, keys, values, mask)
        merged = layer.merge_heads(heads)
        return (merged if knob == "no_out_proj" else layer.out_proj(merged)), (k, v)

    return rope_decode_step


def test_rope_decode_solution_passes(capsys):
    assert passes(check_rope_decode, _decode_solution()["rope_decode_step"])
    assert "check_rope_decode: on all" in capsys.readouterr().out


def _decode_by_einsum_float64(layer, x_t, t, cache):
    """Every number in float64, heads grouped by a view and einsum, the angles written out."""
    h, kv, hd = layer.num_heads, layer.num_kv_heads, layer.head_dim
    B = x_t.size(0)

    def proj(m, heads):
        y = F.linear(x_t.double(), m.weight.double(), None if m.bias is None else m.bias.double())
        return y.view(B, 1, heads, hd).transpose(1, 2)  # (B, heads, 1, hd)

    def turn(z):
        theta = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        a = t * theta
        z1, z2 = z[..., : hd // 2], z[..., hd // 2:]
        return torch.cat([z1 * a.cos() - z2 * a.sin(), z1 * a.sin() + z2 * a.cos()], -1)

    q, k, v = turn(proj(layer.q_proj, h)), turn(proj(layer.k_proj, kv)), proj(layer.v_proj, kv)
    if cache is not None:
        k, v = torch.cat([cache[0].double(), k], 2), torch.cat([cache[1].double(), v], 2)
    qg = q.view(B, kv, h // kv, 1, hd)  # (B, kv, group, 1, hd): query head i -> KV head i // group
    w = torch.einsum("bkgqd,bksd->bkgqs", qg, k).div(math.sqrt(hd)).softmax(-1)
    heads = torch.einsum("bkgqs,bksd->bkgqd", w, v).reshape(B, h, 1, hd)
    out = F.linear(heads.transpose(1, 2).reshape(B, 1, h * hd), layer.out_proj.weight.double(),
                   None if layer.out_proj.bias is None else layer.out_proj.bias.double())
    return out, (k, v)


def _decode_one_sequence_at_a_time(layer, x_t, t, cache):
    right = _decode_solution()["rope_decode_step"]
    outs, ks, vs = [], [], []
    for b in range(x_t.size(0)):
        one = None if cache is None else (cache[0][b : b + 1], cache[1][b : b + 1])
        out, (k, v) = right(layer, x_t[b : b + 1], t, one)
        outs.append(out), ks.append(k), vs.append(v)
    return torch.cat(outs), (torch.cat(ks), torch.cat(vs))


def _decode_decorated(decorator):
    right = _decode_solution()["rope_decode_step"]

    @decorator
    def rope_decode_step(layer, x_t, t, cache):
        return right(layer, x_t, t, cache)

    return rope_decode_step


@pytest.mark.parametrize("fn", [
    _decode_variant(), _decode_by_einsum_float64, _decode_one_sequence_at_a_time,
    _decode_decorated(torch.no_grad()), _decode_decorated(torch.inference_mode()),
])
def test_rope_decode_other_styles_pass(fn):
    assert passes(check_rope_decode, fn)


@pytest.mark.parametrize("knob, words", [
    ("pos0", "turned at position 0"), ("q_unturned", "query is not turned"),
    ("k_unturned", "new key is not turned"), ("turn_v", "values are turned"),
    ("turned_twice", "turned twice"), ("past_only", "does not see itself"),
    ("new_only", "cache is not used"), ("modulo", "i % num_kv_heads"), ("no_scale", "sqrt"),
    # issue 38: positions 1..t+1 (the prompt's cache makes the offset show), the (1, t+1) tril mask,
    # the whole cache turned at t (observed: keys turned again by t, not by their own positions),
    # the turned keys of the cache turned again each step, a forgotten out_proj, an unturned cache
    ("one_based", "positions counted from 1"), ("tril_mask", "attends to position 0 only"),
    ("whole_at_t", "turned again, all by the new position t"), ("unturned_cache", "turned twice"),
    ("no_out_proj", "out_proj is not applied"), ("cache_unturned", "appends to the cache .* is not turned"),
    ("q_prev", "query is turned by t - 1 and the new key by t"),  # a blind tryout's, 2026-11-27
])
def test_rope_decode_mistakes_are_named(knob, words):
    with pytest.raises(CheckFailure, match=words):
        check_rope_decode(_decode_variant(knob))


def test_rope_decode_whole_cache_at_t_is_not_told_position_0():
    """Issue 38: the learner who turns every key by t has already turned the new one by t."""
    with pytest.raises(CheckFailure) as failure:
        check_rope_decode(_decode_variant("whole_at_t"))
    assert "position 0" not in str(failure.value) and "own position" in str(failure.value)


def test_rope_decode_starts_from_a_prompt_in_the_cache():
    """The checker's first case hands over a prefilled cache with two-digit positions."""
    from course_lib.checks.modern import _DECODE_CASES

    seen = []

    def rope_decode_step(layer, x_t, t, cache):
        seen.append((t, None if cache is None else cache[0].size(2)))
        return _decode_solution()["rope_decode_step"](layer, x_t, t, cache)

    assert passes(check_rope_decode, rope_decode_step)
    assert seen[0] == (_DECODE_CASES[0][5], _DECODE_CASES[0][5]) and seen[0][0] >= 10
    assert (0, None) in seen  # and one case starts from no cache


def test_rope_decode_cache_shape_and_refusals():
    right = _decode_solution()["rope_decode_step"]

    def repeated_cache(layer, x_t, t, cache):
        out, (k, v) = right(layer, x_t, t, cache)
        group = layer.num_heads // layer.num_kv_heads
        return out, (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)) if group > 1 else (k, v)

    with pytest.raises(CheckFailure, match="Keep num_kv_heads heads in the cache"):
        check_rope_decode(repeated_cache)
    with pytest.raises(CheckFailure, match="a pair"):
        check_rope_decode(lambda layer, x_t, t, cache: right(layer, x_t, t, cache)[0])

    def with_library(layer, x_t, t, cache):
        RotaryEmbedding(layer.head_dim, t + 1)(layer.split_heads(layer.q_proj(x_t)), start=t)
        return right(layer, x_t, t, cache)

    with pytest.raises(CheckFailure, match="library's rotary"):
        check_rope_decode(with_library)

    def in_place(layer, x_t, t, cache):
        out, (k, v) = right(layer, x_t, t, cache)
        if cache is not None:
            cache[0].zero_()
        return out, (k, v)

    with pytest.raises(CheckFailure, match="changes the cache it received in place"):
        check_rope_decode(in_place)


# ----------------------------------------------------------------------------------------------
# check_gqa: sizes (issue #24: wrong repeat count, sizes hard-coded at the lesson's head size)
# ----------------------------------------------------------------------------------------------


def _gqa_hard_coded(q, k, v, mask=None):
    k, v = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)  # the lesson's 8 : 2
    scores = q @ k.transpose(-2, -1) / 4.0  # sqrt(16), the lesson's head_dim
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


def _gqa_repeats(times):
    def grouped_query_attention(q, k, v, mask=None):
        n = times(q.size(1), k.size(1))
        k, v = k.repeat_interleave(n, dim=1), v.repeat_interleave(n, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    return grouped_query_attention


@pytest.mark.parametrize("fn, words", [
    (_gqa_hard_coded, "Hard-coded sizes.*lesson's own sizes"),
    (_gqa_repeats(lambda h, kv: kv), "repeated the wrong number of times.*not num_kv_heads"),
    (_gqa_repeats(lambda h, kv: h), "repeated the wrong number of times.*not num_heads"),
])
def test_gqa_size_mistakes_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_gqa(fn)


def test_gqa_on_lesson_01s_attention_passes():
    def grouped_query_attention(q, k, v, mask=None):
        group = q.size(1) // k.size(1)
        out, _ = scaled_dot_product_attention(q, k.repeat_interleave(group, 1),
                                              v.repeat_interleave(group, 1), mask)
        return out

    assert passes(check_gqa, grouped_query_attention)


def test_new_checkers_leave_the_global_random_state_alone():
    ns = _decode_solution()
    assert_checkers_keep_random_state([
        (check_rmsnorm, _solution("11.rmsnorm")["MyRMSNorm"]),
        (check_swiglu, _solution("11.swiglu")["MySwiGLU"]),
        (check_apply_rope, ns["apply_rope"]), (check_rope_decode, ns["rope_decode_step"])])


@pytest.mark.parametrize("check, name", [(check_rmsnorm, "MyRMSNorm"), (check_swiglu, "MySwiGLU"),
                                         (check_apply_rope, "apply_rope"),
                                         (check_rope_decode, "rope_decode_step")])
def test_new_stubs_print_a_reminder(check, name, capsys):
    def stub(*args, **kwargs):
        raise NotImplementedError

    stub.__name__ = name
    check(stub)
    assert "not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# issue 38, h11's learner tryout: the attempts that got a generic line, a raw error or a wrong name
# ----------------------------------------------------------------------------------------------


def _rope_unpacks_4_dims(x, positions, base=10000.0):
    B, h, L, hd = x.shape  # only right when x has a heads dim
    return _solution("11.apply_rope")["apply_rope"](x, positions, base)


@pytest.mark.parametrize("fn, words", [
    (_rope_table_variant(outer=False), "without an outer product"),  # again, as found
    (lambda x, p, base=10000.0: _rope_transposed(x, p, base), r"the angle table transposed, \(head_dim/2, L\)"),
    (_rope_unpacks_4_dims, "Only right for x with 4 dims"),
])
def test_apply_rope_tryout_mistakes_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_apply_rope(fn)


def _rope_transposed(x, positions, base=10000.0):
    hd = x.size(-1)
    theta = 1.0 / base ** (torch.arange(0, hd, 2).float() / hd)
    angles = (positions[None, :].float() * theta[:, None])  # (hd/2, L): the transpose
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return torch.cat([x1 * angles.cos() - x2 * angles.sin(), x1 * angles.sin() + x2 * angles.cos()], -1)


def test_rope_layout_tryout_mistake_is_named():
    def apply_rotary_fixed(x, cos, sin):  # the halves split, stacked back in pairs
        half = x.size(-1) // 2
        a, b = x[..., :half], x[..., half:]
        return x * cos + torch.stack([-b, a], dim=-1).flatten(-2) * sin

    with pytest.raises(CheckFailure, match="the turned numbers land in the wrong places"):
        check_rope_layout(apply_rotary_fixed)


def _decode_tryout(pos=None, sdpa_direct=False, scale=None, swap_cache=False):
    ns = _decode_solution()
    apply_rope, attend = ns["apply_rope"], ns["grouped_query_attention"]

    def rope_decode_step(layer, x_t, t, cache):
        kv = layer.num_kv_heads
        q, k = layer.split_heads(layer.q_proj(x_t)), layer.split_heads(layer.k_proj(x_t), kv)
        v = layer.split_heads(layer.v_proj(x_t), kv)
        p = torch.tensor([pos(t) if pos else t])
        q, k = apply_rope(q, p), apply_rope(k, p)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        if sdpa_direct:  # the KV heads never shared out among the query heads
            heads = F.scaled_dot_product_attention(q, k, v)
        elif scale:
            g = layer.num_heads // kv
            heads = F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1),
                                                   v.repeat_interleave(g, 1), scale=scale(layer))
        else:
            heads = attend(q, k, v)
        return layer.out_proj(layer.merge_heads(heads)), ((v, k) if swap_cache else (k, v))

    return rope_decode_step


@pytest.mark.parametrize("fn, words", [
    (_decode_tryout(pos=lambda t: max(t - 1, 0)), "turned at position t - 1"),
    (_decode_tryout(sdpa_direct=True), "the query heads meet the KV heads unshared"),
    (_decode_tryout(scale=lambda layer: (layer.num_heads * layer.head_dim) ** -0.5), r"sqrt\(d_model\)"),
    (_decode_tryout(swap_cache=True), r"is \(v, k\)"),
])
def test_rope_decode_tryout_mistakes_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_rope_decode(fn)


@pytest.mark.parametrize("formula, words", [
    (lambda x, w, e: x / torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True)) * w + e, "eps added to the output"),
    (lambda x, w, e: w * x / (x.abs().mean(-1, keepdim=True) + e), "mean absolute value"),
])
def test_rmsnorm_tryout_mistakes_are_named(formula, words):
    with pytest.raises(CheckFailure, match=words):
        check_rmsnorm(_rmsnorm(formula))


@pytest.mark.parametrize("turn, theta, words", [
    (None, lambda hd, b: b ** (-2 * torch.arange(1, hd // 2 + 1).float() / hd), "counted from i = 1"),
    (lambda x1, x2, c, s: torch.cat([x1 * c - x2 * s] * 2, -1), None, "the first half's formula"),
])
def test_apply_rope_second_tryout_mistakes_are_named(turn, theta, words):
    def apply_rope(x, positions, base=10000.0):
        hd = x.size(-1)
        th = theta(hd, base) if theta else base ** (-torch.arange(0, hd, 2).float() / hd)
        a = torch.outer(positions.float(), th)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        if turn:
            return turn(x1, x2, a.cos(), a.sin())
        return torch.cat([x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()], -1)

    with pytest.raises(CheckFailure, match=words):
        check_apply_rope(apply_rope)


def test_rope_layout_halves_joined_along_another_dim_is_named():
    def apply_rotary_fixed(x, cos, sin):
        half = x.size(-1) // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-2) * sin

    with pytest.raises(CheckFailure, match="joined along another dim than the last") as failure:
        check_rope_layout(apply_rotary_fixed)
    assert "x[..., :" not in str(failure.value)  # the shapes observed, not the fix


def _decode_shapes(variant):
    ns = _decode_solution()
    apply_rope, attend = ns["apply_rope"], ns["grouped_query_attention"]

    def rope_decode_step(layer, x_t, t, cache):
        kv = layer.num_kv_heads
        q = layer.split_heads(layer.q_proj(x_t))
        k = layer.split_heads(layer.k_proj(x_t), None if variant == "split" else kv)
        v = layer.split_heads(layer.v_proj(x_t), kv)
        p = torch.tensor([t])
        q, k = apply_rope(q, p), apply_rope(k, p)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        mask = torch.ones(t + 1, t + 1, dtype=torch.bool).tril() if variant == "full_mask" else None
        out = layer.out_proj(layer.merge_heads(attend(q, k, v, mask)))
        return out, (k, v)

    return rope_decode_step


@pytest.mark.parametrize("variant, words", [
    ("split", "split into num_heads = 6 heads"), ("full_mask", r"a \(t \+ 1, t \+ 1\) mask broadcasts"),
])
def test_rope_decode_second_tryout_mistakes_are_named(variant, words):
    with pytest.raises(CheckFailure, match=words):
        check_rope_decode(_decode_shapes(variant))


def test_third_tryout_mistakes_are_named():
    """h11's third tryout (3 of 8 named before): each now gets its own message."""
    with pytest.raises(CheckFailure, match=r"another eps than the module's.*\(1e-08\), or changed"):
        check_rmsnorm(_rmsnorm(lambda x, w, e: x / torch.sqrt(_ms(x) + e ** 2) * w))
    with pytest.raises(CheckFailure, match="the root mean square itself returned"):
        check_rmsnorm(_rmsnorm(lambda x, w, e: torch.sqrt(_ms(x) + e) * w))

    def rope(base_used=None, swap_halves=False):
        def apply_rope(x, positions, base=10000.0):
            hd = x.size(-1)
            a = torch.outer(positions.float(), (base_used or base) ** (-torch.arange(0, hd, 2).float() / hd))
            x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
            first, second = x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()
            return torch.cat([second, first] if swap_halves else [first, second], -1)

        return apply_rope

    with pytest.raises(CheckFailure, match="base 10000 written in"):
        check_apply_rope(rope(base_used=10000.0))
    with pytest.raises(CheckFailure, match="the two halves of the output swapped"):
        check_apply_rope(rope(swap_halves=True))

    ns = _decode_solution()
    apply_rope = ns["apply_rope"]

    def softmax_rows(layer, x_t, t, cache):
        kv, g = layer.num_kv_heads, layer.num_heads // layer.num_kv_heads
        q = apply_rope(layer.split_heads(layer.q_proj(x_t)), torch.tensor([t]))
        k = apply_rope(layer.split_heads(layer.k_proj(x_t), kv), torch.tensor([t]))
        v = layer.split_heads(layer.v_proj(x_t), kv)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        w = (q @ k.repeat_interleave(g, 1).transpose(-2, -1) / layer.head_dim ** 0.5).softmax(-2)
        return layer.out_proj(layer.merge_heads(w @ v.repeat_interleave(g, 1))), (k, v)

    with pytest.raises(CheckFailure, match="the softmax taken over the query's one row"):
        check_rope_decode(softmax_rows)


@pytest.mark.parametrize("decorator", [torch.no_grad(), torch.inference_mode()],
                         ids=["no_grad", "inference_mode"])
def test_every_lesson_11_checker_accepts_decorated_solutions(decorator):
    """Issue 38: every function under @torch.no_grad() shares the decorator's wrapper code, so a
    checker watching a decorated reference (Hugging Face's LlamaRotaryEmbedding.forward) by its code
    refused the learner's own decorated answer; calls_to now watches the unwrapped body."""
    def decorated(fn):
        @decorator
        def wrapper(*args, **kwargs):
            return fn(*args, **kwargs)

        wrapper.__name__ = fn.__name__
        return wrapper

    def decorated_forward(cls):
        return type(cls.__name__, (cls,), {"forward": decorator(cls.forward)})

    ns = _decode_solution()
    for check, answer in [
        (check_kv_bytes, decorated(_solution("11.kv_bytes")["predicted_kv_bytes"])),
        (check_rope_layout, decorated(_solution("11.rope_layout")["apply_rotary_fixed"])),
        (check_gqa, decorated(_solution("11.gqa")["grouped_query_attention"])),
        (check_apply_rope, decorated(ns["apply_rope"])),
        (check_rope_decode, decorated(ns["rope_decode_step"])),
        (check_rmsnorm, decorated_forward(_solution("11.rmsnorm")["MyRMSNorm"])),
        (check_swiglu, decorated_forward(_solution("11.swiglu")["MySwiGLU"])),
    ]:
        assert passes(check, answer), check.__name__


def test_fourth_tryout_mistakes_are_named():
    """h11's fourth tryout (1 of 6 named before; a (1, t+1).triu mask is all True, and passes)."""
    with pytest.raises(CheckFailure, match="the gain applied before normalising"):
        check_rmsnorm(_rmsnorm(lambda x, w, e: (x * w) / torch.sqrt(_ms(x * w) + e)))
    with pytest.raises(CheckFailure, match="the mean of x, not of its squares"):
        check_rmsnorm(_rmsnorm(lambda x, w, e: x / torch.sqrt(x.mean(-1, keepdim=True) + e) * w))

    def table(cat_dim=-1, split_dim=-1):
        def apply_rope(x, positions, base=10000.0):
            hd = x.size(-1)
            a = positions[:, None].float() * base ** (-torch.arange(0, hd, 2).float() / hd)
            c, s = torch.cat([a.cos()] * 2, cat_dim), torch.cat([a.sin()] * 2, cat_dim)
            x1, x2 = x.chunk(2, dim=split_dim)
            return x * c + torch.cat([-x2, x1], split_dim) * s

        return apply_rope

    with pytest.raises(CheckFailure, match="meets one of head_dim/2 = 4"):
        check_apply_rope(table(cat_dim=0))
    with pytest.raises(CheckFailure, match="halves taken along the positions"):
        check_apply_rope(table(split_dim=-2))

    ns = _decode_solution()
    apply_rope, attend = ns["apply_rope"], ns["grouped_query_attention"]

    def step(q_at, mask=None):
        def rope_decode_step(layer, x_t, t, cache):
            kv = layer.num_kv_heads
            q = apply_rope(layer.split_heads(layer.q_proj(x_t)), torch.tensor([q_at(t)]))
            k = apply_rope(layer.split_heads(layer.k_proj(x_t), kv), torch.tensor([t]))
            v = layer.split_heads(layer.v_proj(x_t), kv)
            if cache is not None:
                k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
            return layer.out_proj(layer.merge_heads(attend(q, k, v, mask and mask(t)))), (k, v)

        return rope_decode_step

    with pytest.raises(CheckFailure, match="turned at different positions"):
        check_rope_decode(step(lambda t: t + 1))
    assert passes(check_rope_decode, step(lambda t: t, lambda t: torch.ones(1, t + 1, dtype=torch.bool).triu()))
