"""Lesson 13's mistakes that tryout 13g found unnamed (issue #48), named by what is observed.
The checkers of ``lesson13_scale`` consult them (through ``lesson13_named_f``); nothing here is a checker.

* ``score_kib_or_1024(got, right) -> (said, mistake)``: a score-bytes answer 1,024 times too small,
  in KiB or for 1,024 tokens.
* ``fix_scale_said(q, k, v, block_k, got, case) -> (said, mistake) | None`` (Debug: observed only):
  the given loop with the scores scaled by 1/d instead of 1/sqrt(d), o rescaled or not.
* ``fix_sum_axis_failure(failure, L_q, L_k, block_k, case) -> CheckFailure``: a crash where a
  tensor of one number per key of a block meets ell's one number per query.
* ``paged_more_said(fails) -> (mistake, said) | None``: paged attention dividing o by ell after each
  block, or reading KV head 0 for every query head; ``merge_call_said(fn, inputs) -> str``: the
  shapes a paged loop passes to merge_softmax_states when they are out of order.
* ``backward_matmul_said(fn) -> str``: the two shapes a backward tile multiplies when a product
  fails, on a tile whose four sizes differ.
* ``merge_order_said(case, inputs, got) -> (said, mistake) | None``: the right merged state returned
  in another order than (m, ell, o), e.g. (ell, m, o).
* ``merge_absolute_said(case, inputs, got) -> (said, mistake) | None``: a merge that takes exp of
  the maxima themselves, (exp(m_a) ell_a + exp(m_b) ell_b) / exp(m): NaN where both states are empty.
"""

from __future__ import annotations

import itertools
import math
import re
import sys
from collections.abc import Callable
from typing import Any

import torch

from .. import flash
from .common import CheckFailure, time_limit

__all__ = ["merge_order_said", "merge_absolute_said", "score_kib_or_1024", "fix_scale_said",
           "fix_sum_axis_failure", "paged_more_said", "merge_call_said", "backward_matmul_said"]


def score_kib_or_1024(got: float, right: int) -> tuple[str, str]:
    """(message, mistake) for a score-bytes answer of right / 1,024: two readings give that number."""
    return (f"Observed: {got:,g}, which two readings give: the answer in KiB ({right:,} bytes "
            "/ 1,024), or 12 heads x 1,024 x 1,024 x 4 bytes, the scores of a sequence of 1,024 tokens "
            "where L is 32,768 (32 x 1,024; 32 times fewer queries and 32 times fewer keys). Return plain "
            "bytes for L = 32,768.", "answer in KiB, or 1,024 tokens instead of 32,768")


def _same(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-9) -> bool:
    """a equals b to ``tol`` (relative), NaN where b is NaN, inf where b is inf (any shapes)."""
    a, b = a.detach().double(), b.detach().double()
    if a.shape != b.shape:
        return False
    return bool(torch.isclose(a, b, rtol=tol, atol=tol, equal_nan=True).all())


def _right_state(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The merged (m, ell, o): m, ell (...), o (..., d_v)."""
    m_a, ell_a, o_a, m_b, ell_b, o_b = (t.double() for t in inputs)
    m = torch.maximum(m_a, m_b)
    ref = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    a, b = torch.exp(m_a - ref), torch.exp(m_b - ref)  # (...)
    return m, a * ell_a + b * ell_b, a[..., None] * o_a + b[..., None] * o_b


def merge_order_said(case: str, inputs: tuple[torch.Tensor, ...], got: tuple[torch.Tensor, ...]
                     ) -> tuple[str, str] | None:
    """What is observed when ``got`` holds the right m, ell and o in another order."""
    if len(got) != 3:
        return None
    right = dict(zip(("m", "ell", "o"), _right_state(inputs)))
    for order in itertools.permutations(right):
        if order != ("m", "ell", "o") and all(_same(t, right[name]) for t, name in zip(got, order)):
            said = ", ".join(order)
            return (f"Observed ({case}): your three tensors are the right m, ell and o, in another order: "
                    f"you return ({said}); the order asked for is (m, ell, o)", f"returned ({said})")
    return None


def _probe_overflows(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` (a merge) gives NaN or inf on two non-empty float64 states whose maxima are
    750 to 800 (the right merge is finite there: every exp argument is a difference of maxima)."""
    gen = torch.Generator().manual_seed(1313)
    m_a, m_b = torch.tensor([800.0, 750.0], dtype=torch.float64), torch.tensor([760.0, 790.0], dtype=torch.float64)
    ell_a, ell_b = (1 + torch.rand(2, generator=gen, dtype=torch.float64) for _ in range(2))  # (2,)
    o_a, o_b = (torch.randn(2, 3, generator=gen, dtype=torch.float64) for _ in range(2))  # (2, d_v)
    try:
        with time_limit(5, "the merge did not finish in 5 s"):
            got = fn(m_a, ell_a, o_a, m_b, ell_b, o_b)
        return not all(torch.isfinite(torch.as_tensor(t)).all() for t in got)
    except Exception:  # noqa: BLE001 -- the learner's code; a crash here tells nothing
        return False


def merge_absolute_said(case: str, inputs: tuple[torch.Tensor, ...], got: tuple[torch.Tensor, ...],
                        fn: Callable[..., Any] | None = None) -> tuple[str, str] | None:
    """What is observed when ``got = (m, ell, o)`` uses exp(m_a), exp(m_b) and exp(m) themselves:
    it equals that formula here (NaN where both states are empty), and ``fn`` overflows on maxima
    near 800, where a merge measured from differences of maxima stays finite."""
    if len(got) != 3 or fn is None:
        return None
    m_a, ell_a, o_a, m_b, ell_b, o_b = (t.double() for t in inputs)
    m = torch.maximum(m_a, m_b)
    a, b, c = torch.exp(m_a), torch.exp(m_b), torch.exp(m)  # (...)
    ell = (a * ell_a + b * ell_b) / c
    o = (a[..., None] * o_a + b[..., None] * o_b) / c[..., None]  # (..., d_v)
    if not all(_same(t, w) for t, w in zip(got, (m, ell, o))) or all(
            _same(t, w) for t, w in zip(got, _right_state(inputs))) or not _probe_overflows(fn):
        return None
    nan = int(torch.isnan(ell).sum())
    where = f"NaN on the {nan} row(s) where both states are empty (0 / 0), and " if nan else ""
    return (f"Observed ({case}): your ell and o equal (exp(m_a) ell_a + exp(m_b) ell_b) / exp(m) and the "
            f"same for o: {where}NaN or inf on two non-empty states whose maxima are 750 to 800: "
            "exponentials of the maxima themselves, not of their differences. exp(m_a) is 0 for an empty "
            "state (m_a = -inf) and inf once m_a passes about 709 in float64 (88 in float32); "
            "exp(m_a - m) <= 1 stays finite", "exp of the maxima, not of their differences")


# ----------------------------------------------------------------------------------------------
# flash_fix (Debug): observed, never the fix
# ----------------------------------------------------------------------------------------------


def _loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_k: int, scale: float,
          rescale_o: bool) -> torch.Tensor:
    """The Debug's loop in float64, q (L_q, d), k (L_k, d), v (L_k, d_v) -> (L_q, d_v)."""
    q, k, v = q.double(), k.double(), v.double()
    m = torch.full((q.size(0),), -math.inf, dtype=torch.float64)
    ell = torch.zeros(q.size(0), dtype=torch.float64)
    o = torch.zeros(q.size(0), v.size(-1), dtype=torch.float64)
    for j in range(0, k.size(0), block_k):
        s = q @ k[j:j + block_k].T * scale  # (L_q, block)
        m_new = torch.maximum(m, s.amax(-1))
        p, alpha = torch.exp(s - m_new[:, None]), torch.exp(m - m_new)
        ell = alpha * ell + p.sum(-1)
        o = (alpha[:, None] * o if rescale_o else o) + p @ v[j:j + block_k]
        m = m_new
    return o / ell[:, None]


def fix_scale_said(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_k: int, got: torch.Tensor,
                   case: str) -> tuple[str, str] | None:
    """What is observed when ``got (L_q, d_v)`` is the loop with its scores scaled by 1/d."""
    d = q.size(-1)
    tol = 1e-3 if q.dtype == torch.float32 else 2e-5
    for rescale_o in (False,):  # with o rescaled, FIX_MISTAKES names it
        wrong = _loop(q, k, v, block_k, 1.0 / d, rescale_o)
        if got.shape == wrong.shape and bool(((got.double() - wrong).abs() <= tol).all()):
            o_said = ("o is rescaled by exp(m - m_new) as ell is" if rescale_o else
                      "o accumulates as in the loop given, never multiplied by a factor")
            return (f"Not yet ({case}): your output equals the loop whose scores are q k^T times 1/d = "
                    f"1/{d}, not times 1/sqrt(d) = 1/{math.sqrt(d):.3g} as in the loop given and in "
                    f"exact attention; and {o_said}. Print s for one query and one block, next to "
                    "q @ k.T / math.sqrt(d)", f"scores scaled by 1/d{'' if rescale_o else ', o unrescaled'}")
    return None


def fix_sum_axis_failure(failure: BaseException, L_q: int, L_k: int, block_k: int, case: str
                         ) -> BaseException:
    """A ``CheckFailure`` for a crash in which one number per key of a block meets one number per
    query (a sum of p over the block's queries), else ``failure`` itself."""
    cause = str(getattr(failure, "__cause__", "") or "")
    found = re.search(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)", cause)
    widths = {min(block_k, L_k - j) for j in range(0, L_k, block_k)} - {L_q}
    if getattr(failure, "mistake", None) or not found or {int(found[1]), int(found[2])} not in (
            {L_q, w} for w in widths):  # a named failure (a factor not made a column) stays as it is
        return failure
    width = (set(map(int, found.groups())) - {L_q}).pop()
    return CheckFailure(
        f"Observed ({case}): PyTorch could not add a tensor of {width} numbers, one per key of the block, "
        f"to one of {L_q} numbers, one per query, like ell ({cause}). A sum of p (L_q, block) over its "
        f"queries, dim=0, gives one number per key; ell holds one number per query. Print the shape of "
        "each term of your ell line", mistake="ell summed over the wrong axis (dim=0)")


# ----------------------------------------------------------------------------------------------
# paged_attention
# ----------------------------------------------------------------------------------------------


def _paged(q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor, table: list[int], length: int,
           kv_zero: bool = False, divide_each: bool = False) -> torch.Tensor:
    """Paged attention in float64, q (heads, d), k_blocks/v_blocks (num_blocks, kv, block_size, d)
    -> (heads, d); ``kv_zero``: every query head reads KV head 0; ``divide_each``: o divided by ell
    after each merge (and once more at the end)."""
    heads, d = q.shape
    kv, bs = k_blocks.size(1), k_blocks.size(2)
    kv_of = torch.zeros(heads, dtype=torch.long) if kv_zero else torch.arange(heads) // (heads // kv)
    m = torch.full((heads,), -math.inf, dtype=torch.float64)
    ell = torch.zeros(heads, dtype=torch.float64)
    o = torch.zeros(heads, v_blocks.size(-1), dtype=torch.float64)
    for n in range(math.ceil(length / bs)):
        filled = min(bs, length - n * bs)
        keys = k_blocks[table[n]][kv_of, :filled].double()  # (heads, filled, d)
        values = v_blocks[table[n]][kv_of, :filled].double()
        s = torch.einsum("hd,hfd->hf", q.double(), keys) / math.sqrt(d)  # (heads, filled)
        m_b = s.amax(-1)
        p = torch.exp(s - m_b[:, None])
        m, ell, o = flash.merge_softmax_states(m, ell, o, m_b, p.sum(-1), torch.einsum("hf,hfd->hd", p, values))
        if divide_each:
            o = o / ell[:, None]
    return o / ell[:, None]


def paged_more_said(fails: list[tuple[tuple, torch.Tensor]]) -> tuple[str, str] | None:
    """(mistake, what is observed) when the outputs ``got (heads, d)`` of the cases that differ,
    ``[(inputs, got), ...]``, are one of ``_paged``'s variants; None otherwise."""
    def same(inputs: tuple, got: torch.Tensor, **knob: bool) -> bool:
        try:
            return _same(got, _paged(*inputs, **knob), 1e-8)
        except (IndexError, RuntimeError, ValueError):
            return False
    inputs, got = fails[0]
    if same(inputs, got, divide_each=True):
        return ("o divided by ell after every block",
                "your output equals a loop that divides o by ell after each block's merge, and once more at "
                "the end: o is the running sum of exp(s - m) * v, and the next merge rescales it and adds "
                "the next block's sum, so a divided o weighs the earlier blocks as 1/ell of their share. "
                "Print o after each merge: it is a sum, not yet an average, until the very end")
    if all(same(i, g, kv_zero=True) for i, g in fails) and any(  # a case where i // num_kv_heads is not 0
            i[0].size(0) > i[1].size(1) > 1 for i, _ in fails):
        return ("every query head reads KV head 0",
                f"in all {len(fails)} cases that differ your output equals attention in which every query "
                "head reads KV head 0 (k_blocks[:, 0] and v_blocks[:, 0]), while the pool holds "
                "num_kv_heads = k_blocks.size(1) heads: query head i reads KV head i // (num_heads // "
                "num_kv_heads)")
    return None


def merge_call_said(fn: Callable[..., Any], inputs: tuple) -> str:
    """What is observed about the arguments of ``fn``'s first call of course_lib's
    merge_softmax_states on ``inputs`` (a tensor of o's shape passed as ell, or the reverse), or ""."""
    code, seen = flash.merge_softmax_states.__code__, []

    def profile(frame: Any, event: str, arg: Any) -> None:  # noqa: ARG001 (profiler signature)
        if event == "call" and frame.f_code is code and not seen:
            seen.append({n: tuple(t.shape) for n, t in frame.f_locals.items() if isinstance(t, torch.Tensor)})

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        with time_limit(30, "stopped"):
            fn(*inputs)
    except Exception:  # noqa: BLE001 -- the learner's code; only the call's arguments matter here
        pass
    finally:
        sys.setprofile(previous)
    if not seen or len(seen[0].get("o_a", ())) == 2 and len(seen[0].get("ell_a", ())) == 1:
        return ""
    shapes = seen[0]
    return (f": observed, your first call of merge_softmax_states passes ell_a of shape {shapes.get('ell_a')} "
            f"and o_a of shape {shapes.get('o_a')} (ell_b {shapes.get('ell_b')}, o_b {shapes.get('o_b')}); "
            "it takes (m_a, ell_a, o_a, m_b, ell_b, o_b), ell one number per head, o one row per head")


# ----------------------------------------------------------------------------------------------
# flash_backward_tile
# ----------------------------------------------------------------------------------------------

_PROBE = {3: "Bq", 5: "Bk", 4: "d", 2: "d_v"}
_NAMES = {("Bq", "d"): "Q_i", ("Bk", "d"): "K_j", ("Bk", "d_v"): "V_j", ("Bq", "d_v"): "dO_i",
          ("Bq", "Bk"): "P or dS", ("Bk", "Bq"): "Pᵀ or dSᵀ", ("d", "Bk"): "K_jᵀ", ("d_v", "Bk"): "V_jᵀ",
          ("d", "Bq"): "Q_iᵀ", ("d_v", "Bq"): "dO_iᵀ"}


def backward_matmul_said(fn: Callable[..., Any]) -> str:
    """What is observed when ``fn`` (a backward tile) fails a matrix product on a tile whose four
    sizes differ (Bq=3, Bk=5, d=4, d_v=2): which two shapes it multiplies, or ""."""
    gen = torch.Generator().manual_seed(1314)
    q, k, v, d_out = (torch.randn(*shape, generator=gen, dtype=torch.float64)
                      for shape in ((3, 4), (5, 4), (5, 2), (3, 2)))  # (Bq, d), (Bk, d), (Bk, d_v), (Bq, d_v)
    scale = 0.5
    lse = torch.logsumexp(q @ k.T * scale, -1)  # (Bq,)
    D = torch.randn(3, generator=gen, dtype=torch.float64)
    try:
        with time_limit(10, "stopped"):
            fn(q, k, v, d_out, lse, D, scale, i0=0, j0=0, is_causal=False)
    except Exception as err:  # noqa: BLE001 -- the learner's code; only a product's shapes matter here
        found = re.search(r"shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)", str(err))
        if not found:
            return ""
        dims = [_PROBE.get(int(x)) for x in found.groups()]
        if None in dims:
            return ""
        a, b = (dims[0], dims[1]), (dims[2], dims[3])
        what = f"{_NAMES.get(a, 'a tensor')} ({', '.join(a)}) times {_NAMES.get(b, 'a tensor')} ({', '.join(b)})"
        return (f" Observed on a tile of Bq=3 queries, Bk=5 keys, d=4 and d_v=2 (four different sizes): "
                f"your code multiplies {what}, whose inner sizes {a[1]} and {b[0]} differ.")
    return ""
