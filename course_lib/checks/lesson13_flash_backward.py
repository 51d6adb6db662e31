"""Checker for lesson 13's backward pass of FlashAttention, written one tile at a time.

* ``check_flash_backward_tile(fn)``: ``fn(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0,
  is_causal=False) -> (dq_i, dk_j, dv_j)``, what one query tile ``q_i (Bq, d)`` and one key tile
  ``k_j (Bk, d)``, ``v_j (Bk, d_v)`` add to dQ_i, dK_j and dV_j, from the output's gradient
  ``d_out_i (Bq, d_v)``, the forward's log-sum-exp ``lse_i (Bq,)`` and ``D_i = rowsum(dO_i ∘ O_i)
  (Bq,)``; ``i0``, ``j0`` are the positions of the tile's first query and first key, ``is_causal``
  whether the attention is causal (query i sees keys 0..i, SDPA's alignment).

The checker calls ``fn`` on every tile of a full tiling (under ``is_causal``, not on the tiles that
lie wholly in the future, as FlashAttention skips them), adds the tiles up, and compares the sums
with autograd through the whole attention, float64, to 1e-9: five cases with tiles that do not
divide the lengths, L_q != L_k, d_v != d, a scale that is not 1/sqrt(d), causal and not. A wrong
sum is compared with the same tiling run with each usual mistake (about forty: D, the scale, the
transposes, the return order, the causal mask's offsets), and the one it matches is named; a sum
off by float32's round-off only is named as float32 arithmetic.
course_lib's FlashAttention, PyTorch's SDPA and autograd are refused.

* ``check_io_ratio(fn)``: ``fn() -> number``, a "predict, then run" question: at L = 16,384,
  head_dim 64, float32, tiles of 256 queries, the bytes standard attention's forward reads and writes
  in slow memory (the FlashAttention paper's Algorithm 0) over FlashAttention-2's. Right within 5%
  (the Θ terms alone give 8, the exact count 7.9). A wrong value is compared with what each usual
  miscount gives; one match is named, and a value several miscounts give (2.0: tiles of 64 queries,
  or S counted once) lists them all, blaming none.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .. import flash
from .common import CheckFailure, calls_to, checker, course_lib_used, one_thread, time_limit

__all__ = ["check_flash_backward_tile", "check_io_ratio", "io_ratio_answer"]

TIME_LIMIT = 60.0
TOL = 1e-9
_CAUSAL_ONLY = ("no causal mask", "mask S with 0", "mask on dV's P only", "mask on dS only",
                "mask in tile coordinates", "mask ignores i0", "mask ignores j0", "mask offset reversed",
                "diagonal hidden", "mask one key late")
MATCH = 1e-6  # a mistake's numbers are matched to this (relative): float32 inside still matches
FLOAT32 = 1e-5  # a difference this small (relative) is float32's round-off, not another formula

# (case, L_q, L_k, d, d_v, Bq, Bk, causal, scale): each mistake below gives other numbers in at least
# one of them; the first has square tiles and d_v = d, so that a missing transpose gives numbers
# (named) rather than a shape error.
CASES = [
    ("12 queries and keys, tiles of 4 x 4, head_dim 6", 12, 12, 6, 6, 4, 4, False, 1 / math.sqrt(6)),
    ("10 queries, 14 keys, tiles of 4 x 5, head_dim 3, d_v 5, scale 0.3", 10, 14, 3, 5, 4, 5, False,
     0.3),
    ("causal, 13 tokens, tiles of 5 x 3, head_dim 4, d_v 2", 13, 13, 4, 2, 5, 3, True, 0.5),
    ("causal, 16 tokens, tiles of 8 x 8, head_dim 16", 16, 16, 16, 16, 8, 8, True, 0.25),
    ("7 queries, 9 keys, one tile each way, head_dim 8", 7, 9, 8, 8, 7, 9, False, 1 / math.sqrt(8)),
]

SIGNATURE_HINT = ("The inputs: q_i (Bq, d), k_j (Bk, d), v_j (Bk, d_v), d_out_i (Bq, d_v), lse_i and D_i "
                  "(Bq,), scale a float, then i0, j0 and is_causal as keywords; lse_i and D_i hold "
                  "one number per query row.")


class _AttentionWatch(TorchFunctionMode):
    """Records whether PyTorch's ready-made attention runs inside the learner's code."""

    def __init__(self) -> None:
        super().__init__()
        self.called = ""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = getattr(func, "__name__", "")
        if func is F.scaled_dot_product_attention or "flex_attention" in name:
            self.called = name or "scaled_dot_product_attention"
        return func(*args, **(kwargs or {}))


def _inputs(n: int, L_q: int, L_k: int, d: int, d_v: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(1300 + n)
    q = 1.5 * torch.randn(L_q, d, generator=gen, dtype=torch.float64)  # peaked softmaxes
    k = 1.5 * torch.randn(L_k, d, generator=gen, dtype=torch.float64)
    v = torch.randn(L_k, d_v, generator=gen, dtype=torch.float64)
    d_out = torch.randn(L_q, d_v, generator=gen, dtype=torch.float64)
    return q, k, v, d_out


def _visible(L_q: int, L_k: int, causal: bool) -> torch.Tensor:
    """Bool ``(L_q, L_k)``: which key each query sees (causal: keys 0..i, SDPA's top-left)."""
    keep = torch.ones(L_q, L_k, dtype=torch.bool)
    return keep.tril() if causal else keep


def _expected(q, k, v, d_out, causal: bool, scale: float):  # noqa: ANN001, ANN202
    """Autograd through the whole attention: ``(dq, dk, dv)``, and the ``lse`` and ``D`` it gives."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    s = (q @ k.T * scale).masked_fill(~_visible(q.size(0), k.size(0), causal), -math.inf)
    out = s.softmax(dim=-1) @ v
    grads = torch.autograd.grad(out, (q, k, v), d_out)
    lse = torch.logsumexp(s.detach(), dim=-1)
    D = (d_out * out.detach()).sum(dim=-1)
    return grads, lse, D


def _tiles(L_q: int, L_k: int, Bq: int, Bk: int, causal: bool) -> list[tuple[int, int, int, int]]:
    """``(i0, i1, j0, j1)`` of every tile FlashAttention computes (causal: not the future ones)."""
    return [(i0, min(i0 + Bq, L_q), j0, min(j0 + Bk, L_k))
            for i0 in range(0, L_q, Bq) for j0 in range(0, L_k, Bk)
            if not (causal and j0 > min(i0 + Bq, L_q) - 1)]


_ORDERS = {  # a return order other than (dq, dk, dv), and what comes back where
    "returns (dq, dv, dk)": ((0, 2, 1), "dK and dV come back in each other's places"),
    "returns (dv, dq, dk)": ((2, 0, 1), "the three come back in the listing's order (dV, dQ, dK)"),
    "returns (dk, dq, dv)": ((1, 0, 2), "dQ and dK come back in each other's places"),
    "returns (dv, dk, dq)": ((2, 1, 0), "dQ and dV come back in each other's places"),
    "returns (dk, dv, dq)": ((1, 2, 0), "dK comes back in dQ's place, dV in dK's, dQ in dV's"),
}


def _tile(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0, j0, causal, knob=""):  # noqa: ANN001, ANN202, PLR0912, PLR0913
    """One tile of the backward pass, right (knob "") or with one usual mistake."""
    s_scale = {"no scale in S": 1.0, "1/sqrt(d) everywhere": 1 / math.sqrt(q_i.size(-1)),
               "scale from head_dim": 1 / math.sqrt(q_i.size(-1))}.get(knob, scale)
    s = q_i @ k_j.T * s_scale
    hidden = torch.zeros(s.shape, dtype=torch.bool)
    if (causal or knob == "causal mask always") and knob != "no causal mask":
        rows = torch.arange(i0, i0 + q_i.size(0))[:, None]
        cols = torch.arange(j0, j0 + k_j.size(0))[None, :]
        if knob == "mask in tile coordinates":
            rows, cols = rows - i0, cols - j0
        if knob == "mask ignores i0":
            rows = rows - i0
        if knob == "mask ignores j0":
            cols = cols - j0
        if knob == "mask offset reversed":  # local c - r compared with j0 - i0 instead of i0 - j0
            rows, cols = rows - 2 * i0, cols - 2 * j0
        hidden = {"diagonal hidden": cols >= rows, "mask one key late": cols > rows + 1}.get(
            knob, cols > rows)
    if knob == "mask S with 0":
        s = s.masked_fill(hidden, 0.0)
    elif knob not in ("mask on dS only", "mask on dV's P only"):
        s = s.masked_fill(hidden, -math.inf)
    if knob == "exp(S)":
        p = torch.exp(s)
    elif knob == "exp(S + L)":
        p = torch.exp(s + lse_i[:, None])
    elif knob == "softmax of the tile":
        p = s.softmax(dim=-1)
    elif knob == "lse along keys":
        p = torch.exp(s - lse_i[None, :])
    else:
        p = torch.exp(s - lse_i[:, None])
    p_dv = p.masked_fill(hidden, 0.0) if knob == "mask on dV's P only" else p
    dp = v_j @ d_out_i.T if knob == "dP transposed" else d_out_i @ v_j.T
    ds = {"no D": lambda: p * dp,
          "D with the wrong sign": lambda: p * (dp + D_i[:, None]),
          "D outside P": lambda: p * dp - D_i[:, None],
          "dS without P": lambda: dp - D_i[:, None],
          "dS negated": lambda: p * (D_i[:, None] - dp),
          "D from the tile": lambda: p * (dp - (p * dp).sum(dim=-1, keepdim=True)),
          "D along keys": lambda: p * (dp - D_i[None, :])}.get(knob, lambda: p * (dp - D_i[:, None]))()
    if knob == "mask on dS only":
        ds = ds.masked_fill(hidden, 0.0)
    dv = {"dV = P dO": lambda: p @ d_out_i, "dV from dS": lambda: ds.T @ d_out_i,
          "dV scaled": lambda: p.T @ d_out_i * scale}.get(knob, lambda: p_dv.T @ d_out_i)()
    root = 1 / math.sqrt(q_i.size(-1))
    q_scale = {"scale divided": 1 / scale, "no scale in dQ dK": 1.0, "no scale in dQ": 1.0,
               "scale twice": scale ** 2, "scale twice in dQ": scale ** 2,
               "1/sqrt(d) everywhere": root, "1/sqrt(d) in dQ dK": root}.get(knob, scale)
    k_scale = {"scale divided": 1 / scale, "no scale in dQ dK": 1.0, "no scale in dK": 1.0,
               "scale twice": scale ** 2, "scale twice in dK": scale ** 2,
               "1/sqrt(d) everywhere": root, "1/sqrt(d) in dQ dK": root}.get(knob, scale)
    dq = {"dQ = dS^T K": lambda: ds.T @ k_j, "dQ from P": lambda: p @ k_j}.get(
        knob, lambda: ds @ k_j)() * q_scale
    dk = {"dK = dS Q": lambda: ds @ q_i, "dK from P": lambda: p.T @ q_i}.get(
        knob, lambda: ds.T @ q_i)() * k_scale
    grads = (dq, dk, dv)
    if knob in _ORDERS:
        grads = tuple(grads[n] for n in _ORDERS[knob][0])
    return grads


MISTAKES = [  # (knob, what is observed and what it means)
    ("no D", "dQ and dK are what dS = P ∘ dP gives, with D_i never subtracted (dV is right): the "
             "softmax's backward is dS = P ∘ (dP − D), where D_i = rowsum(dO_i ∘ O_i) stands in for "
             "the row sums of P ∘ dP over the whole row"),
    ("D with the wrong sign", "dQ and dK are what dS = P ∘ (dP + D_i) gives, D_i added instead of "
                              "subtracted (dV is right): the softmax's backward is dS = P ∘ (dP − D_i)"),
    ("dS negated", "dQ and dK are autograd's with the opposite sign (dV is right), as dS = P ∘ "
                   "(D_i − dP) gives: dS = P ∘ (dP − D_i)"),
    ("D outside P", "dQ and dK are what dS = P ∘ dP − D_i gives, D_i not multiplied by P (dV is "
                    "right): the softmax's backward is dS = P ∘ (dP − D_i)"),
    ("dS without P", "dQ and dK are what dS = dP − D_i gives, without the factor P (dV is right): "
                     "the softmax's backward is dS = P ∘ (dP − D_i)"),
    ("D from the tile", "dQ and dK are what D = rowsum(P ∘ dP) over this tile's keys gives: a tile "
                        "holds only part of the row; use the D_i given, the sum over the whole row"),
    ("exp(S)", "the gradients are what P = exp(S) gives, without subtracting lse_i: the probabilities "
               "are P = exp(S − L), each row's log-sum-exp holding both its maximum and its sum"),
    ("exp(S + L)", "the gradients are what P = exp(S + lse_i) gives, the log-sum-exp added: the "
                   "probabilities are P = exp(S − lse_i)"),
    ("softmax of the tile", "the gradients are what a softmax over this tile's keys gives: a tile "
                            "holds only part of the row; P = exp(S − lse_i) is the softmax over all "
                            "the keys, with no maximum or sum to compute"),
    ("lse along keys", "the gradients are what subtracting lse_i along the keys gives (lse_i[None, :], "
                       "or lse_i without [:, None] on a square tile): each query's row subtracts its "
                       "own log-sum-exp, lse_i[:, None]"),
    ("D along keys", "dQ and dK are what subtracting D_i along the keys gives (D_i without [:, None] "
                     "on a square tile): each query's row subtracts its own D, D_i[:, None]"),
    ("no scale in S", "the gradients are what S = Q_i K_jᵀ without the scale gives: recompute the "
                      "scores exactly as the forward pass did, S = Q_i K_jᵀ · scale"),
    ("1/sqrt(d) everywhere", "dQ, dK and dV are what 1/√head_dim in place of the scale gives (in S, "
                             "dQ and dK), while this case passes another scale: use the scale "
                             "argument everywhere"),
    ("scale from head_dim", "the gradients are what a scale of 1/√head_dim in S gives, while this case "
                            "passes another scale: use the scale argument"),
    ("1/sqrt(d) in dQ dK", "dV is right, and dQ and dK are off by the factor 1/(scale·√head_dim): "
                           "they use 1/√head_dim where this case passes another scale; dQ = dS K · "
                           "scale and dK = dSᵀ Q · scale, with the scale argument"),
    ("no scale in dQ dK", "dV is right, and dQ and dK are 1/scale times too large: S = Q Kᵀ · scale, so "
                          "the chain rule multiplies both dS K and dSᵀ Q by the scale"),
    ("no scale in dQ", "dK and dV are right, and dQ is 1/scale times too large: S = Q Kᵀ · scale, so "
                       "dQ = dS K · scale"),
    ("no scale in dK", "dQ and dV are right, and dK is 1/scale times too large: S = Q Kᵀ · scale, so "
                       "dK = dSᵀ Q · scale"),
    ("scale divided", "dV is right, and dQ and dK are 1/scale² times too large, as dS K / scale "
                      "gives: S = Q Kᵀ · scale, so the chain rule multiplies dS K and dSᵀ Q by the "
                      "scale"),
    ("scale twice", "dV is right, and dQ and dK are scale times too small: the chain rule through "
                    "S = Q Kᵀ · scale brings the scale into dQ and dK once"),
    ("scale twice in dQ", "dK and dV are right, and dQ is scale times too small: dQ = dS K · scale, "
                          "with the scale once"),
    ("scale twice in dK", "dQ and dV are right, and dK is scale times too small: dK = dSᵀ Q · scale, "
                          "with the scale once"),
    ("dV scaled", "dQ and dK are right, and dV is scale times too small: O = P V has no scale in it, "
                  "so dV = Pᵀ dO"),
    ("dV = P dO", "dV is what P dO gives: O = P V, so dV = Pᵀ dO (one row per key)"),
    ("dV from dS", "dQ and dK are right, and dV is what dSᵀ dO gives: O = P V, so dV = Pᵀ dO, with "
                   "P, not dS"),
    ("dP transposed", "dQ and dK are what dP = V dOᵀ gives: dP = dO Vᵀ, one row per query, as P"),
    ("dQ = dS^T K", "dQ is what dSᵀ K gives: dQ = dS K · scale (one row per query)"),
    ("dK = dS Q", "dK is what dS Q gives: dK = dSᵀ Q · scale (one row per key)"),
    ("dQ from P", "dK and dV are right, and dQ is what P K · scale gives: dQ = dS K · scale, with dS, "
                  "not P"),
    ("dK from P", "dQ and dV are right, and dK is what Pᵀ Q · scale gives: dK = dSᵀ Q · scale, with "
                  "dS, not P"),
    *[(knob, f"the three gradients are right, but {what}: return (dq_i, dk_j, dv_j)")
      for knob, (_, what) in _ORDERS.items()],
    ("causal mask always", "the gradients are what a causal mask gives in a case that passes "
                           "is_causal=False: mask only when is_causal is true"),
    ("no causal mask", "the gradients are what the recomputed P gives without the causal mask: in a "
                       "tile that crosses the diagonal, keys after the query must get P = 0, as in "
                       "the forward pass"),
    ("mask S with 0", "the gradients are what masking the scores with 0 gives: a hidden key "
                      "gets S = −inf, so that P = exp(−inf) = 0"),
    ("mask on dV's P only", "dV is right, and dQ and dK are what an unmasked P in dS gives: the mask "
                            "reaches the P of dV = Pᵀ dO but not the P of dS = P ∘ (dP − D_i); mask "
                            "S (or P) before both"),
    ("mask on dS only", "dQ and dK are right, and dV is what an unmasked P gives: the mask is applied "
                        "to dS but not to the P of dV = Pᵀ dO; mask P itself (keys after the query "
                        "get P = 0) and both follow"),
    ("mask in tile coordinates", "the gradients are what a causal mask built from the positions inside "
                                 "the tile gives (row >= column from 0): the tile's first query is at "
                                 "position i0 and its first key at j0; compare i0 + row with j0 + "
                                 "column"),
    ("mask ignores i0", "the gradients are what a causal mask that counts the queries from 0 in "
                        "each tile gives (i0 left out, j0 kept): query i0 + row sees key j0 + column "
                        "when j0 + column <= i0 + row"),
    ("mask ignores j0", "the gradients are what a causal mask that counts the keys from 0 in each "
                        "tile gives (j0 left out, i0 kept): query i0 + row sees key j0 + column when "
                        "j0 + column <= i0 + row"),
    ("mask offset reversed", "the gradients are what a causal mask shifted the wrong way gives (e.g. "
                             "tril(diagonal=j0 − i0)): key j0 + column is visible when j0 + column <= "
                             "i0 + row, i.e. column − row <= i0 − j0"),
    ("diagonal hidden", "the gradients are what a causal mask that also hides the diagonal gives: "
                        "query i sees keys 0..i, itself included"),
    ("mask one key late", "the gradients are what a causal mask that lets each query see one key "
                          "after itself gives: query i sees keys 0..i, not i + 1"),
]


def _run_tiling(tile: Callable[..., Any], q, k, v, d_out, lse, D, Bq, Bk, causal, scale,  # noqa: ANN001, PLR0913
                check_shapes: str = "") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every tile through ``tile``, added up; ``check_shapes`` (the case) checks the learner's."""
    L_q, L_k = q.size(0), k.size(0)
    dq, dk = torch.zeros_like(q), torch.zeros_like(k)
    dv = torch.zeros_like(v)
    for i0, i1, j0, j1 in _tiles(L_q, L_k, Bq, Bk, causal):
        args = (q[i0:i1].clone(), k[j0:j1].clone(), v[j0:j1].clone(), d_out[i0:i1].clone(),
                lse[i0:i1].clone(), D[i0:i1].clone(), scale)
        if check_shapes:
            given = [a.clone() for a in args[:-1]]
            got = _call(tile, *args, i0=i0, j0=j0, is_causal=causal, case=check_shapes)
            if any(not torch.equal(a, b) for a, b in zip(given, args)):
                raise CheckFailure(f"Your function changes its inputs in place ({check_shapes}); "
                                   "build new tensors (e.g. s = s.masked_fill(...), not masked_fill_).")
            got = _result(got, (i1 - i0, j1 - j0, q.size(1), v.size(1)), i0, j0, check_shapes)
        else:
            got = tile(*args, i0, j0, causal)
        dq[i0:i1] += got[0]
        dk[j0:j1] += got[1]
        dv[j0:j1] += got[2]
    return dq, dk, dv


def _call(fn: Callable[..., Any], *args: Any, case: str, **kwargs: Any) -> Any:
    try:
        with time_limit(TIME_LIMIT, f"Your code ran for more than {TIME_LIMIT:g} s ({case}) and was "
                                    "stopped: does a loop never end?"):
            return fn(*args, **kwargs)
    except (NotImplementedError, CheckFailure):
        raise
    except Exception as err:
        raise CheckFailure(f"Your code raised {type(err).__name__} ({case}, tile at i0={kwargs['i0']}, "
                           f"j0={kwargs['j0']}): {err}. {SIGNATURE_HINT} Check which products need a "
                           "transpose.") from err


def _result(got: Any, sizes: tuple[int, int, int, int], i0: int, j0: int, case: str) -> tuple[torch.Tensor, ...]:
    """The learner's ``(dq_i, dk_j, dv_j)`` of one tile, checked for type and shape, in float64."""
    Bq, Bk, d, d_v = sizes
    where = f"({case}, tile at i0={i0}, j0={j0})"
    if not isinstance(got, (tuple, list)) or len(got) != 3 or not all(
            isinstance(t, torch.Tensor) for t in got):
        raise CheckFailure(f"Return three tensors (dq_i, dk_j, dv_j) {where}, got "
                           f"{type(got).__name__}{'' if got is None else ' ' + repr(got)[:80]}.")
    expected = {"dq_i": (Bq, d), "dk_j": (Bk, d), "dv_j": (Bk, d_v)}
    for (name, shape), t in zip(expected.items(), got):
        if tuple(t.shape) != shape:
            rows = "one row per query of the tile" if name == "dq_i" else "one row per key of the tile"
            swapped = t.dim() == 2 and t.size(0) == (Bk if name == "dq_i" else Bq)
            raise CheckFailure(
                f"Wrong shape {where}: {name} is {tuple(t.shape)}, expected {shape}, {rows}."
                + (" Observed: as many rows as the other tile has; look at which matrix is transposed "
                   "in its product." if swapped else ""))
        if t.dtype != torch.float64:
            raise CheckFailure(f"Observed {where}: {name} is {t.dtype} while the inputs are float64. "
                               "Keep the inputs' dtype (a tensor made with torch.zeros(...) needs "
                               "dtype=q_i.dtype).")
    return tuple(t.detach().to(torch.float64) for t in got)


def _near(got: torch.Tensor, expected: torch.Tensor) -> bool:
    if got.shape != expected.shape or not torch.isfinite(got).all():
        return False
    return (got - expected).abs().max().item() <= TOL * (1.0 + expected.abs().max().item())


@checker
def check_flash_backward_tile(fn: Callable[..., Any]) -> None:
    """Check ``fn(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0, is_causal=False) ->
    (dq_i, dk_j, dv_j)``: every tile added up equals autograd's dQ, dK, dV (float64, 1e-9)."""
    if not callable(fn):
        raise CheckFailure(f"Hand in your function itself (the name, without parentheses), got "
                           f"{type(fn).__name__}.")
    try:
        with torch.random.fork_rng(devices=[]), one_thread():
            _check(fn)
    except (NotImplementedError, CheckFailure):
        raise
    except Exception as err:
        raise CheckFailure(f"The checker could not use your answer: {type(err).__name__}: {err}. "
                           "Check that it has the signature the exercise gives.") from err


def _refused() -> list[Callable[..., Any]]:
    return [flash.flash_backward_tile, flash.flash_attention_backward, flash.flash_attention_forward,
            flash.flash_attention, flash.naive_attention, flash.FlashAttention.forward,
            flash.FlashAttention.backward]


def _autograd() -> list[Callable[..., Any]]:
    return [torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward, torch.func.vjp,
            torch.func.grad, torch.func.grad_and_value]


def _check(fn: Callable[..., Any]) -> None:
    used = course_lib_used(fn, (flash.flash_backward_tile, flash.flash_attention_backward))
    if used:
        raise CheckFailure(f"Your function is or uses course_lib's `{used}`, the reference: write the "
                           "tile's five steps yourself. Matmuls, exp and sums are welcome.")
    rounded: tuple[str, float] | None = None  # the first case off by float32's round-off only
    for n, (case, L_q, L_k, d, d_v, Bq, Bk, causal, scale) in enumerate(CASES):
        q, k, v, d_out = _inputs(n, L_q, L_k, d, d_v)
        expected, lse, D = _expected(q, k, v, d_out, causal, scale)
        watch = _AttentionWatch()
        refused, autograd = _refused(), _autograd()
        with calls_to(refused + autograd) as called, watch:  # one profile hook: they do not nest
            got = _run_tiling(fn, q, k, v, d_out, lse, D, Bq, Bk, causal, scale, check_shapes=case)
        seen = [f for f in called if any(f is r for r in refused)]
        asked = [f for f in called if any(f is a for a in autograd)]
        if seen:
            raise CheckFailure("Your function calls course_lib's FlashAttention (course_lib.flash), the "
                               "reference: write the tile's five steps yourself.")
        if watch.called:
            raise CheckFailure("Your function calls PyTorch's attention (scaled_dot_product_attention or "
                               "flex_attention): this exercise writes its backward by hand. Matmuls, exp "
                               "and sums are welcome.")
        if asked:
            raise CheckFailure("Your function asks autograd for the gradients (torch.autograd.grad, "
                               ".backward() or torch.func): this exercise writes them by hand, the few "
                               "lines autograd cannot run one tile at a time. Matmuls, exp and sums are "
                               "welcome.")
        if all(_near(g, e) for g, e in zip(got, expected)):
            continue
        if not all(torch.isfinite(g).all() for g in got):
            raise CheckFailure(
                f"Observed ({case}): your gradients contain NaN or inf. exp(S − lse_i) never overflows "
                "(S <= lse_i); a key hidden by the causal mask must give P = 0 (exp(−inf) = 0), and a "
                "softmax over a row whose keys are all hidden gives NaN.")
        if all(_close(g, e, FLOAT32) for g, e in zip(got, expected)):  # round-off: the other cases
            largest = max((g - e).abs().max().item() for g, e in zip(got, expected))
            rounded = rounded or (case, largest)
            continue
        _name_the_mistake(got, expected, (q, k, v, d_out, lse, D, Bq, Bk, causal, scale), case)
    if rounded:
        raise CheckFailure(
            f"Observed ({rounded[0]}): the tiles added up agree with autograd's to {rounded[1]:.1g}, "
            "float32's round-off, not to float64's 1e-9: your tile computes in float32 somewhere (a "
            ".float(), or a tensor made without dtype=). The checker works in float64: compute in "
            "the inputs' dtype.", mistake="float32")
    print(f"check_flash_backward_tile: all {len(CASES)} tilings add up to autograd's dQ, dK and dV "
          "(float64, to 1e-9), causal and not, with tiles that do not divide the lengths. Well done!")


def _close(got: torch.Tensor, other: torch.Tensor, tol: float) -> bool:
    if got.shape != other.shape or not torch.isfinite(got).all() or not torch.isfinite(other).all():
        return False
    return (got - other).abs().max().item() <= tol * (1.0 + other.abs().max().item())


def _name_the_mistake(got: tuple[torch.Tensor, ...], expected: tuple[torch.Tensor, ...],
                      setup: tuple[Any, ...], case: str) -> None:
    q, k, v, d_out, lse, D, Bq, Bk, causal, scale = setup
    for knob, reason in MISTAKES:
        if (knob in _CAUSAL_ONLY and not causal) or (knob == "causal mask always" and causal):
            continue

        def wrong(*args: Any, knob: str = knob) -> tuple[torch.Tensor, ...]:
            return _tile(*args, knob=knob)

        try:
            with torch.no_grad():
                variant = _run_tiling(wrong, q, k, v, d_out, lse, D, Bq, Bk, causal, scale)
        except RuntimeError:  # this mistake does not fit these shapes (a transpose on non-square tiles)
            continue
        if all(_close(g, x, MATCH) for g, x in zip(got, variant)) and not all(
                _close(x, e, FLOAT32) for x, e in zip(variant, expected)):
            raise CheckFailure(f"Likely mistake ({case}): {reason}.", mistake=knob)
    wrong_names = [name for name, g, e in zip(("dQ", "dK", "dV"), got, expected) if not _near(g, e)]
    hint = {("dV",): "dV alone differs: look at step 2, dV_j = Pᵀ dO_i, and at P.",
            ("dQ",): "dQ alone differs: look at dQ_i = dS K_j · scale.",
            ("dK",): "dK alone differs: look at dK_j = dSᵀ Q_i · scale.",
            ("dQ", "dK"): "dV is right, so P is: look at dP = dO_i V_jᵀ, dS = P ∘ (dP − D_i), "
                          "then dQ_i = dS K_j · scale and dK_j = dSᵀ Q_i · scale."}.get(
        tuple(wrong_names), "Compute one tile by hand on a tiny input and compare each step with the "
                            "listing: P, dV, dP, dS, then dQ and dK.")
    factors = []  # a gradient that is autograd's times a constant: say by how much
    for name, g, e in zip(("dQ", "dK", "dV"), got, expected):
        c = ((g * e).sum() / (e * e).sum()).item() if (e * e).sum() > 0 else 0.0
        if name in wrong_names and c != 0.0 and _close(g, c * e, MATCH):
            factors.append(f"{name} is {c:.4g} times autograd's")
    if factors:
        hint = ("Observed: " + ", ".join(factors) + ". A constant factor: look at the scale and the "
                "signs in that gradient's formula.")
    largest = max((g - e).abs().max().item() for g, e in zip(got, expected))
    raise CheckFailure(f"Not yet ({case}): the tiles added up give {', '.join(wrong_names)} different "
                       f"from autograd's (largest difference {largest:.3g}), and none of the usual "
                       f"mistakes explains it. {hint}")


# ----------------------------------------------------------------------------------------------
# check_io_ratio (predict)
# ----------------------------------------------------------------------------------------------

IO_L, IO_D, IO_BLOCK = 16 * 1024, 64, 256


def io_ratio_answer() -> float:
    """Standard attention's bytes of slow memory over FlashAttention-2's, forward, at 16k."""
    return (flash.attention_io_bytes(IO_L, IO_D, "standard")
            / flash.attention_io_bytes(IO_L, IO_D, "flash", block=IO_BLOCK))


def _io_miscounts() -> list[tuple[float, str, str]]:
    """``(value, what gives it, what the question counts)`` of the usual miscounts, in numbers."""
    L, d, B = IO_L, IO_D, IO_BLOCK
    tiles = L // B

    def standard(d: int = d) -> int:
        return 4 * L * d + 4 * L * L

    def tiled(d: int = d, B: int = B) -> int:
        return 2 * L * d + L + 2 * (L // B) * L * d

    right = standard() / tiled()
    kv = f"each of the {tiles} query tiles reads all of K and V again"
    four = "standard attention writes S and reads it back, then writes P and reads it back"
    block = f"FlashAttention-2's tiles hold {B} queries: {tiles} query tiles"
    head = f"head_dim is {d}"
    sram = 192 * 1024
    theorem = ("Theorem 2's Θ(N d + N²) over Θ(N² d² / M), with M = {}", "Θ drops the constants: "
               f"count the transfers, with tiles of {B} queries")
    bytes_ = 4 * standard() - 4 * tiled()
    return [
        (1 / right, "FlashAttention-2's count over standard attention's (the ratio upside down)",
         "the question asks standard / FlashAttention-2, more than 1"),
        (standard() / (4 * L * d + L), "FlashAttention-2 reading K and V once", kv),
        (standard() / (2 * L * d + tiles * L * d + L),
         "FlashAttention-2 reading only K (or only V) once per query tile", kv),
        (standard() / (2 * L * d + L + 3 * tiles * L * d), "three L x d matrices moved per query tile "
         "(Q read again with K and V, or O read and written per key tile as in FlashAttention-1)",
         "FlashAttention-2 reads each query tile once and writes its output once; only K and V are "
         "read again per query tile"),
        ((4 * L * d + 3 * L * L) / tiled(), "standard attention with three L x L transfers", four),
        ((4 * L * d + 2 * L * L) / tiled(), "standard attention with two L x L transfers (S alone, "
         "P forgotten, or S and P written but not read back)", four),
        ((4 * L * d + L * L) / tiled(), "standard attention with one L x L transfer (S written once)",
         four),
        ((3 * L * d + 2 * L * L) / (L * d + 2 * tiles * L * d), "the reads alone",
         "count the reads and the writes"),
        (standard() / (2 * L * d + L + 2 * L * L * d), "FlashAttention-2 reading K and V once per "
         "query (no tiles)", kv),
        (standard() / (2 * L * d + L), "FlashAttention-2 without K and V (Q, O and the log-sum-exp "
         "alone)", kv),
        ((2 * L * L + L * d) / (L * d + L), "the writes alone", "count the reads and the writes"),
        *[(standard() / tiled(B=other), f"tiles of {other} queries", block)
          for other in (32, 64, 128, 512)],
        *[(standard(other) / tiled(other), f"head_dim {other}", head) for other in (32, 128)],
        (4 * right, "standard attention in bytes over FlashAttention-2 in numbers (4 bytes a float32)",
         "count both in the same unit"),
        (right / 4, "standard attention in numbers over FlashAttention-2 in bytes (4 bytes a float32)",
         "count both in the same unit"),
        *[((L * d + L * L) / (L * L * d * d / M), theorem[0].format(what), theorem[1])
          for M, what in ((sram / 4, "192 KB of float32 numbers"), (sram, "192 KB counted in bytes"),
                          (sram / 2, "192 KB of 2-byte numbers"),
                          (4 * d * B, f"4 d B = {4 * d * B} (B ≈ M / (4d))"),
                          (B * d, f"one tile's {B * d} numbers"),
                          (108 * sram / 4, "the 108 SMs' SRAM in float32 numbers"))],
        (1 - 1 / right, "the fraction of the bytes FlashAttention-2 saves", "divide, do not subtract"),
        (100 * (1 - 1 / right), "the percentage of the bytes FlashAttention-2 saves",
         "divide, do not subtract"),
        (right - 1, "(standard − FlashAttention-2) / FlashAttention-2, the extra over FlashAttention-2",
         "the question asks standard / FlashAttention-2"),
        (100 * right, "the ratio in percent", "return the ratio itself"),
        (bytes_, "the bytes FlashAttention-2 saves, a difference", "divide the two counts"),
        (bytes_ / 4, "the numbers FlashAttention-2 saves, a difference", "divide the two counts"),
        (4 * standard(), "standard attention's bytes", "divide by FlashAttention-2's"),
        (standard(), "standard attention's numbers", "divide by FlashAttention-2's"),
        (4 * tiled(), "FlashAttention-2's bytes", "divide standard attention's by them"),
        (tiled(), "FlashAttention-2's numbers", "divide standard attention's by them"),
    ]


IO_RECIPE = ("Count the numbers each pass reads and writes: standard attention (read Q, K, write S; "
             "read S, write P; read P, V, write O), FlashAttention-2 (read Q once, K and V once per "
             "query tile, write O and the log-sum-exp), then divide.")


@checker
def check_io_ratio(fn: Callable[[], Any]) -> None:
    """Check ``fn() -> number``: standard attention's bytes over FlashAttention-2's, at 16k."""
    if not callable(fn):
        raise CheckFailure(f"Hand in your function itself (without parentheses), got {type(fn).__name__}.")
    try:
        with time_limit(TIME_LIMIT, "Your prediction ran for more than a minute and was stopped."):
            raw = fn()
    except (NotImplementedError, CheckFailure):
        raise
    except Exception as err:
        raise CheckFailure(f"Your code raised {type(err).__name__}: {err}. Return one number.") from err
    if isinstance(raw, torch.Tensor) and raw.numel() == 1:
        raw = raw.item()
    if isinstance(raw, bool) or not isinstance(raw, numbers.Real) or not math.isfinite(float(raw)):
        raise CheckFailure(f"Return one number (a ratio, such as 3.5), got {type(raw).__name__} {raw!r}.")
    got, right = float(raw), io_ratio_answer()
    if abs(got - right) <= 0.05 * right:
        print(f"check_io_ratio: right, about {right:.1f}x: standard attention moves 4 L^2 numbers "
              f"(S and P, each written and read), FlashAttention-2 about 2 L^2 d / {IO_BLOCK} (K and V "
              f"read again for each of the {IO_L // IO_BLOCK} query tiles).")
        return
    matches = sorted((abs(got - value) / value, what, fix) for value, what, fix in _io_miscounts()
                     if abs(got - value) <= 0.05 * value)  # the closest first
    off = (f" ({right / got:.2g}x too small)" if got < right else f" ({got / right:.2g}x too large)"
           ) if 0 < got < 1e4 else ""
    if len(matches) == 1:
        _, what, fix = matches[0]
        raise CheckFailure(f"Not quite: {got:.4g}{off} matches {what}; {fix}.", mistake=what)
    if matches:  # several counts give this value: say which, blame none of them
        fixes = list(dict.fromkeys(fix for _, _, fix in matches))
        raise CheckFailure(f"Not quite: {got:.4g}{off} is what any of these gives: "
                           + "; ".join(what for _, what, _ in matches)
                           + ". Check each against the question: " + "; ".join(fixes) + ".")
    if got <= 0:
        raise CheckFailure(f"Not quite: {got:.4g}, while a ratio of two counts of bytes is positive. "
                           + IO_RECIPE)
    if got > 1e4:
        raise CheckFailure(f"Not quite: {got:.4g} looks like a count of bytes or numbers, not a ratio. "
                           + IO_RECIPE)
    raise CheckFailure("Not quite: " + ("too small" if got < right else "too large") + ". " + IO_RECIPE)
