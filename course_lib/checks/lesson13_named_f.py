"""Lesson 13's mistakes that tryout 13f found unnamed (issue #48), named by what is observed.
The checkers of ``lesson13_scale`` consult them; nothing here is a checker.

* ``merge_named_more(case, inputs, got) -> (said, mistake) | None``: a merge of two softmax states
  returned in the wrong order, measured from 0, halved, or with o averaged or weighted by ell.
* ``forward_named_more(q, k, v, causal, bq, bk, out, lse, tol) -> (said, mistake) | None``: a
  causal forward that ignores the mask, or whose loop skips the diagonal key tiles.
* ``forward_shapes_swapped(out, lse, out_shape, lse_shape) -> str``: (lse, out) returned.
* ``fix_named_more(fn, q, k, v, block_k, got, case) -> (said, mistake) | None``: the Debug loop
  with p measured from the old maximum, each block's own softmax averaged, or o never divided.
* ``LOW_FIX_CASE``, ``low_fix_inputs(L_q, L_k, d, gen)`` and ``low_said(case, q, k, got)``: the
  Debug's float32 case whose scores are all about -150, and what is observed when it gives NaN.
* ``largest_finite(t) -> float`` and ``raw_exp_said(case, largest) -> str``: the largest argument
  an ``exp`` received, and what is said when it is above 0 (scores not measured from a maximum).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .common import time_limit
from .lesson13_named_g import fix_scale_said, merge_absolute_said, merge_order_said

__all__ = ["merge_named_more", "forward_named_more", "forward_shapes_swapped", "fix_named_more",
           "LOW_FIX_CASE", "low_fix_inputs", "low_said", "largest_finite", "raw_exp_said", "RAW_EXP_SLACK",
           "positive_finite", "are_raw_scores"]

RAW_EXP_SLACK = 1e-3  # s - m_new and m_old - m_new are <= 0; round-off between float32 and float64 stays below


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-9) -> bool:
    a, b = a.detach().double(), b.detach().double()
    if a.shape != b.shape or not torch.isfinite(a).all() or not torch.isfinite(b).all():
        return False
    return bool(((a - b).abs() <= tol * (1 + b.abs())).all())


# ----------------------------------------------------------------------------------------------
# merge_states
# ----------------------------------------------------------------------------------------------

def _more_merges(m_a: torch.Tensor, ell_a: torch.Tensor, o_a: torch.Tensor, m_b: torch.Tensor,
                 ell_b: torch.Tensor, o_b: torch.Tensor) -> list[tuple[str, str, tuple[torch.Tensor, ...]]]:
    """``(what is observed, mistake, (m, ell, o))``: m, ell (...), o (..., d_v)."""
    m = torch.maximum(m_a, m_b)
    ref = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    a, b = torch.exp(m_a - ref), torch.exp(m_b - ref)  # (...)
    ell = a * ell_a + b * ell_b
    o = a[..., None] * o_a + b[..., None] * o_b  # (..., d_v)
    mean = ((a * ell_a / ell).nan_to_num(0.0)[..., None] * o_a
            + (b * ell_b / ell).nan_to_num(0.0)[..., None] * o_b)
    by_ell = (a * ell_a)[..., None] * o_a + (b * ell_b)[..., None] * o_b
    return [
        ("m and ell are right, and o is (exp(m_a - m) ell_a o_a + exp(m_b - m) ell_b o_b) / ell, a "
         "mean of o_a and o_b weighted by their ell, as if each o were already divided by its ell: "
         "o here is the running sum of exp(score - m) * v, not yet divided",
         "o merged as an ell-weighted mean", (m, ell, mean)),
        ("m and ell are right, and o is exp(m_a - m) ell_a o_a + exp(m_b - m) ell_b o_b: o's terms "
         "are multiplied by ell_a and ell_b too. o_a already sums exp(score - m_a) * v over a's keys, "
         "so it takes the same factor as ell_a, exp(m_a - m), alone",
         "o's factor multiplied by ell", (m, ell, by_ell)),
        ("m is right, and ell and o are exactly half the state of all the keys together: the two "
         "rescaled states are averaged, (a + b) / 2, where the merged state sums over the keys of "
         "both (o / ell comes out right, but ell and o do not, and the next merge weighs them wrong)",
         "the two states averaged, not added", (m, ell / 2, o / 2)),
        ("m and o are right, and ell is exp(m_a - m) ell_a + ell_b: ell_b is added without its factor "
         "exp(m_b - m), as if m_b were always the larger maximum (where m_b < m_a, ell_b's terms are "
         "measured from m_b, not from m)", "ell_b not rescaled", (m, a * ell_a + ell_b, o)),
        ("m and o are right, and ell is ell_a + exp(m_b - m) ell_b: ell_a is added without its factor "
         "exp(m_a - m), as if m_a were always the larger maximum", "ell_a not rescaled",
         (m, ell_a + b * ell_b, o)),
        ("m is right, and ell and o are both divided by exp(m_a - m) + exp(m_b - m): the two factors "
         "are normalised to add up to 1, like weights. Each factor rescales its own state on its "
         "own: ell_a and o_a sum exp(score - m_a) over a's keys, and exp(m_a - m) moves them to m",
         "factors normalised to sum to 1",
         (m, ell / (a + b).clamp_min(1e-300), o / (a + b).clamp_min(1e-300)[..., None])),
    ]


def merge_named_more(case: str, inputs: tuple[torch.Tensor, ...], got: tuple[torch.Tensor, ...],
                     fn: Callable[..., Any] | None = None) -> tuple[str, str] | None:
    """What is observed when ``got = (m, ell, o)`` is one of the merges above, or ``(m, o, ell)``
    returned in that order, or a state measured from 0 (m = 0, ell = exp(m_a) ell_a + ...)."""
    m_a, ell_a, o_a, m_b, ell_b, o_b = inputs
    if order := merge_order_said(case, inputs, got):
        return order
    if absolute := merge_absolute_said(case, inputs, got, fn):
        return absolute
    if (len(got) == 3 and got[1].shape == o_a.shape and got[2].shape == ell_a.shape
            and o_a.shape != ell_a.shape):
        return (f"Observed ({case}): your second tensor has o's shape {tuple(o_a.shape)} and your "
                f"third ell's {tuple(ell_a.shape)}: you return (m, o, ell); the order asked for is "
                "(m, ell, o)", "returned (m, o, ell)")
    m, ell, o = got
    if m.shape != m_a.shape or ell.shape != ell_a.shape or o.shape != o_a.shape:
        return None
    top = torch.maximum(m_a, m_b)
    ref = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    a, b = torch.exp(m_a - ref), torch.exp(m_b - ref)  # (...)
    if _close(m, top) and _close(ell, a * ell_a + b * ell_b) and _close(
            o, a[..., None] * o_a + b[..., None] * o_b):
        return None  # the right state
    if (bool((m == 0).all()) and _close(ell, torch.exp(m_a) * ell_a + torch.exp(m_b) * ell_b)
            and not _close(m, torch.maximum(m_a, m_b))):
        return (f"Observed ({case}): your m is 0 on every row, and ell = exp(m_a) ell_a + exp(m_b) ell_b: "
                "the state is measured from 0 instead of from the larger maximum. That is the same "
                "softmax here, but m must be max(m_a, m_b), the maximum over the keys of both; and "
                "exp(m_a) overflows to inf once m_a passes about 709 in float64 (88 in float32), "
                "which scores do", "state measured from 0, exp(m_a) unsubtracted")
    for said, mistake, (wm, well, wo) in _more_merges(*inputs):
        if _close(m, wm) and _close(ell, well) and _close(o, wo):
            return f"Likely mistake ({case}): {said}", mistake
    return None


# ----------------------------------------------------------------------------------------------
# flash_forward
# ----------------------------------------------------------------------------------------------

def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seen: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention where query i sees the keys ``seen[i]``: q (..., L_q, d), k, v (..., L_k, d),
    seen (L_q, L_k) -> out (..., L_q, d_v), lse (..., L_q). Small checker cases only."""
    s = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(~seen, -math.inf)  # (..., L_q, L_k)
    lse = torch.logsumexp(s, dim=-1)
    return torch.softmax(s, dim=-1) @ v, lse


def forward_named_more(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, bq: int,
                       bk: int, out: torch.Tensor, lse: torch.Tensor, tol: float) -> tuple[str, str] | None:
    """On a causal case: out and lse equal attention with no mask, or with the key tiles that start
    at or after the query tile's start skipped (tile 0 kept). q, k, v (B, h, L, d) float64."""
    if not causal:
        return None
    L_q, L_k = q.size(-2), k.size(-2)
    i = torch.arange(L_q)[:, None]
    j = torch.arange(L_k)[None, :]
    none = torch.ones(L_q, L_k, dtype=torch.bool)
    start_q, start_k = (i // bq) * bq, (j // bk) * bk
    early = (j <= i) & ((start_k < start_q) | (start_k == 0))
    for seen, said, mistake in (
            (none, "out and lse equal attention with no mask at all, while this case has "
                   "is_causal=True: query i also sees the keys after i (is_causal is ignored)",
             "is_causal ignored"),
            (early, f"each query sees only the keys of the key tiles that start before its own query "
                    f"tile does (and key tile 0): your loop stops at the first key tile that starts "
                    f"at or after the query tile's start, so the tiles on the diagonal, which hold a "
                    f"query's own key and its nearest ones, are skipped (query tiles of {bq}, key "
                    f"tiles of {bk}); only the tiles wholly after a tile's last query are in the future",
             "the diagonal key tiles skipped")):
        want_out, want_lse = _dense(q, k, v, seen)
        if (torch.isfinite(want_lse).all() and _close(out, want_out, tol) and _close(lse, want_lse, tol)):
            return said, mistake
    return None


def forward_shapes_swapped(out: torch.Tensor, lse: torch.Tensor, out_shape: tuple[int, ...],
                           lse_shape: tuple[int, ...]) -> str:
    """" (you return (lse, out) ...)" when the two tensors' shapes are each other's; else ""."""
    if tuple(out.shape) == tuple(lse_shape) and tuple(lse.shape) == tuple(out_shape):
        return (": observed, your first tensor has lse's shape and your second out's: you return "
                "(lse, out), the order asked for is (out, lse)")
    return ""


# ----------------------------------------------------------------------------------------------
# flash_fix (Debug): observed, never the fix
# ----------------------------------------------------------------------------------------------

class _ExpArgs(TorchDispatchMode):
    """Records, for each ``exp`` over ``rows`` x n numbers, whether all its arguments were +inf."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows, self.all_inf = rows, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)
        if name in ("exp", "exp_") and args and isinstance(args[0], torch.Tensor):
            x = args[0]
            if x.dim() == 2 and x.size(0) == self.rows and x.numel() > 0:
                self.all_inf.append(bool((x == math.inf).all()))
        return func(*args, **(kwargs or {}))


def fix_named_more(fn: Callable[..., Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   block_k: int, got: torch.Tensor, case: str) -> tuple[str, str] | None:
    """What the Debug checker observes: q (L_q, d), k (L_k, d), v (L_k, d_v), got (L_q, d_v)."""
    qd, kd, vd = q.double(), k.double(), v.double()
    s = qd @ kd.T / math.sqrt(q.size(-1))  # (L_q, L_k): the checker's small cases
    tol = 1e-3 if q.dtype == torch.float32 else 2e-5
    if not torch.isfinite(got).all():
        watch = _ExpArgs(q.size(0))
        try:
            with time_limit(60.0, "stopped"), watch:
                fn(q, k, v, block_k=block_k)
        except Exception:  # noqa: BLE001 - it ran once already
            return None
        if watch.all_inf[:1] == [True]:
            return (f"Not yet ({case}): observed {int((~torch.isfinite(got)).sum())} of {got.numel()} "
                    "outputs NaN or inf. The first exp over a block of scores your loop computes gets "
                    "+inf for every argument: your p is exp(s - m) with m the running maximum from "
                    "before that block, -inf at the first block, so p is inf there, and every "
                    "block's p is measured from that old maximum. Print p and the maximum it is "
                    "measured from at the first two blocks", "p measured from the old maximum")
        return None
    if scaled := fix_scale_said(q, k, v, block_k, got, case):
        return scaled
    blocks = [slice(j, j + block_k) for j in range(0, k.size(0), block_k)]
    per_block = sum(torch.softmax(s[:, b], -1) @ vd[b] for b in blocks) / len(blocks)
    if len(blocks) > 1 and _close(got, per_block, tol):
        return (f"Not yet ({case}): your output equals the average, over the {len(blocks)} blocks, of "
                "each block's own softmax times its values: every block's weights add up to 1 on their "
                "own, and every block counts 1/" f"{len(blocks)} however large or small its scores. Print "
                "one row's weights for all its keys: they add up to 1 over the whole row in attention",
                "each block's softmax averaged")
    ell = torch.exp(s - s.amax(-1, keepdim=True)).sum(-1)  # (L_q,)
    exact = torch.softmax(s, -1) @ vd
    if _close(got, exact * ell[:, None], tol) and not _close(ell, torch.ones_like(ell), tol):
        return (f"Not yet ({case}): your output equals exact attention times each row's ell, the sum "
                f"of exp(score - m) over its keys ({ell.min().item():.3g} to {ell.max().item():.3g} "
                "here): o is returned as it is summed, with every value equal to 1 your function "
                "returns ell, not 1. Print o and ell after the last block", "o never divided by ell")
    return None


LOW_FIX_CASE = "L_q=4, L_k=40, d=8, block_k=16, float32, every score about -150"


def low_fix_inputs(L_q: int, L_k: int, d: int, gen: torch.Generator
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float32 q (L_q, d), k (L_k, d), v (L_k, d): every score between about -156 and -144, the
    maximum growing block after block."""
    u = torch.nn.functional.normalize(torch.randn(d, generator=gen, dtype=torch.float64), dim=0)
    q = u + 0.02 * torch.randn(L_q, d, generator=gen, dtype=torch.float64)
    c = -153 + torch.linspace(0, 6, L_k, dtype=torch.float64) + 3 * torch.rand(L_k, generator=gen,
                                                                                dtype=torch.float64)
    k = c[:, None] * math.sqrt(d) * u + 0.3 * torch.randn(L_k, d, generator=gen, dtype=torch.float64)
    v = torch.randn(L_k, d, generator=gen, dtype=torch.float64)
    return q.float(), k.float(), v.float()


def low_said(case: str, q: torch.Tensor, k: torch.Tensor, got: torch.Tensor) -> str:
    """What is observed when the all-negative float32 case gives NaN or inf."""
    s = q.double() @ k.double().T / math.sqrt(q.size(-1))  # (L_q, L_k)
    return (f"Not yet ({case}): observed NaN/inf in {int((~torch.isfinite(got)).sum())} of "
            f"{got.numel()} outputs, in float32, while the earlier cases are right. Here every score is "
            f"between {s.min().item():.0f} and {s.max().item():.0f}, all below 0. In float32, exp(x) is "
            "exactly 0 once x is below about -104 (the smallest float32 above 0 is about 1.4e-45 = "
            "exp(-103.3)), and 0 / 0 is NaN. Print the arguments your exp receives at the first block, "
            "and ell after it")


# ----------------------------------------------------------------------------------------------
# flash_forward: exp of raw scores
# ----------------------------------------------------------------------------------------------


def largest_finite(t: Any) -> float:
    """The largest finite value of a floating tensor ``t`` (any shape), -inf if there is none."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
        return -math.inf
    finite = t.detach()[torch.isfinite(t.detach())]
    return float(finite.max()) if finite.numel() else -math.inf


def raw_exp_said(case: str, largest: float) -> str:
    """What is observed when an ``exp`` received ``largest`` > 0: scores not measured from a maximum."""
    return (f"Right numbers here, but exp receives scores up to {largest:.3g} ({case}), not measured from "
            "a running maximum: an online softmax only ever takes exp of s - m_new and of m_old - m_new, "
            "both <= 0. These scores are small; in float32 exp overflows past about 88 (exp(88.7) = "
            "3.4e38, inf beyond), in float64 past about 709, so real scores of a few hundred give inf "
            "and NaN.")


def positive_finite(t: Any, limit: int = 4096) -> torch.Tensor:
    """Up to ``limit`` of the finite values above ``RAW_EXP_SLACK`` in a floating tensor ``t`` (any
    shape), as a float64 vector; empty if there are none."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
        return torch.zeros(0, dtype=torch.float64)
    flat = t.detach().reshape(-1).double()
    return flat[torch.isfinite(flat) & (flat > RAW_EXP_SLACK)][:limit]


def are_raw_scores(args: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether most positive ``exp`` arguments ``args (n,)`` are the case's own scaled scores
    ``q kᵀ / √d`` (q (B, h, L_q, d), k (B, h, L_k, d)): exp of raw scores. A rescale written as
    ``1 / exp(m_new - m_old)`` passes positive differences of maxima, which are not scores."""
    if args.numel() == 0:
        return False
    scores = (q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.size(-1))).reshape(-1)
    scores, _ = scores.sort()
    where = torch.searchsorted(scores, args).clamp(1, scores.numel() - 1)  # (n,)
    nearest = torch.minimum((scores[where] - args).abs(), (scores[where - 1] - args).abs())
    # float32 scores are within a few ulp of the float64 ones; a random value of these cases lands that
    # near one of a few thousand scores about 1 time in 50
    return bool((nearest <= 2e-6 * (1 + args.abs())).float().mean() >= 0.9)
