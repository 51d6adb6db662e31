"""Lesson 13's checkers name the wrong attempts of tryout 13f (issue #48) by what they observe: each
attempt restated here as the test's wrong code; the Debug checker's messages say what is observed,
never the fix; a forward that merges with course_lib's merge_softmax_states passes (the exercise
welcomes it) while one that calls the reference is refused by name; and the Debug's float32 case
whose scores are all about -150 tells "m = 0" from -inf even with the rescale fixed."""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import passes, solution_namespace

from course_lib.checks import CheckFailure
from course_lib.checks import lesson13_flash_backward as backward
from course_lib.checks import lesson13_scale as scale
from course_lib.flash import flash_attention_forward, merge_softmax_states


def _fails(check, fn, *words) -> CheckFailure:
    with pytest.raises(CheckFailure) as info:
        check(fn)
    for word in words:
        assert word in str(info.value), str(info.value)
    return info.value


def _observed_only(failure: CheckFailure) -> None:
    text = str(failure)
    assert "show_solution" not in text and "exp(m - m_new) <=" not in text, text
    assert "m_new[:, None]" not in text and "Likely mistake" not in text, text


# --- score_bytes --------------------------------------------------------------------------------

def test_causal_half_is_named_beside_float16():
    failure = _fails(scale.check_score_bytes, lambda: 12 * 32768 * 32768 * 4 // 2, "two readings",
                     "float16", "causal mask", "computed whole")
    assert "causal" in failure.mistake


# --- flash_fix (Debug) --------------------------------------------------------------------------

def _fix(bug: str):
    def flash_one_head(q, k, v, block_k=16):
        scale_ = 1.0 / math.sqrt(q.size(-1))
        start = 0.0 if bug == "m = 0, fixed" else float("-inf")
        m = torch.full((q.size(0),), start, dtype=q.dtype)
        ell = torch.zeros(q.size(0), dtype=q.dtype)
        o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
        blocks = 0
        for j in range(0, k.size(0), block_k):
            s = q @ k[j:j + block_k].T * scale_  # (L_q, block_k)
            if bug == "per-block softmax":
                o = o + torch.softmax(s, dim=-1) @ v[j:j + block_k]
                blocks += 1
                continue
            m_new = torch.maximum(m, s.amax(dim=-1))
            p = torch.exp(s - (m if bug == "p with old max" else m_new)[:, None])
            ell = torch.exp(m - m_new) * ell + p.sum(dim=-1)
            o = torch.exp(m - m_new)[:, None] * o + p @ v[j:j + block_k]
            m = m_new
        if bug == "per-block softmax":
            return o / blocks
        return o if bug == "no final divide" else o / ell[:, None]
    return flash_one_head


def test_fix_p_with_the_old_maximum_is_observed():
    failure = _fails(scale.check_flash_fix, _fix("p with old max"), "Not yet", "NaN or inf",
                     "+inf for every argument", "before that block")
    assert "multiplied by exp(m_new - m)" not in str(failure)
    _observed_only(failure)


def test_fix_per_block_softmax_averaged_is_observed():
    failure = _fails(scale.check_flash_fix, _fix("per-block softmax"), "Not yet", "average",
                     "each block's own softmax", "counts 1/3")
    _observed_only(failure)


def test_fix_no_final_divide_is_observed():
    failure = _fails(scale.check_flash_fix, _fix("no final divide"), "Not yet",
                     "exact attention times each row's ell", "returns ell, not 1")
    _observed_only(failure)


def test_fix_m_zero_with_the_rescale_fixed_fails_on_all_negative_scores():
    failure = _fails(scale.check_flash_fix, _fix("m = 0, fixed"), "Not yet", "every score about -150",
                     "NaN/inf", "all below 0", "exactly 0")
    _observed_only(failure)


def test_fix_right_styles_pass_the_all_negative_case():
    assert passes(scale.check_flash_fix, _fix(""))
    assert passes(scale.check_flash_fix, solution_namespace("13.flash_fix")["flash_one_head"])

    def in_float64(q, k, v, block_k=16):  # float64 inside, then back
        return _fix("")(q.double(), k.double(), v.double(), block_k).to(q.dtype)
    assert passes(scale.check_flash_fix, in_float64)


# --- merge_states -------------------------------------------------------------------------------

def _factors(m_a, m_b):
    m = torch.maximum(m_a, m_b)
    ref = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    return m, torch.exp(m_a - ref), torch.exp(m_b - ref)


def merge_o_as_mean(m_a, ell_a, o_a, m_b, ell_b, o_b):
    m, a, b = _factors(m_a, m_b)
    ell = a * ell_a + b * ell_b
    wa, wb = (a * ell_a / ell).nan_to_num(0.0), (b * ell_b / ell).nan_to_num(0.0)
    return m, ell, wa[..., None] * o_a + wb[..., None] * o_b


def merge_ell_factor_on_o(m_a, ell_a, o_a, m_b, ell_b, o_b):
    m, a, b = _factors(m_a, m_b)
    a, b = a * ell_a, b * ell_b
    return m, a + b, a[..., None] * o_a + b[..., None] * o_b


def merge_wrong_order(m_a, ell_a, o_a, m_b, ell_b, o_b):
    m, a, b = _factors(m_a, m_b)
    return m, a[..., None] * o_a + b[..., None] * o_b, a * ell_a + b * ell_b


def merge_halved(m_a, ell_a, o_a, m_b, ell_b, o_b):
    m, a, b = _factors(m_a, m_b)
    return m, (a * ell_a + b * ell_b) / 2, (a[..., None] * o_a + b[..., None] * o_b) / 2


def merge_from_zero(m_a, ell_a, o_a, m_b, ell_b, o_b):
    a, b = torch.exp(m_a), torch.exp(m_b)
    return torch.zeros_like(m_a), a * ell_a + b * ell_b, a[..., None] * o_a + b[..., None] * o_b


@pytest.mark.parametrize("fn, words, mistake", [
    (merge_o_as_mean, ["Likely mistake", "weighted by their ell", "not yet divided"],
     "o merged as an ell-weighted mean"),
    (merge_ell_factor_on_o, ["Likely mistake", "multiplied by ell_a and ell_b"],
     "o's factor multiplied by ell"),
    (merge_wrong_order, ["you return (m, o, ell)", "(m, ell, o)"], "returned (m, o, ell)"),
    (merge_halved, ["Likely mistake", "exactly half", "averaged"], "the two states averaged, not added"),
    (merge_from_zero, ["your m is 0 on every row", "measured from 0", "overflows"],
     "state measured from 0, exp(m_a) unsubtracted"),
])
def test_merge_mistakes_are_named(fn, words, mistake):
    assert _fails(scale.check_merge_states, fn, *words).mistake == mistake


# --- flash_forward ------------------------------------------------------------------------------

def _forward(bug: str):
    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        B, h, L_q, d = q.shape
        out = torch.empty(B, h, L_q, v.size(-1), dtype=q.dtype)
        lse = torch.empty(B, h, L_q, dtype=q.dtype)
        causal = is_causal and bug != "ignores causal"
        for i0 in range(0, L_q, block_q):
            q_i = q[:, :, i0:i0 + block_q]  # (B, h, bq, d)
            bq = q_i.size(2)
            state = (torch.full((B, h, bq), -math.inf, dtype=q.dtype), torch.zeros(B, h, bq, dtype=q.dtype),
                     torch.zeros(B, h, bq, v.size(-1), dtype=q.dtype))
            for j0 in range(0, k.size(2), block_k):
                if causal and (j0 > i0 + bq - 1 or (bug == "skips diagonal" and j0 >= i0 and j0 > 0)):
                    break
                k_j, v_j = k[:, :, j0:j0 + block_k], v[:, :, j0:j0 + block_k]
                s = q_i @ k_j.transpose(-2, -1) / math.sqrt(d)  # (B, h, bq, bk)
                if causal:
                    s = s.masked_fill(torch.arange(j0, j0 + k_j.size(2)) > torch.arange(i0, i0 + bq)[:, None],
                                      -math.inf)
                m_t = s.amax(-1)
                p = torch.exp(s - torch.where(torch.isinf(m_t), torch.zeros_like(m_t), m_t)[..., None])
                state = merge_softmax_states(*state, m_t, p.sum(-1), p @ v_j)
            m, ell, o = state
            out[:, :, i0:i0 + bq] = o / ell[..., None]
            lse[:, :, i0:i0 + bq] = m + ell.log()
        return (lse, out) if bug == "swapped return" else (out, lse)
    return my_flash_forward


def test_forward_merging_with_course_libs_merge_softmax_states_passes():
    assert passes(scale.check_flash_forward, _forward(""))


@pytest.mark.parametrize("bug, words", [
    ("ignores causal", ["Likely mistake", "no mask at all", "is_causal is ignored"]),
    ("swapped return", ["Wrong shapes", "you return (lse, out)", "(out, lse)"]),
    ("skips diagonal", ["Likely mistake", "start before its own query tile", "diagonal"]),
])
def test_forward_mistakes_are_named(bug, words):
    _fails(scale.check_flash_forward, _forward(bug), *words)


def test_forward_calling_the_reference_is_refused_by_name():
    def calls_reference(q, k, v, is_causal=False, block_q=32, block_k=32):
        return flash_attention_forward(q, k, v, is_causal=is_causal, block_q=block_q, block_k=block_k)

    failure = _fails(scale.check_flash_forward, calls_reference, "flash_attention_forward",
                     "merge_softmax_states is welcome")
    assert "FlashAttention (course_lib.flash)" not in str(failure)

    def calls_sdpa(q, k, v, is_causal=False, block_q=32, block_k=32):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        return out, torch.zeros(q.shape[:-1], dtype=q.dtype)

    _fails(scale.check_flash_forward, calls_sdpa, "scaled_dot_product_attention")


# --- flash_backward_tile ------------------------------------------------------------------------

def backward_dv_from_v(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0, is_causal=False):
    s = q_i @ k_j.T * scale
    if is_causal:
        s = s.masked_fill(torch.arange(j0, j0 + k_j.size(0))[None, :]
                          > torch.arange(i0, i0 + q_i.size(0))[:, None], float("-inf"))
    p = torch.exp(s - lse_i[:, None])
    ds = p * (d_out_i @ v_j.T - D_i[:, None])
    return ds @ k_j * scale, ds.T @ q_i * scale, p.T @ v_j


def test_backward_dv_from_v_is_named():
    failure = _fails(backward.check_flash_backward_tile, backward_dv_from_v, "Likely mistake",
                     "Pᵀ V_j", "V_j in place of dO_i")
    assert failure.mistake == "dV = P^T V"


# --- io_ratio -----------------------------------------------------------------------------------

def test_io_loops_swapped_names_both_readings():
    def predicted_io_bytes():
        N, d = 16384, 64
        return 4 * (4 * N * d + 4 * N * N), 4 * (N * d * (N // 256) + 3 * N * d + N)

    _fails(backward.check_io_ratio, predicted_io_bytes, "two readings", "only one of K and V",
           "the loops swapped, Q read once per key tile")


# --- locate -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn, words", [
    (lambda t, p, s: (t[p // 16], p % 16), ["a block size of 16 whatever block_size is passed"]),
    (lambda t, p, s: (t[(p + 1) // s], p % s), ["from position + 1", "(position + 1) // block_size"]),
])
def test_locate_mistakes_are_named(fn, words):
    _fails(scale.check_locate, fn, "Observed", *words)
