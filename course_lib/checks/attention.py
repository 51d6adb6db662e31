"""Checkers for the exercises of lesson 01 (scaled dot-product attention and masks).

* ``check_scaled_dot_product_attention(fn)``: ``fn(query, key, value, mask=None) -> (output, weights)``
  with query ``(..., L_q, d_k)``, key ``(..., L_k, d_k)``, value ``(..., L_k, d_v)`` and a boolean mask
  (True = may attend) broadcastable to ``(..., L_q, L_k)``.
* ``check_attention_mask(fn)``: ``fn(ids (B, L), pad_id) -> bool (B, 1, L)``, the padding mask that
  hides pad KEYS (True = may attend), like ``course_lib.masks.padding_mask``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..attention import scaled_dot_product_attention
from ..masks import causal_mask, padding_mask
from ._common import (
    CheckFailure, Mistake, broadcasts_to, checker, compare, expect_bool_mask, expect_finite, expect_shape, passed,
    run_learner,
)

__all__ = ["check_scaled_dot_product_attention", "check_attention_mask"]


# ----------------------------------------------------------------------------------------------
# check_scaled_dot_product_attention
# ----------------------------------------------------------------------------------------------

def _variant(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float | None = None,
    softmax_dim: int = -1,
    use_mask: bool = True,
    invert_mask: bool = False,
    fill: str = "safe",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with one thing changed, to reproduce a learner's likely mistake.

    ``scale``: what the scores are divided by (default sqrt(d_k)); ``fill``: "safe" (course_lib:
    finite minimum, then zero the hidden weights), "-inf" (NaN on fully masked rows) or
    "no_zeroing" (finite minimum only: a fully masked row becomes uniform).
    """
    scale = math.sqrt(q.size(-1)) if scale is None else scale
    scores = q @ k.transpose(-2, -1) / scale
    if mask is not None and use_mask:
        keep = ~mask if invert_mask else mask
        if fill == "-inf":
            scores = scores.masked_fill(~keep, float("-inf"))
        else:
            scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
        weights = scores.softmax(dim=softmax_dim)
        if fill == "safe":
            weights = weights.masked_fill(~keep, 0.0)
    else:
        weights = scores.softmax(dim=softmax_dim)
    return weights @ v, weights


def _sdpa_mistakes() -> list[Mistake]:
    def scaled_by(what: str, fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], float], hint: str) -> Mistake:
        return Mistake(
            f"scores divided by {what} instead of sqrt(d_k)",
            hint,
            lambda q, k, v, m: _variant(q, k, v, m, scale=fn(q, k, v)),
        )

    fix_scale = "Divide by math.sqrt(d_k) where d_k = query.size(-1), the length of the vectors in each dot product."
    return [
        Mistake(
            "missing scale: the scores are not divided by sqrt(d_k)",
            "Divide the scores by math.sqrt(query.size(-1)) before the softmax; without it large d_k "
            "saturates the softmax.",
            lambda q, k, v, m: _variant(q, k, v, m, scale=1.0),
        ),
        scaled_by("d_k (no square root)", lambda q, k, v: float(q.size(-1)),
                  "The variance of q.k is d_k, so its standard deviation is sqrt(d_k): take the square root."),
        scaled_by("sqrt(L_k), the number of keys,", lambda q, k, v: math.sqrt(k.size(-2)),
                  f"You used the sequence axis (-2) instead of the feature axis (-1). {fix_scale}"),
        scaled_by("sqrt(L_q), the number of queries,", lambda q, k, v: math.sqrt(q.size(-2)),
                  f"You used the sequence axis (-2) instead of the feature axis (-1). {fix_scale}"),
        scaled_by("sqrt(d_v), the value size,", lambda q, k, v: math.sqrt(v.size(-1)),
                  f"d_v only sets the output width; the dot products are over d_k. {fix_scale}"),
        Mistake(
            "softmax over the wrong axis (the query axis, dim=-2)",
            "Each query's weights over the keys must sum to 1: use softmax(dim=-1), the key axis. A fixed "
            "dim=1 or dim=2 points at a different axis for 3-D and 4-D inputs.",
            lambda q, k, v, m: _variant(q, k, v, m, softmax_dim=-2),
        ),
        Mistake(
            "mask ignored: hidden keys still get attention",
            "Before the softmax, fill the scores where mask is False with a very negative number: "
            "scores.masked_fill(~mask, torch.finfo(scores.dtype).min).",
            lambda q, k, v, m: _variant(q, k, v, m, use_mask=False),
        ),
        Mistake(
            "mask inverted: you hid the allowed keys and kept the hidden ones",
            "In course_lib True = may attend, so hide where the mask is False: masked_fill(~mask, ...) "
            "(or masked_fill(mask == 0, ...)), not masked_fill(mask, ...).",
            lambda q, k, v, m: _variant(q, k, v, m, invert_mask=True),
        ),
        Mistake(
            "mask inverted: you hid the allowed keys and kept the hidden ones",
            "In course_lib True = may attend, so hide where the mask is False: masked_fill(~mask, ...) "
            "(or masked_fill(mask == 0, ...)), not masked_fill(mask, ...).",
            lambda q, k, v, m: _variant(q, k, v, m, invert_mask=True, fill="-inf"),
        ),
        Mistake(
            "fully masked row not zeroed: a query that may attend to no key got uniform weights",
            "With a finite fill value the softmax of an all-hidden row is uniform (1/L_k each). After the "
            "softmax, set the hidden weights to 0: weights.masked_fill(~mask, 0.0).",
            lambda q, k, v, m: _variant(q, k, v, m, fill="no_zeroing"),
        ),
    ]


_NAN_FIX = (
    "A query whose keys are ALL masked gets softmax([-inf, ..., -inf]) = 0/0 = NaN, and the NaN then "
    "spreads to the loss and every gradient. Fill with a finite minimum, "
    "scores.masked_fill(~mask, torch.finfo(scores.dtype).min), and after the softmax zero the hidden "
    "weights: weights.masked_fill(~mask, 0.0). Such a row then gets zero weights and a zero output."
)

_RAISED_FIX = (
    "Check the shapes step by step: scores = query @ key.transpose(-2, -1) is (..., L_q, L_k) (did you "
    "forget to transpose key, or use transpose(1, 2), which is wrong for 4-D inputs?); use @ "
    "(torch.matmul), not torch.bmm, so inputs with a head axis work; apply the mask as given, it already "
    "broadcasts to the scores (no unsqueeze)."
)


def _sdpa_cases() -> list[tuple[str, tuple[torch.Tensor, ...], torch.Tensor | None]]:
    g = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    cases = []
    # 1. 3-D, L_q != L_k, d_v != d_k; every size differs so each wrong scale is recognisable.
    B, L_q, L_k, d_k, d_v = 2, 3, 5, 16, 7
    cases.append(("3-D inputs, L_q=3, L_k=5, d_k=16, d_v=7, no mask",
                  (randn(B, L_q, d_k), randn(B, L_k, d_k), randn(B, L_k, d_v)), None))
    # 2. 4-D (batch, heads, L, d).
    B, h, L_q, L_k, d_k, d_v = 2, 3, 4, 6, 8, 5
    cases.append(("4-D inputs (B, heads, L, d), no mask",
                  (randn(B, h, L_q, d_k), randn(B, h, L_k, d_k), randn(B, h, L_k, d_v)), None))
    # 3. Padding mask (B, 1, L_k): every sequence has at least one pad and one real token.
    ids = torch.tensor([[5, 8, 3, 0, 0, 0], [7, 2, 9, 4, 6, 0]])
    cases.append(("3-D inputs with a padding mask (B, 1, L_k)",
                  (randn(2, 4, 8), randn(2, 6, 8), randn(2, 6, 5)), padding_mask(ids, 0)))
    # 4. Causal mask (L, L) on 4-D inputs.
    cases.append(("4-D inputs with a causal mask (L, L)",
                  (randn(2, 2, 5, 8), randn(2, 2, 5, 8), randn(2, 2, 5, 8)), causal_mask(5)))
    # 5. A fully masked row: query 1 of batch 0 may attend to no key.
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    mask[0, 1] = False
    mask[1, :, 3] = False
    cases.append(("a fully masked row (query 1 of batch 0 may attend to no key)",
                  (randn(2, 3, 8), randn(2, 4, 8), randn(2, 4, 6)), mask))
    return cases


@checker
def check_scaled_dot_product_attention(fn: Callable[..., Any]) -> None:
    """Check ``fn(query, key, value, mask=None) -> (output, weights)`` against course_lib's."""
    cases = _sdpa_cases()
    mistakes = _sdpa_mistakes()
    for case, (q, k, v), mask in cases:
        got = run_learner(fn, q.clone(), k.clone(), v.clone(), mask=None if mask is None else mask.clone(),
                          case=case, hint=_RAISED_FIX)
        if isinstance(got, torch.Tensor) or not isinstance(got, (tuple, list)) or len(got) != 2:
            what = f"a tensor of shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else type(got).__name__
            raise CheckFailure(
                f"Return (output, weights), a tuple of two tensors; your function returned {what}. "
                "End with `return weights @ value, weights`."
            )
        out, weights = got
        exp_out, exp_weights = scaled_dot_product_attention(q, k, v, mask)
        shape_fix = (
            "output = weights @ value is (..., L_q, d_v) and weights (..., L_q, L_k): did you forget to "
            "transpose key (query @ key.transpose(-2, -1)), swap the order of a product, or transpose the result?"
        )
        expect_shape(out, exp_out.shape, "output", shape_fix)
        expect_shape(weights, exp_weights.shape, "weights", shape_fix)
        if mask is not None and not bool(mask.any(-1).all()):
            expect_finite(out, f"The output ({case})", _NAN_FIX)
            expect_finite(weights, f"The weights ({case})", _NAN_FIX)
        compare((out, weights), (exp_out, exp_weights), (q, k, v, mask), mistakes, case)
    passed("check_scaled_dot_product_attention", len(cases))


# ----------------------------------------------------------------------------------------------
# check_attention_mask
# ----------------------------------------------------------------------------------------------

def _full(mask: torch.Tensor, B: int, L: int) -> torch.Tensor:
    """A mask broadcast to the scores of self-attention, (B, L_q, L_k) = (B, L, L)."""
    return mask.expand(B, L, L)


def _mask_mistakes() -> list[Mistake]:
    def variant(build: Callable[[torch.Tensor, int], torch.Tensor]) -> Callable[[torch.Tensor, int], torch.Tensor]:
        return lambda ids, pad: _full(build(ids, pad), *ids.shape)

    return [
        Mistake(
            "mask inverted: True on the pads",
            "In course_lib True = may attend, so the mask is True for REAL tokens: ids != pad_id, not "
            "ids == pad_id (nn.MultiheadAttention's key_padding_mask uses the opposite convention; ours is "
            "F.scaled_dot_product_attention's).",
            variant(lambda ids, pad: ~padding_mask(ids, pad)),
        ),
        Mistake(
            "padding on the query axis instead of the keys: (B, L, 1)",
            "Padding hides KEYS, the last axis of the scores (B, L_q, L_k): (ids != pad_id).unsqueeze(1) is "
            "(B, 1, L) and hides the pad columns for every query; unsqueeze(2) or unsqueeze(-1) gives "
            "(B, L, 1), which hides the pad query rows and lets every real query attend to the pads.",
            variant(lambda ids, pad: (ids != pad).unsqueeze(2)),
        ),
        Mistake(
            "padding on both axes: the pad queries become fully masked rows",
            "Only the keys need hiding: return (ids != pad_id).unsqueeze(1), (B, 1, L). Hiding the pad query "
            "rows as well leaves them no key at all (a fully masked row: NaN with -inf, section 8), and their "
            "outputs are never used anyway.",
            variant(lambda ids, pad: (ids != pad).unsqueeze(2) & padding_mask(ids, pad)),
        ),
        Mistake(
            "pad_id ignored (0 is hard-coded)",
            "Compare with the pad_id argument, ids != pad_id: tokenizers use other pad ids than 0 (MiniLM's "
            "[PAD] happens to be 0, but 0 can be a real token elsewhere).",
            variant(lambda ids, pad: padding_mask(ids, 0)),
        ),
        Mistake(
            "causal part included: this exercise is the padding mask alone",
            "Return only the padding part, (ids != pad_id).unsqueeze(1). The causal mask is a separate (L, L) "
            "mask; lesson 05 combines the two into the decoder's mask.",
            variant(lambda ids, pad: padding_mask(ids, pad) & causal_mask(ids.size(1))),
        ),
    ]


def _mask_cases() -> list[tuple[str, torch.Tensor, int]]:
    return [
        ("ids (B=3, L=5) with pad_id=0, right padding",
         torch.tensor([[4, 7, 2, 0, 0], [9, 3, 5, 8, 6], [6, 1, 0, 0, 0]]), 0),
        ("ids (B=2, L=5) with pad_id=0, left padding",
         torch.tensor([[0, 0, 2, 6, 1], [0, 5, 8, 3, 9]]), 0),
        ("ids (B=2, L=4) without padding", torch.tensor([[11, 12, 13, 14], [21, 22, 23, 24]]), 0),
        ("ids (B=2, L=6) with pad_id=3 (0 is a real token here)",
         torch.tensor([[5, 0, 8, 2, 3, 3], [0, 7, 0, 3, 3, 3]]), 3),
        ("ids (B=1, L=4) with pad_id=0, one sequence", torch.tensor([[7, 5, 9, 0]]), 0),
    ]


_MASK_RAISED_FIX = "ids is a (B, L) tensor of token ids: return (ids != pad_id).unsqueeze(1), a (B, 1, L) bool tensor."


@checker
def check_attention_mask(fn: Callable[..., Any]) -> None:
    """Check ``fn(ids (B, L), pad_id) -> bool (B, 1, L)``: True where the KEY is a real token.

    A full ``(B, L, L)`` mask that hides the same pad keys for every query is accepted too. The mask is
    compared with ``course_lib.masks.padding_mask`` after broadcasting to ``(B, L, L)``, and attention
    run with it must equal attention run with course_lib's mask.
    """
    cases = _mask_cases()
    mistakes = _mask_mistakes()
    g = torch.Generator().manual_seed(0)
    for case, ids, pad in cases:
        B, L = ids.shape
        got = run_learner(fn, ids.clone(), pad, case=case, hint=_MASK_RAISED_FIX)
        expect_bool_mask(got, case, "Build it from a comparison, ids != pad_id, which is already bool "
                                    "(or convert 0/1 with .bool()).")
        if got.dim() == 2 and tuple(got.shape) == (B, L):
            raise CheckFailure(
                f"Wrong shape ({case}): {tuple(got.shape)} is (B, L), one flag per token, and does not broadcast "
                "against the scores (B, L_q, L_k) as you mean: its B axis lines up with L_q (an error, or every "
                "sentence silently gets another sentence's mask). Add a query axis of size 1 with "
                f".unsqueeze(1): (B, 1, L) = {(B, 1, L)}."
            )
        if not broadcasts_to(got, (B, L, L)):
            expect_shape(got, (B, 1, L), "the mask",
                         "Return (ids != pad_id).unsqueeze(1): one row per sequence, broadcast over every query "
                         "(B, L_q, L_k); no head axis, the attention layer adds it.")
        compare(_full(got, B, L), _full(padding_mask(ids, pad), B, L), (ids, pad), mistakes, case)

        # Its effect: attention with the learner's mask equals attention with course_lib's.
        x = torch.randn(B, L, 8, generator=g)
        out, weights = scaled_dot_product_attention(x, x, x, got)
        exp_out, exp_weights = scaled_dot_product_attention(x, x, x, padding_mask(ids, pad))
        if not (torch.allclose(out, exp_out, atol=1e-6) and torch.allclose(weights, exp_weights, atol=1e-6)):
            raise CheckFailure(
                f"Attention with your mask differs from attention with course_lib's padding mask ({case}). "
                "Every query must give zero weight to the pad keys and share its weight among the real ones."
            )
    passed("check_attention_mask", len(cases))
