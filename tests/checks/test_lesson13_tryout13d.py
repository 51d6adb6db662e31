"""Lesson 13's checkers name the mistakes of tryout 13d's held half (issue #48): each one gets a
message that says what is observed, the Debug exercise's first messages never give the fix, and a
correct answer is never called a mistake."""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import passes, solution_namespace

from course_lib.checks import CheckFailure
from course_lib.checks import lesson13_flash_backward as backward
from course_lib.checks import lesson13_scale as scale
from course_lib.checks.lesson13_locate import locate_rules
from course_lib.checks.lesson13_paged import check_paged_attention
from course_lib.flash import merge_softmax_states

L = 32 * 1024


def _fails(check, fn, *words) -> CheckFailure:
    with pytest.raises(CheckFailure) as info:
        check(fn)
    for word in words:
        assert word in str(info.value), str(info.value)
    return info.value


# --- score_bytes: the factor that is off, both readings when one factor fits two -----------------

def test_linear_scaling_from_1024_tokens_is_named():
    _fails(scale.check_score_bytes, lambda: 12 * 1024 * 1024 * 4 * 32, "1/32", "grew like L",
           "32 x 32 = 1,024")


@pytest.mark.parametrize("value", [768 * L * L * 4, 12 * L * L * 64 * 4])
def test_a_factor_64_names_both_readings(value):
    _fails(scale.check_score_bytes, lambda: value, "d_model = 768 in place of the 12 heads",
           "head_dim = 64 numbers")


@pytest.mark.parametrize("value, words", [
    (144 * L * L, ["12 layers x 12 heads", "numbers, not bytes"]),
    (768 * L * L * 2, ["d_model = 768 in place of the 12 heads", "head_dim = 64", "float16"]),
    (12 * 32000 * L * 4, ["32,000 keys, not 32,768", "32,000 queries"]),
])
def test_score_bytes_decomposes_other_numbers_into_the_questions_factors(value, words):
    _fails(scale.check_score_bytes, lambda: value, "heads x queries x keys x bytes", *words)


# --- merge_states ------------------------------------------------------------------------------

def _no_exp(m_a, ell_a, o_a, m_b, ell_b, o_b):
    m = torch.maximum(m_a, m_b)
    ref = torch.where(m == -math.inf, 0.0, m)
    a = torch.nan_to_num(m_a - ref, neginf=0.0)
    b = torch.nan_to_num(m_b - ref, neginf=0.0)
    return m, a * ell_a + b * ell_b, a[..., None] * o_a + b[..., None] * o_b


def _lse_as_ell(m_a, ell_a, o_a, m_b, ell_b, o_b):
    m = torch.maximum(m_a, m_b)
    ref = torch.where(m == -math.inf, 0.0, m)
    a, b = torch.exp(m_a - ref), torch.exp(m_b - ref)
    return m, m + torch.log(a * ell_a + b * ell_b), a[..., None] * o_a + b[..., None] * o_b


def test_merge_factors_without_exp_and_lse_as_ell_are_named():
    _fails(scale.check_merge_states, _no_exp, "Likely mistake", "m_a - m and m_b - m", "no exp")
    _fails(scale.check_merge_states, _lse_as_ell, "Likely mistake", "m + log(ell)", "log-sum-exp")


# --- flash_fix (Debug): observed, never the fix --------------------------------------------------

def _loop(q, k, v, block_k, bug):
    scale_ = 1.0 / math.sqrt(q.size(-1))
    m = torch.full((q.size(0),), float("-inf"), dtype=q.dtype)
    ell = torch.zeros(q.size(0), dtype=q.dtype)
    o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
    for start in range(0, k.size(0), block_k):
        s = q @ k[start:start + block_k].T * scale_
        m_new = torch.maximum(m, s.amax(dim=-1))
        p = torch.exp(s - m_new[:, None])
        ell = torch.exp(m - m_new) * ell + p.sum(dim=-1)
        if bug == "cubed":
            o = torch.exp(m - m_new)[:, None] ** 3 * o + p @ v[start:start + block_k]
        elif bug == "new term":
            o = o + torch.exp(m - m_new)[:, None] * (p @ v[start:start + block_k])
        else:
            o = torch.exp(m - m_new)[:, None] * o + p @ v[start:start + block_k]
        m = m_new
    return o / p.sum(dim=-1)[:, None] if bug == "last sum" else o / ell[:, None]


def flash_one_head(q, k, v, block_k=16):
    scale = 1.0 / math.sqrt(q.size(-1))
    m = torch.full((q.size(0),), float("-inf"), dtype=q.dtype)  # running maximum per query
    ell = torch.zeros(q.size(0), dtype=q.dtype)  # running sum of exp(score - m)
    o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)  # running sum of exp(score - m) * v
    for start in range(0, k.size(0), block_k):
        s = q @ k[start:start + block_k].T * scale  # (L_q, block_k)
        m_new = torch.maximum(m, s.amax(dim=-1))
        p = torch.exp(s - m_new[:, None])
        ell = torch.exp(m - m_new) * ell + p.sum(dim=-1)
        o = o + p @ v[start:start + block_k]
        m = m_new
    return o / ell[:, None]


@pytest.mark.parametrize("bug, words", [
    ("new term", "multiplies the new block's p @ v as it is added to o"),
    ("last sum", "divided by the last block's sum p.sum() alone"),
])
def test_debug_factor_on_the_new_term_and_the_last_sum_are_named(bug, words):
    def fn(q, k, v, block_k=16):
        return _loop(q, k, v, block_k, bug)

    _fails(scale.check_flash_fix, fn, "Not yet", words)


def test_an_unknown_factor_names_the_rows_whose_maximum_arrives_later():
    def fn(q, k, v, block_k=16):
        return _loop(q, k, v, block_k, "cubed")

    _fails(scale.check_flash_fix, fn, "rows whose largest score arrives in a later block")
    ell_cubed = _forward("ell cubed")
    _fails(scale.check_flash_forward, ell_cubed, "rows whose largest score arrives in a later block")


def test_the_untouched_loop_is_observed_without_the_fix(monkeypatch):
    monkeypatch.setitem(scale._FIX_SEEN, "o", 0)
    message = str(_fails(scale.check_flash_fix, flash_one_head, "the one given, unchanged"))
    assert "show_solution" not in message and "rescaled by alpha" not in message


def test_the_solution_passes_flash_fix():
    assert passes(scale.check_flash_fix, solution_namespace("13.flash_fix")["flash_one_head"])


# --- flash_forward -------------------------------------------------------------------------------

def _forward(bug):
    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        B, h, Lq, d = q.shape
        Lk = k.size(2)
        out, lse = q.new_zeros(B, h, Lq, v.size(-1)), q.new_zeros(B, h, Lq)
        for i0 in range(0, Lq, block_q):
            i1 = min(i0 + block_q, Lq)
            m = torch.full((B, h, i1 - i0), -math.inf, dtype=q.dtype)
            ell = torch.zeros(B, h, i1 - i0, dtype=q.dtype)
            o = torch.zeros(B, h, i1 - i0, v.size(-1), dtype=q.dtype)
            for j0 in range(0, Lk, block_k):
                if is_causal and j0 > i1 - 1:
                    break
                j1 = min(j0 + block_k, Lk)
                s = q[:, :, i0:i1] @ k[:, :, j0:j1].transpose(-2, -1) / math.sqrt(d)
                if is_causal and j1 - 1 > i0:
                    if bug == "local mask":
                        future = torch.ones(i1 - i0, j1 - j0, dtype=torch.bool).triu(1)
                    else:
                        future = torch.arange(j0, j1)[None, :] > torch.arange(i0, i1)[:, None]
                    s = s.masked_fill(future, -math.inf)
                m_new = torch.maximum(m, s.amax(dim=-1))
                p = torch.exp(s - m_new[..., None])
                alpha = torch.exp(m - m_new)
                factor = {"ell": 1.0, "ell cubed": alpha ** 3}.get(bug, alpha)
                ell = factor * ell + p.sum(dim=-1)
                o = alpha[..., None] * o + p @ v[:, :, j0:j1]
                m = m_new
            out[:, :, i0:i1] = o / ell[..., None]
            lse[:, :, i0:i1] = m + torch.log(ell)
        return out, lse
    return my_flash_forward


def test_forward_ell_not_rescaled_and_a_mask_inside_the_tile_are_named():
    assert passes(scale.check_flash_forward, _forward(""))
    _fails(scale.check_flash_forward, _forward("ell"), "Likely mistake", "but ell is not")
    _fails(scale.check_flash_forward, _forward("local mask"), "Likely mistake",
           "positions inside the tile, counted from 0")


# --- locate: the rule behind each number, over all the cases -----------------------------------

def _clipped(index):
    def locate(block_table, position, block_size):
        return block_table[min(index(position, block_size), len(block_table) - 1)], position % block_size
    return locate


@pytest.mark.parametrize("fn, words", [
    (_clipped(lambda p, s: math.ceil(p / s)), "block_table[ceil(position / block_size)]"),
    (_clipped(lambda p, s: round(p / s)), "block_table[round(position / block_size)]"),
    (lambda t, p, s: (t[p // s], p), "your slot is the position itself"),
    (lambda t, p, s: (t[p // s], p // s * s), "the block's first position"),
])
def test_locate_names_the_rule_of_each_number(fn, words):
    message = str(_fails(scale.check_locate, fn, words))
    assert "flat array" not in message or "flat array" in words


def test_locate_rules_say_nothing_for_a_right_answer():
    cases = [([7, 2, 9], 5, 4), ([3], 2, 3)]
    assert locate_rules([(2, 1), (3, 2)], cases) is None
    assert "right in every case" in locate_rules([(2, 5), (3, 2)], cases)


# --- flash_backward_tile, paged_attention, io_ratio ---------------------------------------------

def test_dq_from_v_is_named():
    source = solution_namespace("13.flash_backward_tile")["my_backward_tile"]

    def wrong(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0, is_causal=False):
        dq, dk, dv = source(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0, j0, is_causal)
        p = torch.exp(q_i @ k_j.T * scale - lse_i[:, None])
        if is_causal:
            p = p.masked_fill(torch.arange(j0, j0 + len(k_j))[None] > torch.arange(i0, i0 + len(q_i))[:, None], 0)
        ds = p * (d_out_i @ v_j.T - D_i[:, None])
        return ds @ v_j * scale, dk, dv

    failure = _fails(backward.check_flash_backward_tile, wrong, "Likely mistake", "V_j in place of K_j")
    assert failure.mistake == "dQ = dS V"


def test_paged_division_inside_the_loop_is_named():
    def my_paged_attention(q, k_blocks, v_blocks, block_table, length):
        heads, d = q.shape
        kv, bs = k_blocks.size(1), k_blocks.size(2)
        group = torch.arange(heads) // (heads // kv)
        m = torch.full((heads,), -math.inf, dtype=q.dtype)
        ell, o = torch.zeros(heads, dtype=q.dtype), torch.zeros(heads, v_blocks.size(-1), dtype=q.dtype)
        for n in range((length + bs - 1) // bs):
            filled = min(bs, length - n * bs)
            kb, vb = k_blocks[block_table[n], group, :filled], v_blocks[block_table[n], group, :filled]
            s = torch.einsum("hd,hnd->hn", q, kb) / math.sqrt(d)
            p = torch.exp(s - s.amax(-1, keepdim=True))
            m, ell, o = merge_softmax_states(m, ell, o, s.amax(-1), p.sum(-1),
                                             torch.einsum("hn,hnd->hd", p, vb))
            o, ell = o / ell[:, None], torch.ones_like(ell)
        return o

    failure = _fails(check_paged_attention, my_paged_attention, "Likely mistake",
                     "divided by ell after every block's merge")
    assert failure.mistake == "divided in the loop"


_N, _D = 16384, 64
_FLASH = 4 * (2 * _N * _D + _N + 2 * _N * _D * (_N // 256))


def test_io_two_transfers_has_at_most_three_readings():
    message = str(_fails(backward.check_io_ratio, lambda: (4 * (4 * _N * _D + 2 * _N * _N), _FLASH),
                         "two L x L transfers counted"))
    assert message.count("; or ") == 0 and message.count(", or ") <= 2


def test_io_theta_taken_literally_is_named_from_both_counts():
    theta = (4 * (_N * _D + _N * _N), 4 * (_N * _N * _D * _D / (4 * _D * 256)))
    message = str(_fails(backward.check_io_ratio, lambda: theta, "Θ(L d + L²) taken as a count",
                         "Theorem 2's bound"))
    assert "numbers, not bytes" not in message
    # with the other count right, the standard one alone keeps both readings
    _fails(backward.check_io_ratio, lambda: (theta[0], _FLASH), "numbers, not bytes", "Θ(L d + L²)")


def test_later_max_said_names_only_an_exact_match_of_the_rows():
    from course_lib.checks.lesson13_scale_mistakes import later_max_said

    q = torch.eye(2, dtype=torch.float64)  # query 0 peaks at key 0 (block 0), query 1 at key 3
    k = torch.tensor([[1.0, 0], [0, 0], [0, 0], [0, 1]], dtype=torch.float64)
    assert "exactly the 1 rows" in later_max_said(q, k, False, 2, torch.tensor([False, True]))
    assert later_max_said(q, k, False, 2, torch.tensor([True, True])) == ""
    assert later_max_said(q, k, False, 2, torch.tensor([True, False])) == ""


def test_an_unknown_paged_mistake_still_gets_its_case():
    def my_paged_attention(q, k_blocks, v_blocks, block_table, length):
        heads, d = q.shape
        kv, bs = k_blocks.size(1), k_blocks.size(2)
        group = torch.arange(heads) // (heads // kv)
        m = torch.full((heads,), -math.inf, dtype=q.dtype)
        ell, o = torch.zeros(heads, dtype=q.dtype), torch.zeros(heads, d, dtype=q.dtype)
        for n in range((length + bs - 1) // bs):
            filled = min(bs, length - n * bs)
            kb, vb = k_blocks[block_table[n], group, :filled], v_blocks[block_table[n], group, :filled]
            s = torch.einsum("hd,hnd->hn", q, kb) / math.sqrt(d)
            m_new = torch.maximum(m, s.amax(-1))
            a, p = torch.exp(m - m_new), torch.exp(s - m_new[:, None])
            ell = a ** 3 * ell + p.sum(-1)
            o = a[:, None] * o + torch.einsum("hn,hnd->hd", p, vb)
            m = m_new
        return o / ell[:, None]

    _fails(check_paged_attention, my_paged_attention, "Not yet", "in query heads", "print, for one query head")
