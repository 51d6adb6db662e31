"""Checkers for the exercises of lesson 01 (scaled dot-product attention and masks).

* ``check_scaled_dot_product_attention(fn)``: ``fn(query, key, value, mask=None) -> (output, weights)``
  with query ``(..., L_q, d_k)``, key ``(..., L_k, d_k)``, value ``(..., L_k, d_v)`` and a boolean mask
  (True = may attend) broadcastable to ``(..., L_q, L_k)``.
* ``check_attention_mask(fn)``: ``fn(ids (B, L), pad_id) -> bool (B, L, L)``, the decoder's
  self-attention mask (padding AND causal).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..attention import scaled_dot_product_attention
from ..masks import causal_mask, decoder_self_attention_mask, padding_mask
from ._common import CheckFailure, Mistake, checker, compare, expect_finite, expect_shape, passed, run_learner

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

def _mask_mistakes() -> list[Mistake]:
    def tri(ids: torch.Tensor, diagonal: int, upper: bool) -> torch.Tensor:
        ones = torch.ones(ids.size(1), ids.size(1), dtype=torch.bool)
        return ones.triu(diagonal) if upper else ones.tril(diagonal)

    return [
        Mistake(
            "mask inverted: True where a key is hidden",
            "In course_lib True = may attend: True for real, past-or-present keys and False for pads and "
            "future keys (nn.MultiheadAttention uses the opposite convention; ours is F.scaled_dot_product_attention's).",
            lambda ids, pad: ~decoder_self_attention_mask(ids, pad),
        ),
        Mistake(
            "upper triangle instead of lower: every query sees the future",
            "Query t may attend to keys 0..t, which is the LOWER triangle: torch.tril, not torch.triu.",
            lambda ids, pad: padding_mask(ids, pad) & tri(ids, 0, upper=True),
        ),
        Mistake(
            "upper triangle instead of lower: every query sees the future",
            "Query t may attend to keys 0..t, which is the LOWER triangle: torch.tril, not torch.triu.",
            lambda ids, pad: padding_mask(ids, pad) & tri(ids, 1, upper=True),
        ),
        Mistake(
            "diagonal excluded: a token cannot see itself",
            "Query t may attend to keys 0..t INCLUDING t: use torch.tril(...) with the default diagonal=0 "
            "(with diagonal=-1 the first token sees nothing at all).",
            lambda ids, pad: padding_mask(ids, pad) & tri(ids, -1, upper=False),
        ),
        Mistake(
            "padding applied to the queries instead of the keys (wrong axis)",
            "Padding hides KEYS, the last axis: (ids != pad_id).unsqueeze(1) is (B, 1, L) and broadcasts over "
            "every query row; unsqueeze(2) or unsqueeze(-1) gives (B, L, 1), which hides query rows instead.",
            lambda ids, pad: (ids != pad).unsqueeze(2) & tri(ids, 0, upper=False),
        ),
        Mistake(
            "padding applied to both queries and keys",
            "Only the keys need hiding: (ids != pad_id).unsqueeze(1) -> (B, 1, L). Hiding the pad query rows "
            "as well makes them fully masked, and their outputs are never used anyway.",
            lambda ids, pad: (ids != pad).unsqueeze(2) & decoder_self_attention_mask(ids, pad),
        ),
        Mistake(
            "pad_id ignored (0 is hard-coded)",
            "Compare with the pad_id argument, ids != pad_id; tokenizers use other pad ids than 0.",
            lambda ids, pad: decoder_self_attention_mask(ids, 0),
        ),
        Mistake(
            "padding missing: pad keys are visible",
            "Combine the causal mask with the padding mask: (ids != pad_id).unsqueeze(1) & causal.",
            lambda ids, pad: causal_mask(ids.size(1)).expand(ids.size(0), -1, -1),
        ),
        Mistake(
            "causal part missing: every query sees the future",
            "Combine the padding mask with the causal mask torch.tril(torch.ones(L, L, dtype=torch.bool)).",
            lambda ids, pad: padding_mask(ids, pad).expand(-1, ids.size(1), -1),
        ),
    ]


def _mask_cases() -> list[tuple[str, torch.Tensor, int]]:
    return [
        ("ids (B=3, L=5) with pad_id=0, the last row padded on the left",
         torch.tensor([[4, 7, 2, 0, 0], [9, 3, 5, 8, 6], [0, 0, 2, 6, 1]]), 0),
        ("ids (B=2, L=6) with pad_id=3 (0 is a real token here)",
         torch.tensor([[5, 0, 8, 2, 3, 3], [0, 7, 3, 3, 3, 3]]), 3),
        ("ids (B=1, L=4) without padding", torch.tensor([[11, 12, 13, 14]]), 0),
    ]


@checker
def check_attention_mask(fn: Callable[..., Any]) -> None:
    """Check ``fn(ids (B, L), pad_id) -> bool (B, L, L)``: padding AND causal, True = may attend."""
    cases = _mask_cases()
    mistakes = _mask_mistakes()
    for case, ids, pad in cases:
        B, L = ids.shape
        got = run_learner(fn, ids.clone(), pad, case=case,
                          hint="A padding mask (B, L) must become (B, 1, L) with .unsqueeze(1) before it can be "
                          "combined (&) with the causal (L, L) mask.")
        if not isinstance(got, torch.Tensor):
            raise CheckFailure(f"Return a torch.Tensor of dtype torch.bool, got {type(got).__name__}.")
        if got.dtype != torch.bool:
            raise CheckFailure(
                f"Wrong dtype ({case}): the mask has dtype {got.dtype}, expected torch.bool, where True = may "
                "attend and False = hidden. Build it from comparisons (ids != pad_id) and "
                "torch.ones(L, L, dtype=torch.bool).tril(), combined with &; or convert 0/1 with .bool()."
            )
        if tuple(got.shape) == (B, L):
            raise CheckFailure(
                f"Wrong shape ({case}): {tuple(got.shape)} is (B, L), one flag per token. Against scores "
                "(B, L_q, L_k) it does not broadcast as you mean: the mask needs a query axis and a key axis. "
                f"Return (B, L, L) = {(B, L, L)}: (ids != pad_id).unsqueeze(1) & causal."
            )
        expect_shape(got, (B, L, L), "the mask",
                     "It must be (B, L_q, L_k): padding (B, 1, L) & causal (L, L) broadcasts to that.")
        compare(got, decoder_self_attention_mask(ids, pad), (ids, pad), mistakes, case)
    passed("check_attention_mask", len(cases))

