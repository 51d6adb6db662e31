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

* ``check_io_ratio(fn)``: ``fn() -> (standard_bytes, flash_bytes)``, a "predict, then run" question:
  at L = 16,384, head_dim 64, float32, tiles of 256 queries, the bytes standard attention's forward
  reads and writes in slow memory (the FlashAttention paper's Algorithm 0) and FlashAttention-2's.
  Each count is right within 5% (a count rounded to its largest terms). A unit mistake on both counts
  (numbers, bits, float64, float16, GiB), the two swapped and the ratio handed in are named first;
  then each count is compared with its usual miscounts (S and P not read back, K and V read once,
  tiles of 128, 192 or 512, head_dim, Q read per tile, ...) and the ones it matches (at most three,
  the closest first) are named, or the number of L x L transfers (of K and V reads) it holds.
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
from .common import CheckFailure, calls_to, checker, course_lib_used, one_thread, plain, time_limit
from .lesson13_named_g import backward_matmul_said

__all__ = ["check_flash_backward_tile", "check_io_ratio", "io_bytes_answer", "io_ratio_answer"]

TIME_LIMIT = 60.0
TOL = 1e-9
_CAUSAL_ONLY = ("no causal mask", "mask S with 0", "mask on dV's P only", "mask on dS only",
                "mask bottom-right in the tile",
                "mask in tile coordinates", "mask ignores i0", "mask ignores j0", "mask offset reversed",
                "diagonal hidden", "mask one key late", "mask transposed")
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
        corner = k_j.size(0) - q_i.size(0)  # the tile's own bottom-right alignment
        hidden = {"diagonal hidden": cols >= rows, "mask one key late": cols > rows + 1,
                  "mask bottom-right in the tile": cols > rows + corner,
                  "mask transposed": cols < rows}.get(knob, cols > rows)
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
          "dV scaled": lambda: p.T @ d_out_i * scale,
          "dV = P^T V": lambda: p.T @ v_j}.get(knob, lambda: p_dv.T @ d_out_i)()
    root = 1 / math.sqrt(q_i.size(-1))
    q_scale = {"scale divided": 1 / scale, "no scale in dQ dK": 1.0, "no scale in dQ": 1.0,
               "scale twice": scale ** 2, "scale twice in dQ": scale ** 2,
               "1/sqrt(d) everywhere": root, "1/sqrt(d) in dQ dK": root}.get(knob, scale)
    k_scale = {"scale divided": 1 / scale, "no scale in dQ dK": 1.0, "no scale in dK": 1.0,
               "scale twice": scale ** 2, "scale twice in dK": scale ** 2,
               "1/sqrt(d) everywhere": root, "1/sqrt(d) in dQ dK": root}.get(knob, scale)
    dq = {"dQ = dS^T K": lambda: ds.T @ k_j, "dQ from P": lambda: p @ k_j,
          "dQ from Q": lambda: ds @ q_i, "dQ = dS V": lambda: ds @ v_j}.get(
        knob, lambda: ds @ k_j)() * q_scale
    dk = {"dK = dS Q": lambda: ds @ q_i, "dK from P": lambda: p.T @ q_i,
          "dK from K": lambda: ds.T @ k_j}.get(knob, lambda: ds.T @ q_i)() * k_scale
    grads = (dq, dk, dv)
    if knob in _ORDERS:
        grads = tuple(grads[n] for n in _ORDERS[knob][0])
    return grads


MISTAKES = [  # (knob, what is observed and what it means)
    ("mask transposed", "the tiles add up to the gradients of attention whose causal mask is "
                        "transposed: each query sees the keys at or after its own position and not "
                        "the earlier ones, as if keys were masked as queries (column < row hidden); "
                        "query i sees keys 0..i, so the hidden scores are those with key > query"),
    ("dQ = dS V", "dK and dV are right, and dQ is what dS V_j · scale gives, V_j in place of K_j: "
                  "S = Q_i K_jᵀ · scale, so dQ_i = dS K_j · scale (V enters only through dP = dO_i V_jᵀ)"),
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
    ("dV = P^T V", "dQ and dK are right, and dV is what Pᵀ V_j gives, V_j in place of dO_i: O = P V, "
                   "so the gradient that flows back to V is dV = Pᵀ dO (dO_i, the incoming gradient)"),
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
    ("dK from K", "dQ and dV are right, and dK is what dSᵀ K_j · scale gives, K where Q belongs: "
                  "S = Q Kᵀ · scale, so dK = dSᵀ Q_i · scale (as dQ = dS K_j · scale)"),
    ("dQ from Q", "dK and dV are right, and dQ is what dS Q_i · scale gives, Q where K belongs: "
                  "S = Q Kᵀ · scale, so dQ = dS K_j · scale (as dK = dSᵀ Q_i · scale)"),
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
    ("mask bottom-right in the tile", "the gradients are what a causal mask aligned to each tile's "
                                      "bottom-right corner gives (key j0 + column visible when "
                                      "column <= row + Bk − Bq, from the tile's own sizes): this "
                                      "exercise's is_causal is SDPA's, aligned top-left, query i sees "
                                      "keys 0..i whatever the tile's shape"),
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
                           f"j0={kwargs['j0']}): {err}.{backward_matmul_said(fn)} {SIGNATURE_HINT} Check "
                           "which products need a transpose.") from err


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
# check_io_ratio (predict): the two counts, standard attention's bytes and FlashAttention-2's
# ----------------------------------------------------------------------------------------------

IO_L, IO_D, IO_BLOCK = 16 * 1024, 64, 256
IO_TILES = IO_L // IO_BLOCK  # 64 query tiles
IO_TOL = 0.05  # a count rounded to its largest terms is right (4 L², 2 L² d / 256: 0.4%, 1.6% off)


def io_bytes_answer() -> tuple[int, int]:
    """``(standard_bytes, flash_bytes)``: one head's forward pass at 16k, float32, tiles of 256."""
    return (flash.attention_io_bytes(IO_L, IO_D, "standard"),
            flash.attention_io_bytes(IO_L, IO_D, "flash", block=IO_BLOCK))


def io_ratio_answer() -> float:
    """Standard attention's bytes of slow memory over FlashAttention-2's, forward, at 16k."""
    standard, tiled = io_bytes_answer()
    return standard / tiled


# (factor on both counts, what it is): a unit mistake shows on both counts alike
IO_UNITS = [
    (1 / 4, "both counts are in numbers, not bytes: a float32 number takes 4 bytes"),
    (8, "both counts are in bits, 8 times the bytes"),
    (32, "both counts are in bits of numbers (32 a float32), not bytes"),
    (2, "both counts take 8 bytes a number (float64): the question's numbers are float32, 4 bytes"),
    (1 / 2, "both counts take 2 bytes a number (float16 or bfloat16): the question's numbers are "
            "float32, 4 bytes"),
    (1 / 2**30, "both counts are in GiB (2^30 bytes): return bytes"),
    (1 / 1e9, "both counts are in GB (10^9 bytes): return bytes"),
    (1 / 2**20, "both counts are in MiB (2^20 bytes): return bytes"),
    (1 / 1e6, "both counts are in MB (10^6 bytes): return bytes"),
]


IO_MATCH = 0.03  # a miscount is matched to 3%: two of them 3% apart or more are told apart
STANDARD_RULE = ("the rules above give four L x L transfers: S written, S read back, P written, P read "
                 "back")
FLASH_RULE = (f"FlashAttention-2 reads Q once, all of K and V (2 L d numbers) once per query tile "
              f"({IO_L} / {IO_BLOCK} = {IO_TILES} tiles), and writes O and the log-sum-exp once")
UNIT_RULE = "a float32 number takes 4 bytes"


THETA_STANDARD = ("Θ(L d + L²) taken as a count, in bytes: one L x d and one L x L transfer; Θ drops "
                  "the constants, count the transfers (Q, K, V read and O written: 4 L d; S and P "
                  "each written and read back: 4 L²)")


def _standard_miscounts() -> list[tuple[float, str, str]]:
    """``(bytes, what gives them, the rule)``: the usual miscounts of standard attention's bytes."""
    L, d = IO_L, IO_D
    Ld, L2 = L * d, L * L
    right = 4 * (4 * Ld + 4 * L2)
    return [
        (4 * (4 * Ld + 2 * L2), "two L x L transfers counted: each of S and P once (written but "
         "not read back, or read but never written), or P left out altogether", STANDARD_RULE),
        (4 * (4 * Ld + 3 * L2), "three L x L transfers counted: one of S and P written but not "
         "read back", STANDARD_RULE),
        (4 * (4 * Ld + L2), "one L x L transfer counted (S written once)", STANDARD_RULE),
        (4 * (4 * Ld + 5 * L2), "five L x L transfers counted", STANDARD_RULE),
        (4 * (4 * Ld + 6 * L2), "six L x L transfers counted (S, P or a read of P counted twice)",
         STANDARD_RULE),
        (4 * 4 * Ld, "S and P left out (Q, K, V and O alone)", STANDARD_RULE),
        (4 * (4 * Ld + 4 * L2 * d), f"each score counted as head_dim = {d} numbers (L x L x d per "
         "transfer): a score is one number, a dot product", STANDARD_RULE),
        (right / 4, "numbers, not bytes", UNIT_RULE),
        (4 * (Ld + L2), THETA_STANDARD, ""),
        (right * 8, "bits, not bytes", UNIT_RULE),
        (right * 2, "8 bytes a number (float64)", UNIT_RULE),
        (right * 12, "12 heads: the question counts one head", ""),
        (right * IO_TILES, f"the whole count once per query tile ({IO_TILES}): standard attention "
         "has no tiles", STANDARD_RULE),
    ]


def _flash_miscounts() -> list[tuple[float, str, str]]:
    """``(bytes, what gives them, the rule)``: the usual miscounts of FlashAttention-2's bytes."""
    L, d, T, B = IO_L, IO_D, IO_TILES, IO_BLOCK
    Ld = L * d

    def tiled(tiles: float, d: int = d) -> float:
        return 4 * (2 * L * d + 2 * tiles * L * d + L)

    sram = 192 * 1024
    theorem = "Theorem 2's bound L² d² / M with M = {}: Θ drops the constants, count the transfers"
    return [
        (tiled(1), "K and V read once in all, not once per query tile", FLASH_RULE),
        (4 * (2 * Ld + L), "K and V left out (Q, O and the log-sum-exp alone)", FLASH_RULE),
        (4 * (2 * Ld + T * Ld + L), "K and V counted as L d numbers together per query tile, not "
         "2 L d (one of them left out)", FLASH_RULE),
        (4 * (3 * Ld + T * Ld + L), "one of two readings, both giving this number: either only one of "
         "K and V read once per query tile, the other once in all; or the loops swapped, Q read "
         f"once per key tile ({T} tiles) while K and V are read once in all", FLASH_RULE),
        (tiled(T // 2), f"tiles of {2 * B} queries ({T // 2} tiles)", FLASH_RULE),
        (tiled(T, d // 2), f"head_dim {d // 2}, not {d}", ""),
        (tiled(2 * T), f"tiles of {B // 2} queries ({2 * T} tiles)", FLASH_RULE),
        (tiled(T, 2 * d), f"head_dim {2 * d}, not {d}", ""),
        (tiled(T) * 2, "8 bytes a number (float64)", UNIT_RULE),
        (tiled(math.ceil(L / 192)), f"tiles of 192 queries (M / (4d) with M = 192 KB of float32; "
         f"about {math.ceil(L / 192)} tiles), not the question's {B}", FLASH_RULE),
        (tiled(4 * T), f"tiles of {B // 4} queries ({4 * T} tiles, as many as L / head_dim)",
         FLASH_RULE),
        (tiled(8 * T), f"tiles of {B // 8} queries ({8 * T} tiles)", FLASH_RULE),
        (tiled(L), "K and V read once per query (no tiles)", FLASH_RULE),
        (4 * (3 * T * Ld + Ld + L), "Q read again with K and V for each query tile",
         FLASH_RULE),
        (4 * (2 * Ld + T * (3 * Ld + 4 * L)), "O and the softmax's statistics read and written "
         "once per key tile (FlashAttention-1's loop)", FLASH_RULE),
        (tiled(T) + 4 * 4 * L * L, "S and P written and read back, as in standard attention: "
         "FlashAttention keeps each tile of them in fast memory", FLASH_RULE),
        (tiled(T) + 4 * L * L, "S written once: FlashAttention keeps each tile of S in fast memory",
         FLASH_RULE),
        (tiled(T) + 2 * 4 * L * L, "S and P written once each: FlashAttention keeps each tile of "
         "them in fast memory", FLASH_RULE),
        (4 * (3 * Ld + 2 * B * d + B), f"one query tile's transfers, not all {T} tiles'",
         FLASH_RULE),
        (tiled(T) / 4, "numbers, not bytes", UNIT_RULE),
        (tiled(T) * 8, "bits, not bytes", UNIT_RULE),
        *[(scale * L * L * d * d / M, theorem.format(what), "")
          for scale, M, what in ((4, sram / 4, "192 KB of float32 numbers"),
                                 (1, sram / 4, "192 KB of float32 numbers, in numbers"),
                                 (4, sram, "192 KB counted in bytes"),
                                 (4, 4 * d * B, f"4 d B = {4 * d * B}"))],
    ]


def _io_close(got: float, value: float, tol: float = IO_TOL) -> bool:
    return abs(got - value) <= tol * abs(value)


def _times(got: float, right: float) -> str:
    """How far a count is from the right one, as the learner reads it: "2x the right count"."""
    factor = got / right
    return (f"{factor:.3g}x the right count" if factor >= 1 else
            f"1/{1 / factor:.3g} of the right count")


def _bytes(value: float) -> str:
    return f"{value:,.0f} bytes" if abs(value) >= 1000 else f"{value:.4g} bytes"


def _judge_count(got: float, right: float, name: str, miscounts: list[tuple[float, str, str]],
                 whole: list[tuple[float, str, str]], fallback: str) -> tuple[str, list[str]]:
    """One count's verdict: ``("", [])`` if right, else (a sentence, the miscounts it matches).

    ``miscounts`` are the usual ones; ``whole`` the count with a whole number of the large
    transfers, tried when no usual one matches to 1%."""
    if _io_close(got, right):
        return "", []
    found = sorted((abs(got - value) / value, what, rule) for value, what, rule in miscounts
                   if _io_close(got, value, IO_MATCH))  # the closest first
    if not found or found[0][0] > 0.01:
        found = sorted(found + [(abs(got - value) / value, what, rule) for value, what, rule in whole
                                if _io_close(got, value, IO_MATCH)])
    found = [f for f in found if f[0] <= found[0][0] + 0.01]  # a much closer one outranks the rest
    observed = f"your {name} count, {_bytes(got)}, is {_times(got, right)}"
    if not found:
        return observed + fallback, []
    rules = list(dict.fromkeys(rule for _, _, rule in found if rule))
    what = [w for _, w, _ in found]
    shown = what if len(what) <= 3 else what[:3] + [f"{len(what) - 3} other miscount(s)"]
    return (f"{observed}: it matches {'; or '.join(shown)}"
            + (f" ({'; '.join(rules)})" if rules else ""), what if len(what) <= 3 else [])


def _flash_times(got: float) -> list[tuple[float, str, str]]:
    """The count that reads K and V a whole number of times other than 64, nearest to ``got``."""
    L, d = IO_L, IO_D
    times = round((got / 4 - 2 * L * d - L) / (2 * L * d))
    if times < 2 or times == IO_TILES:
        return []
    return [(4 * (2 * L * d + 2 * times * L * d + L), f"K and V read {times} times ({times} query "
             f"tiles)", FLASH_RULE)]


def _standard_times(got: float) -> list[tuple[float, str, str]]:
    """The count with a whole number of L x L transfers other than 4, nearest to ``got``."""
    L, d = IO_L, IO_D
    transfers = round((got / 4 - 4 * L * d) / (L * L))
    if transfers < 1 or transfers == 4:
        return []
    return [(4 * (4 * L * d + transfers * L * L), f"{transfers} L x L transfers counted",
             STANDARD_RULE)]


FLASH_FALLBACK = f". {FLASH_RULE}; {UNIT_RULE}"
STANDARD_FALLBACK = f". Read Q and K, write S; read S, write P; read P and V, write O; {UNIT_RULE}"


def _io_numbers(raw: Any) -> tuple[float, float]:
    """The two counts as floats, or a CheckFailure saying what the answer is instead."""
    raw = plain(raw, "your prediction")  # exact built-ins: a subclass's methods never run
    if isinstance(raw, torch.Tensor) and raw.numel() == 2:
        raw = tuple(raw.flatten().tolist())
    if isinstance(raw, torch.Tensor) and raw.numel() == 1:
        raw = raw.item()
    if isinstance(raw, numbers.Real) and not isinstance(raw, bool) and math.isfinite(float(raw)):
        got = float(raw)
        standard, tiled = io_bytes_answer()
        if any(_io_close(got, value) for value in (io_ratio_answer(), 8.0)):
            raise CheckFailure(f"Observed: one number, {got:.4g}, the ratio of the two counts. Return "
                               "the two counts themselves, (standard_bytes, flash_bytes): the cell "
                               "after the checker divides them.", mistake="the ratio, not the counts")
        if _io_close(got, 1 / io_ratio_answer()):
            raise CheckFailure(f"Observed: one number, {got:.4g}, FlashAttention-2's count over "
                               "standard attention's. Return the two counts themselves, "
                               "(standard_bytes, flash_bytes).", mistake="the ratio, not the counts")
        which = ("standard attention's count" if _io_close(got, standard) else
                 "FlashAttention-2's count" if _io_close(got, tiled) else "")
        raise CheckFailure(f"Observed: one number, {got:.4g}{' (' + which + ')' if which else ''}. "
                           "Return a tuple of two numbers, (standard_bytes, flash_bytes): standard "
                           "attention's bytes first, FlashAttention-2's second.",
                           mistake="one count" if which else None)
    if not isinstance(raw, (tuple, list)) or len(raw) != 2:
        size = f" of {len(raw)}" if isinstance(raw, (tuple, list)) else ""
        raise CheckFailure(f"Return a tuple of two numbers, (standard_bytes, flash_bytes); got "
                           f"{type(raw).__name__}{size} {repr(raw)[:80]}.")
    got = []
    for value, name in zip(raw, ("standard attention's", "FlashAttention-2's")):
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(
                float(value)):
            raise CheckFailure(f"Return two numbers, (standard_bytes, flash_bytes); {name} count is "
                               f"{type(value).__name__} {repr(value)[:80]}.")
        got.append(float(value))
    return got[0], got[1]


@checker
def check_io_ratio(fn: Callable[[], Any]) -> None:
    """Check ``fn() -> (standard_bytes, flash_bytes)``: one head's forward pass at 16k, each to 5%."""
    if not callable(fn):
        raise CheckFailure(f"Hand in your function itself (without parentheses), got {type(fn).__name__}.")
    try:
        with time_limit(TIME_LIMIT, "Your prediction ran for more than a minute and was stopped."), \
                calls_to([flash.attention_io_bytes]) as called:
            raw = fn()
    except (NotImplementedError, CheckFailure):
        raise
    except Exception as err:
        raise CheckFailure(f"Your code raised {type(err).__name__}: {err}. Return two numbers, "
                           "(standard_bytes, flash_bytes).") from err
    if called:
        raise CheckFailure("Your function calls course_lib's attention_io_bytes, the count this "
                           "exercise asks you to make: count the transfers by the rules above.")
    got_s, got_f = _io_numbers(raw)
    standard, tiled = io_bytes_answer()
    if _io_close(got_s, standard) and _io_close(got_f, tiled):
        print(f"check_io_ratio: right: about {standard / 2**30:.2f} GiB for standard attention (4 L² "
              f"numbers: S and P, each written and read back) and {tiled / 2**30:.2f} GiB for "
              f"FlashAttention-2 (about 2 L² d / {IO_BLOCK}: K and V read again for each of the "
              f"{IO_TILES} query tiles).")
        return
    if _io_close(got_s, tiled) and _io_close(got_f, standard):
        raise CheckFailure(f"Observed: the two counts are swapped: {got_s:,.4g} bytes first, "
                           f"{got_f:,.4g} second. Return (standard_bytes, flash_bytes), standard "
                           "attention's first.", mistake="swapped")
    for factor, what in IO_UNITS:
        if _io_close(got_s, factor * standard) and _io_close(got_f, factor * tiled):
            raise CheckFailure(f"Observed: both counts are {_times(got_s, standard)} "
                               f"({got_s:,.4g} and {got_f:,.4g}): {what}.", mistake=what)
    if min(got_s, got_f) <= 0:
        raise CheckFailure(f"Observed: a count of {min(got_s, got_f):.4g} bytes: a count of bytes "
                           "moved is positive. Return (standard_bytes, flash_bytes).")
    say_s, names_s = _judge_count(got_s, standard, "standard-attention",
                                  _standard_miscounts(), _standard_times(got_s), STANDARD_FALLBACK)
    say_f, names_f = _judge_count(got_f, tiled, "FlashAttention-2",
                                  _flash_miscounts(), _flash_times(got_f), FLASH_FALLBACK)
    if {"numbers, not bytes", THETA_STANDARD} <= set(names_s) and names_f and not any(
            n == "numbers, not bytes" or "in numbers:" in n for n in names_f):  # flash's is in bytes
        say_s, names_s = _judge_count(got_s, standard, "standard-attention", [
            c for c in _standard_miscounts() if c[1] != "numbers, not bytes"], [], STANDARD_FALLBACK)
    parts = [p for p in (say_s, say_f) if p]
    right = ("; standard attention's count is right" if not say_s else
             "; FlashAttention-2's count is right" if not say_f else "")
    names = names_s + names_f
    raise CheckFailure("Observed: " + ". And ".join(parts) + right + ".",
                       mistake=names[0] if len(names) == 1 else None)
