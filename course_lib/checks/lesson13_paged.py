"""Checkers for lesson 13's paged KV cache, read page by page (PagedAttention's kernel).

* ``check_paged_attention(fn)``: ``fn(q, k_blocks, v_blocks, block_table, length) -> (num_heads,
  head_dim)``: one query per head attends to a sequence's ``length`` positions, whose keys and values
  live in the physical blocks ``block_table`` names (``k_blocks, v_blocks (num_blocks, num_kv_heads,
  block_size, head_dim)``, one layer of the pool), read one block at a time and merged as softmax
  states. Reference: the softmax written out over the gathered keys, float64, to 1e-9. The pools
  hold noise in every slot no sequence owns, the tables are out of order, the last block is partly
  full in most cases and full in one, some cases have grouped-query heads, and the last case's scores
  are near 1000 (exp overflows there unless the maximum is subtracted), so that each usual mistake
  (the table ignored, the pool flattened with its heads, the heads and slots axes swapped, one
  position short or one too many, the last partial block forgotten or read whole, the scale, the
  head grouping, ell or o not rescaled when the maximum grows, a block normalised before the merge,
  sums over the heads, no final division, averaged or summed tiles, float32) gives other numbers.
  The first case that differs is diagnosed: the mistake that gives its numbers (and, of those, the
  one that gives the most cases' numbers) is named; if none does, the message gives the case's
  sizes and table and ``paged_case(number)`` rebuilds its inputs. Also checked: no tensor larger
  than a page's worth per head (no gathered cache), no SDPA, not course_lib's ``paged_attention``.

Every checker compares in float64, runs the learner's code under a time limit on one thread, and
turns any raw error into a message (the conventions of ``common``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from .. import paged
from .common import CheckFailure, calls_to, checker, is_course_lib, one_thread, time_limit
from .common import SdpaWatch
from .lesson13_named_g import merge_call_said, paged_more_said
from .lesson13_scale_mistakes import later_max_said
from .lesson13_named import paged_nan_named, paged_named, paged_raise_named

__all__ = ["check_paged_attention"]

TIME_LIMIT = 60.0

# (case, block_size, num_kv_heads, num_heads, head_dim, length, num_blocks, block_table)
_CASES = [
    ("1 head, blocks of 4, 10 positions (the last block holds 2 of 4)", 4, 1, 1, 8, 10, 12, [7, 2, 9]),
    ("2 heads, blocks of 4, 16 positions (the last block is full)", 4, 2, 2, 8, 16, 10, [5, 0, 9, 3]),
    ("6 query heads on 2 KV heads, blocks of 8, 21 positions", 8, 2, 6, 4, 21, 7, [4, 6, 1]),
    ("4 query heads on 1 KV head, blocks of 3, 1 position", 3, 1, 4, 8, 1, 5, [3]),
    ("8 query heads on 4 KV heads, blocks of 16, 50 positions", 16, 4, 8, 16, 50, 9, [8, 1, 6, 2]),
    ("3 heads, blocks of 5, 23 positions, a table of 5 blocks, scores near 1000", 5, 3, 3, 8, 23, 11,
     [10, 4, 0, 7, 5]),
]
_LARGE = 5  # the case whose scores are near 1000: exp(score) is inf in float64 above 709.8
_FIRST_OF_ITS_KIND = {  # case: (mistake, what is new in it), for an error raised there first
    1: ("full last block", "whose last block is full (length = 4 * block_size): is a last block of "
                           "length % block_size = 0 slots read, or block_table[length // block_size], "
                           "one past the table's end? The sequence has ceil(length / block_size) "
                           "blocks, the last holding length - (n_blocks - 1) * block_size slots."),
    2: ("grouped heads", "with grouped-query heads (6 query heads on 2 KV heads): q has more heads "
                         "than k_blocks, and query head i reads KV head i // (num_heads // "
                         "num_kv_heads)."),
}

_RESCALE_FIX = ("when the maximum grows from m_old to m_new, multiply both the old ell and the old o "
                "by exp(m_old - m_new) before adding the block's (merge_states does both)")
_MISTAKES = [  # (knob, what is observed, what to do)
    ("table ignored", "logical block n is read from physical block n: the block table is not used",
     "the keys of logical block n live in physical block block_table[n]"),
    ("table sorted", "the blocks are read in the order of their physical numbers, "
                     "sorted(block_table), not in the table's order: the keys of logical block n come "
                     "from another physical block, and the last, partly filled block is cut where "
                     "another block's slots are", "the keys of logical block n live in physical block "
                     "block_table[n]: walk the table in its own order"),
    ("flat pool", "the pool is flattened to (num_kv_heads, num_blocks * block_size, head_dim) with a "
                  "reshape that mixes the heads axis with the blocks (k_blocks is (num_blocks, "
                  "num_kv_heads, block_size, head_dim))",
     "read one block, k_blocks[physical], which is (num_kv_heads, block_size, head_dim)"),
    ("axes swapped", "the KV-heads and slots axes are swapped: KV head j's keys are read as "
                     "k_blocks[physical, :n, j] (slot j of the first n KV heads)",
     "k_blocks is (num_blocks, num_kv_heads, block_size, head_dim): the first n keys of KV head j "
     "are k_blocks[physical, j, :n]"),
    ("one short", "the newest position, length - 1, is missing: only positions 0 .. length - 2 are "
                  "attended to", "the sequence holds positions 0 .. length - 1, all of them"),
    ("one more", "one slot too many is read: position `length`, which holds no key of this sequence "
                 "(noise)", "the sequence holds positions 0 .. length - 1"),
    ("no last partial", "the last block, which is only partly filled, is left out",
     "the sequence has ceil(length / block_size) blocks; the last holds length - (n_blocks - 1) * "
     "block_size positions"),
    ("whole last block", "every slot of the last block is read, also the slots after position "
                         "length - 1, which hold no key of this sequence (noise)",
     "read only the filled slots of the last block"),
    ("scale 1/sqrt(num_heads)", "the scores are divided by sqrt(num_heads), not by sqrt(head_dim)",
     "scale them by 1 / sqrt(head_dim), head_dim = q.shape[1]"),
    ("scale 1/sqrt(block_size)", "the scores are divided by sqrt(block_size), not by sqrt(head_dim)",
     "scale them by 1 / sqrt(head_dim), head_dim = q.shape[1]"),
    ("no scale", "the scores are not divided by sqrt(head_dim)", "scale them by 1 / sqrt(head_dim)"),
    ("scale 1/d", "the scores are divided by head_dim, not by its square root",
     "scale them by 1 / sqrt(head_dim)"),
    ("heads modulo", "query head i reads KV head i % num_kv_heads",
     "with grouped-query heads, query head i reads KV head i // (num_heads // num_kv_heads): "
     "neighbouring query heads share a KV head"),
    ("heads divided", "query head i reads KV head i // num_kv_heads",
     "with grouped-query heads, query head i reads KV head i // (num_heads // num_kv_heads), the "
     "group size being num_heads // num_kv_heads"),
    ("ell not o", "when the running maximum grows, ell is rescaled by exp(m_old - m_new) but o is "
                  "not (the lesson's first pitfall)", _RESCALE_FIX),
    ("o not ell", "when the running maximum grows, o is rescaled by exp(m_old - m_new) but ell is "
                  "not", _RESCALE_FIX),
    ("no rescale", "the blocks' states are added without rescaling: the old ell and o are never "
                   "multiplied by exp(m_old - m_new) when the maximum grows", _RESCALE_FIX),
    ("no rescale, new max", "the old state is never rescaled: each block's exp is taken from the new "
                            "running maximum, but the old ell and o keep the old one",
     _RESCALE_FIX),
    ("o added as is", "ell is merged with its rescaling, but o just adds each block's o, every one "
                      "measured from its own maximum: o is never rescaled", _RESCALE_FIX),
    ("ell added as is", "o is merged with its rescaling, but ell just adds each block's ell, every "
                        "one measured from its own maximum: ell is never rescaled", _RESCALE_FIX),
    ("normalised per block", "each block's o is divided by its own ell before the merge, and the "
                             "merged o is divided by ell once more at the end",
     "keep each block's o as it comes, sum of exp(s - m) * v, merge, and divide once, at the end"),
    ("divided in the loop", "o is divided by ell after every block's merge, and ell set back to 1: "
                            "the earlier keys then weigh in the next merge as if their sum of "
                            "exp(s - m) were 1, not ell",
     "keep o and ell as running sums through the loop, and divide once, after the last block"),
    ("sum over heads", "each block's ell is one sum over every head's scores (and its maximum one "
                       "maximum over every head), not one per head along its keys",
     "the block's scores s are (num_heads, n): m = s.amax(-1) and ell = p.sum(-1), one per head"),
    ("sum over heads, own max", "each block's ell is one sum over every head's exp(s - m), not one "
                                "per head along its keys",
     "the block's scores s are (num_heads, n): ell = p.sum(-1), one per head"),
    ("no division", "the output is the merged o, not divided by ell",
     "after the last block, the output is o / ell"),
    ("mean of tiles", "the output is the mean of each block's own softmax output",
     "blocks hold different numbers of keys and different maxima: merge their states (m, ell, o), "
     "then divide once"),
    ("weighted mean of tiles", "the output is the mean of each block's own softmax output, "
                               "weighted by the block's number of keys",
     "the weight of a block is its sum of exp(s - m_total), not its number of keys: merge the "
     "states (m, ell, o), then divide once"),
    ("sum of tiles", "the output is the sum of each block's own softmax output",
     "blocks hold different numbers of keys and different maxima: merge their states (m, ell, o), "
     "then divide once"),
]
_TILED = {"axes swapped", "divided in the loop", "ell not o", "o not ell", "no rescale", "no rescale, new max",
          "o added as is", "ell added as is",
          "normalised per block", "sum over heads", "sum over heads, own max", "sum of tiles"}


def _attend(q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor, table: list[int],
            length: int, knob: str | None = None) -> torch.Tensor:
    """Attention over the gathered keys (the reference), or a mistaken variant of it (``knob``)."""
    if knob in _TILED:
        return _tiled(q, k_blocks, v_blocks, table, length, knob)
    heads, d = q.shape
    num_blocks, kv, bs, _ = k_blocks.shape
    n_keys = {"one short": length - 1, "one more": length + 1, "no last partial": length // bs * bs,
              "whole last block": math.ceil(length / bs) * bs}.get(knob, length)
    if n_keys < 1 or math.ceil(n_keys / bs) > len(table):
        raise ValueError("this variant cannot run on this case")
    logical = range(math.ceil(n_keys / bs))
    physical = list(logical) if knob == "table ignored" else [table[n] for n in logical]
    physical = sorted(physical) if knob == "table sorted" else physical
    if knob == "flat pool":
        flat = [table[p // bs] * bs + p % bs for p in range(n_keys)]
        k = k_blocks.reshape(kv, num_blocks * bs, d)[:, flat]
        v = v_blocks.reshape(kv, num_blocks * bs, d)[:, flat]
    else:  # (n, kv, bs, d) -> (kv, n * bs, d), then the first n_keys positions
        k = k_blocks[physical].transpose(0, 1).reshape(kv, -1, d)[:, :n_keys]
        v = v_blocks[physical].transpose(0, 1).reshape(kv, -1, d)[:, :n_keys]
    scale = {"no scale": 1.0, "scale 1/d": 1.0 / d,
             "scale 1/sqrt(num_heads)": 1.0 / math.sqrt(heads),
             "scale 1/sqrt(block_size)": 1.0 / math.sqrt(bs)}.get(knob, 1.0 / math.sqrt(d))
    rows = []
    for i in range(heads):
        j = {"heads modulo": i % kv, "heads divided": i // kv}.get(knob, i // (heads // kv))
        if j >= kv:
            raise ValueError("this variant cannot run on this case")
        s = q[i] @ k[j].T * scale  # (n_keys,)
        if knob == "no division":
            rows.append(torch.exp(s - s.max()) @ v[j])
        elif knob == "mean of tiles":
            rows.append(torch.stack([s[a:a + bs].softmax(-1) @ v[j][a:a + bs]
                                     for a in range(0, n_keys, bs)]).mean(0))
        elif knob == "weighted mean of tiles":
            rows.append(sum(s[a:a + bs].softmax(-1) @ v[j][a:a + bs] * len(s[a:a + bs])
                            for a in range(0, n_keys, bs)) / n_keys)
        else:
            rows.append(s.softmax(-1) @ v[j])
    return torch.stack(rows)  # (heads, d)


def _tiled(q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor, table: list[int],
           length: int, knob: str) -> torch.Tensor:
    """The block-by-block loop with one mistake in a block's state or in the merge (``knob``)."""
    heads, d = q.shape
    kv, bs = k_blocks.shape[1], k_blocks.shape[2]
    m = torch.full((heads,), -math.inf, dtype=torch.float64)
    ell = torch.zeros(heads, dtype=torch.float64)
    o = torch.zeros(heads, d, dtype=torch.float64)
    tiles = []
    for n in range(math.ceil(length / bs)):
        filled, b = min(bs, length - n * bs), table[n]
        scores, values = [], []
        for i in range(heads):
            j = i // (heads // kv)
            if knob == "axes swapped":
                if j >= bs:
                    raise ValueError("this variant cannot run on this case")
                k, v = k_blocks[b, :filled, j], v_blocks[b, :filled, j]  # (min(filled, kv), d)
            else:
                k, v = k_blocks[b, j, :filled], v_blocks[b, j, :filled]  # (filled, d)
            scores.append(k @ q[i] / math.sqrt(d))
            values.append(v)
        mb = torch.stack([s.max() for s in scores])  # (heads,)
        if knob == "sum over heads":
            mb = mb.max().expand(heads)
        p = [torch.exp(s - mb[i]) for i, s in enumerate(scores)]
        lb = torch.stack([pi.sum() for pi in p])  # (heads,)
        ob = torch.stack([pi @ v for pi, v in zip(p, values)])  # (heads, d)
        if knob in ("sum over heads", "sum over heads, own max"):
            lb = lb.sum().expand(heads)
        if knob in ("normalised per block", "sum of tiles"):
            ob = ob / lb[:, None]
        tiles.append(ob)
        m_new = torch.maximum(m, mb)
        a, c = torch.exp(m - m_new), torch.exp(mb - m_new)
        one = torch.ones_like(a)
        a_ell = one if knob in ("o not ell", "no rescale, new max") else a
        a_o = one if knob in ("ell not o", "no rescale, new max") else a
        if knob == "no rescale":  # each block's state kept from its own maximum
            a_ell, a_o, c = one, one, one
        ell = ell + lb if knob == "ell added as is" else a_ell * ell + c * lb
        o = o + ob if knob == "o added as is" else a_o[:, None] * o + c[:, None] * ob
        m = m_new
        if knob == "divided in the loop":  # o normalised after each merge, ell reset to 1
            o, ell = o / ell[:, None], torch.ones_like(ell)
    if knob == "sum of tiles":
        return torch.stack(tiles).sum(0)
    return o / ell[:, None]


def _inputs(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int], int]:
    _, bs, kv, heads, d, length, num_blocks, table = _CASES[n]
    gen = torch.Generator().manual_seed(1313 + n)
    q = torch.randn(heads, d, generator=gen, dtype=torch.float64)
    k_blocks = 3 * torch.randn(num_blocks, kv, bs, d, generator=gen, dtype=torch.float64)
    v_blocks = torch.randn(num_blocks, kv, bs, d, generator=gen, dtype=torch.float64)
    if n == _LARGE:  # every score gets the same large part, 60 * 50 / sqrt(8) = 1061: exp overflows
        q[:, 0], k_blocks[..., 0] = 60.0, 50.0
    return q, k_blocks, v_blocks, list(table), length


def paged_case(number: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int], int]:
    """The inputs of ``check_paged_attention``'s case ``number`` (1 to 6), to compare block by block.

    Returns ``(q, k_blocks, v_blocks, block_table, length)``: ``q (num_heads, head_dim)``, the pools
    ``(num_blocks, num_kv_heads, block_size, head_dim)``, float64, the numbers the checker uses.
    """
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= len(_CASES):
        raise ValueError(f"number is a case of check_paged_attention, 1 to {len(_CASES)}; "
                         f"got {number!r}")
    return _inputs(number - 1)


def _is_view(func: Any) -> bool:
    """An operation that returns a view of (or writes into) its input allocates no new numbers."""
    try:
        return any(r.alias_info is not None for r in func._schema.returns)
    except AttributeError:
        return False


class _Watch(TorchDispatchMode):
    """Records the largest new tensor an operation makes, and whether a fused attention ran."""

    def __init__(self) -> None:
        super().__init__()
        self.largest, self.largest_shape, self.fused = 0, (), ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)
        if "scaled_dot_product" in name or "flex_attention" in name or "flash_attention" in name:
            self.fused = name
        if not _is_view(func):
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.numel() > self.largest:
                    self.largest, self.largest_shape = t.numel(), tuple(t.shape)
        return out


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if not torch.isfinite(a).all():
        return math.inf
    return (a.detach().to(torch.float64) - b).abs().max().item()


@checker
def check_paged_attention(fn: Callable[..., Any]) -> None:
    """Check ``fn(q, k_blocks, v_blocks, block_table, length) -> (num_heads, head_dim)``: attention of
    one query per head over a sequence's pages, read block by block through its block table."""
    try:
        with torch.random.fork_rng(devices=[]), one_thread():
            _check_paged_attention(fn)
    except (NotImplementedError, CheckFailure):
        raise
    except Exception as err:
        raise CheckFailure(f"The checker could not use your answer: {type(err).__name__}: {err}. "
                           "Check that it has the signature the exercise gives.") from err


def _call(fn: Callable[..., Any], args: tuple, case: str) -> Any:
    try:
        with time_limit(TIME_LIMIT, f"Your code ran for more than {TIME_LIMIT:g} s ({case}) and was "
                                    "stopped: does a loop never end?"):
            return fn(*args)
    except (NotImplementedError, CheckFailure):
        raise
    except Exception as err:
        raise CheckFailure(f"Your code raised {type(err).__name__} ({case}): {err}. q is (num_heads, "
                           "head_dim), k_blocks and v_blocks (num_blocks, num_kv_heads, block_size, "
                           "head_dim), block_table a list of ints, length an int.") from err


def _check_paged_attention(fn: Callable[..., Any]) -> None:
    if not callable(fn):
        raise CheckFailure(f"Hand in your function itself, got {type(fn).__name__}.")
    if is_course_lib(fn) or fn is F.scaled_dot_product_attention:
        raise CheckFailure("You handed in a ready-made function (course_lib's or PyTorch's): walk the "
                           "block table and merge the pages' states yourself (a short loop).")
    runs: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (case, output, reference) per case run
    pages: list[tuple[int, int, tuple]] = []  # (case, largest new tensor, its shape)
    for n, (case, bs, kv, heads, d, length, num_blocks, table) in enumerate(_CASES):
        q, k_blocks, v_blocks, table, length = _inputs(n)
        given = (q.clone(), k_blocks.clone(), v_blocks.clone(), list(table), length)
        watch, sdpa = _Watch(), SdpaWatch()
        try:
            with calls_to([paged.paged_attention, paged.PagedKVCache.read]) as seen, sdpa, watch:
                got = _call(fn, given, case)
        except CheckFailure as err:
            if any(_max_diff(g, e) > 1e-9 for _, g, e in runs):
                break  # an earlier case's numbers already differ: say what they show
            if str(err).startswith("Your code raised") and (named := paged_raise_named(fn, _inputs(n))):
                raise CheckFailure(f"Likely mistake ({case}): {named[1]}. Then: {named[2]}.",
                                   mistake=named[0]) from err
            if n in _FIRST_OF_ITS_KIND and str(err).startswith("Your code raised"):
                kind, hint = _FIRST_OF_ITS_KIND[n]
                raise CheckFailure(f"{err} The cases before this one pass, and it is the first {hint}",
                                   mistake=kind) from err
            raise
        if seen:
            raise CheckFailure("Your function calls course_lib's paged_attention (or the cache's read, "
                               "which gathers): that is the reference. Walk the table yourself; your "
                               "merge_states, or course_lib's merge_softmax_states, is welcome.")
        if watch.fused or sdpa.called:
            raise CheckFailure("Your function calls PyTorch's attention (scaled_dot_product_attention): "
                               "that attends over keys gathered in one tensor, which is what the pages "
                               "avoid. Compute each block's state (m, ell, o) with matmul, max, exp and "
                               "sums, and merge the states.")
        if any(not torch.equal(a, b) for a, b in zip(given[:3], (q, k_blocks, v_blocks))) or \
                given[3] != table:
            raise CheckFailure(f"Your function changes its inputs in place ({case}): the pool is shared "
                               "by every sequence; build new tensors.")
        if not isinstance(got, torch.Tensor):
            raise CheckFailure(f"Return a tensor (num_heads, head_dim) ({case}), got {type(got).__name__}.")
        if tuple(got.shape) != (heads, d):
            raise CheckFailure(f"Wrong shape ({case}): {tuple(got.shape)}, expected {(heads, d)}, "
                               "(num_heads, head_dim): one output row per query head"
                               f"{merge_call_said(fn, _inputs(n))}.")
        runs.append((n, got.detach(), _attend(q, k_blocks, v_blocks, table, length)))
        pages.append((n, watch.largest, watch.largest_shape))
    if any(_max_diff(g, e) > 1e-9 for _, g, e in runs):
        n, got = next((n, g) for n, g, e in runs if _max_diff(g, e) > 1e-9)
        if named := paged_nan_named(fn, _inputs(n), got):
            raise CheckFailure(f"Likely mistake ({_CASES[n][0]}): {named[1]}. Then: {named[2]}.",
                               mistake=named[0])
        _diagnose(runs)
    for n, largest, shape in pages:
        case, bs, _, heads, d = _CASES[n][:5]
        page_limit = heads * bs * d  # one page's keys for every query head, the largest tile needs
        if largest > page_limit:
            raise CheckFailure(
                f"Right numbers, but your function makes a tensor of {largest} numbers, shape "
                f"{shape} ({case}), more than one block's keys for every head "
                f"(num_heads * block_size * head_dim = {page_limit}): the whole sequence gathered, or a "
                "copy of the pool. Read one block at a time, k_blocks[physical] and its filled slots.",
                mistake="gathered the cache")
    print(f"check_paged_attention: all {len(_CASES)} cases equal attention over the gathered positions "
          "(float64, 1e-9), one block at a time. Well done!")


def _float32_tolerance(n: int, dtype: torch.dtype) -> float:
    """How far float32 (or ``dtype``, if coarser) arithmetic may land from the float64 reference."""
    q, k_blocks, v_blocks, table, length = _inputs(n)
    ref32 = _attend(q.float(), k_blocks.float(), v_blocks.float(), table, length)
    err = _max_diff(ref32, _attend(q, k_blocks, v_blocks, table, length))
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    return max(1e-5, 100 * err, 20 * eps)


def _diagnose(runs: list[tuple[int, torch.Tensor, torch.Tensor]]) -> None:
    """Raise the message for the first case whose numbers differ: a named mistake if one of
    ``_MISTAKES`` gives the same numbers (the one that explains the most cases), else its details."""
    fails = [(n, g, e) for n, g, e in runs if _max_diff(g, e) > 1e-9]
    n, got, expected = fails[0]
    case, bs, kv, heads, d, length, _, table = _CASES[n]
    inputs = _inputs(n)
    if more := paged_more_said([(_inputs(k), g) for k, g, _ in fails]):
        raise CheckFailure(f"Likely mistake ({case}): {more[1]}.", mistake=more[0])
    if named := paged_named(*inputs, got, 1e-9 if got.dtype == torch.float64 else 1e-4):
        knob, observed, fix = named
        raise CheckFailure(f"Likely mistake ({case}): {observed}. Then: {fix}.", mistake=knob)
    if not torch.isfinite(got).all():
        if n == _LARGE:  # every earlier case passed; this one only adds large scores
            raise CheckFailure(
                f"Likely mistake ({case}): your output contains NaN or inf where the scores are near "
                "1000, and every earlier case passed: exp(score) overflows (exp(710) is already inf in "
                "float64), so the exponentials are taken without subtracting the maximum. Then: "
                "p = exp(s - m) with m the block's maximum (a state's ell and o are measured from "
                "its m).", mistake="no max subtracted")
        raise CheckFailure(f"Your output contains NaN or inf ({case}): a state that has seen no "
                           "key has m = -inf, and exp(-inf - (-inf)) is NaN; does a block hold no "
                           "key, or is the last block read with 0 positions?")
    coarse = got.dtype != torch.float64
    if all(_max_diff(g, e) <= _float32_tolerance(k, g.dtype) for k, g, e in fails):
        worst = max(_max_diff(g, e) for _, g, e in fails)
        dtype = str(got.dtype).replace("torch.", "")
        what = f"your output is {dtype}" if coarse else "your output is float64, computed in float32"
        raise CheckFailure(
            f"Nearly: {what}. In every case that differs, the numbers agree with attention over the "
            f"sequence to {worst:.1g} or better, float32's rounding (about 7 digits; more where the "
            "scores are near 1000), but the checker gives float64 inputs and compares in float64 to "
            "1e-9. Then: compute in the inputs' dtype: no .float(), no float32 number in the "
            "arithmetic, and new tensors made with dtype=q.dtype (torch.zeros and torch.full "
            "default to float32).",
            mistake="float32")

    def tolerance(k: int, g: torch.Tensor) -> float:
        return _float32_tolerance(k, g.dtype) if coarse else 1e-9

    best, best_score = None, 0
    for knob, observed, fix in _MISTAKES:  # it must explain the first case that differs
        if _explains(knob, n, got, tolerance(n, got)):
            score = sum(_explains(knob, k, g, tolerance(k, g)) for k, g, _ in runs)
            if score > best_score:  # the one that explains the most cases; ties: the list's order
                best, best_score = (knob, observed, fix), score
    if best is not None:
        knob, observed, fix = best
        also = (f" Your output is also {str(got.dtype).replace('torch.', '')}: compute in float64, the "
                "inputs' dtype." if coarse else "")
        raise CheckFailure(f"Likely mistake ({case}): {observed}. Then: {fix}.{also}", mistake=knob)
    rows = [i for i in range(heads) if (got[i].to(torch.float64) - expected[i]).abs().max() >
            tolerance(n, got)]
    blocks = math.ceil(length / bs)
    q, k_blocks = inputs[0], inputs[1]
    keys = torch.cat([k_blocks[b, :, :min(bs, length - i * bs)] for i, b in enumerate(table[:blocks])],
                     dim=1)[torch.arange(heads) // (heads // kv)]  # (heads, length, d)
    bad = torch.zeros(heads, 1, dtype=torch.bool)
    bad[rows] = True
    late = later_max_said(q[:, None], keys, False, bs, bad).replace("rows", "heads")
    passed = [_CASES[k][0] for k, g, e in runs if _max_diff(g, e) <= 1e-9]
    passing = f"Cases that pass: {'; '.join(passed)}." if passed else "No case passes yet."
    raise CheckFailure(
        f"Not yet ({case}): largest difference {_max_diff(got, expected):.3g} from attention over the "
        f"sequence's positions 0 .. length - 1, in query heads {rows}{late}. None of the usual mistakes "
        f"explains it. This case: num_heads {heads}, num_kv_heads {kv}, head_dim {d}, block_size {bs}, "
        f"block_table {table}, length {length}: {blocks} blocks, the last holding "
        f"{length - (blocks - 1) * bs} of {bs} slots. {passing} To compare block by block, print, for "
        "one query head, each block's physical number, its filled slots and its (m, ell, o): the max, "
        "the sum of exp(s - m) and exp(s - m) @ v over its filled slots, s = k @ q / sqrt(head_dim); "
        "then the merged (m, ell, o) after each block.")


def _explains(knob: str, n: int, got: torch.Tensor, tol: float) -> bool:
    """Whether ``knob``'s numbers are ``got`` on case ``n`` (the first case that differs)."""
    try:
        return _max_diff(got, _attend(*_inputs(n), knob)) <= tol
    except (ValueError, IndexError, RuntimeError):
        return False
