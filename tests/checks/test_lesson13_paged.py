"""check_paged_attention (lesson 13, the paged cache read page by page): the solution and other
correct styles pass, each usual mistake is named with its own message, course_lib's
paged_attention, the cache's gather and SDPA are refused kindly, bad answers get a message."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _helpers import as_library, assert_checkers_keep_random_state, passes, solution_namespace

from course_lib import paged
from course_lib.checks import CheckFailure
from course_lib.checks.lesson13_paged import check_paged_attention, paged_case
from course_lib.flash import merge_softmax_states


def _solution():
    return solution_namespace("13.paged_attention")["my_paged_attention"]


def per_head_loop(q, k_blocks, v_blocks, block_table, length):
    """Another style: one head at a time, an online softmax written inline, float64 throughout."""
    heads, d = q.shape
    kv, bs = k_blocks.shape[1], k_blocks.shape[2]
    out = []
    for i in range(heads):
        j = i * kv // heads  # = i // (heads // kv)
        m, ell, o = -math.inf, 0.0, torch.zeros(d, dtype=torch.float64)
        for n in range((length + bs - 1) // bs):
            block = block_table[n]
            filled = min(bs, length - n * bs)
            s = torch.einsum("d,kd->k", q[i], k_blocks[block, j, :filled]) / math.sqrt(d)
            m_new = max(m, s.max().item())
            p = torch.exp(s - m_new)
            ell = ell * math.exp(m - m_new) + p.sum().item()
            o = o * math.exp(m - m_new) + p @ v_blocks[block, j, :filled]
            m = m_new
        out.append(o / ell)
    return torch.stack(out)


@torch.no_grad()
def grouped_view(q, k_blocks, v_blocks, block_table, length):
    """Another style: the query heads viewed as (kv, group), course_lib's merge (a building block)."""
    heads, d = q.shape
    kv, bs = k_blocks.shape[1], k_blocks.shape[2]
    qg = q.view(kv, heads // kv, d)
    state = (torch.full((kv, heads // kv), -math.inf, dtype=q.dtype),
             torch.zeros(kv, heads // kv, dtype=q.dtype), torch.zeros(kv, heads // kv, d, dtype=q.dtype))
    for n, block in enumerate(block_table):
        filled = max(0, min(bs, length - n * bs))
        if filled == 0:
            break
        s = qg @ k_blocks[block, :, :filled].transpose(1, 2) / d ** 0.5  # (kv, group, filled)
        m = s.amax(-1)
        p = (s - m[..., None]).exp()
        state = merge_softmax_states(*state, m, p.sum(-1), p @ v_blocks[block, :, :filled])
    return (state[2] / state[1][..., None]).reshape(heads, d)


def mistaken(knob):
    """The solution's loop, tile by tile (never gathering), with one mistake."""
    rescales = {"ell not o", "o not ell", "no rescale", "no rescale, new max", "o added as is",
                "ell added as is"}

    def attend(q, k_blocks, v_blocks, block_table, length):
        heads, d = q.shape
        nb, kv, bs, _ = k_blocks.shape
        n_keys = {"one short": length - 1, "one more": length + 1,
                  "no last partial": length // bs * bs,
                  "whole last block": -(-length // bs) * bs}.get(knob, length)
        scale = {"no scale": 1.0, "scale 1/d": 1 / d, "scale 1/sqrt(num_heads)": heads ** -0.5,
                 "scale 1/sqrt(block_size)": bs ** -0.5}.get(knob, d ** -0.5)
        flat_k, flat_v = k_blocks.reshape(kv, nb * bs, d), v_blocks.reshape(kv, nb * bs, d)
        m = torch.full((heads,), -math.inf, dtype=q.dtype)
        ell, o = torch.zeros(heads, dtype=q.dtype), torch.zeros(heads, d, dtype=q.dtype)
        outs, counts = [], []
        heads_ = torch.arange(heads)
        index = {"heads modulo": heads_ % kv,
                 "heads divided": heads_ // kv}.get(knob, heads_ // (heads // kv))
        for n in range(-(-n_keys // bs)):
            physical = n if knob == "table ignored" else block_table[n]
            filled = min(bs, n_keys - n * bs)
            if knob == "flat pool":
                k = flat_k[:, physical * bs:physical * bs + filled][index]
                v = flat_v[:, physical * bs:physical * bs + filled][index]
            elif knob == "axes swapped":  # k_blocks[b, :filled, j] for KV head j
                k = k_blocks[physical, :filled][:, index].transpose(0, 1)  # (heads, min(filled, kv), d)
                v = v_blocks[physical, :filled][:, index].transpose(0, 1)
            else:
                k, v = k_blocks[physical, :, :filled][index], v_blocks[physical, :, :filled][index]
            s = torch.einsum("hd,hkd->hk", q, k) * scale
            if knob == "no max":
                mt = torch.zeros(heads, dtype=q.dtype)
            elif knob == "sum over heads":
                mt = s.max().expand(heads)
            else:
                mt = s.amax(-1)
            p = torch.exp(s - mt[:, None])
            lt = p.sum().expand(heads) if knob.startswith("sum over heads") else p.sum(-1)
            o_tile = torch.einsum("hk,hkd->hd", p, v)  # (heads, d)
            outs.append(o_tile / p.sum(-1)[:, None])
            counts.append(filled)
            if knob == "normalised per block":
                o_tile = o_tile / lt[:, None]
            if knob in rescales:  # a running loop written inline
                m_new = torch.maximum(m, mt)
                a, c = torch.exp(m - m_new), torch.exp(mt - m_new)
                if knob == "no rescale":
                    ell, o = ell + lt, o + o_tile
                elif knob == "o added as is":
                    ell, o = a * ell + c * lt, o + o_tile
                elif knob == "ell added as is":
                    ell, o = ell + lt, a[:, None] * o + c[:, None] * o_tile
                else:
                    ell = (1 if knob in ("o not ell", "no rescale, new max") else a) * ell + c * lt
                    keep = 1 if knob in ("ell not o", "no rescale, new max") else a[:, None]
                    o = keep * o + c[:, None] * o_tile
                m = m_new
            else:
                m, ell, o = merge_softmax_states(m, ell, o, mt, lt, o_tile)
        if knob == "no division":
            return o
        if knob == "mean of tiles":
            return torch.stack(outs).mean(0)
        if knob == "sum of tiles":
            return torch.stack(outs).sum(0)
        if knob == "weighted mean of tiles":
            return sum(c * t for c, t in zip(counts, outs)) / n_keys
        return o / ell[:, None]

    attend.__name__ = f"attend_{knob.replace(' ', '_').replace('/', '').replace(',', '')}"
    return attend


def normalised_then_weighted(q, k_blocks, v_blocks, block_table, length):
    """Another style: each block's softmax output, merged with the weights ell * exp(m - m_total)."""
    heads, d = q.shape
    kv, bs = k_blocks.shape[1], k_blocks.shape[2]
    index = torch.arange(heads) // (heads // kv)
    outs, ms, ells = [], [], []
    for n in range(math.ceil(length / bs)):
        filled = min(bs, length - n * bs)
        k = k_blocks[block_table[n]][index, :filled]  # (heads, filled, d)
        v = v_blocks[block_table[n]][index, :filled]
        s = torch.einsum("hd,hkd->hk", q, k) / math.sqrt(d)
        outs.append(torch.einsum("hk,hkd->hd", s.softmax(-1), v))
        ms.append(s.amax(-1))
        ells.append(torch.exp(s - ms[-1][:, None]).sum(-1))
    m = torch.stack(ms).amax(0)  # (heads,)
    w = torch.stack([e * torch.exp(mb - m) for e, mb in zip(ells, ms)])  # (blocks, heads)
    return (w[..., None] * torch.stack(outs)).sum(0) / w.sum(0)[:, None]


def logsumexp_with_float32_start(q, k_blocks, v_blocks, block_table, length):
    """Another style: the state as (log-sum-exp, output), started from float32 zeros (which
    become float64 at the first merge, as PyTorch promotes)."""
    heads, d = q.shape
    kv, bs = k_blocks.shape[1], k_blocks.shape[2]
    lse, out = torch.full((heads,), -math.inf), torch.zeros(heads, d)
    for n in range(math.ceil(length / bs)):
        filled = min(bs, length - n * bs)
        k = k_blocks[block_table[n], :, :filled].repeat_interleave(heads // kv, 0)
        v = v_blocks[block_table[n], :, :filled].repeat_interleave(heads // kv, 0)
        s = torch.einsum("hd,hkd->hk", q, k) / math.sqrt(d)
        lb = torch.logsumexp(s, -1)
        new = torch.logaddexp(lse, lb)
        out = torch.exp(lse - new)[:, None] * out + torch.exp(lb - new)[:, None] * (
            torch.einsum("hk,hkd->hd", s.softmax(-1), v))
        lse = new
    return out


@pytest.mark.parametrize("fn", [_solution(), per_head_loop, grouped_view, normalised_then_weighted,
                                logsumexp_with_float32_start],
                         ids=["solution", "loop", "view", "normalised", "logsumexp"])
def test_correct_styles_pass(fn, capsys):
    assert passes(check_paged_attention, fn)
    assert "all 6 cases" in capsys.readouterr().out


def test_the_solution_passes_with_course_libs_merge():
    namespace = solution_namespace("13.paged_attention")
    namespace["merge_states"] = merge_softmax_states  # a learner whose own merge is not done
    assert passes(check_paged_attention, namespace["my_paged_attention"])


@pytest.mark.parametrize("knob, words", [
    ("table ignored", "logical block n is read from physical block n"),
    ("flat pool", "mixes the heads axis with the blocks"),
    ("axes swapped", "the KV-heads and slots axes are swapped"),
    ("one short", "the newest position, length - 1, is missing"),
    ("one more", "one slot too many is read"),
    ("no last partial", "the last block, which is only partly filled, is left out"),
    ("whole last block", "every slot of the last block is read"),
    ("scale 1/sqrt(num_heads)", "divided by sqrt(num_heads), not by sqrt(head_dim)"),
    ("scale 1/sqrt(block_size)", "divided by sqrt(block_size), not by sqrt(head_dim)"),
    ("no scale", "not divided by sqrt(head_dim)"),
    ("scale 1/d", "divided by head_dim, not by its square root"),
    ("heads modulo", "query head i reads KV head i % num_kv_heads"),
    ("heads divided", "query head i reads KV head i // num_kv_heads"),
    ("ell not o", "ell is rescaled by exp(m_old - m_new) but o is not"),
    ("o not ell", "o is rescaled by exp(m_old - m_new) but ell is not"),
    ("no rescale", "added without rescaling"),
    ("no rescale, new max", "the old ell and o keep the old one"),
    ("o added as is", "o is never rescaled"),
    ("ell added as is", "ell is never rescaled"),
    ("normalised per block", "divided by its own ell before the merge"),
    ("sum over heads", "one sum over every head's scores"),
    ("sum over heads, own max", "one sum over every head's exp(s - m)"),
    ("no division", "the merged o, not divided by ell"),
    ("mean of tiles", "the mean of each block's own softmax output"),
    ("weighted mean of tiles", "weighted by the block's number of keys"),
    ("sum of tiles", "the sum of each block's own softmax output"),
])
def test_each_mistake_is_named(knob, words):
    with pytest.raises(CheckFailure, match="Likely mistake") as info:
        check_paged_attention(mistaken(knob))
    assert words in str(info.value) and info.value.mistake == knob


def test_exp_without_the_maximum_is_named_where_it_overflows():
    with pytest.raises(CheckFailure, match="scores are near 1000") as info:
        check_paged_attention(mistaken("no max"))
    assert info.value.mistake == "no max subtracted" and "exp(s - m)" in str(info.value)


def test_float32_is_named_not_sent_hunting_for_a_logic_bug():
    right = mistaken("none")  # the loop without a mistake, in the inputs' dtype

    def in_float32(q, k_blocks, v_blocks, block_table, length):
        return right(q.float(), k_blocks.float(), v_blocks.float(), block_table, length)

    def float32_inside(q, k_blocks, v_blocks, block_table, length):
        return in_float32(q, k_blocks, v_blocks, block_table, length).double()

    for fn, words in [(in_float32, "your output is float32"),
                      (float32_inside, "your output is float64, computed in float32")]:
        with pytest.raises(CheckFailure, match="Nearly") as info:
            check_paged_attention(fn)
        assert words in str(info.value) and info.value.mistake == "float32"
        assert "compares in float64 to 1e-9" in str(info.value)
    wrong_and_float32 = mistaken("mean of tiles")
    with pytest.raises(CheckFailure, match="the mean of each block's own softmax output") as info:
        check_paged_attention(lambda q, kb, vb, t, n: wrong_and_float32(q.float(), kb.float(),
                                                                        vb.float(), t, n))
    assert "Your output is also float32" in str(info.value)


def test_errors_where_a_case_first_brings_something_new_say_what():
    def ceil_forgotten_when_full(q, k_blocks, v_blocks, block_table, length):
        bs = k_blocks.size(2)
        if length % bs == 0:
            block_table[length // bs]  # one block past the table, as `length // bs + 1` blocks would
        return per_head_loop(q, k_blocks, v_blocks, block_table, length)

    with pytest.raises(CheckFailure, match="Your code raised IndexError") as info:
        check_paged_attention(ceil_forgotten_when_full)
    assert info.value.mistake == "full last block" and "one past the table's end" in str(info.value)

    def heads_not_grouped(q, k_blocks, v_blocks, block_table, length):
        heads, d = q.shape
        bs = k_blocks.size(2)
        state = (torch.full((heads,), -math.inf, dtype=q.dtype), torch.zeros(heads, dtype=q.dtype),
                 torch.zeros(heads, d, dtype=q.dtype))
        for n in range(math.ceil(length / bs)):
            filled = min(bs, length - n * bs)
            k, v = k_blocks[block_table[n], :, :filled], v_blocks[block_table[n], :, :filled]
            s = torch.einsum("hd,hkd->hk", q, k) / d ** 0.5  # q's heads taken as the KV heads
            m = s.amax(-1)
            p = torch.exp(s - m[:, None])
            state = merge_softmax_states(*state, m, p.sum(-1), torch.einsum("hk,hkd->hd", p, v))
        return state[2] / state[1][:, None]

    with pytest.raises(CheckFailure, match="Your code raised RuntimeError") as info:
        check_paged_attention(heads_not_grouped)
    assert info.value.mistake == "grouped heads"
    assert "i // (num_heads // num_kv_heads)" in str(info.value)


def test_an_unknown_mistake_gets_the_case_to_compare_block_by_block():
    def last_value_doubled(q, k_blocks, v_blocks, block_table, length):
        v = v_blocks.clone()
        v[block_table[(length - 1) // v.size(2)], :, (length - 1) % v.size(2)] *= 2
        return per_head_loop(q, k_blocks, v, block_table, length)

    with pytest.raises(CheckFailure, match="None of the usual mistakes") as info:
        check_paged_attention(last_value_doubled)
    text = str(info.value)
    for words in ["block_size 4", "block_table [7, 2, 9]", "length 10", "3 blocks, the last holding 2",
                  "num_heads 1", "in query heads [0]", "No case passes yet", "each block's physical number"]:
        assert words in text, words
    assert "import" not in text  # what to print, not a checker's module to import (tryout 13g)
    q, k_blocks, v_blocks, table, length = paged_case(1)
    assert q.shape == (1, 8) and k_blocks.shape == (12, 1, 4, 8) and table == [7, 2, 9] and length == 10
    with pytest.raises(ValueError, match="1 to 6"):
        paged_case(0)


def test_ready_made_attention_is_refused_kindly():
    with pytest.raises(CheckFailure, match="ready-made function"):
        check_paged_attention(paged.paged_attention)

    def through_the_library(q, k_blocks, v_blocks, block_table, length):
        cache = paged.PagedKVCache(1, k_blocks.size(1), q.size(1), k_blocks.size(0), k_blocks.size(2),
                                   dtype=q.dtype)
        cache.k_blocks[0], cache.v_blocks[0] = k_blocks, v_blocks
        cache.block_tables[0], cache.lengths[0] = list(block_table), [length]
        return paged.paged_attention(q, cache, 0, 0)

    with pytest.raises(CheckFailure, match="calls course_lib's paged_attention"):
        check_paged_attention(through_the_library)

    def sdpa_on_the_gathered_cache(q, k_blocks, v_blocks, block_table, length):
        kv = k_blocks.size(1)
        k = k_blocks[block_table].transpose(0, 1).flatten(1, 2)[:, :length]  # (kv, length, d)
        v = v_blocks[block_table].transpose(0, 1).flatten(1, 2)[:, :length]
        return F.scaled_dot_product_attention(q[None, :, None], k[None], v[None],
                                              enable_gqa=q.size(0) != kv)[0, :, 0]

    with pytest.raises(CheckFailure, match="calls PyTorch's attention") as info:
        check_paged_attention(sdpa_on_the_gathered_cache)
    assert "merge the states" in str(info.value)
    with pytest.raises(CheckFailure, match="ready-made function"):
        check_paged_attention(F.scaled_dot_product_attention)
    hidden = as_library(per_head_loop, "course_lib.paged")
    with pytest.raises(CheckFailure, match="ready-made function"):
        check_paged_attention(hidden)


def test_the_gathered_cache_is_named_though_its_numbers_are_right():
    def gathered(q, k_blocks, v_blocks, block_table, length):
        heads, d = q.shape
        kv = k_blocks.size(1)
        k = k_blocks[block_table].transpose(0, 1).flatten(1, 2)[:, :length]  # (kv, length, d)
        v = v_blocks[block_table].transpose(0, 1).flatten(1, 2)[:, :length]
        k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
        return ((q[:, None] @ k.transpose(1, 2)) / d ** 0.5).softmax(-1).matmul(v)[:, 0]

    with pytest.raises(CheckFailure, match="Right numbers, but your function makes a tensor of") as info:
        check_paged_attention(gathered)
    assert info.value.mistake == "gathered the cache" and "one block at a time" in str(info.value)


def test_bad_answers_get_a_message(capsys):
    def stub(q, k_blocks, v_blocks, block_table, length):
        raise NotImplementedError

    check_paged_attention(stub)
    assert "not implemented yet" in capsys.readouterr().out
    for answer, words in [
        (lambda *a: None, "Return a tensor (num_heads, head_dim)"),
        (lambda *a: [[0.0]], "got list"),
        (lambda q, *a: q[:, :2], "Wrong shape"),
        (lambda q, *a: q * math.nan, "NaN or inf"),
        (lambda q, *a: q[5], "Your code raised IndexError"),
    ]:
        with pytest.raises(CheckFailure, match=words.replace("(", r"\(").replace(")", r"\)")):
            check_paged_attention(answer)

    def in_place(q, k_blocks, v_blocks, block_table, length):
        out = per_head_loop(q, k_blocks, v_blocks, block_table, length)
        k_blocks.zero_()
        return out

    with pytest.raises(CheckFailure, match="changes its inputs in place"):
        check_paged_attention(in_place)
    with pytest.raises(CheckFailure, match="Hand in your function itself, got int"):
        check_paged_attention(3)


def test_the_checker_keeps_the_random_state():
    assert_checkers_keep_random_state([(check_paged_attention, per_head_loop)])


def test_a_table_walked_in_sorted_order_is_named():
    """The tryout's attempt: the blocks visited in sorted(block_table) order, each filled as logical n."""
    def my_paged_attention(q, k_blocks, v_blocks, block_table, length):
        num_heads, head_dim = q.shape
        num_kv, block_size = k_blocks.size(1), k_blocks.size(2)
        kv_of_head = torch.arange(num_heads) // (num_heads // num_kv)
        m = torch.full((num_heads,), -math.inf, dtype=q.dtype)
        ell = torch.zeros(num_heads, dtype=q.dtype)
        o = torch.zeros(num_heads, v_blocks.size(-1), dtype=q.dtype)
        n_blocks = (length + block_size - 1) // block_size
        for n, physical in enumerate(sorted(block_table[:n_blocks])):
            filled = min(block_size, length - n * block_size)
            kb, vb = k_blocks[physical, kv_of_head, :filled], v_blocks[physical, kv_of_head, :filled]
            s = torch.einsum("hd,hnd->hn", q, kb) / math.sqrt(head_dim)
            m_b = s.amax(dim=-1)
            p = torch.exp(s - m_b[:, None])
            m, ell, o = merge_softmax_states(m, ell, o, m_b, p.sum(-1),
                                             torch.einsum("hn,hnd->hd", p, vb))
        return o / ell[:, None]
    with pytest.raises(CheckFailure, match="Likely mistake") as info:
        check_paged_attention(my_paged_attention)
    assert "sorted(block_table)" in str(info.value) and info.value.mistake == "table sorted"
