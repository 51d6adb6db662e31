"""More of lesson 13's usual mistakes, as code, named by what is observed (tryout 13e, issue #48).
The checkers of ``lesson13_scale``, ``lesson13_paged`` and ``lesson13_locate`` consult them after
their own lists; nothing here is a checker.

* ``named_merges()``: wrong merges of two softmax states ``(m, ell, o)``, as ``(what, fn)``.
* ``forward_named(q, k, v, causal, block_q, block_k, out, lse, tol) -> (said, mistake) | None``: a
  tiled forward whose causal mask is built from positions inside the tile, on every tile, or aligned
  to the bottom right with the tile loop stopping at the diagonal.
* ``fix_m_zero(q (L_q, d), k (L_k, d), v (L_k, d_v), block_k) -> (L_q, d_v)``: the Debug loop as
  given, with m starting at 0; ``M_ZERO_SAID`` what is observed when it matches.
* ``fix_inverted_zeroed(...)``: the loop with ell's and o's factors upside down, the first inf
  made 0; ``FIX_INVERTED_SAID`` what is observed when it matches.
* ``FactorWatch``: records the per-row factors a loop computes with ``exp``; ``inverted_said(...)``
  says whether ell's factor is inverted too.
* ``NAMED_LOCATE``: wrong readings of a block table, ``fn(table, position, block_size)``;
  ``boundary_failure(outcomes, cases)``: a position on a block boundary kept in the previous block.
* ``paged_named(q, k_blocks, v_blocks, table, length, got, tol) -> (knob, observed, then) | None``;
  ``paged_raise_named(fn, inputs)`` the same for a learner's code that raised, and
  ``paged_nan_named(fn, inputs, got)`` for NaN from factors that are all >= 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .common import CheckFailure, time_limit

__all__ = ["named_merges", "forward_named", "fix_m_zero", "m_zero_observed", "M_ZERO_SAID",
           "fix_inverted_zeroed", "FIX_INVERTED_SAID", "FactorWatch", "inverted_said", "NAMED_LOCATE",
           "boundary_failure", "paged_named", "paged_raise_named", "paged_nan_named"]


# ----------------------------------------------------------------------------------------------
# merge_states
# ----------------------------------------------------------------------------------------------

def _factors(m_a: torch.Tensor, m_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The merged maximum m (...) and the two right factors exp(m_a - m), exp(m_b - m) (0 for an
    empty state; rows where both are empty measured from 0)."""
    m = torch.maximum(m_a, m_b)
    ref = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    return m, torch.exp(m_a - ref), torch.exp(m_b - ref)


def named_merges() -> list[tuple[str, Callable[..., tuple[torch.Tensor, ...]]]]:
    """``(what is observed, fn(m_a, ell_a, o_a, m_b, ell_b, o_b) -> (m, ell, o))``: m, ell (...),
    o (..., d_v)."""

    def o_squared(m_a, ell_a, o_a, m_b, ell_b, o_b):  # noqa: ANN001, ANN202
        m, a, b = _factors(m_a, m_b)
        return m, a * ell_a + b * ell_b, (a * a)[..., None] * o_a + (b * b)[..., None] * o_b

    def ell_one(where: str):  # noqa: ANN202
        def merge(m_a, ell_a, o_a, m_b, ell_b, o_b):  # noqa: ANN001, ANN202
            m, a, b = _factors(m_a, m_b)
            ell = a * ell_a + b * ell_b
            empty = torch.isinf(m) if where == "both" else torch.isinf(m_a) | torch.isinf(m_b)
            return m, torch.where(empty, torch.ones_like(ell), ell), a[..., None] * o_a + b[..., None] * o_b
        return merge

    def average(ell_is: str):  # noqa: ANN202
        def merge(m_a, ell_a, o_a, m_b, ell_b, o_b):  # noqa: ANN001, ANN202
            m, a, b = _factors(m_a, m_b)
            ell = {"right": a * ell_a + b * ell_b, "sum": ell_a + ell_b,
                   "average": (ell_a + ell_b) / 2}[ell_is]
            return m, ell, (o_a + o_b) / 2
        return merge

    avg = ("observed: your o is (o_a + o_b) / 2 on every row, a plain average of the two o's: each "
           "state's o is a sum of exp(score - its own maximum) * v, so the two are on different "
           "scales and hold different numbers of keys; they are added with the weights exp(m_a - m) "
           "and exp(m_b - m), as ell's sums are")
    return [
        ("observed: your ell is right, but o takes each factor squared, exp(m_a - m)² o_a + "
         "exp(m_b - m)² o_b: right only on the rows where a state's factor is 1 (its maximum is m). "
         "o's terms exp(score - m_a) v become exp(score - m) v with the same factor as ell's, "
         "exp(m_a - m), once", o_squared),
        ("observed: your ell is 1 on the rows where a state has seen no key (m = -inf), though the "
         "other state's sum is there (m and o are right). An empty state adds nothing: ell_a = 0 and "
         "its factor exp(-inf - m) = 0, so the merged ell is the other state's ell, rescaled",
         ell_one("either")),
        ("observed: your ell is 1 on the rows where both states have seen no key (m = -inf), where "
         "the merged state has seen no key either: its sum of exponentials is 0, not 1",
         ell_one("both")),
        (avg, average("right")),
        (avg + " (your ell = ell_a + ell_b is not rescaled either)", average("sum")),
        (avg + " (and your ell is the plain average (ell_a + ell_b) / 2 too)", average("average")),
    ]


# ----------------------------------------------------------------------------------------------
# flash_forward: a causal mask from the positions inside the tile, on every tile
# ----------------------------------------------------------------------------------------------

def _local_mask_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bq: int, bk: int,
                        knob: str = "tile-local") -> tuple[torch.Tensor, torch.Tensor]:
    """The tiled forward whose causal mask is ``column > row`` counted inside each tile (triu(1) of
    the tile) on every tile it visits (knob "tile-local"), or aligned to the bottom right,
    key > query + L_k - L_q (knob "bottom-right"); tiles skipped by absolute positions (after the
    query tile's last query): q, k, v (B, h, L, d) in float64 -> (out (B, h, L_q, d_v),
    lse (B, h, L_q)); a row that sees no key comes out NaN."""
    L_q, L_k, d = q.size(-2), k.size(-2), q.size(-1)
    out = q.new_zeros(*q.shape[:-1], v.size(-1))
    lse = q.new_zeros(q.shape[:-1])
    for i0 in range(0, L_q, bq):
        i1 = min(i0 + bq, L_q)
        m = torch.full(q.shape[:-2] + (i1 - i0,), -math.inf, dtype=q.dtype)
        ell, o = torch.zeros_like(m), q.new_zeros(*m.shape, v.size(-1))
        for j0 in range(0, min(L_k, i1), bk):
            j1 = min(j0 + bk, L_k)
            s = q[..., i0:i1, :] @ k[..., j0:j1, :].transpose(-2, -1) / math.sqrt(d)  # (B, h, bq, bk)
            future = (torch.ones(i1 - i0, j1 - j0, dtype=torch.bool).triu(1) if knob == "tile-local" else
                      torch.arange(j0, j1)[None, :] > torch.arange(i0, i1)[:, None] + L_k - L_q)
            s = s.masked_fill(future, -math.inf)
            m_new = torch.maximum(m, s.amax(-1))
            p, alpha = torch.exp(s - m_new[..., None]), torch.exp(m - m_new)
            ell, o, m = alpha * ell + p.sum(-1), alpha[..., None] * o + p @ v[..., j0:j1, :], m_new
        out[..., i0:i1, :], lse[..., i0:i1] = o / ell[..., None], m + torch.log(ell)
    return out, lse


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| where b is finite; inf when a and b are not finite at the same places."""
    finite = torch.isfinite(b)
    if a.shape != b.shape or not torch.equal(torch.isfinite(a), finite):
        return math.inf
    return (a[finite] - b[finite]).abs().max().item() if finite.any() else 0.0


def forward_named(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, bq: int, bk: int,
                  out: torch.Tensor, lse: torch.Tensor, tol: float) -> tuple[str, str] | None:
    """``(what is observed, the mistake's name)`` when ``(out, lse)`` is the forward with a tile-local
    causal mask on every tile, or a bottom-right mask whose tile loop stops at the query tile's last
    position (None otherwise); q, k, v (B, h, L, d), out and lse in float64."""
    if not causal:
        return None
    if q.size(-2) != k.size(-2):
        want = _local_mask_forward(q, k, v, bq, bk, "bottom-right")
        if _diff(out, want[0]) <= tol and _diff(lse, want[1]) <= tol:
            return ("out and lse equal a loop whose causal mask is aligned to the bottom right, query i "
                    "seeing keys up to i + L_k - L_q, while its loop over key tiles stops at the tile "
                    "of the query tile's last position: this exercise uses SDPA's is_causal, query i "
                    "sees keys 0..i (L_q and L_k differ here)", "causal mask aligned bottom-right")
    want = _local_mask_forward(q, k, v, bq, bk)
    if _diff(out, want[0]) > tol or _diff(lse, want[1]) > tol:
        return None
    return ("out and lse equal a loop whose causal mask is built from the positions inside each tile, "
            "counted from 0 (column > row, as triu(1) of the tile), on every tile it computes: in a "
            "tile wholly in the past, keys the query may see are hidden, and in diagonal tiles that do "
            "not start at the same position queries see future keys or lose past ones. Query i0 + row "
            "may see key j0 + column when j0 + column <= i0 + row (absolute positions)",
            "causal mask from tile indices")


# ----------------------------------------------------------------------------------------------
# flash_fix (Debug): observed, never the fix
# ----------------------------------------------------------------------------------------------

def fix_m_zero(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_k: int, start: float = 0.0
               ) -> torch.Tensor:
    """The Debug exercise's loop as given (o never rescaled), with m starting at ``start`` (0, the
    mistake; -inf, the loop as given): q (L_q, d), k (L_k, d), v (L_k, d_v) -> (L_q, d_v)."""
    scale = 1.0 / math.sqrt(q.size(-1))
    m = torch.full((q.size(0),), start, dtype=q.dtype)
    ell, o = torch.zeros(q.size(0), dtype=q.dtype), torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
    for start in range(0, k.size(0), block_k):
        s = q @ k[start:start + block_k].T * scale  # (L_q, block)
        m_new = torch.maximum(m, s.amax(-1))
        p = torch.exp(s - m_new[:, None])
        ell, o, m = torch.exp(m - m_new) * ell + p.sum(-1), o + p @ v[start:start + block_k], m_new
    return o / ell[:, None]


def m_zero_observed(fn: Callable[..., Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    block_k: int, got: torch.Tensor, tol: float) -> bool:
    """Whether ``got`` is the loop as given with m starting at 0, on this case and on a probe whose
    scores are all below 0 while their maxima grow block after block (there that loop is exact and
    the loop as given is not). Runs ``fn`` once more; False if that fails."""
    if _diff(got, fix_m_zero(q, k, v, block_k).double()) > tol:
        return False
    q2 = torch.cat([q, torch.ones(q.size(0), 1, dtype=q.dtype)], dim=1)  # (L_q, d + 1)
    shift = (q @ k.T).abs().max().item() + 10.0
    k2 = torch.cat([k, torch.full((k.size(0), 1), -shift, dtype=k.dtype)], dim=1)  # scores < 0
    want, given = fix_m_zero(q2, k2, v, block_k).double(), fix_m_zero(q2, k2, v, block_k, -math.inf).double()
    try:
        with time_limit(60.0, "stopped"):
            probe = fn(q2, k2, v, block_k=block_k)
    except Exception:  # noqa: BLE001 - it ran once already
        return False
    return (isinstance(probe, torch.Tensor) and _diff(want, given) > 100 * tol
            and _diff(probe.detach().double(), want) <= tol)


def fix_inverted_zeroed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_k: int) -> torch.Tensor:
    """The Debug loop with ell's and o's factor exp(m_new - m), its inf at the first block made 0:
    q (L_q, d), k (L_k, d), v (L_k, d_v) -> (L_q, d_v)."""
    scale = 1.0 / math.sqrt(q.size(-1))
    m = torch.full((q.size(0),), -math.inf, dtype=q.dtype)
    ell, o = torch.zeros(q.size(0), dtype=q.dtype), torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
    for start in range(0, k.size(0), block_k):
        s = q @ k[start:start + block_k].T * scale  # (L_q, block)
        m_new = torch.maximum(m, s.amax(-1))
        p = torch.exp(s - m_new[:, None])
        a = torch.where(torch.isinf(m), torch.zeros_like(m), torch.exp(m_new - m))
        ell, o, m = a * ell + p.sum(-1), a[:, None] * o + p @ v[start:start + block_k], m_new
    return o / ell[:, None]


FIX_INVERTED_SAID = ("your output equals the loop in which ell and o are both multiplied by "
                     "exp(m_new - m) >= 1 (its inf at the first block made 0): the {bad} rows whose "
                     "maximum grows in a later block come out wrong, the rows whose maximum is in the "
                     "first block right (there the factor is 1)")


M_ZERO_SAID = ("your output equals the loop as given, with m starting at 0 instead of -inf: the rows "
               "whose scores never rise above 0 are right (m stays 0 there, and nothing is "
               "rescaled), the {bad} rows whose running maximum rises above 0 come out as wrong as "
               "in the loop given")


class FactorWatch(TorchDispatchMode):
    """Records the outputs of ``exp`` with ``rows`` numbers (one factor per query row)."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows, self.factors = rows, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)
        if name in ("exp", "exp_") and isinstance(out, torch.Tensor) and out.numel() == self.rows:
            self.factors.append(out.detach().clone())
        return out


def inverted_said(fn: Callable[..., Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  block_k: int, case: str, bad: int, total: int) -> str:
    """What the Debug checker says when the output is all NaN/inf as with o's factor upside down:
    whether any per-row factor of the learner's loop is <= 1 (ell's right) or none is (both ell's
    and o's are exp(m_new - m)). Runs ``fn`` once more; "" if that fails."""
    watch = FactorWatch(q.size(0))
    try:
        with time_limit(60.0, "stopped"), watch:
            fn(q, k, v, block_k=block_k)
    except Exception:  # noqa: BLE001 - it ran once already; then say the general sentence
        return ""
    finite = [f for f in watch.factors if torch.isfinite(f).all()]
    if not watch.factors or any(bool((f < 1).any()) for f in finite):
        return ""
    return (f"Not yet ({case}): observed {bad} of {total} outputs NaN or inf. Every per-row factor "
            "your loop computes with exp is >= 1: exp(m_new - m), which is inf at the first block "
            "(m = -inf, while ell and o are still 0, and inf * 0 = NaN) and > 1 whenever m grows, "
            "and it multiplies ell and o both. Print that factor and ell at the first two blocks.")


# ----------------------------------------------------------------------------------------------
# locate
# ----------------------------------------------------------------------------------------------

def _entry(table: list[int], n: Any) -> int:
    """``table[n]`` for a list index n in 0..len - 1; IndexError otherwise."""
    if isinstance(n, float) or not 0 <= n < len(table):
        raise IndexError("list index out of range")
    return table[n]


NAMED_LOCATE: list[tuple[str, Callable[[list[int], int, int], Any]]] = [  # (what, fn)
    ("the table read as if it were sorted, sorted(block_table)[position // block_size]: the table is "
     "in the order of the sequence's logical blocks, not of the physical numbers; entry n, as it is, "
     "is where logical block n lives", lambda t, p, s: (sorted(t)[p // s], p % s)),
    ("observed (position % block_size, position // block_size) in every case: the slot first, then "
     "the logical block, divmod's two numbers in the other order; and the second number is the "
     "logical block, not the physical one: block_table.index(block_table[n]) is n again. Return "
     "(block_table[logical block], slot)", lambda t, p, s: (p % s, p // s)),
    ("block_size - 1 used as the block size: block_table[position // (block_size - 1)] with slot "
     "position % (block_size - 1). Each block holds block_size positions, slots 0..block_size - 1",
     lambda t, p, s: (_entry(t, p // (s - 1)), p % (s - 1))),
    ("block index divided by block_size - 1, block_table[position // (block_size - 1)] (the slot, "
     "position % block_size, is right): each block holds block_size positions",
     lambda t, p, s: (_entry(t, p // (s - 1)), p % s)),
    ("a block size of 16 whatever block_size is passed (vLLM's default): block_table[position // 16] "
     "and slot position % 16; use the block_size argument", lambda t, p, s: (_entry(t, p // 16), p % 16)),
    ("the logical block computed from position + 1, block_table[(position + 1) // block_size] (the "
     "slot, position % block_size, is right): logical block n holds positions n * block_size .. "
     "(n + 1) * block_size - 1, so the last position of each block lands in the next block",
     lambda t, p, s: (_entry(t, (p + 1) // s), p % s)),
    ("the slot computed as position - n, with n = position // block_size the logical block (the "
     "physical block is right): block n starts at position n * block_size, so the slot is position - "
     "n * block_size, that is position % block_size", lambda t, p, s: (_entry(t, p // s), p - p // s)),
]


def boundary_failure(outcomes: list[Any], cases: list[tuple[list[int], int, int]]) -> CheckFailure | None:
    """The message when every case is right but those whose position is a positive multiple of
    block_size, where the learner's block is the previous logical block's (a walk over the block
    boundaries that stops one step early); None otherwise."""
    edge = [n for n, (t, p, s) in enumerate(cases) if p > 0 and p % s == 0]
    if not edge:
        return None
    for n, ((t, p, s), got) in enumerate(zip(cases, outcomes)):
        right = (t[p // s], p % s)
        if n not in edge and got != right:
            return None
        if n in edge and not (isinstance(got, tuple) and len(got) == 2 and got[0] == t[p // s - 1]
                              and got != right):
            return None
    t, p, s = cases[edge[0]]
    got = outcomes[edge[0]]
    slot = {s: f"slot {s} = block_size, one past the last slot {s - 1} (slots run 0..{s - 1})",
            s - 1: f"slot {s - 1}, where position {p - 1} lives (not position - 1 everywhere: the other "
                   "positions are right)",
            0: "slot 0 of that block"}.get(got[1], f"slot {got[1]}")
    return CheckFailure(
        f"Observed: right in the {len(cases) - len(edge)} other cases, but "
        f"at position {p} with block_size {s}, a block boundary, you return {got!r}: physical block "
        f"{got[0]} is logical block {p // s - 1}'s (the one before), {slot}. Position {p} is the first "
        f"position of logical block {p} // {s} = {p // s}, so the answer is ({t[p // s]}, 0). Likely "
        "mistake: a walk over the blocks that stops one step early at a boundary (a test like "
        "position > end where position >= end is meant), or logical blocks taken as holding "
        "positions n * block_size + 1 .. (n + 1) * block_size.",
        mistake="a position on a block boundary kept in the previous block")


# ----------------------------------------------------------------------------------------------
# paged_attention
# ----------------------------------------------------------------------------------------------

def _paged_loop(q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor, table: list[int],
                length: int, knob: str) -> torch.Tensor:
    """The page-by-page loop with one mistake (``knob``): q (num_heads, head_dim), pools (num_blocks,
    num_kv_heads, block_size, head_dim) -> (num_heads, d_v), float64."""
    heads, d = q.shape
    kv, bs = k_blocks.size(1), k_blocks.size(2)
    if knob == "k and v swapped":
        k_blocks, v_blocks = v_blocks, k_blocks
    group = torch.arange(heads) // (heads // kv)
    m = torch.full((heads,), -math.inf, dtype=torch.float64)
    ell = torch.zeros(heads, dtype=torch.float64)
    o = torch.zeros(heads, v_blocks.size(-1), dtype=torch.float64)
    for n in range(math.ceil(length / bs)):
        b = table[n]
        filled = min(bs, length - (b if knob == "fill from the physical block" else n) * bs)
        k, v = k_blocks[b][group, :filled].double(), v_blocks[b][group, :filled].double()  # (heads, n, d)
        if k.size(1) == 0:
            raise ValueError("an empty block: the learner's code raises here")
        s = (k @ q.double()[:, :, None]).squeeze(-1) / math.sqrt(d)  # (heads, n)
        mb = s.amax(-1)
        p = torch.exp(s - mb[:, None])
        lb, ob = p.sum(-1), (p[:, :, None] * v).sum(1)  # (heads,), (heads, d_v)
        m_new = torch.maximum(m, mb)
        a, c = torch.exp(m - m_new), torch.exp(mb - m_new)
        if knob.startswith("merge upside down"):
            a = torch.where(torch.isinf(m), torch.zeros_like(m), torch.exp(m_new - m))
            c = torch.exp(m_new - mb)
            if knob == "merge upside down, old state only":
                c = torch.exp(mb - m_new)
        ell, o, m = a * ell + c * lb, a[:, None] * o + c[:, None] * ob, m_new
    return o / ell[:, None]


_UPSIDE = ("when the running maximum grows, the old state is multiplied by exp(m_new - m_old) >= 1 "
           "(and the block's by exp(m_new - m_block) >= 1): the merge's factors are upside down, so the "
           "terms measured from a lower maximum grow instead of shrinking")
_PAGED = [  # (knob, what is observed, what to do)
    ("merge upside down", _UPSIDE, "each state's sums were measured from its own maximum; measured "
     "from the larger one, they shrink: times exp(m_old - m_new) <= 1"),
    ("merge upside down, old state only", "when the running maximum grows, the old ell and o are "
     "multiplied by exp(m_new - m_old) >= 1 while the block's state takes exp(m_block - m_new) <= 1: "
     "the old state's factor is upside down", "the old sums shrink too: times exp(m_old - m_new)"),
    ("k and v swapped", "your output equals attention with k and v exchanged: the scores are "
     "v_blocks' rows times q, and the output averages k_blocks' rows",
     "the scores come from k_blocks (s = k @ q / sqrt(head_dim)), the output from v_blocks"),
    ("fill from the physical block", "the number of filled slots of a block is taken from its "
     "physical number, length - block_table[n] * block_size, not from its place in the sequence: "
     "blocks are read cut short (or their slots counted from the end) wherever the physical number "
     "differs from the logical one", "logical block n holds min(block_size, length - n * block_size) "
     "positions, n counted in the sequence's order, whatever its physical number"),
]


def paged_named(q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor, table: list[int],
                length: int, got: torch.Tensor, tol: float) -> tuple[str, str, str] | None:
    """``(knob, observed, then)`` of the first of these mistakes whose numbers are ``got``
    (num_heads, d_v) on this case, NaN and inf at the same places; None if none is."""
    for knob, observed, then in _PAGED:
        try:
            want = _paged_loop(q, k_blocks, v_blocks, list(table), length, knob)
        except (ValueError, IndexError, RuntimeError):
            continue
        if _diff(got.detach().double(), want) <= tol and _diff(want, _paged_loop(
                q, k_blocks, v_blocks, list(table), length, "")) > tol:
            return knob, observed, then
    return None


def paged_raise_named(fn: Callable[..., Any], inputs: tuple[Any, ...]) -> tuple[str, str, str] | None:
    """``(knob, observed, then)`` when the learner's code raised on this case where the loop that
    takes a block's fill count from its physical number meets an empty block too, and is right on
    the same case with the pool renumbered so that logical block n lives in physical block n; None
    otherwise. Runs ``fn`` once more, under a time limit."""
    q, k_blocks, v_blocks, table, length = inputs
    try:
        _paged_loop(q, k_blocks, v_blocks, list(table), length, "fill from the physical block")
        return None  # that mistake runs here: the error is something else
    except ValueError:
        pass
    order = list(table) + [b for b in range(k_blocks.size(0)) if b not in table]
    k2, v2, table2 = k_blocks[order], v_blocks[order], list(range(len(table)))
    try:
        with time_limit(60.0, "stopped"):
            probe = fn(q.clone(), k2.clone(), v2.clone(), list(table2), length)
    except Exception:  # noqa: BLE001 - the error is then not this mistake's alone
        return None
    right = _paged_loop(q, k2, v2, table2, length, "")
    if not isinstance(probe, torch.Tensor) or _diff(probe.detach().double(), right) > 1e-6:
        return None
    empty = next(n for n, b in enumerate(table) if min(k_blocks.size(2), length - b * k_blocks.size(2)) <= 0
                 or k_blocks.size(2) + min(0, length - b * k_blocks.size(2)) <= 0)
    b, bs = table[empty], k_blocks.size(2)
    return ("fill from the physical block",
            f"your code raises here, and is right on this same case once the pool is renumbered so "
            f"that logical block n lives in physical block n. Observed: it fits a fill count taken "
            f"from the physical number: logical block {empty} lives in physical block {b}, and "
            f"length - {b} * block_size = {length} - {b * bs} = {length - b * bs} slots, so that "
            f"block is read with no key (an empty max)",
            "logical block n holds min(block_size, length - n * block_size) positions, n counted in "
            "the sequence's order, whatever its physical number")


def paged_nan_named(fn: Callable[..., Any], inputs: tuple[Any, ...], got: torch.Tensor
                    ) -> tuple[str, str, str] | None:
    """``(knob, observed, then)`` when ``got`` has NaN or inf and every per-head factor the learner's
    loop computes with exp is >= 1, one of them inf (the merge upside down, with no guard for the
    empty state); None otherwise. Runs ``fn`` once more, under a time limit."""
    if torch.isfinite(got).all():
        return None
    q = inputs[0]
    watch = FactorWatch(q.size(0))
    try:
        with time_limit(60.0, "stopped"), watch:
            fn(*(t.clone() if isinstance(t, torch.Tensor) else t for t in inputs))
    except Exception:  # noqa: BLE001 - it ran once already; then say the general sentence
        return None
    finite = [f for f in watch.factors if torch.isfinite(f).all()]
    if (not finite or len(finite) == len(watch.factors) or any(bool((f < 1).any()) for f in finite)
            or any(bool(torch.isnan(f).any()) for f in watch.factors)):
        return None
    return ("merge upside down",
            "observed NaN or inf in your output, and every per-head factor your loop computes with exp "
            "is >= 1, one of them inf: exp(m_new - m_old), which is inf at the first block (m_old = "
            "-inf, while ell and o are still 0, and inf * 0 = NaN): the merge's factors are upside down",
            "each state's sums were measured from its own maximum; measured from the larger one, they "
            "shrink: times exp(m_old - m_new) <= 1, which is 0 for the empty state")
