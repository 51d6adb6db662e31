"""Checkers for lesson 02's exercises on the heads (multi-head attention, exercises 2-4).

* ``check_split_heads(fn)``: ``fn(x (B, L, d_model), num_heads) -> (B, num_heads, L, head_dim)``
* ``check_merge_heads(fn)``: ``fn(x (B, num_heads, L, head_dim)) -> (B, L, d_model)``
* ``check_view_prediction(fn)``: ``fn() -> 4 answers``, which of four ``view`` calls on a transposed
  tensor work (True) and which raise (False); ``VIEW_CALLS`` lists them

The references are ``course_lib.attention.split_heads`` and ``merge_heads`` (the functions
``MultiHeadAttention``'s methods call). Exercises 1 and 5 (the parameter count, the multi-head
attention class) are checked in ``lesson02_multi_head``, with this module's shared helpers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..attention import MultiHeadAttention, merge_heads, split_heads
from .common import (CheckFailure, Mistake, calls_to, checker, close, compare, expect_shape, is_course_lib, passed,
                     run_learner)

__all__ = ["check_split_heads", "check_merge_heads", "check_view_prediction"]


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", type(obj).__name__)


def first_tensor(out: Any) -> Any:
    """Accept ``out`` or ``(out, weights)`` from a forward that also returns the weights."""
    return out[0] if isinstance(out, (tuple, list)) and len(out) > 0 else out


def compare_any_shape(
    got: Any,
    expected: torch.Tensor,
    inputs: Sequence[Any],
    mistakes: Sequence[Mistake],
    case: str,
    what: str,
    shape_fix: str,
) -> None:
    """Like ``compare``, but a wrong shape that no named mistake explains gets a shape message."""
    if isinstance(got, torch.Tensor) and got.shape != expected.shape:
        for mistake in mistakes:
            try:
                wrong = mistake.compute(*inputs)
            except Exception:  # a variant that cannot run on this case does not match
                continue
            if close(got, wrong, 1e-5):
                raise CheckFailure(f"Likely mistake ({case}): {mistake.name}. {mistake.hint}", mistake=mistake.name)
    expect_shape(got, expected.shape, what, shape_fix)
    compare(got, expected, inputs, mistakes, case)


# ----------------------------------------------------------------------------------------------
# Handing in course_lib's own code
# ----------------------------------------------------------------------------------------------

def reject_reference(what: str, reference: str, exercise: str) -> None:
    """Fail: the learner handed in course_lib's own ``reference`` (``is_course_lib``)."""
    raise CheckFailure(
        f"You handed in course_lib's own {reference}, the reference the checker compares with, so "
        f"there is nothing of yours to check. Write {what} yourself (the lesson keeps using "
        f"course_lib's until yours passes), or read a solution with show_solution(\"{exercise}\")."
    )


def reject_call(what: str, called: list[Callable[..., Any]], exercise: str) -> None:
    """Fail: the learner's code called ``called[0]``, one of ``REFERENCE_FUNCTIONS`` (``calls_to``)."""
    raise CheckFailure(
        f"Your {what} calls course_lib's `{called[0].__qualname__}`, the reference the checker compares with, "
        f"so the checker would only test course_lib. Write the steps yourself, or read a solution "
        f"with show_solution(\"{exercise}\")."
    )


def _run_own(fn: Callable[..., Any], what: str, exercise: str, *args: Any, case: str,
             hint: str) -> Any:
    """``run_learner``, failing if the learner's code calls course_lib's split/merge/attention."""
    with calls_to(REFERENCE_FUNCTIONS) as called:
        got = run_learner(fn, *args, case=case, hint=hint)
    if called:
        reject_call(what, called, exercise)
    return got


# What a learner's split, merge or multi-head attention must not call: course_lib's references.
REFERENCE_FUNCTIONS = [
    split_heads, merge_heads, MultiHeadAttention.forward,
    MultiHeadAttention.attend, MultiHeadAttention.split_heads, MultiHeadAttention.merge_heads,
]


# ----------------------------------------------------------------------------------------------
# split_heads / merge_heads
# ----------------------------------------------------------------------------------------------

_SPLIT_TRY = ("Try it on section 5's example: `split_heads(t, 3)[0, 1]` must equal "
              "`target_head_1`, features 2 and 3 of every position; print yours and see whose "
              "features it holds.")

_SPLIT_MISTAKES = [
    Mistake(
        "heads split without the transpose",
        "`x.view(B, L, num_heads, head_dim)` is only half of the job: it groups the features of "
        "each position into heads, shape (B, L, num_heads, head_dim). Add `.transpose(1, 2)` so "
        "the head axis comes before the positions: (B, num_heads, L, head_dim).",
        lambda x, h: x.view(x.size(0), x.size(1), h, x.size(2) // h),
    ),
    Mistake(
        "reshaped straight to (B, num_heads, L, head_dim) without the transpose",
        "The shape is right but the numbers are scrambled: reshape reads the features of "
        "position 0, then position 1, ... and cuts them into rows of head_dim, so one 'head' holds "
        "pieces of several positions. First `view(B, L, num_heads, head_dim)` (features -> "
        "heads, per position), then `.transpose(1, 2)`. " + _SPLIT_TRY,
        lambda x, h: x.reshape(x.size(0), h, x.size(1), x.size(2) // h),
    ),
    Mistake(
        "transposed before splitting (x.transpose(1, 2), then a reshape to (B, num_heads, L, "
        "head_dim))",
        "Transposing (B, L, d_model) first gives (B, d_model, L): the reshape then cuts each "
        "feature's row of positions into pieces, so a 'head' holds one feature of several "
        "positions. Cut the features first, `view(B, L, num_heads, head_dim)`, then "
        "`.transpose(1, 2)`. " + _SPLIT_TRY,
        lambda x, h: x.transpose(1, 2).reshape(x.size(0), h, x.size(1), x.size(2) // h),
    ),
    Mistake(
        "heads take every num_heads-th feature (view(B, L, head_dim, num_heads))",
        "Head i must get the consecutive features i*head_dim ... (i+1)*head_dim - 1, so the head "
        "axis comes first in the view: `view(B, L, num_heads, head_dim)`, then `.transpose(1, 2)`.",
        lambda x, h: x.view(x.size(0), x.size(1), x.size(2) // h, h).permute(0, 3, 1, 2),
    ),
    Mistake(
        "num_heads and head_dim swapped in the view (view(B, L, head_dim, num_heads), then "
        "transpose(1, 2))",
        "The view must be `view(B, L, num_heads, head_dim)`: the head axis first, so that head i "
        "gets the consecutive features i*head_dim ... (i+1)*head_dim - 1; then `.transpose(1, 2)`.",
        lambda x, h: x.view(x.size(0), x.size(1), x.size(2) // h, h).transpose(1, 2),
    ),
    Mistake(
        "the last two axes transposed (transpose(-2, -1)) instead of the positions and heads",
        "After `view(B, L, num_heads, head_dim)` the axes to swap are the positions (1) and the "
        "heads (2): `.transpose(1, 2)`. `transpose(-2, -1)` swaps heads and head_dim, the habit "
        "from `k.transpose(-2, -1)` in attention.",
        lambda x, h: x.view(x.size(0), x.size(1), h, x.size(2) // h).transpose(-2, -1),
    ),
]


@checker
def check_split_heads(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
    """Check ``fn(x, num_heads)``: ``(B, L, d_model) -> (B, num_heads, L, head_dim)``."""
    if is_course_lib(fn):
        reject_reference("split_heads", f"`{_name(fn)}`", "02.split_heads")
    cases = [((2, 5, 12), 3), ((1, 4, 8), 2), ((3, 7, 16), 4), ((2, 3, 6), 6), ((2, 4, 10), 1)]
    g = torch.Generator().manual_seed(2)
    for shape, h in cases:
        x = torch.randn(*shape, generator=g)
        case = f"x {shape}, num_heads={h}"
        B, L, d = shape
        try:
            got = _run_own(fn, "split_heads", "02.split_heads", x.clone(), h, case=case,
                           hint="Read B, L, d_model from x.shape; head_dim = d_model // num_heads.")
        except CheckFailure as failure:
            err = failure.__cause__
            if isinstance(err, RuntimeError) and "is invalid for input of size" in str(err):
                raise CheckFailure(
                    f"Likely mistake ({case}): sizes fixed in the code instead of read from the "
                    f"input. Your view asked for {str(err).split(' is invalid')[0]}, which does "
                    f"not hold the {B * L * d} numbers of x: read B, L, d_model from x.shape and "
                    f"use the argument num_heads, with head_dim = d_model // num_heads = {d // h}."
                ) from None
            raise
        compare_any_shape(
            got, split_heads(x, h), (x, h), _SPLIT_MISTAKES, case,
            "split_heads(x, num_heads)",
            f"Expected (B, num_heads, L, head_dim) with head_dim = d_model // num_heads = "
            f"{d // h}.",
        )
    passed("check_split_heads", len(cases))


_MERGE_MISTAKES = [
    Mistake(
        "heads merged in the wrong order (reshape or view without the transpose)",
        "Reshaping (or viewing) (B, num_heads, L, head_dim) straight to (B, L, d_model) reads head "
        "0's rows first, so output position 0 gets head 0's features of positions 0, 1, ... The "
        "shape is right and nothing crashes, which is why this bug is silent. First "
        "`.transpose(1, 2)` -> (B, L, num_heads, head_dim), then `.reshape(B, L, d_model)` (or "
        "`.contiguous().view(B, L, d_model)`).",
        lambda x: x.reshape(x.size(0), x.size(2), x.size(1) * x.size(3)),
    ),
    Mistake(
        "transposed but not reshaped",
        "After `.transpose(1, 2)` the tensor is (B, L, num_heads, head_dim); finish with "
        "`.reshape(B, L, num_heads * head_dim)` to concatenate the heads.",
        lambda x: x.transpose(1, 2),
    ),
    Mistake(
        "the last two axes transposed (transpose(2, 3)) before the reshape",
        "`transpose(2, 3)` swaps the positions and head_dim, (B, num_heads, head_dim, L); the "
        "reshape then mixes positions. Swap the heads and the positions, `.transpose(1, 2)` -> "
        "(B, L, num_heads, head_dim), then `.reshape(B, L, d_model)`.",
        lambda x: x.transpose(2, 3).reshape(x.size(0), x.size(2), x.size(1) * x.size(3)),
    ),
    Mistake(
        "heads interleaved (head_dim before num_heads when merging, e.g. permute(0, 2, 3, 1))",
        "Each position's output must hold head 0's head_dim features, then head 1's, ...: the axes "
        "before the reshape must be (B, L, num_heads, head_dim), `.transpose(1, 2)`. With "
        "(B, L, head_dim, num_heads) the heads' features are interleaved.",
        lambda x: x.permute(0, 2, 3, 1).reshape(x.size(0), x.size(2), x.size(1) * x.size(3)),
    ),
    Mistake(
        "heads concatenated along the positions (dim=1), not along the features",
        "Concat(head_1, ..., head_h) puts each position's heads side by side: "
        "`torch.cat(heads, dim=-1)` on (B, L, head_dim) pieces, or `.transpose(1, 2).reshape(B, "
        "L, d_model)`.",
        lambda x: torch.cat(x.unbind(1), dim=1),
    ),
    Mistake(
        "heads added up instead of concatenated",
        "Merging concatenates the heads, (B, L, num_heads * head_dim); it does not sum or average "
        "them. `.transpose(1, 2).reshape(B, L, num_heads * head_dim)`.",
        lambda x: x.sum(dim=1),
    ),
    Mistake(
        "heads averaged instead of concatenated",
        "Merging concatenates the heads, (B, L, num_heads * head_dim); it does not sum or average "
        "them. `.transpose(1, 2).reshape(B, L, num_heads * head_dim)`.",
        lambda x: x.mean(dim=1),
    ),
]


@checker
def check_merge_heads(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Check ``fn(x)``: ``(B, num_heads, L, head_dim) -> (B, L, num_heads * head_dim)``."""
    if is_course_lib(fn):
        reject_reference("merge_heads", f"`{_name(fn)}`", "02.merge_heads")
    cases = [(2, 3, 5, 4), (1, 2, 4, 4), (3, 4, 7, 2), (2, 1, 3, 6)]
    g = torch.Generator().manual_seed(3)
    for shape in cases:
        # A fresh, contiguous tensor, like the output of the attention matmul inside the module.
        x = torch.randn(*shape, generator=g)
        case = f"x {shape}"
        try:
            got = _run_own(fn, "merge_heads", "02.merge_heads", x.clone(), case=case,
                           hint="Read B, num_heads, L, head_dim from x.shape.")
        except CheckFailure as failure:
            err = failure.__cause__
            if isinstance(err, RuntimeError) and "is invalid for input of size" in str(err):
                raise CheckFailure(
                    f"Likely mistake ({case}): sizes fixed in the code instead of read from the "
                    f"input. Your reshape asked for {str(err).split(' is invalid')[0]}, which "
                    f"does not hold the {x.numel()} numbers of x: read B, num_heads, L, head_dim "
                    "from x.shape."
                ) from None
            if isinstance(err, RuntimeError) and "view" in str(err) and (
                    "contiguous" in str(err) or "compatible" in str(err)):
                raise CheckFailure(
                    f"Likely mistake ({case}): `.view` after `.transpose`. transpose only swaps "
                    "two strides, so the (num_heads, head_dim) axes you merge no longer lie back "
                    "to back in memory, and view, which never copies, cannot merge them (PyTorch: "
                    f"'{str(err).splitlines()[0].split(' (')[0]}'). "
                    "Use `.reshape(...)`, or `.contiguous().view(...)`."
                ) from None
            raise
        B, h, L, hd = shape
        compare_any_shape(
            got, merge_heads(x), (x,), _MERGE_MISTAKES, case,
            "merge_heads(x)", f"Expected (B, L, d_model) = {(B, L, h * hd)}.",
        )
    passed("check_merge_heads", len(cases))


# ----------------------------------------------------------------------------------------------
# Predict: which views of a transposed tensor work
# ----------------------------------------------------------------------------------------------

# (call as the lesson writes it, the view's shape, why it works or not). `swapped` is a fresh
# (1, 3, 4, 2) tensor transposed to (1, 4, 3, 2): strides (24, 2, 8, 1).
VIEW_CALLS: list[tuple[str, Callable[[torch.Tensor], torch.Tensor], str]] = [
    ("swapped.view(1, 4, 6)", lambda t: t.view(1, 4, 6),
     "it glues num_heads (size 3, stride 8) and head_dim (size 2, stride 1) into one axis, and 8 "
     "!= 2 x 1: "
     "they are not back to back in memory"),
    ("swapped.view(1, 2, 2, 3, 2)", lambda t: t.view(1, 2, 2, 3, 2),
     "it only cuts L = 4 into 2 x 2 (strides 4 and 2), which strides can always express"),
    ("swapped.view(1, 12, 2)", lambda t: t.view(1, 12, 2),
     "it glues L (size 4, stride 2) and num_heads (size 3, stride 8), and 2 != 3 x 8: after the "
     "transpose "
     "the positions are no longer the outer axis in memory"),
    ("swapped.transpose(1, 2).view(1, 3, 8)", lambda t: t.transpose(1, 2).view(1, 3, 8),
     "transposing back restores the fresh tensor's row-by-row layout (contiguous again), so gluing "
     "L and "
     "head_dim works"),
]


def _view_works(call: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    swapped = torch.arange(24).view(1, 3, 4, 2).transpose(1, 2)  # (B, L, num_heads, head_dim)
    try:
        call(swapped)
    except RuntimeError:
        return False
    return True


def _as_works(value: Any, i: int) -> bool:
    if isinstance(value, str) and value.strip().lower() in ("works", "raises"):
        return value.strip().lower() == "works"
    if isinstance(value, bool) or "bool" in str(getattr(value, "dtype", "")):  # also NumPy, torch
        return bool(value)
    raise CheckFailure(f"Answer {i + 1} should be True (works) or False (raises), or the word "
                       f"'works' or 'raises'; got {value!r}.")


@checker
def check_view_prediction(fn: Callable[[], Any]) -> None:
    """Check ``fn() -> 4 answers``: which of ``VIEW_CALLS`` work (True) and which raise (False)."""
    answer = fn()
    if not isinstance(answer, (tuple, list)) or len(answer) != len(VIEW_CALLS):
        raise CheckFailure(f"Return {len(VIEW_CALLS)} answers, True (works) or False (raises), one "
                           f"per "
                           f"call and in the lesson's order; got {answer!r}.")
    said = [_as_works(v, i) for i, v in enumerate(answer)]
    truth = [_view_works(call) for _, call, _ in VIEW_CALLS]
    if said == truth:
        print("check_view_prediction: right, all four. view never copies: it works when strides "
              "can "
              "express the new shape (cutting an axis always can, gluing two only if they are back "
              "to "
              "back in memory), not only on contiguous tensors.")
        return
    wrong = [f"{text} {'works' if ok else 'raises'}: {why}."
             for (text, _, why), ok, guess in zip(VIEW_CALLS, truth, said) if ok != guess]
    if said == [False, False, False, True]:
        confusion = ("Likely confusion: view does not need a contiguous tensor, only strides that "
                     "can "
                     "express the new shape. ")
    elif all(said):
        confusion = ("Likely confusion: view never copies, so it cannot glue axes that are not "
                     "back to "
                     "back in memory. ")
    else:
        confusion = ""
    raise CheckFailure(f"{len(wrong)} of {len(VIEW_CALLS)} not right. "
                       f"{confusion}" + " ".join(wrong))
