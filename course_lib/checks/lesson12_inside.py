"""Checkers for lesson 12's first exercises (inside a trained model: induction heads), and what the
lesson's checkers share.

* ``check_induction_score(fn)``: ``fn(pattern (B, h, 2n, 2n), length) -> (h,)``, the induction
  score. Reference: ``interp.induction_score`` on random causal patterns (rows sum to 1) of four
  lengths, in float64, and on one-hot heads that score exactly 1 and 0; a length written in is named.
* ``check_predict_ablation(prediction)``: the Predict question "what is the repeated copy's loss
  with head 0.3 zero-ablated, and with one induction head zero-ablated?"; ``prediction`` is a
  function returning the two losses in nats (or that pair). The truth is measured on the lesson's
  checkpoint and test rows (``measure_ablation_losses``), within ``ABLATION_BANDS``.

Shared with ``lesson12_hooks`` and ``lesson12_circuits``: ``no_raw_errors`` (every checker leaves
the global random state as it was, runs within ``TIME_LIMITS`` and answers with a ``CheckFailure``,
never a raw error), ``refuse_reference`` (``is_course_lib``), ``close64`` and ``as_float_tensor``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
from collections.abc import Callable
from typing import Any

import torch

from .. import interp
from ..induction import load_checkpoint, repeated_tokens
from .common import (
    CheckFailure, calls_to, checker, is_course_lib, one_thread, run_learner, time_limit,
)

__all__ = ["check_induction_score", "check_predict_ablation"]


# Seconds a checker lets the learner's code run in all (a correct answer needs well under 1 s;
# the patching table a few): a loop that never ends is stopped with a CheckFailure.
TIME_LIMITS = {"induction_score": 20.0, "predict_ablation": 20.0, "ablation_hook": 30.0,
               "patching_hook": 30.0, "patching_table": 60.0, "ov_circuit": 30.0}


def _time_limit(seconds: float) -> contextlib.AbstractContextManager[None]:
    """Stop the checker after ``seconds`` (``time_limit``), so that a loop that never ends cannot hang it."""
    return time_limit(seconds, f"Your code ran for more than {seconds:g} s and was stopped (a right "
                               "answer takes about a second): does every loop end?")


def no_raw_errors(body: Callable[..., None]) -> Callable[..., None]:
    """Run a checker's body in a forked random state, without gradients, on one thread, within
    its time limit; anything but a verdict becomes a ``CheckFailure`` that says so."""

    def run(*args: Any) -> None:
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad(), one_thread(), \
                    _time_limit(TIME_LIMITS[body.__name__.removeprefix("_check_")]):
                body(*args)
        except (NotImplementedError, CheckFailure):
            raise
        except Exception as err:  # a learner's object the checker could not use
            raise CheckFailure(
                f"The checker could not use your answer: {type(err).__name__}: {err}. Check that it "
                "has the signature the exercise gives and returns what the exercise asks for."
            ) from err

    run.__name__ = body.__name__
    return run


def call_learner(fn: Callable[..., Any], *args: Any, case: str, hint: str) -> Any:
    """``run_learner``: the learner's call, a crash named with the case and ``hint``."""
    return run_learner(fn, *args, case=case, hint=hint)


def refuse_reference(fn: Any, what: str) -> None:
    """Fail if ``fn`` is course_lib's own code (``is_course_lib``): write ``what`` yourself."""
    if is_course_lib(fn):
        raise CheckFailure(f"You handed in one of course_lib's own functions: write {what} yourself.")


def close64(got: torch.Tensor, expected: torch.Tensor, atol: float) -> bool:
    """Same shape and values, compared in float64."""
    return (got.shape == expected.shape
            and torch.allclose(got.double(), expected.double(), atol=atol, rtol=1e-4))


def as_float_tensor(got: Any, shape: tuple[int, ...], what: str, fix: str) -> torch.Tensor:
    """``got`` detached, or a ``CheckFailure`` unless it is a finite float tensor of ``shape``."""
    if not isinstance(got, torch.Tensor):
        raise CheckFailure(f"Wrong type: {what} should be a torch.Tensor, got {type(got).__name__}.")
    if tuple(got.shape) != shape:
        raise CheckFailure(f"Wrong output shape: {what} has shape {tuple(got.shape)}, expected "
                           f"{shape}. {fix}".strip())
    if not got.is_floating_point():
        raise CheckFailure(f"{what} has dtype {got.dtype}; it holds fractions, so it must be a "
                           "float tensor.")
    if not torch.isfinite(got).all():
        raise CheckFailure(f"{what} contains NaN or inf.")
    return got.detach()


# ----------------------------------------------------------------------------------------------
# check_induction_score (build, ★)
# ----------------------------------------------------------------------------------------------


_SCORE_CASES = [(2, 3, 5), (3, 4, 8), (1, 2, 11), (4, 5, 3)]  # (B, h, n)


def _random_pattern(B: int, h: int, n: int, seed: int) -> torch.Tensor:
    """A causal attention pattern ``(B, h, 2n, 2n)`` in float64: rows of random, uneven weights
    that sum to 1 (softmax of scores with spread 2), nothing above the diagonal."""
    gen = torch.Generator().manual_seed(seed)
    T = 2 * n
    scores = 2.0 * torch.randn(B, h, T, T, generator=gen, dtype=torch.float64)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)


def _induction_diagonal(pattern: torch.Tensor, n: int) -> torch.Tensor:
    """``(B, h, n + 1)``: the weight from i to i - n + 1 for i = n - 1 .. 2n - 1."""
    return pattern.diagonal(offset=-(n - 1), dim1=-2, dim2=-1)


def _score_mistakes(pattern: torch.Tensor, n: int) -> list[tuple[str, torch.Tensor]]:
    """``(message, (h,) scores)`` of the usual mistakes, in float64."""
    d = _induction_diagonal(pattern, n)  # index k is query i = n - 1 + k
    T = pattern.size(-1)
    whole_all = torch.stack([pattern[:, :, i, i - n + 1] if i - n + 1 >= 0
                             else torch.zeros(pattern.shape[:2], dtype=pattern.dtype)
                             for i in range(T)], dim=-1).mean(dim=(0, 2))
    return [
        ("offset i - n: that is the duplicate-token score (the earlier copy of the same token), "
         "not the induction score", pattern.diagonal(offset=-n, dim1=-2, dim2=-1).mean(dim=(0, 2))),
        ("the key and query axes are swapped: pattern[b, h, i, j] is the weight that query i puts on "
         "key j, so read row i, column i - n + 1 (the pattern is causal: above the diagonal it is 0)",
         _induction_diagonal(pattern.transpose(-1, -2), n).mean(dim=(0, 2))),
        ("averaged over the whole sequence, not only the second copy: the first copy's tokens have "
         "not been seen before, so an induction head has nothing to look up there; take the queries "
         "i = n .. 2n-1", d.mean(dim=(0, 2))),
        ("averaged over every query of the whole sequence (counting 0 where i - n + 1 is missing): "
         "take only the queries of the second copy, i = n .. 2n-1", whole_all),
        ("the queries are shifted by one: you took i = n-1 .. 2n-2, the second copy is i = n .. 2n-1",
         d[..., :n].mean(dim=(0, 2))),
        ("the last query is missing: i runs over n .. 2n-1, all n positions of the second copy "
         "(Python's range and slices stop one before their end)", d[..., 1:n].mean(dim=(0, 2))),
        ("the first query of the second copy (i = n) is missing: i runs over n .. 2n-1",
         d[..., 2:].mean(dim=(0, 2))),
        ("summed over the positions instead of averaging: the score is a mean weight, between 0 "
         "and 1", d[..., 1:].sum(dim=-1).mean(dim=0)),
        ("divided by all 2n query positions, not by the n of the second copy (TransformerLens's "
         "head_detector divides by every query's total attention, so a perfect induction head scores "
         "0.5 there): average over the second copy's n queries only",
         d[..., 1:].sum(dim=-1).mean(dim=0) / (2 * n)),
    ]


def _exact_pattern(B: int, n: int) -> torch.Tensor:
    """``(B, 3, 2n, 2n)`` one-hot patterns on [r, r] whose induction scores are exactly 1, 0 and 0:
    head 0 attends from i to i - n + 1 (an induction head), head 1 to i - n (the same token: a
    duplicate-token head), head 2 to i - 1 (a previous-token head); where the target does not exist,
    a query attends to itself."""
    T = 2 * n
    pattern = torch.zeros(B, 3, T, T, dtype=torch.float64)
    for head, back in enumerate((n - 1, n, 1)):
        for i in range(T):
            pattern[:, head, i, i - back if i - back >= 0 else i] = 1.0
    return pattern


_LENGTH_PROBES = (20, 4, 6, 10, 12, 16, 24)  # the lesson's n = 20 first: a number written in


def _right_at(fn: Callable[..., Any], n: int) -> bool:
    """Is ``fn`` right on a random (2, 3, 2n, 2n) pattern with length ``n``? (Errors: no.)"""
    pattern = _random_pattern(2, 3, n, seed=500 + n)
    try:
        got = fn(pattern.float(), n)
    except (NotImplementedError, CheckFailure):
        raise
    except Exception:
        return False
    return isinstance(got, torch.Tensor) and close64(got.detach(), interp.induction_score(pattern, n), 1e-5)


def _one_length(fn: Callable[..., Any], n: int, case: str, failure: CheckFailure | None = None
                ) -> CheckFailure | None:
    """A CheckFailure if ``fn`` is right at some other length than ``n`` (a number written in).
    Not after ``failure`` was the time limit: the code would run again with no timer."""
    if failure is not None and "ran for more than" in str(failure):
        return None
    right = [m for m in sorted({c[2] for c in _SCORE_CASES} | set(_LENGTH_PROBES))
             if m != n and _right_at(fn, m)]
    if not right:
        return None
    return CheckFailure(f"Only works for one length: right with length n = {right}, wrong with n = "
                        f"{n} ({case}). Use the argument `length` instead of writing a number.")


@checker
def check_induction_score(fn: Callable[..., Any]) -> None:
    """Check ``fn(pattern (B, h, 2n, 2n), length) -> (h,)`` against ``interp.induction_score``."""
    no_raw_errors(_check_induction_score)(fn)


def _check_induction_score(fn: Callable[..., Any]) -> None:
    refuse_reference(fn, "the induction score")
    cases = [(B, h, n, f"B={B}, {h} heads, length n={n}, a random causal pattern of {2 * n} positions",
              _random_pattern(B, h, n, seed=100 + k)) for k, (B, h, n) in enumerate(_SCORE_CASES)]
    cases.append((2, 3, 7, "B=2, 3 one-hot heads of length n=7 whose scores are exactly 1 (an "
                  "induction head), 0 (a duplicate-token head) and 0 (a previous-token head)",
                  _exact_pattern(2, 7)))
    for B, h, n, case, pattern in cases:
        with calls_to([interp.induction_score]) as seen:
            try:
                raw = call_learner(fn, pattern.float(), n, case=case,
                            hint="Index the pattern (B, h, 2n, 2n) with the query positions "
                            "i = n .. 2n-1 and the key positions i - n + 1.")
            except CheckFailure as failure:
                raise (_one_length(fn, n, case, failure) or failure) from failure
        if seen:
            raise CheckFailure("Your function calls course_lib's interp.induction_score, the score "
                               "this exercise asks you to write: index the pattern yourself.")
        if isinstance(raw, torch.Tensor) and raw.dim() == 0:
            raise CheckFailure(f"Wrong output shape ({case}): one number, expected one score per "
                               f"head, shape ({h},). Average over the batch and the positions "
                               "(dims 0 and 2 of (B, h, n)), not over the heads.")
        if isinstance(raw, torch.Tensor) and tuple(raw.shape) == (B, h):
            raise CheckFailure(f"Wrong output shape ({case}): (B, h) = {(B, h)}, expected ({h},): "
                               "average over the batch too.")
        try:
            got = as_float_tensor(raw, (h,), f"the score ({case})",
                             "One score per head: average over the batch and the positions.")
        except CheckFailure as failure:  # e.g. NaN from an empty slice: a length written in?
            raise (_one_length(fn, n, case, failure) or failure) from failure
        expected = interp.induction_score(pattern, n)
        if close64(got, expected, 1e-5):
            continue
        for message, wrong in _score_mistakes(pattern, n):
            if close64(got, wrong, 1e-5):
                raise CheckFailure(f"Likely mistake ({case}): {message}.", mistake=message)
        written_in = _one_length(fn, n, case)
        if written_in:
            raise written_in
        raise CheckFailure(
            f"Output differs from course_lib's reference ({case}): largest difference "
            f"{(got.double() - expected).abs().max().item():.3g}. None of the usual mistakes explains "
            "it; print both for a small pattern (B=1, h=1, n=3) and compare step by step.")
    print(f"check_induction_score: all {len(cases)} cases (random patterns of 4 lengths, and heads "
          "that score exactly 1 and 0) match course_lib's reference. Well done!")


# ----------------------------------------------------------------------------------------------
# check_predict_ablation (predict)
# ----------------------------------------------------------------------------------------------


# How far (nats) each prediction may sit from the measured loss; the exercise's text states both.
ABLATION_BANDS = {"head_0_3": 1.0, "induction_head": 0.7}


_ORDER = "(loss with head 0.3 removed, loss with one induction head removed)"


@functools.lru_cache(maxsize=1)
def measure_ablation_losses() -> dict[str, float]:
    """The repeated copy's loss (nats) of the lesson's checkpoint on the lesson's test rows (64 rows
    ``[r, r]``, ``|r| = 20``, ``repeated_tokens`` seed 0, as the notebook builds them), as the
    ablation cell measures it: clean; with head 0.3 (the previous-token head) zero-ablated; with each
    layer-1 head zero-ablated alone, and their mean; and the first copy's loss. The global random
    state and thread count are left as they were."""
    with torch.random.fork_rng(devices=[]), torch.no_grad(), one_thread():
        model, _ = load_checkpoint()
        n = 20
        ids = repeated_tokens(64, n, 64, torch.Generator().manual_seed(0))  # (64, 2n)
        heads = model.config.num_heads

        def loss(layer: int | None = None, head: int | None = None) -> float:
            if layer is None:
                return interp.loss_per_position(model, ids)[n - 1:].mean().item()
            with interp.hooked(model, layer, interp.ablation_hook(head, heads)):
                return interp.loss_per_position(model, ids)[n - 1:].mean().item()

        layer_1 = [loss(1, h) for h in range(heads)]
        return {"clean": loss(), "head_0_3": loss(0, 3), "induction_heads": layer_1,
                "induction_head": sum(layer_1) / len(layer_1),
                "first_copy": interp.loss_per_position(model, ids)[: n - 1].mean().item()}


def _as_loss(value: Any, which: str) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    elif hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "size", 0) == 1:
        value = value.item()  # a NumPy number or one-element array
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise CheckFailure(f"The {which} should be a number of nats (a float such as 2.5), got "
                           f"{type(value).__name__} {value!r}. Return two numbers: {_ORDER}.")
    value = float(value)
    if not math.isfinite(value):
        raise CheckFailure(f"The {which} is {value}: return a finite number of nats.")
    if value < 0:
        raise CheckFailure(f"The {which} is {value:g}: a loss is never negative (it is minus the log "
                           "of a probability, at most 1).")
    return value


def _as_two_losses(got: Any) -> tuple[float, float]:
    """The learner's two predictions as floats, or a ``CheckFailure`` that says what came instead."""
    if isinstance(got, (set, frozenset)):
        raise CheckFailure(f"Return the two numbers in order, as a tuple {_ORDER}: a set has no order.")
    if isinstance(got, dict):
        raise CheckFailure(f"Return the two numbers in order, as a tuple {_ORDER}, not a dict: a "
                           "dict's keys do not say which number is which to the checker.")
    if isinstance(got, (str, bytes)) or got is None or isinstance(got, numbers.Number):
        raise CheckFailure(f"Return two numbers (nats), as a tuple {_ORDER}; got "
                           f"{type(got).__name__} {got!r}.")
    if isinstance(got, torch.Tensor) or (hasattr(got, "tolist") and hasattr(got, "dtype")):
        got = got.reshape(-1).tolist() if hasattr(got, "reshape") else got.tolist()
    try:
        items = list(got)
    except TypeError:
        raise CheckFailure(f"Return two numbers (nats), as a tuple {_ORDER}; got "
                           f"{type(got).__name__}.") from None
    if len(items) != 2:
        raise CheckFailure(f"Return exactly two numbers, {_ORDER}; got {len(items)}.")
    second = items[1]
    if isinstance(second, (list, tuple)) or (isinstance(second, torch.Tensor) and second.numel() > 1):
        raise CheckFailure("The second number is one number: the mean, over the four induction heads, "
                           "of the loss with that head removed alone. Return the mean of your "
                           f"per-head predictions, {_ORDER}.")
    return (_as_loss(items[0], "first number (head 0.3 removed)"),
            _as_loss(items[1], "second number (one induction head removed)"))


@checker
def check_predict_ablation(prediction: Any) -> None:
    """Check ``prediction() -> (loss with head 0.3 zero-ablated, mean loss with one layer-1 head
    zero-ablated)`` (or that pair) against the repeated copy's losses of the lesson's checkpoint
    (``measure_ablation_losses``), within ``ABLATION_BANDS``, the first larger than the second."""
    no_raw_errors(_check_predict_ablation)(prediction)


def _check_predict_ablation(prediction: Any) -> None:
    if is_course_lib(prediction):
        raise CheckFailure("You handed in one of course_lib's own functions: return your prediction.")
    got = prediction
    if callable(prediction):
        got = call_learner(prediction, case="your prediction",
                    hint=f"Return two numbers, {_ORDER}.")
    head_0_3, induction_head = _as_two_losses(got)
    m = measure_ablation_losses()
    clean, first = m["clean"], m["first_copy"]
    band_a, band_b = ABLATION_BANDS["head_0_3"], ABLATION_BANDS["induction_head"]

    def fits(a: float, b: float) -> bool:
        return abs(a - m["head_0_3"]) <= band_a and abs(b - m["induction_head"]) <= band_b and a > b

    if fits(head_0_3, induction_head):
        low, high = min(m["induction_heads"]), max(m["induction_heads"])
        print(f"check_predict_ablation: right. You said {head_0_3:.2f} and {induction_head:.2f} "
              f"nats; the lesson's model measures {m['head_0_3']:.2f} without head 0.3, and "
              f"{m['induction_head']:.2f} on average without one induction head ({low:.2f} to "
              f"{high:.2f}). One layer-0 head matters more than any induction head, because all four "
              "read it through their keys. The next cell shows every head.")
        return
    reads = ("all four induction heads find their target through keys that read what head 0.3 "
             "writes into every position, \"the token before me\" (K-composition, section 2)")
    if max(head_0_3, induction_head) > 3 * first:
        raise CheckFailure(
            f"Not quite: {max(head_0_3, induction_head):g} nats is more than three times what an "
            f"unpredictable token costs here (the first copy: {first:.2f} nats). Give both losses in "
            "nats, the unit of section 3's loss, not in percent.", mistake="not in nats")
    if max(head_0_3, induction_head) <= clean + 0.15:
        raise CheckFailure(
            f"Not quite: you predict about the clean loss ({clean:.2f}) for both, as if removing one "
            f"head changed nothing. But {reads}: without it every one of them loses its target at "
            "once. And the four induction heads share the push towards the right token: without one "
            "of them, its lead shrinks.", mistake="removing a head changes nothing")
    if clean + 0.15 < head_0_3 <= induction_head:  # (head 0.3 near the clean loss: named below)
        swapped = fits(induction_head, head_0_3)
        raise CheckFailure(
            f"Not quite: you predict that removing one induction head ({induction_head:.2f}) costs at "
            f"least as much as removing head 0.3 ({head_0_3:.2f}). But {reads}: without it, every "
            "one of them loses its target at once; without one induction head, three still copy."
            + (f" (Swapped? The first number is head 0.3's: {_ORDER}.)" if swapped else ""),
            mistake="one induction head above head 0.3")
    reasons, mistakes = [], []
    if head_0_3 < m["head_0_3"] - band_a:
        if head_0_3 <= clean + 0.15:
            reasons.append(
                f"head 0.3 removed: {head_0_3:.2f} is about the clean loss ({clean:.2f}), as if the "
                "head did not matter. It sits in layer 0 and writes almost nothing to the logits "
                f"directly, but it matters through others: {reads}")
            mistakes.append("head 0.3 does not matter")
        else:
            reasons.append(f"head 0.3 removed: {head_0_3:.2f} is too low: {reads}, so removing "
                           "it weakens all four at once, and most of the copy is lost")
            mistakes.append("head 0.3 too low")
    elif head_0_3 > m["head_0_3"] + band_a:
        near = (" (that is ln 64, a uniform guess)" if abs(head_0_3 - math.log(64)) < 0.1 else
                " (about the first copy's loss)" if abs(head_0_3 - first) < 0.15 else "")
        reasons.append(
            f"head 0.3 removed: {head_0_3:.2f} is too high{near}: not all of the copy is lost. Head "
            "0.3 is not the only head that looks one position back: section 2's table shows heads "
            "0.0 and 0.1 doing it part of the time, so part of the previous token is still written. "
            f"The loss rises most of the way from the clean {clean:.2f} towards an uncopyable copy "
            f"(the first copy's {first:.2f}), not all of it")
        mistakes.append("head 0.3: all of the copy lost")
    if induction_head < m["induction_head"] - band_b:
        what = (f"{induction_head:.2f} is about the clean loss ({clean:.2f}), as if three heads "
                "could carry the copy alone" if induction_head <= clean + 0.15 else
                f"{induction_head:.2f} is too low")
        reasons.append(
            f"one induction head removed: {what}. The three others still attend to the right "
            "position and write the right token, but the four share the push towards it (they score "
            "alike in section 2): with a quarter of the push gone, the right token's lead shrinks and "
            "the loss rises several-fold")
        mistakes.append("one induction head: no change" if induction_head <= clean + 0.15
                        else "one induction head too low")
    elif induction_head > m["induction_head"] + band_b:
        reasons.append(
            f"one induction head removed: {induction_head:.2f} is too high. Three induction heads are "
            "left, and each attends to the right position and writes the right token: most of the copy "
            f"survives, far from an uncopyable copy ({first:.2f})")
        mistakes.append("one induction head: copy lost")
    raise CheckFailure("Not quite: " + "; ".join(reasons) + ".",
                       mistake=", ".join(mistakes) or None)
