"""Lesson-11 checkers of grouped-query attention and the KV cache's bytes
(course_lib/checks/lesson11_gqa.py): right answers pass, each named mistake is caught."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _helpers import passes, solution_namespace

from course_lib import MultiHeadAttention, scaled_dot_product_attention
from course_lib.checks import CheckFailure, check_gqa, check_kv_bytes
from course_lib.checks.lesson11_gqa import (
    KV_BATCH, KV_CONFIG, KV_TOKENS, kv_bytes_factors, kv_bytes_mistakes,
)
from course_lib.gpt import GPT
from course_lib.modern import kv_cache_bytes
from course_lib.solutions import predicted_answer


# ----------------------------------------------------------------------------------------------
# predict: the bytes of a KV cache
# ----------------------------------------------------------------------------------------------


RIGHT = kv_cache_bytes(KV_CONFIG.num_layers, KV_CONFIG.num_kv_heads, KV_CONFIG.head_dim, KV_TOKENS,
                       KV_BATCH, 4)


def test_kv_bytes_solution_passes(capsys):
    assert passes(check_kv_bytes, solution_namespace("11.kv_bytes")["predicted_kv_bytes"])
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
    assert passes(check_gqa, solution_namespace("11.gqa")["grouped_query_attention"])
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
