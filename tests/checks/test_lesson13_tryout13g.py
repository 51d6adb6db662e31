"""Lesson 13's checkers on the attempts of tryout 13g (issue #48): a forward that takes exp of the raw
scores (no running maximum) is refused, named by the largest argument its exp receives, while every
correct style (float64 inside, logsumexp per tile, merge_softmax_states, one row at a time, the
solution) still passes; the Debug and paged checkers refuse exp of raw scores too (their float32 /
near-1000 cases overflow it)."""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import passes, solution_namespace

from course_lib.checks import CheckFailure
from course_lib.checks import lesson13_paged as paged_checks
from course_lib.checks import lesson13_scale as scale
from course_lib.flash import merge_softmax_states


def _fails(check, fn, *words) -> CheckFailure:
    with pytest.raises(CheckFailure) as info:
        check(fn)
    for word in words:
        assert word in str(info.value), str(info.value)
    return info.value


# --- flash_forward: exp of raw scores -----------------------------------------------------------

def _forward(style: str):
    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        B, h, L_q, d = q.shape
        work = torch.float64 if style == "float64 inside" else q.dtype
        qw, kw, vw = q.to(work), k.to(work), v.to(work)
        out = torch.empty(B, h, L_q, v.size(-1), dtype=work)
        lse = torch.empty(B, h, L_q, dtype=work)
        for i0 in range(0, L_q, block_q):
            q_i = qw[:, :, i0:i0 + block_q]  # (B, h, bq, d)
            bq = q_i.size(2)
            m = torch.full((B, h, bq), -math.inf, dtype=work)
            ell = torch.zeros(B, h, bq, dtype=work)
            o = torch.zeros(B, h, bq, v.size(-1), dtype=work)
            for j0 in range(0, k.size(2), block_k):
                if is_causal and j0 > i0 + bq - 1:
                    break
                k_j, v_j = kw[:, :, j0:j0 + block_k], vw[:, :, j0:j0 + block_k]
                s = q_i @ k_j.transpose(-2, -1) / math.sqrt(d)  # (B, h, bq, bk)
                if is_causal:
                    s = s.masked_fill(torch.arange(j0, j0 + k_j.size(2)) > torch.arange(i0, i0 + bq)[:, None],
                                      -math.inf)
                if style == "raw exp":
                    p = torch.exp(s)
                    ell, o = ell + p.sum(-1), o + p @ v_j
                    continue
                if style == "logsumexp":  # each tile's state from torch.logsumexp, then merged
                    lse_t = torch.logsumexp(s, -1)  # (B, h, bq)
                    safe = torch.where(torch.isinf(lse_t), torch.zeros_like(lse_t), lse_t)
                    p = torch.exp(s - safe[..., None])
                    m, ell, o = merge_softmax_states(m, ell, o, safe, p.sum(-1), p @ v_j)
                    continue
                m_new = torch.maximum(m, s.amax(-1))
                p = torch.exp(s - m_new[..., None])
                alpha = 1 / torch.exp(m_new - m) if style == "one over exp" else torch.exp(m - m_new)
                ell, o, m = alpha * ell + p.sum(-1), alpha[..., None] * o + p @ v_j, m_new
            out[:, :, i0:i0 + bq] = o / ell[..., None]
            lse[:, :, i0:i0 + bq] = (ell.log() if style == "raw exp" else m + ell.log())
        return out.to(q.dtype), lse.to(q.dtype)
    return my_flash_forward


def per_row_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
    """One query row at a time, one head at a time, tiles of keys."""
    B, h, L_q, d = q.shape
    out = torch.empty(B, h, L_q, v.size(-1), dtype=q.dtype)
    lse = torch.empty(B, h, L_q, dtype=q.dtype)
    for b in range(B):
        for head in range(h):
            for i in range(L_q):
                m, ell = torch.tensor(-math.inf, dtype=q.dtype), torch.tensor(0.0, dtype=q.dtype)
                o = torch.zeros(v.size(-1), dtype=q.dtype)
                stop = min(i + 1, k.size(2)) if is_causal else k.size(2)
                for j0 in range(0, stop, block_k):
                    s = k[b, head, j0:min(j0 + block_k, stop)] @ q[b, head, i] / math.sqrt(d)  # (bk,)
                    m_new = torch.maximum(m, s.max())
                    p, alpha = torch.exp(s - m_new), torch.exp(m - m_new)
                    ell, o, m = alpha * ell + p.sum(), alpha * o + p @ v[b, head, j0:j0 + s.numel()], m_new
                out[b, head, i], lse[b, head, i] = o / ell, m + ell.log()
    return out, lse


def test_forward_exp_of_raw_scores_is_refused_and_named():
    failure = _fails(scale.check_flash_forward, _forward("raw exp"), "exp receives scores up to",
                     "not measured from a running maximum", "about 88")
    assert failure.mistake == "exp of raw scores"


@pytest.mark.parametrize("style", ["running max", "float64 inside", "logsumexp",
                                   "one over exp"])  # 1 / exp(m_new - m): positive arguments, no scores
def test_forward_correct_styles_still_pass(style):
    assert passes(scale.check_flash_forward, _forward(style))


def test_forward_per_row_and_solution_still_pass():
    assert passes(scale.check_flash_forward, solution_namespace("13.flash_forward")["my_flash_forward"])
    assert passes(scale.check_flash_forward, per_row_forward)


# --- flash_fix and paged_attention: exp of raw scores -----------------------------------------------

def fix_raw_exp(q, k, v, block_k=16):
    scale_ = 1.0 / math.sqrt(q.size(-1))
    ell = torch.zeros(q.size(0), dtype=q.dtype)
    o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
    for j in range(0, k.size(0), block_k):
        p = torch.exp(q @ k[j:j + block_k].T * scale_)  # (L_q, block_k), no maximum
        ell, o = ell + p.sum(-1), o + p @ v[j:j + block_k]
    return o / ell[:, None]


def test_fix_exp_of_raw_scores_is_refused_by_what_is_observed():
    failure = _fails(scale.check_flash_fix, fix_raw_exp, "NaN", "88")
    assert "show_solution" not in str(failure)


def paged_raw_exp(q, k_blocks, v_blocks, block_table, length):
    num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_blocks.size(1), k_blocks.size(2)
    group = num_heads // num_kv_heads
    ell = torch.zeros(num_heads, dtype=q.dtype)
    o = torch.zeros(num_heads, v_blocks.size(-1), dtype=q.dtype)
    for n in range(math.ceil(length / block_size)):
        filled = min(block_size, length - n * block_size)
        k = k_blocks[block_table[n], :, :filled].repeat_interleave(group, dim=0)  # (heads, filled, d)
        v = v_blocks[block_table[n], :, :filled].repeat_interleave(group, dim=0)
        p = torch.exp((k @ q[:, :, None])[..., 0] / math.sqrt(head_dim))  # (heads, filled), no maximum
        ell, o = ell + p.sum(-1), o + (p[:, None, :] @ v)[:, 0]
    return o / ell[:, None]


def test_paged_exp_of_raw_scores_is_refused_and_named():
    _fails(paged_checks.check_paged_attention, paged_raw_exp, "near 1000", "overflows")


# --- merge_states -------------------------------------------------------------------------------

def _factors(m_a, m_b):
    m = torch.maximum(m_a, m_b)
    safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    return m, torch.exp(m_a - safe), torch.exp(m_b - safe)


def merge_return_order(m_a, ell_a, o_a, m_b, ell_b, o_b):
    m, a, b = _factors(m_a, m_b)
    return a * ell_a + b * ell_b, m, a[..., None] * o_a + b[..., None] * o_b


def merge_weights_normalised(m_a, ell_a, o_a, m_b, ell_b, o_b):
    m, a, b = _factors(m_a, m_b)
    total = (a + b).clamp_min(1e-300)
    a, b = a / total, b / total
    return m, a * ell_a + b * ell_b, a[..., None] * o_a + b[..., None] * o_b


def merge_no_max_subtraction(m_a, ell_a, o_a, m_b, ell_b, o_b):
    m = torch.maximum(m_a, m_b)
    ell = (ell_a * torch.exp(m_a) + ell_b * torch.exp(m_b)) / torch.exp(m)
    o = (o_a * torch.exp(m_a)[..., None] + o_b * torch.exp(m_b)[..., None]) / torch.exp(m)[..., None]
    return m, ell, o


def merge_ell_b_not_rescaled(m_a, ell_a, o_a, m_b, ell_b, o_b):
    m, a, b = _factors(m_a, m_b)
    return m, a * ell_a + ell_b, a[..., None] * o_a + b[..., None] * o_b


def merge_no_guard(m_a, ell_a, o_a, m_b, ell_b, o_b):  # exp(-inf - (-inf)) on two empty states
    m = torch.maximum(m_a, m_b)
    a, b = torch.exp(m_a - m), torch.exp(m_b - m)
    return m, a * ell_a + b * ell_b, a[..., None] * o_a + b[..., None] * o_b


@pytest.mark.parametrize("fn, words, mistake", [
    (merge_return_order, ["you return (ell, m, o)", "(m, ell, o)"], "returned (ell, m, o)"),
    (merge_weights_normalised, ["Likely mistake", "normalised to add up to 1"], "factors normalised to sum to 1"),
    (merge_no_max_subtraction, ["exp(m_a) ell_a", "empty", "750 to 800", "not of their differences"],
     "exp of the maxima, not of their differences"),
    (merge_ell_b_not_rescaled, ["Likely mistake", "ell_b is added without its factor"], "ell_b not rescaled"),
])
def test_merge_mistakes_are_named(fn, words, mistake):
    failure = _fails(scale.check_merge_states, fn, *words)
    assert failure.mistake == mistake
    assert "is not the larger" not in str(failure)


def test_merge_without_guard_is_not_called_absolute():
    failure = _fails(scale.check_merge_states, merge_no_guard, "contains NaN")
    assert "exp(m_a) ell_a" not in str(failure)


# --- score_bytes, locate ------------------------------------------------------------------------

def test_score_bytes_of_1024_tokens_names_both_readings():
    failure = _fails(scale.check_score_bytes, lambda: 12 * 1024 ** 2 * 4, "two readings", "KiB",
                     "1,024 tokens", "32,768")
    assert "1,024 tokens" in failure.mistake


def test_locate_slot_without_multiply_is_named():
    def locate(block_table, position, block_size):
        n = position // block_size
        return block_table[n], position - n
    _fails(scale.check_locate, locate, "position - n", "n * block_size")


# --- flash_fix (Debug): observed, never the fix -----------------------------------------------------

def _fix(bug: str):
    def flash_one_head(q, k, v, block_k=16):
        scale_ = 1.0 / q.size(-1) if bug == "1/d" else 1.0 / math.sqrt(q.size(-1))
        m = torch.full((q.size(0),), float("-inf"), dtype=q.dtype)
        ell = torch.zeros(q.size(0), dtype=q.dtype)
        o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
        for start in range(0, k.size(0), block_k):
            s = q @ k[start:start + block_k].T * scale_  # (L_q, block_k)
            m_new = torch.maximum(m, s.amax(dim=-1))
            p = torch.exp(s - m_new[:, None])
            ell = torch.exp(m - m_new) * ell + p.sum(dim=0 if bug == "sum dim 0" else -1)
            o = (o if bug == "1/d" else torch.exp(m - m_new)[:, None] * o) + p @ v[start:start + block_k]
            m = m_new
        return o / ell[:, None]
    return flash_one_head


def test_fix_scale_one_over_d_is_observed():
    failure = _fails(scale.check_flash_fix, _fix("1/d"), "Not yet", "times 1/d = 1/8",
                     "never multiplied by a factor")
    assert "show_solution" not in str(failure) and "Likely mistake" not in str(failure)


def test_fix_ell_summed_over_the_queries_is_observed():
    failure = _fails(scale.check_flash_fix, _fix("sum dim 0"), "Observed", "one per key of the block",
                     "one per query")
    assert failure.mistake == "ell summed over the wrong axis (dim=0)"


# --- paged_attention ------------------------------------------------------------------------------

def _paged(bug: str):
    def my_paged_attention(q, k_blocks, v_blocks, block_table, length):
        num_heads, head_dim = q.shape
        num_kv_heads, block_size = k_blocks.size(1), k_blocks.size(2)
        group = num_heads // num_kv_heads
        m = torch.full((num_heads,), -math.inf, dtype=q.dtype)
        ell = torch.zeros(num_heads, dtype=q.dtype)
        o = torch.zeros(num_heads, v_blocks.size(-1), dtype=q.dtype)
        for n in range(math.ceil(length / block_size)):
            filled = min(block_size, length - n * block_size)
            if bug == "kv head 0":
                k = k_blocks[block_table[n], :1, :filled].expand(num_heads, -1, -1)  # (heads, filled, d)
                v = v_blocks[block_table[n], :1, :filled].expand(num_heads, -1, -1)
            else:
                k = k_blocks[block_table[n], :, :filled].repeat_interleave(group, dim=0)
                v = v_blocks[block_table[n], :, :filled].repeat_interleave(group, dim=0)
            s = (k @ q[:, :, None])[..., 0] / math.sqrt(head_dim)  # (heads, filled)
            m_b = s.amax(-1)
            p = torch.exp(s - m_b[:, None])
            if bug == "merge args order":
                m, o, ell = merge_softmax_states(m, o, ell, m_b, (p[:, None, :] @ v)[:, 0], p.sum(-1))
                continue
            m, ell, o = merge_softmax_states(m, ell, o, m_b, p.sum(-1), (p[:, None, :] @ v)[:, 0])
            if bug == "divide each block":
                o = o / ell[:, None]
        return o / ell[:, None]
    return my_paged_attention


@pytest.mark.parametrize("bug, words", [
    ("merge args order", ["Wrong shape", "passes ell_a of shape (1, 8)", "(m_a, ell_a, o_a, m_b, ell_b, o_b)"]),
    ("divide each block", ["Likely mistake", "divides o by ell after each block"]),
    ("kv head 0", ["Likely mistake", "every query head reads KV head 0"]),
])
def test_paged_mistakes_are_named(bug, words):
    failure = _fails(paged_checks.check_paged_attention, _paged(bug), *words)
    assert "import" not in str(failure)


def test_paged_right_loop_passes():
    assert passes(paged_checks.check_paged_attention, _paged(""))


# --- flash_backward_tile ------------------------------------------------------------------------

def test_backward_dp_without_transpose_names_the_product():
    from course_lib.checks.lesson13_flash_backward import check_flash_backward_tile

    def my_backward_tile(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0, is_causal=False):
        s = q_i @ k_j.T * scale  # (Bq, Bk)
        p = torch.exp(s - lse_i[:, None])
        dv_j = p.T @ d_out_i  # (Bk, d_v)
        dp = d_out_i @ v_j  # V not transposed
        ds = p * (dp - D_i[:, None])
        return ds @ k_j * scale, ds.T @ q_i * scale, dv_j
    _fails(check_flash_backward_tile, my_backward_tile, "Your code raised",
           "multiplies dO_i (Bq, d_v) times V_j (Bk, d_v)")
