"""Lesson 13's checkers name the wrong attempts of tryout 13e (issue #48) by what they observe: one
test per mistake, each written here from the tryout's description; the Debug checker's messages say
what is observed, never the fix; and every correct style still passes with no "mistake" wording."""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import passes, solution_namespace

from course_lib.checks import CheckFailure
from course_lib.checks import lesson13_flash_backward as backward
from course_lib.checks import lesson13_scale as scale
from course_lib.checks.lesson13_paged import check_paged_attention


def _fails(check, fn, *words) -> CheckFailure:
    with pytest.raises(CheckFailure) as info:
        check(fn)
    for word in words:
        assert word in str(info.value), str(info.value)
    return info.value


# --- merge_states -----------------------------------------------------------------------------

def _factors(m_a, m_b):
    m = torch.maximum(m_a, m_b)
    ref = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    return m, torch.exp(m_a - ref), torch.exp(m_b - ref)


def merge_o_squared(m_a, ell_a, o_a, m_b, ell_b, o_b):
    m, a, b = _factors(m_a, m_b)
    return m, a * ell_a + b * ell_b, (a ** 2)[..., None] * o_a + (b ** 2)[..., None] * o_b


def merge_empty_ell_one(m_a, ell_a, o_a, m_b, ell_b, o_b):
    m, a, b = _factors(m_a, m_b)
    ell = a * ell_a + b * ell_b
    ell = torch.where(torch.isinf(m_a) | torch.isinf(m_b), torch.ones_like(ell), ell)
    return m, ell, a[..., None] * o_a + b[..., None] * o_b


def merge_plain_average(m_a, ell_a, o_a, m_b, ell_b, o_b):
    m, a, b = _factors(m_a, m_b)
    return m, a * ell_a + b * ell_b, (o_a + o_b) / 2


def test_merge_o_factor_squared_is_named():
    _fails(scale.check_merge_states, merge_o_squared, "Likely mistake", "each factor squared")


def test_merge_ell_one_for_an_empty_state_is_named():
    _fails(scale.check_merge_states, merge_empty_ell_one, "Likely mistake", "your ell is 1",
           "has seen no key")


def test_merge_plain_average_of_the_os_is_named():
    _fails(scale.check_merge_states, merge_plain_average, "Likely mistake", "(o_a + o_b) / 2",
           "plain average")


def test_merge_an_empty_state_given_ell_one_before_the_merge_is_right():
    def merge(m_a, ell_a, o_a, m_b, ell_b, o_b):  # its factor is 0, so its ell does not count
        ell_a = torch.where(torch.isinf(m_a), torch.ones_like(ell_a), ell_a)
        ell_b = torch.where(torch.isinf(m_b), torch.ones_like(ell_b), ell_b)
        m, a, b = _factors(m_a, m_b)
        return m, a * ell_a + b * ell_b, a[..., None] * o_a + b[..., None] * o_b

    assert passes(scale.check_merge_states, merge)


# --- flash_forward ----------------------------------------------------------------------------

def _forward(bug=""):
    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        B, h, Lq, d = q.shape
        Lk = k.size(2)
        shift = Lk - Lq if bug.startswith("bottom-right") else 0
        skip = 0 if bug == "bottom-right, skip at the diagonal" else shift
        out, lse = q.new_zeros(B, h, Lq, v.size(-1)), q.new_zeros(B, h, Lq)
        for i0 in range(0, Lq, block_q):
            i1 = min(i0 + block_q, Lq)
            m = torch.full((B, h, i1 - i0), -math.inf, dtype=q.dtype)
            ell = torch.zeros(B, h, i1 - i0, dtype=q.dtype)
            o = torch.zeros(B, h, i1 - i0, v.size(-1), dtype=q.dtype)
            for j0 in range(0, Lk, block_k):
                if is_causal and j0 > i1 - 1 + skip:
                    break
                j1 = min(j0 + block_k, Lk)
                s = q[:, :, i0:i1] @ k[:, :, j0:j1].transpose(-2, -1) / math.sqrt(d)
                if is_causal:
                    if bug == "tile-local":  # i, j counted inside the tile
                        future = torch.arange(j1 - j0)[None, :] > torch.arange(i1 - i0)[:, None]
                    else:
                        future = torch.arange(j0, j1)[None, :] > torch.arange(i0, i1)[:, None] + shift
                    s = s.masked_fill(future, -math.inf)
                m_new = torch.maximum(m, s.amax(dim=-1))
                p = torch.exp(s - m_new[..., None])
                alpha = torch.exp(m - m_new)
                ell = alpha * ell + p.sum(dim=-1)
                o = alpha[..., None] * o + p @ v[:, :, j0:j1]
                m = m_new
            out[:, :, i0:i1] = o / ell[..., None]
            lse[:, :, i0:i1] = m + torch.log(ell)
        return out, lse
    return my_flash_forward


def test_forward_right_style_passes():
    assert passes(scale.check_flash_forward, _forward(""))


@pytest.mark.parametrize("bug", ["bottom-right", "bottom-right, skip at the diagonal"])
def test_forward_bottom_right_mask_is_named(bug):
    _fails(scale.check_flash_forward, _forward(bug), "Likely mistake", "bottom right",
           "query i sees keys 0..i")


def test_forward_mask_from_tile_local_indices_is_named():
    _fails(scale.check_flash_forward, _forward("tile-local"), "Likely mistake",
           "positions inside each tile", "absolute positions")


# --- flash_fix (Debug): observed, never the fix --------------------------------------------------

def _fix(bug=""):
    def flash_one_head(q, k, v, block_k=16):
        scale_ = 1.0 / math.sqrt(q.size(-1))
        m = torch.full((q.size(0),), 0.0 if bug == "m = 0" else float("-inf"), dtype=q.dtype)
        ell = torch.zeros(q.size(0), dtype=q.dtype)
        o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
        for start in range(0, k.size(0), block_k):
            s = q @ k[start:start + block_k].T * scale_
            m_new = torch.maximum(m, s.amax(dim=-1))
            p = torch.exp(s - m_new[:, None])
            alpha = torch.exp(m_new - m) if bug.startswith("upside down") else torch.exp(m - m_new)
            if bug == "upside down, inf made 0":
                alpha = torch.nan_to_num(alpha, posinf=0.0)
            ell = alpha * ell + p.sum(dim=-1)
            if bug == "m = 0":  # the stub's o, m now starting at 0
                o = o + p @ v[start:start + block_k]
            else:
                o = alpha[:, None] * o + p @ v[start:start + block_k]
            if bug == "normalised":
                o = o / ell[:, None]
            m = m_new
        return o if bug == "normalised" else o / ell[:, None]
    return flash_one_head


def _observed_only(failure: CheckFailure) -> None:
    text = str(failure)
    assert "show_solution" not in text and "exp(m - m_new) <=" not in text, text


def test_fix_rescale_factor_upside_down_is_observed():
    failure = _fails(scale.check_flash_fix, _fix("upside down"), "Not yet", "NaN or inf",
                     "exp(m_new - m)", "multiplies ell and o both")
    _observed_only(failure)


def test_fix_rescale_factor_upside_down_with_the_inf_made_0_is_observed():
    failure = _fails(scale.check_flash_fix, _fix("upside down, inf made 0"), "Not yet",
                     "both multiplied by exp(m_new - m) >= 1", "rows whose maximum grows")
    _observed_only(failure)


def test_fix_m_started_at_zero_is_observed():
    failure = _fails(scale.check_flash_fix, _fix("m = 0"), "Not yet", "m starting at 0",
                     "rises above 0")
    _observed_only(failure)


def test_fix_output_normalised_in_every_block_is_observed():
    failure = _fails(scale.check_flash_fix, _fix("normalised"), "Not yet", "divided by ell in every block")
    _observed_only(failure)


def test_fix_right_styles_pass():
    assert passes(scale.check_flash_fix, _fix(""))
    assert passes(scale.check_flash_fix, solution_namespace("13.flash_fix")["flash_one_head"])


# --- flash_backward_tile ----------------------------------------------------------------------

def backward_mask_transposed(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0, is_causal=False):
    s = q_i @ k_j.T * scale
    if is_causal:  # keys masked as if they were queries
        rows = torch.arange(j0, j0 + k_j.size(0))[:, None]
        cols = torch.arange(i0, i0 + q_i.size(0))[None, :]
        s = s.masked_fill((cols > rows).T, float("-inf"))
    p = torch.exp(s - lse_i[:, None])
    ds = p * (d_out_i @ v_j.T - D_i[:, None])
    return ds @ k_j * scale, ds.T @ q_i * scale, p.T @ d_out_i


def test_backward_causal_mask_transposed_is_named():
    failure = _fails(backward.check_flash_backward_tile, backward_mask_transposed, "Likely mistake",
                     "causal mask is transposed")
    assert failure.mistake == "mask transposed"


# --- locate -----------------------------------------------------------------------------------

def locate_sorted(block_table, position, block_size):
    return sorted(block_table)[position // block_size], position % block_size


def locate_boundary_walk(block_table, position, block_size):
    n, start = 0, 0
    while position > start + block_size:  # the boundary itself stays in the block before
        start += block_size
        n += 1
    return block_table[n], position - start


def locate_boundary_walk_last_slot(block_table, position, block_size):
    n, start = 0, 0
    while position > start + block_size:
        start += block_size
        n += 1
    return block_table[n], min(position - start, block_size - 1)


def locate_by_index(block_table, position, block_size):
    logical, slot = divmod(position, block_size)
    return slot, block_table.index(block_table[logical])


def locate_block_size_minus_one(block_table, position, block_size):
    return block_table[position // (block_size - 1)], position % (block_size - 1)


def test_locate_sorted_table_is_named():
    _fails(scale.check_locate, locate_sorted, "as if it were sorted")


@pytest.mark.parametrize("fn, slot", [(locate_boundary_walk, "slot 16 = block_size"),
                                      (locate_boundary_walk_last_slot, "slot 15, where position 15")])
def test_locate_boundary_walk_is_named_not_position_minus_one(fn, slot):
    failure = _fails(scale.check_locate, fn, "block boundary", "logical block 0's", slot)
    assert failure.mistake != "position - 1"


def test_locate_index_lookup_is_not_called_swapped_alone():
    failure = _fails(scale.check_locate, locate_by_index, "the logical block, not the physical one")
    assert "the two numbers are swapped" not in str(failure)


def test_locate_block_size_minus_one_is_not_called_the_tables_length():
    failure = _fails(scale.check_locate, locate_block_size_minus_one, "block_size - 1")
    assert "table's length" not in str(failure)


def test_locate_right_styles_pass():
    def walk(block_table, position, block_size):
        n, start = 0, 0
        while position >= start + block_size:
            start += block_size
            n += 1
        return block_table[n], position - start

    assert passes(scale.check_locate, walk)
    assert passes(scale.check_locate, lambda t, p, s: (t[t.index(t[p // s])], p % s))


# --- paged_attention --------------------------------------------------------------------------

def _paged(bug=""):
    def my_paged_attention(q, k_blocks, v_blocks, block_table, length):
        num_heads, head_dim = q.shape
        num_kv_heads, block_size = k_blocks.size(1), k_blocks.size(2)
        group = num_heads // num_kv_heads
        m = torch.full((num_heads,), float("-inf"), dtype=q.dtype)
        ell = torch.zeros(num_heads, dtype=q.dtype)
        o = torch.zeros(num_heads, head_dim, dtype=q.dtype)
        kb, vb = (v_blocks, k_blocks) if bug == "k and v swapped" else (k_blocks, v_blocks)
        for logical in range(math.ceil(length / block_size)):
            physical = block_table[logical]
            counted = physical if bug == "fill from physical" else logical
            filled = min(block_size, length - counted * block_size)
            k = kb[physical, :, :filled].repeat_interleave(group, dim=0)
            v = vb[physical, :, :filled].repeat_interleave(group, dim=0)
            s = (k @ q.unsqueeze(-1)).squeeze(-1) / math.sqrt(head_dim)
            m_tile = s.amax(dim=-1)
            p = torch.exp(s - m_tile[:, None])
            m_new = torch.maximum(m, m_tile)
            if bug.startswith("merge upside down"):  # both states' factors exp(m_new - m_state)
                a = torch.exp(m_new - m)
                if bug == "merge upside down":  # the empty state's inf made 0
                    a = torch.where(torch.isinf(m), torch.zeros_like(m), a)
                c = torch.exp(m_new - m_tile)
            else:
                a, c = torch.exp(m - m_new), torch.exp(m_tile - m_new)
            ell = a * ell + c * p.sum(-1)
            o = a[:, None] * o + c[:, None] * (p.unsqueeze(-1) * v).sum(dim=1)
            m = m_new
        return o / ell.unsqueeze(-1)
    return my_paged_attention


def test_paged_right_style_passes():
    assert passes(check_paged_attention, _paged(""))


@pytest.mark.parametrize("bug, words", [
    ("merge upside down", ["Likely mistake", "upside down", "exp(m_new - m_old)"]),
    ("merge upside down, no guard", ["Likely mistake", "NaN", "factors are upside down"]),
    ("k and v swapped", ["Likely mistake", "k and v exchanged"]),
    ("fill from physical", ["Likely mistake", "physical number", "length - 7 * block_size"]),
])
def test_paged_mistakes_are_named(bug, words):
    _fails(check_paged_attention, _paged(bug), *words)
