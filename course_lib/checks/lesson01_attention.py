"""Checkers for the exercises of lesson 01 (scaled dot-product attention and masks).

* ``check_scaled_dot_product_attention(fn)``: ``fn(query, key, value, mask=None) -> (output, weights)``
  with query ``(..., L_q, d_k)``, key ``(..., L_k, d_k)``, value ``(..., L_k, d_v)`` and a boolean mask
  (True = may attend) broadcastable to ``(..., L_q, L_k)``.
* ``check_attention_mask(fn)``: ``fn(ids (B, L), pad_id) -> bool (B, 1, L)``, the padding mask that
  hides pad KEYS (True = may attend), like ``course_lib.masks.padding_mask``.
* ``check_top_key_prediction(fn, query, key, tokens, query_token)`` (predict): ``fn()`` returns the
  token (or its position) whose key gets the largest score from ``query_token``'s query.
* ``check_nan_rows_prediction(fn, ids, pad_id)`` (predict): ``fn()`` returns the ``(sentence,
  position)`` pairs whose output rows are NaN when ``-inf`` hides padding on both axes.
* ``check_fixed_attention(fn)`` (debug): attention that no longer adds an axis to the mask inside
  the function, so masks of every rank that broadcast to ``(..., L_q, L_k)`` work.

The Build and Debug checkers watch the calls while the learner's code runs: handing in course_lib's
own function, or a function that calls it, is reported as such instead of passing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..attention import scaled_dot_product_attention
from ..masks import causal_mask, decoder_self_attention_mask, padding_mask
from .common import (
    CheckFailure, Mistake, broadcasts_to, checker, compare, expect_bool_mask, expect_finite, expect_shape, passed,
    calls_to, plain, run_learner,
)

__all__ = [
    "check_scaled_dot_product_attention", "check_attention_mask",
    "check_top_key_prediction", "check_nan_rows_prediction", "check_fixed_attention",
]


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
    multiply: bool = False,
    scale_after_softmax: bool = False,
    invert_zeroing: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with one thing changed, to reproduce a learner's likely mistake.

    ``scale``: what the scores are divided by (default sqrt(d_k)); ``fill``: "safe" (course_lib:
    finite minimum, then zero the hidden weights), "-inf" (NaN on fully masked rows) or
    "no_zeroing" (finite minimum only: a fully masked row becomes uniform), "zero" (hidden scores
    set to 0, then the weights zeroed), "zero_only" (hidden scores set to 0, nothing else) or
    "after_softmax" (the scores are not masked; the weights are zeroed after the softmax).
    ``multiply``: the scores are multiplied by ``scale`` instead of divided; ``scale_after_softmax``:
    the weights, not the scores, are divided; ``invert_zeroing``: the hidden scores are filled
    correctly but the zeroing after the softmax uses the mask the wrong way round.
    """
    scale = math.sqrt(q.size(-1)) if scale is None else scale
    scores = q @ k.transpose(-2, -1)
    if not scale_after_softmax:
        scores = scores * scale if multiply else scores / scale
    if mask is not None and use_mask:
        keep = ~mask if invert_mask else mask
        if fill == "-inf":
            scores = scores.masked_fill(~keep, float("-inf"))
        elif fill in ("zero", "zero_only"):
            scores = scores.masked_fill(~keep, 0.0)
        elif fill != "after_softmax":
            scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
        weights = scores.softmax(dim=softmax_dim)
        if fill in ("safe", "zero", "after_softmax"):
            weights = weights.masked_fill(keep if invert_zeroing else ~keep, 0.0)
    else:
        weights = scores.softmax(dim=softmax_dim)
    if scale_after_softmax:
        weights = weights / scale
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
        scaled_by("a fixed 4 = sqrt(16) (a global d_k or d_model of the lesson?)",
                  lambda q, k, v: 4.0,
                  "d_k must come from the inputs, d_k = query.size(-1), not from a variable of the "
                  "notebook (d_model = d_k = 16 there): the checker calls your function with other "
                  "sizes, and so do lessons 02 and 04."),
        Mistake(
            "scores multiplied by sqrt(d_k) instead of divided",
            "The paper's scale is 1/sqrt(d_k): scores = query @ key.transpose(-2, -1) / math.sqrt(d_k).",
            lambda q, k, v, m: _variant(q, k, v, m, multiply=True),
        ),
        Mistake(
            "the weights are divided by sqrt(d_k) after the softmax, instead of the scores before it",
            "Scale the scores, then take the softmax: softmax(Q K^T / sqrt(d_k)). Dividing the weights "
            "afterwards leaves the softmax saturated and makes each row sum to 1/sqrt(d_k), not 1.",
            lambda q, k, v, m: _variant(q, k, v, m, scale_after_softmax=True),
        ),
        Mistake(
            "softmax over the batch axis (dim=0)",
            "Each query's weights over the keys must sum to 1: use softmax(dim=-1), the key axis. dim=0 "
            "mixes different sequences of the batch.",
            lambda q, k, v, m: _variant(q, k, v, m, softmax_dim=0),
        ),
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
        Mistake(
            "mask applied after the softmax: the hidden weights are zeroed, but the softmax still "
            "shared the weight among all keys",
            "Hide the scores BEFORE the softmax, scores.masked_fill(~mask, torch.finfo(scores.dtype).min), "
            "so the visible keys share all the weight and each row sums to 1; zeroing afterwards alone "
            "leaves rows that sum to less than 1.",
            lambda q, k, v, m: _variant(q, k, v, m, fill="after_softmax"),
        ),
        Mistake(
            "hidden scores set to 0 instead of a very negative number (masked_fill(~mask, 0) or "
            "scores * mask)",
            "A score of 0 is an ordinary score: e^0 = 1, so the hidden keys still get weight. Fill with "
            "torch.finfo(scores.dtype).min, whose exponential is 0.",
            lambda q, k, v, m: _variant(q, k, v, m, fill="zero_only"),
        ),
        Mistake(
            "hidden scores set to 0 instead of a very negative number, then the hidden weights zeroed: "
            "the rows no longer sum to 1",
            "A score of 0 still takes its share e^0 in the softmax's denominator. Fill the scores with "
            "torch.finfo(scores.dtype).min before the softmax, then zero the hidden weights.",
            lambda q, k, v, m: _variant(q, k, v, m, fill="zero"),
        ),
        Mistake(
            "mask inverted in the zeroing after the softmax: the visible keys' weights are set to 0",
            "The scores are hidden right, but weights.masked_fill(mask, 0.0) zeroes the keys that MAY be "
            "attended to. Zero where the mask is False: weights.masked_fill(~mask, 0.0).",
            lambda q, k, v, m: _variant(q, k, v, m, invert_zeroing=True),
        ),
    ]


def _fitted_scale(q: torch.Tensor, k: torch.Tensor, weights: Any) -> float | None:
    """The constant c such that ``weights == softmax(q @ k^T / c)``, if there is one (no mask)."""
    if not isinstance(weights, torch.Tensor) or weights.shape != (q @ k.transpose(-2, -1)).shape:
        return None
    w = weights.detach().double()
    if not bool((w > 1e-12).all()):
        return None
    scores = (q @ k.transpose(-2, -1)).double()
    ds = scores - scores.mean(-1, keepdim=True)
    dl = w.log() - w.log().mean(-1, keepdim=True)  # = ds / c if the weights are a scaled softmax
    c = float((ds * ds).sum() / (ds * dl).sum())
    if not math.isfinite(c) or c <= 0:
        return None
    out_w = (scores / c).softmax(-1)
    return c if torch.allclose(out_w, w, atol=1e-5, rtol=1e-4) else None


def _run_watching(fn: Callable[..., Any], references: tuple[Callable[..., Any], ...], *args: Any,
                  **kwargs: Any) -> tuple[Any, Callable[..., Any] | None]:
    """``run_learner(fn, *args, **kwargs)``, and which of course_lib's ``references`` ran meanwhile.

    ``calls_to`` sees every route: the function itself, a wrapper, an alias,
    ``course_lib.attention.scaled_dot_product_attention`` or a module that calls it.
    """
    with calls_to(references) as seen:
        result = run_learner(fn, *args, **kwargs)
    # plain tensors, in a plain tuple or list: a subclass's own allclose or __eq__ never judges them
    return plain(result, "the output"), (seen[0] if seen else None)


def _own_function(fn: Callable[..., Any], used: Callable[..., Any], task: str) -> CheckFailure:
    """The message for a learner who hands in (or only calls) course_lib's reference ``used``."""
    name = getattr(fn, "__name__", "your function")
    what = (f"This is course_lib's own `{used.__name__}`" if fn is used
            else f"`{name}` calls course_lib's own `{used.__name__}`")
    return CheckFailure(f"{what}, the reference your code is compared with, so this checks nothing of "
                        f"yours. {task}")


_NAN_FIX = (
    "A query whose keys are ALL masked gets 0/0 = NaN (the softmax of a row of -inf, or a row of zero "
    "weights divided by its sum), and the NaN then "
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
    # 6. 2-D: one sequence without a batch axis, (L, d), with a causal mask.
    cases.append(("2-D inputs (L, d): one sequence without a batch axis, causal mask (L, L)",
                  (randn(5, 8), randn(5, 8), randn(5, 3)), causal_mask(5)))
    return cases


@checker
def check_scaled_dot_product_attention(fn: Callable[..., Any]) -> None:
    """Check ``fn(query, key, value, mask=None) -> (output, weights)`` against course_lib's."""
    cases = _sdpa_cases()
    mistakes = _sdpa_mistakes()
    for case, (q, k, v), mask in cases:
        got, used = _run_watching(fn, (scaled_dot_product_attention,), q.clone(), k.clone(), v.clone(),
                                  mask=None if mask is None else mask.clone(), case=case, hint=_RAISED_FIX)
        if used is not None:
            raise _own_function(fn, used, "Write the attention yourself from torch operations "
                                "(lesson 01, sections 2 to 7): scores, scale, mask, softmax, weighted sum.")
        if isinstance(got, torch.Tensor) or not isinstance(got, (tuple, list)) or len(got) != 2:
            what = f"a tensor of shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else type(got).__name__
            raise CheckFailure(
                f"Return (output, weights), a tuple of two tensors; your function returned {what}. "
                "End with `return weights @ value, weights`."
            )
        out, weights = got
        exp_out, exp_weights = scaled_dot_product_attention(q, k, v, mask)
        if (isinstance(out, torch.Tensor) and isinstance(weights, torch.Tensor)
                and out.shape == exp_weights.shape and weights.shape == exp_out.shape
                and exp_out.shape != exp_weights.shape):
            raise CheckFailure(f"Outputs swapped ({case}): the first tensor has the shape of the weights "
                               f"{tuple(exp_weights.shape)} and the second that of the output "
                               f"{tuple(exp_out.shape)}. Return (output, weights), in that order.")
        for t, exp in ((out, exp_out), (weights, exp_weights)):
            if mask is not None and isinstance(t, torch.Tensor) and t.dim() > exp.dim():
                raise CheckFailure(_extra_axis_message(case, t, exp.shape, tuple(exp_weights.shape),
                                                       mask))
        shape_fix = (
            "output = weights @ value is (..., L_q, d_v) and weights (..., L_q, L_k): did you forget to "
            "transpose key (query @ key.transpose(-2, -1)), swap the order of a product, or transpose the result?"
        )
        expect_shape(out, exp_out.shape, "output", shape_fix)
        expect_shape(weights, exp_weights.shape, "weights", shape_fix)
        if mask is not None and not bool(mask.any(-1).all()):
            expect_finite(out, f"The output ({case})", _NAN_FIX)
            expect_finite(weights, f"The weights ({case})", _NAN_FIX)
        try:
            compare((out, weights), (exp_out, exp_weights), (q, k, v, mask), mistakes, case)
        except CheckFailure as failure:
            c = _fitted_scale(q, k, weights) if mask is None else None
            if c is None or "None of the usual mistakes" not in str(failure):
                raise
            raise CheckFailure(
                f"Likely mistake ({case}): the scores are divided by {c:.4g}, not by sqrt(d_k) = "
                f"sqrt({q.size(-1)}) = {math.sqrt(q.size(-1)):.4g} (the weights are exactly "
                f"softmax(q.k / {c:.4g})). Take d_k from the inputs, d_k = query.size(-1), and divide "
                "by math.sqrt(d_k).") from None
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
            "padding on the query axis instead of the keys: the pad rows are hidden, not the pad "
            "columns",
            "Padding hides KEYS, the last axis of the scores (B, L_q, L_k): (ids != pad_id).unsqueeze(1) is "
            "(B, 1, L) and hides the pad columns for every query; unsqueeze(2) or unsqueeze(-1) gives "
            "(B, L, 1), which hides the pad query rows and lets every real query attend to the pads.",
            variant(lambda ids, pad: (ids != pad).unsqueeze(2)),
        ),
        Mistake(
            "padding on both axes: the pad queries become fully masked rows",
            "Only the keys need hiding: return (ids != pad_id).unsqueeze(1), (B, 1, L). Hiding the pad query "
            "rows as well leaves them no key at all (a fully masked row: NaN with -inf, section 7), and their "
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
            "mask built from the lengths (arange(L) < number of real tokens): it assumes the pads are at "
            "the end",
            "Tokenizers also pad on the left, and a pad id can sit anywhere: compare every id with the "
            "pad id instead, ids != pad_id, then .unsqueeze(1).",
            variant(lambda ids, pad: (torch.arange(ids.size(1)) < (ids != pad).sum(-1, keepdim=True))
                    .unsqueeze(1)),
        ),
        Mistake(
            "padding and causal combined with | (or): a key is then hidden only if it is both a pad and "
            "in the future",
            "This exercise is the padding mask alone: return (ids != pad_id).unsqueeze(1). (When you "
            "combine masks later, a key may be attended only if BOTH allow it: &, not |.)",
            variant(lambda ids, pad: padding_mask(ids, pad) | causal_mask(ids.size(1))),
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
        got, used = _run_watching(fn, (padding_mask, decoder_self_attention_mask), ids.clone(), pad,
                                  case=case, hint=_MASK_RAISED_FIX)
        if used is not None:
            raise _own_function(fn, used, "Build the mask with plain torch: a comparison of the ids "
                                "with the pad id, and one axis added.")
        expect_bool_mask(got, case, "Build it from a comparison, ids != pad_id, which is already bool "
                                    "(or convert 0/1 with .bool()).")
        if got.dim() == 2 and tuple(got.shape) == (B, L):
            raise CheckFailure(
                f"Wrong shape ({case}): {tuple(got.shape)} is (B, L), one flag per token, and does not broadcast "
                "against the scores (B, L_q, L_k) as you mean: its B axis lines up with L_q (an error, or every "
                "sentence silently gets another sentence's mask). Add a query axis of size 1 with "
                f".unsqueeze(1): (B, 1, L) = {(B, 1, L)}."
            )
        if tuple(got.shape) == (1, B, L) and B > 1:
            raise CheckFailure(
                f"Wrong shape ({case}): {tuple(got.shape)} has the new axis in front (unsqueeze(0)), so the "
                "batch axis now lines up with the queries L_q. Add the axis in the middle, .unsqueeze(1): "
                f"(B, 1, L) = {(B, 1, L)}.")
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


# ----------------------------------------------------------------------------------------------
# check_top_key_prediction (predict, then run)
# ----------------------------------------------------------------------------------------------

def _token_positions(answer: Any, tokens: list[str], what: str) -> tuple[list[int], str]:
    """The positions a predicted token (a string) or position (an int) stands for, and how to name it."""
    if isinstance(answer, torch.Tensor) and answer.numel() == 1 and not answer.is_floating_point():
        answer = int(answer.item())
    if isinstance(answer, bool) or not isinstance(answer, (str, int)):
        raise CheckFailure(f"Return one token as a string (e.g. \"cat\") or its position as an int "
                           f"(e.g. 2); {what} returned {answer!r}.")
    if isinstance(answer, int):
        if not 0 <= answer < len(tokens):
            raise CheckFailure(f"Position {answer} is outside the sentence: positions run from 0 to "
                               f"{len(tokens) - 1} ({tokens}).")
        return [answer], f"position {answer} ({tokens[answer]!r})"
    word = answer.strip()
    positions = [p for p, t in enumerate(tokens) if t == word]
    positions = positions or [p for p, t in enumerate(tokens) if t.lower() == word.lower()]
    if not positions:
        raise CheckFailure(f"{answer!r} is not a token of the sentence; the tokens are {tokens}.")
    return positions, repr(tokens[positions[0]])


@checker
def check_top_key_prediction(
    fn: Callable[[], Any], query: torch.Tensor, key: torch.Tensor, tokens: list[str], query_token: str
) -> None:
    """Predict: which key gets the largest raw score ``q . k`` from the query of ``query_token``?

    ``query``, ``key``: ``(L, d)``; ``tokens``: the ``L`` token strings. ``fn()`` returns a token
    (string) or a position (int). The truth is computed here, from the scores themselves.
    """
    tokens = list(tokens)
    if query_token not in tokens:
        raise ValueError(f"check_top_key_prediction: {query_token!r} is not among the tokens {tokens}")
    # the learner's answer first: the truth is not yet in this frame for their code to read (#49)
    answer = plain(run_learner(fn, case="your prediction",
                               hint="predicted_top_key() takes no argument and returns a token, e.g. \"cat\"."))
    i = tokens.index(query_token)
    scores = (query[i] @ key.transpose(-2, -1)).detach().float()  # (L,): one score per key
    best = int(scores.argmax())
    positions, said = _token_positions(answer, tokens, fn.__name__ if hasattr(fn, "__name__") else "it")
    runner = max((p for p in range(len(tokens)) if tokens[p] != tokens[best]), key=lambda p: scores[p])
    own = torch.equal(query, key) and best == i
    why_own = (
        f"With Q = K = x, the query of {query_token!r} meets its own vector as a key: q . k = |x|^2, a "
        f"sum of d = {query.size(-1)} squares (about d, and always positive), while an unrelated random "
        f"key gives a sum of d products with mean 0 (standard deviation about sqrt(d) = "
        f"{math.sqrt(query.size(-1)):.0f})."
    )
    if best in positions:
        print(f"check_top_key_prediction: right, {tokens[best]!r} (score {scores[best]:.1f}; next best "
              f"{tokens[runner]!r}, {scores[runner]:.1f}). " + (why_own if own else ""))
        return
    got = positions[0]
    message = (f"Not {said}: its score is {scores[got]:.1f}, while {tokens[best]!r} gets "
               f"{scores[best]:.1f}, the largest of the row. ")
    if own:
        message += why_own + (" Random embeddings know nothing about meaning: which word "
                              f"{query_token!r} refers to is learned in training (section 12).")
    raise CheckFailure(message.strip())


# ----------------------------------------------------------------------------------------------
# check_nan_rows_prediction (predict, then run)
# ----------------------------------------------------------------------------------------------

def _nan_rows(ids: torch.Tensor, pad_id: int) -> set[tuple[int, int]]:
    """Rows whose output is NaN when ``-inf`` hides padding on BOTH axes (computed, not assumed)."""
    real = ids != pad_id  # (B, L)
    mask = real.unsqueeze(2) & real.unsqueeze(1)  # (B, L, L): pad queries AND pad keys hidden
    x = torch.randn(*ids.shape, 8, generator=torch.Generator().manual_seed(0))
    scores = (x @ x.transpose(-2, -1) / math.sqrt(8)).masked_fill(~mask, float("-inf"))
    out = scores.softmax(dim=-1) @ x  # (B, L, 8)
    return {(b, t) for b, t in out.isnan().any(dim=-1).nonzero().tolist()}


def _as_pairs(answer: Any, shape: tuple[int, int]) -> set[tuple[int, int]]:
    fix = ("Return a list of (sentence, position) pairs, e.g. [(0, 3), (1, 11)], or [] if you expect "
           "no NaN row")
    if isinstance(answer, torch.Tensor):
        if answer.dtype == torch.bool and tuple(answer.shape) == shape:
            return {(b, t) for b, t in answer.nonzero().tolist()}
        raise CheckFailure(f"{fix} (or a bool tensor of shape {shape}); got a {answer.dtype} tensor of "
                           f"shape {tuple(answer.shape)}.")
    try:
        pairs = {(int(b), int(t)) for b, t in answer}
    except (TypeError, ValueError):
        raise CheckFailure(f"{fix}; got {answer!r}. Each pair names a sentence (0 or 1) and a query "
                           "position in it.") from None
    outside = sorted(p for p in pairs if not (0 <= p[0] < shape[0] and 0 <= p[1] < shape[1]))
    if outside:
        from_one = ("" if any(b == 0 or t == 0 for b, t in pairs) else
                    " Python counts from 0: the first sentence is 0 and its first token is position 0.")
        raise CheckFailure(f"{outside} lie outside the batch: sentences 0..{shape[0] - 1}, positions "
                           f"0..{shape[1] - 1}.{from_one}")
    return pairs


def _pairs_text(pairs: set[tuple[int, int]]) -> str:
    return ", ".join(str(p) for p in sorted(pairs)) or "none"


@checker
def check_nan_rows_prediction(fn: Callable[[], Any], ids: torch.Tensor, pad_id: int) -> None:
    """Predict: which output rows are NaN when ``-inf`` hides padding on the query AND the key axis?

    ``ids``: the token ids ``(B, L)`` of the padded batch. ``fn()`` returns ``(sentence, position)``
    pairs (or a bool ``(B, L)`` tensor). The truth is computed here by running the ``-inf`` recipe.
    """
    # the learner's answer first: the truth is not yet in this frame for their code to read (#49)
    answer = plain(run_learner(fn, case="your prediction",
                               hint="predicted_nan_rows() takes no argument and returns a list of pairs."))
    truth = _nan_rows(ids, pad_id)
    got = _as_pairs(answer, tuple(ids.shape))
    why = ("with padding hidden on the query axis too, a pad query's whole row of the mask is False, "
           "every one of its scores is -inf, and softmax(-inf, ..., -inf) = 0 / 0 = NaN")
    if got == truth:
        print(f"check_nan_rows_prediction: right, {len(truth)} rows: {_pairs_text(truth)}. These are "
              f"the pad queries: {why}. Every other row sees a real key and stays finite.")
        return
    parts = [f"The NaN rows are {_pairs_text(truth)}; you predicted {_pairs_text(got)}."]
    if not got:
        parts.append(f"-inf is harmless only while a row keeps one visible key: {why}.")
    missing, extra = truth - got, got - truth
    if got and missing:
        parts.append(f"You missed {_pairs_text(missing)}: pad queries as well; {why}.")
    if extra:
        unpadded = sorted({b for b, _ in extra} - {b for b, _ in truth})
        parts.append(
            f"Rows {_pairs_text(extra)} see at least one real key, so their softmax is finite. A NaN "
            "does not spread from row to row in the forward pass: each output row is computed from its "
            "own row of weights (it does spread backwards, through the gradients: next cell)."
        )
        if unpadded:
            parts.append(f"Sentence(s) {unpadded} have no padding, so no row of theirs is hidden.")
    raise CheckFailure(" ".join(parts))


# ----------------------------------------------------------------------------------------------
# check_fixed_attention (debug: the mask that gains an axis inside the function)
# ----------------------------------------------------------------------------------------------

_FIXED_RAISED_FIX = (
    "Does the mask still gain an axis inside the function (mask.unsqueeze(1))? A mask that already "
    "broadcasts to the scores (..., L_q, L_k) must be used as it comes: masked_fill(~mask, ...)."
)


def _fixed_cases() -> list[tuple[str, tuple[torch.Tensor, ...], torch.Tensor | None]]:
    g = torch.Generator().manual_seed(1)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    ids = torch.tensor([[5, 8, 3, 9, 0, 0], [7, 2, 9, 4, 6, 1]])
    pad = padding_mask(ids, 0)  # (B, 1, L)
    decoder = pad & causal_mask(6)  # (B, L, L)
    empty = torch.ones(2, 4, 6, dtype=torch.bool)
    empty[0, 2] = False  # query 2 of sentence 0 may attend to no key
    return [
        ("3-D inputs (B, L, d) with a decoder mask (B, L, L)",
         (randn(2, 6, 8), randn(2, 6, 8), randn(2, 6, 8)), decoder),
        ("3-D inputs with a padding mask (B, 1, L_k), L_q=4, L_k=6",
         (randn(2, 4, 8), randn(2, 6, 8), randn(2, 6, 5)), pad),
        ("3-D inputs with a causal mask (L, L)",
         (randn(2, 6, 8), randn(2, 6, 8), randn(2, 6, 8)), causal_mask(6)),
        ("4-D inputs (B, heads, L, d) with a mask (B, 1, L, L), as MultiHeadAttention passes it",
         (randn(2, 3, 6, 8), randn(2, 3, 6, 8), randn(2, 3, 6, 8)), decoder.unsqueeze(1)),
        ("4-D inputs with a padding mask (B, 1, 1, L_k)",
         (randn(2, 3, 4, 8), randn(2, 3, 6, 8), randn(2, 3, 6, 5)), pad.unsqueeze(1)),
        ("4-D inputs, no mask", (randn(2, 3, 4, 8), randn(2, 3, 6, 8), randn(2, 3, 6, 5)), None),
        ("3-D inputs with a fully masked row (B, L_q, L_k)",
         (randn(2, 4, 8), randn(2, 6, 8), randn(2, 6, 5)), empty),
    ]


def _extra_axis_message(case: str, got: torch.Tensor, expected: torch.Size,
                        scores_shape: tuple[int, ...], mask: torch.Tensor | None) -> str:
    message = (f"Wrong output shape ({case}): {tuple(got.shape)}, expected {tuple(expected)}: one axis "
               "too many, and no error. ")
    if mask is not None:
        grown = tuple(mask.unsqueeze(1).shape)
        try:
            wide = tuple(torch.broadcast_shapes(grown, scores_shape))
        except RuntimeError:
            wide = None
        if wide is not None and tuple(got.shape[:-1]) == wide[:-1]:
            message += (f"The mask {tuple(mask.shape)} gains an axis inside the function, "
                        f"{grown}, and broadcasting it against the scores {scores_shape} gives "
                        f"{wide}: every sentence is paired with every other sentence's mask. ")
        else:
            message += (f"The mask {tuple(mask.shape)} or the scores {scores_shape} gain an axis "
                        "inside the function (an unsqueeze?), and broadcasting spreads it. ")
    return message + ("The caller's mask already broadcasts to the scores (..., L_q, L_k): use it "
                      "as it comes, without unsqueeze.")


@checker
def check_fixed_attention(fn: Callable[..., Any]) -> None:
    """Debug: ``fn(query, key, value, mask=None) -> (output, weights)`` must accept every mask that
    broadcasts to ``(..., L_q, L_k)`` (ranks 2, 3 and 4) with 3-D and 4-D inputs, as course_lib does.
    """
    cases = _fixed_cases()
    mistakes = _sdpa_mistakes()
    for case, (q, k, v), mask in cases:
        got, used = _run_watching(fn, (scaled_dot_product_attention,), q.clone(), k.clone(), v.clone(),
                                  mask=None if mask is None else mask.clone(), case=case,
                                  hint=_FIXED_RAISED_FIX)
        if used is not None:
            raise _own_function(fn, used, "Fix the function you were given: find the line with the bug "
                                "and change it.")
        if isinstance(got, torch.Tensor) or not isinstance(got, (tuple, list)) or len(got) != 2:
            raise CheckFailure("Return (output, weights), a tuple of two tensors, as the original "
                               "function did.")
        out, weights = got
        exp_out, exp_weights = scaled_dot_product_attention(q, k, v, mask)
        for name, t, exp in (("output", out, exp_out), ("weights", weights, exp_weights)):
            if isinstance(t, torch.Tensor) and t.dim() > exp.dim():
                raise CheckFailure(_extra_axis_message(case, t, exp.shape, tuple(exp_weights.shape),
                                                       mask))
            expect_shape(t, exp.shape, name, "Change only the line with the bug.")
        if mask is not None and not bool(mask.any(-1).all()):
            expect_finite(out, f"The output ({case})", _NAN_FIX)
            expect_finite(weights, f"The weights ({case})", _NAN_FIX)
        compare((out, weights), (exp_out, exp_weights), (q, k, v, mask), mistakes, case)
    print(f"check_fixed_attention: fixed, all {len(cases)} cases match course_lib's reference: 3-D and "
          "4-D inputs with masks (L, L), (B, 1, L_k), (B, L, L), (B, 1, L, L), (B, 1, 1, L_k) and none. "
          "A mask arrives shaped to broadcast; giving it a head axis is the caller's job.")
