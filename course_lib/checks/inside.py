"""Checkers for the exercises of lesson 12 (inside a trained model: induction heads).

* ``check_induction_score(fn)``: ``fn(pattern (B, h, 2n, 2n), length) -> (h,)``, the induction
  score. Reference: ``interp.induction_score`` on random causal patterns (rows sum to 1) of four
  lengths, in float64, and on one-hot heads that score exactly 1 and 0; a length written in is named.
* ``check_predict_ablation(prediction)``: the Predict question "what is the repeated copy's loss
  with head 0.3 zero-ablated, and with one induction head zero-ablated?"; ``prediction`` is a
  function returning the two losses in nats (or that pair). The truth is measured on the lesson's
  checkpoint and test rows (``measure_ablation_losses``), within ``ABLATION_BANDS``.
* ``check_ablation_hook(fn)``: ``fn(head, num_heads, mean=None) -> hook``, a forward pre-hook for
  ``out_proj`` that zero- or mean-ablates one head. Reference: ``interp.ablation_hook``, compared
  through random attention-only GPTs' logits (4, 2 and 3 heads, batches of several shapes).
* ``check_patching_hook(fn)``: ``fn(head, num_heads, clean (B, T, h, hd), position=None) -> hook``,
  the fixed patching hook (the Debug exercise: the given hook tests ``if position:``, so position 0
  patches every position). Reference: ``interp.patching_hook``.
* ``check_ov_circuit(fn)``: ``fn(model, layer, head) -> (V, V)``, the full OV circuit with
  LayerNorm's centring and gains folded in. Reference: ``interp.full_ov_circuit`` on random models
  of 4, 2 and 8 heads (one with grouped-query attention) and on the trained checkpoint.
* ``check_patching_table(fn)``: ``fn(model, clean, corrupted) -> (num_layers, h)``, activation
  patching. Reference: ``interp.patching_table`` on the trained checkpoint and a random model; a
  crash from runs of 2n and 2n - 1 positions is named.

Every checker leaves the global random state as it was and removes every hook it registers.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import numbers
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .. import interp
from ..gpt import GPT
from ..induction import induction_config, load_checkpoint, repeated_tokens
from ._common import CheckFailure, calls_to, checker, is_course_lib, one_thread, run_learner, time_limit

__all__ = ["check_induction_score", "check_predict_ablation", "check_ablation_hook",
           "check_patching_hook", "check_patching_table", "check_ov_circuit"]


# Seconds a checker lets the learner's code run in all (a correct answer needs well under 1 s;
# the patching table a few): a loop that never ends is stopped with a CheckFailure.
TIME_LIMITS = {"induction_score": 20.0, "predict_ablation": 20.0, "ablation_hook": 30.0,
               "patching_hook": 30.0, "patching_table": 60.0, "ov_circuit": 30.0}


def _time_limit(seconds: float) -> contextlib.AbstractContextManager[None]:
    """Stop the checker after ``seconds`` (``time_limit``), so that a loop that never ends cannot hang it."""
    return time_limit(seconds, f"Your code ran for more than {seconds:g} s and was stopped (a right "
                               "answer takes about a second): does every loop end?")


def _no_raw_errors(body: Callable[..., None]) -> Callable[..., None]:
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


def _learner_hook_output(fn: Callable[..., Any], args: tuple, reference: Callable[..., Any], model: GPT,
                         ids: torch.Tensor, layer: int, case: str, refusal: str) -> tuple[Any, torch.Tensor]:
    """Build the learner's hook from ``args`` and run ``model(ids)`` with it on ``layer``'s out_proj:
    ``(hook, logits)``; refuse a hook factory that only calls course_lib's ``reference``."""
    with calls_to([reference]) as seen:
        hook = _call(fn, *args, case=case, hint="Build and return the inner hook function.")
        got = _run_with(model, ids, layer, hook, case,
                        "The hook receives (module, args); args[0] is out_proj's input "
                        "(B, T, num_heads * head_dim).")
    if seen:
        raise CheckFailure(refusal)
    return hook, got


def _call(fn: Callable[..., Any], *args: Any, case: str, hint: str) -> Any:
    return run_learner(fn, *args, case=case, hint=hint)


def _refuse_reference(fn: Any, what: str) -> None:
    if is_course_lib(fn):
        raise CheckFailure(f"You handed in one of course_lib's own functions: write {what} yourself.")


def _close(got: torch.Tensor, expected: torch.Tensor, atol: float) -> bool:
    return (got.shape == expected.shape
            and torch.allclose(got.double(), expected.double(), atol=atol, rtol=1e-4))


def _as_tensor(got: Any, shape: tuple[int, ...], what: str, fix: str) -> torch.Tensor:
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
    return isinstance(got, torch.Tensor) and _close(got.detach(), interp.induction_score(pattern, n), 1e-5)


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
    _no_raw_errors(_check_induction_score)(fn)


def _check_induction_score(fn: Callable[..., Any]) -> None:
    _refuse_reference(fn, "the induction score")
    cases = [(B, h, n, f"B={B}, {h} heads, length n={n}, a random causal pattern of {2 * n} positions",
              _random_pattern(B, h, n, seed=100 + k)) for k, (B, h, n) in enumerate(_SCORE_CASES)]
    cases.append((2, 3, 7, "B=2, 3 one-hot heads of length n=7 whose scores are exactly 1 (an "
                  "induction head), 0 (a duplicate-token head) and 0 (a previous-token head)",
                  _exact_pattern(2, 7)))
    for B, h, n, case, pattern in cases:
        with calls_to([interp.induction_score]) as seen:
            try:
                raw = _call(fn, pattern.float(), n, case=case,
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
            got = _as_tensor(raw, (h,), f"the score ({case})",
                             "One score per head: average over the batch and the positions.")
        except CheckFailure as failure:  # e.g. NaN from an empty slice: a length written in?
            raise (_one_length(fn, n, case, failure) or failure) from failure
        expected = interp.induction_score(pattern, n)
        if _close(got, expected, 1e-5):
            continue
        for message, wrong in _score_mistakes(pattern, n):
            if _close(got, wrong, 1e-5):
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
    _no_raw_errors(_check_predict_ablation)(prediction)


def _check_predict_ablation(prediction: Any) -> None:
    if is_course_lib(prediction):
        raise CheckFailure("You handed in one of course_lib's own functions: return your prediction.")
    got = prediction
    if callable(prediction):
        got = _call(prediction, case="your prediction",
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


# ----------------------------------------------------------------------------------------------
# check_ablation_hook (build, ★★) and check_patching_hook (debug)
# ----------------------------------------------------------------------------------------------

_HOOK_D_MODEL, _HOOK_HEADS, _HOOK_T = 48, 4, 10  # head_dim 12: != num_heads, views differ


def _random_model(seed: int, num_layers: int = 2, num_heads: int = _HOOK_HEADS,
                  d_model: int = _HOOK_D_MODEL, scale: float = 3.0) -> GPT:
    """A random attention-only GPT (lesson 12's kind) with every weight moved by noise and the token
    table scaled by ``scale``, so that its heads are uneven and its predictions not uniform."""
    torch.manual_seed(seed)
    model = GPT(induction_config(num_layers=num_layers, num_heads=num_heads, d_model=d_model)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * scale * torch.randn_like(p))
        model.embed.token.weight.mul_(scale)
    return model


def _hooks_on(model: GPT) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def _remove_hooks(model: GPT) -> None:
    for m in model.modules():
        m._forward_pre_hooks.clear()
        m._forward_hooks.clear()


def _run_with(model: GPT, ids: torch.Tensor, layer: int, hook: Any, case: str, hint: str) -> torch.Tensor:
    """The logits of ``model(ids)`` with ``hook`` on layer ``layer``'s out_proj (always removed)."""
    if not callable(hook):
        raise CheckFailure(f"Your function returned {type(hook).__name__}, not a hook ({case}): "
                           "return the inner function hook(module, args).")
    shapes: list[tuple[tuple[int, ...], Any]] = []  # (input shape, what the hook returned)

    def recorded(module: Any, args: tuple) -> Any:
        shapes.append((tuple(args[0].shape), None))
        result = hook(module, args)
        shapes[-1] = (shapes[-1][0], result)
        return result

    try:
        with interp.hooked(model, layer, recorded):
            out = model(ids)
    except (NotImplementedError, CheckFailure):
        raise
    except Exception as err:
        if shapes:
            wanted, result = shapes[-1]
            got = result[0] if isinstance(result, tuple) and result else result
            if isinstance(got, torch.Tensor) and tuple(got.shape) != wanted:
                raise CheckFailure(
                    f"Your hook returned a tensor of shape {tuple(got.shape)}, but out_proj's input "
                    f"has shape {wanted} ({case}): return it in the shape it came in, the heads side "
                    "by side (B, T, num_heads * head_dim), e.g. z.view(B, T, -1).") from err
        if "Boolean value of Tensor" in str(err):
            raise CheckFailure(
                f"Your hook asked for the truth of a tensor ({case}): `if mean:` (or `if not mean`, "
                "`mean or ...`) on a tensor of several numbers is refused by PyTorch. Whether an "
                "argument was given is `mean is None` / `mean is not None`.") from err
        raise CheckFailure(f"Your hook raised {type(err).__name__} inside out_proj's forward "
                           f"({case}): {err}. {hint}") from err
    return out


def _hook_verdict(got: torch.Tensor, expected: torch.Tensor, unhooked: torch.Tensor,
                  mistakes: list[tuple[str, torch.Tensor]], case: str, unchanged: str) -> None:
    if _close(got, expected, 1e-5):
        return
    if _close(got, unhooked, 1e-6):
        raise CheckFailure(unchanged.format(case=case))
    for message, wrong in mistakes:
        if _close(got, wrong, 1e-5):
            raise CheckFailure(f"Likely mistake ({case}): {message}.", mistake=message)
    raise CheckFailure(
        f"The model's output with your hook differs from its output with course_lib's ({case}): "
        f"largest difference {(got - expected).abs().max().item():.3g}. None of the usual mistakes "
        "explains it; print the input of out_proj before and after your hook for a small batch.")


def _replace_hook(change: Callable[[torch.Tensor], None]) -> Callable[..., Any]:
    """A pre-hook that clones out_proj's input, applies ``change`` to the clone, returns it."""

    def hook(module: Any, args: tuple) -> tuple:
        z = args[0].clone()
        change(z)
        return (z,)

    return hook


def _written_in_heads(h: int, hd: int, head: int, change: Callable[[torch.Tensor], None] | None = None
                      ) -> list[tuple[str, Callable[[torch.Tensor], None]]]:
    """The lesson's 4 heads written in where the model has ``h``: ``change(z4)`` on the (B, T, 4, -1)
    view (default: head ``head`` zeroed)."""
    d = h * hd
    if h == 4 or d % 4 or head >= 4:
        return []
    change = change or (lambda z4: z4[:, :, head].zero_())
    return [("the number of heads is written in as 4 (the lesson's model): this model has "
             f"{h} heads of {hd} numbers; use the argument num_heads, so the hook fits any layer",
             lambda z: change(z.view(*z.shape[:2], 4, -1)))]


def _only_four_heads(failure: CheckFailure, h: int, case: str) -> CheckFailure:
    """A failure in a case of ``h != 4`` heads after every 4-head case passed: say so."""
    message = str(failure)
    if "written in" in message:
        return failure
    return CheckFailure(
        f"Your hook is right for the lesson's 4 heads but not for {h} heads ({case}): is a number of "
        "heads or head_dim written in? Take num_heads from the argument and head_dim from the input, "
        f"args[0].size(-1) // num_heads. What the checker saw: {message}")


def _ablation_mistakes(model: GPT, ids: torch.Tensor, layer: int, head: int,
                       mean: torch.Tensor | None) -> list[tuple[str, torch.Tensor]]:
    h = model.config.num_heads
    hd = model.config.d_model // h
    fill = 0.0 if mean is None else mean
    variants: list[tuple[str, Callable[[torch.Tensor], None]]] = [
        ("interleaved slicing: z[..., head::num_heads] takes every num_heads-th number, but a head's "
         "output is a contiguous slice, numbers head * head_dim .. (head + 1) * head_dim - 1 "
         "(merge_heads puts the heads side by side)",
         lambda z: z[..., head::h].copy_(torch.zeros_like(z[..., head::h]) + fill)),
        ("the view has its axes the wrong way round: view(B, T, head_dim, num_heads) then [:, :, head] "
         "picks numbers across heads; view as (B, T, num_heads, head_dim)",
         lambda z: z.view(*z.shape[:2], hd, h)[:, :, head].copy_(
             torch.zeros_like(z.view(*z.shape[:2], hd, h)[:, :, head]) + fill)),
        ("every head is ablated, not only head `head`: change only its slice of the last axis",
         lambda z: z.view(*z.shape[:2], h, hd).copy_(torch.zeros_like(z.view(*z.shape[:2], h, hd))
                                                     + fill)),
    ]
    for other, word in ((head + 1, "the next"), (head - 1, "the previous")):
        if 0 <= other < h:
            variants.append((f"off by one head: you ablated {word} head ({other}, not {head}); head "
                             f"`head`'s slice starts at head * head_dim",
                             lambda z, o=other: z.view(*z.shape[:2], h, hd)[:, :, o].copy_(
                                 torch.zeros_like(z.view(*z.shape[:2], h, hd)[:, :, o]) + fill)))
    if mean is None:  # the lesson's head_dim, written in as a number (its slice reaches past head_dim)
        variants.append(("head_dim is written in as 32 (the lesson's model); compute it from the input, "
                         "head_dim = args[0].size(-1) // num_heads, so the hook fits any model",
                         lambda z: z[..., head * 32 : (head + 1) * 32].zero_()))
    if mean is None:
        variants += _written_in_heads(h, hd, head)
    if mean is not None:
        variants.append(("the mean is ignored: with `mean` given, the head's output becomes `mean` "
                         "(mean-ablation), not 0",
                         lambda z: z.view(*z.shape[:2], h, hd)[:, :, head].zero_()))
        variants.append(("the mean is subtracted from the head's output: mean-ablation REPLACES the "
                         "head's output by `mean`, so that nothing of this input's own output stays",
                         lambda z: z.view(*z.shape[:2], h, hd)[:, :, head].sub_(mean)))
    found = []
    for message, change in variants:
        try:
            found.append((message, _run_with(model, ids, layer, _replace_hook(change), "", "")))
        except CheckFailure:
            continue
    return found


def _changes_its_input(hook: Any, model: GPT, layer: int, shape: tuple[int, int]) -> bool:
    """Call ``hook`` on a tensor of out_proj's input shape ``(B, T, d_model)``: did it change that
    tensor in place?"""
    gen = torch.Generator().manual_seed(11)
    given = torch.randn(*shape, model.config.d_model, generator=gen)  # (B, T, h * head_dim)
    before = given.clone()
    try:
        hook(model.blocks.layers[layer].self_attn.out_proj, (given,))
    except Exception:  # noqa: BLE001 (the run through the model already passed)
        return False
    return not torch.equal(given, before)


# (num_heads, (B, T), layer, head, mean: None, "vector" (head_dim,) or "positions" (T, head_dim));
# d_model 48: heads of 12 (4 heads), 24 (2) and 16 (3) numbers, so a number written in shows
_ABLATION_CASES = [
    (4, (3, 10), 0, 1, None), (4, (3, 10), 1, 2, None), (4, (2, 7), 1, 0, "vector"),
    (4, (3, 10), 0, 3, None), (4, (1, 9), 0, 2, "positions"), (2, (4, 6), 1, 1, None),
    (2, (2, 5), 0, 0, "positions"), (3, (3, 8), 1, 2, "vector"), (3, (1, 4), 0, 1, None),
]

_UNCHANGED_ABLATION = (
    "Your hook changed nothing ({case}): the model's output equals the run without a hook. A forward "
    "pre-hook changes what out_proj receives only if it returns the new input (a tensor or a "
    "1-tuple), or changes args[0] in place; a changed copy that is not returned is thrown away.")

_IN_PLACE_NOTE = (
    "One note: your hook changes args[0], the tensor PyTorch passed in, in place. That works here, "
    "but other code may still hold that tensor (a hook that saved it, for one): change a clone, "
    "z = args[0].clone(), and return it.")


@checker
def check_ablation_hook(fn: Callable[..., Any]) -> None:
    """Check ``fn(head, num_heads, mean=None) -> pre-hook`` against ``interp.ablation_hook``,
    through random attention-only GPTs' logits: 4, 2 and 3 heads, batches of several shapes,
    zero- and mean-ablation, both layers."""
    _no_raw_errors(_check_ablation_hook)(fn)


def _check_ablation_hook(fn: Callable[..., Any]) -> None:
    _refuse_reference(fn, "the ablation hook")
    models = {h: _random_model(seed=12 + h, num_heads=h) for h in (4, 2, 3)}
    gen = torch.Generator().manual_seed(7)
    in_place = False
    try:
        for h, (B, T), layer, head, kind in _ABLATION_CASES:
            model = models[h]
            hd = model.config.d_model // h
            ids = torch.randint(0, model.config.vocab_size, (B, T), generator=gen)  # (B, T)
            unhooked = model(ids)
            mean = None
            if kind == "vector":
                mean = torch.randn(hd, generator=gen)
            elif kind == "positions":
                mean = torch.randn(T, hd, generator=gen)
            what = ("zero-ablation" if mean is None else
                    f"mean-ablation with mean of shape {tuple(mean.shape)}")
            case = (f"layer {layer}, head {head} of {h}, head_dim {hd}, {what}, "
                    f"input ({B}, {T}, {model.config.d_model})")
            args = (head, h) if mean is None else (head, h, mean.clone())
            try:
                hook, got = _learner_hook_output(
                    fn, args, interp.ablation_hook, model, ids, layer, case, "Your function calls "
                    "course_lib's interp.ablation_hook, the hook this exercise asks you to write.")
                with interp.hooked(model, layer, interp.ablation_hook(head, h, mean)):
                    expected = model(ids)
                if not _close(got, expected, 1e-5):
                    _hook_verdict(got, expected, unhooked,
                                  _ablation_mistakes(model, ids, layer, head, mean), case,
                                  _UNCHANGED_ABLATION)
            except CheckFailure as failure:
                if h == 4 or "course_lib" in str(failure):
                    raise
                raise _only_four_heads(failure, h, case) from failure
            in_place = in_place or _changes_its_input(hook, model, layer, (B, T))
    finally:
        for model in models.values():
            _remove_hooks(model)
    print(f"check_ablation_hook: all {len(_ABLATION_CASES)} cases (4, 2 and 3 heads, several batch "
          "shapes) match course_lib's reference (the model's logits with your hook). Well done!")
    if in_place:
        print(_IN_PLACE_NOTE)


# --- the patching hook (debug) ---------------------------------------------------------------

# (num_heads, layer, head, position): d_model 48, heads of 12, 24 and 16 numbers
_PATCH_CASES = [(4, 0, 1, None), (4, 1, 2, None), (4, 1, 0, 4), (4, 0, 3, 7), (4, 1, 3, 0),
                (2, 1, 1, None), (2, 0, 0, 3), (3, 1, 2, None), (3, 0, 1, 0)]

_POSITION_ZERO = (
    "With position=0 your hook changed the corrupted run as if no position were given: head {head}'s "
    "output was patched at every position ({case}). With position=4 and position=7 it patched only "
    "that position. What does your hook do differently when position is 0?")

_UNCHANGED_PATCH = (
    "The patched run's output equals the unpatched run's ({case}): the patch never reached "
    "out_proj. Hint: your hook writes the clean values somewhere; ask what out_proj then receives. "
    "The documentation of nn.Module.register_forward_pre_hook says which of the hook's doings "
    "PyTorch uses.")


def _patch_mistakes(model: GPT, ids: torch.Tensor, layer: int, head: int, clean: torch.Tensor,
                    position: int | None) -> list[tuple[str, torch.Tensor]]:
    h = model.config.num_heads
    T = ids.size(1)

    def heads(z: torch.Tensor) -> torch.Tensor:
        return z.view(*z.shape[:2], h, -1)  # (B, T, h, hd)

    def put(z: torch.Tensor, where: Any, which: Any, source: torch.Tensor) -> None:
        heads(z)[:, where, which] = source

    where = slice(None) if position is None else position
    variants: list[tuple[str, Callable[[torch.Tensor], None]]] = [
        ("every head is patched, not only head `head`: write clean[:, ..., head] into head `head`'s "
         "slice only", lambda z: put(z, where, slice(None), clean[:, where])),
        ("patched from the wrong tensor: you wrote zeros (an ablation), not the clean run's output",
         lambda z: put(z, where, head, 0.0)),
        ("interleaved slicing: a head's output is a contiguous slice of out_proj's input, numbers "
         "head * head_dim .. (head + 1) * head_dim - 1",
         lambda z: z.view(*z.shape[:2], -1, h)[:, where, :, head].copy_(clean[:, where, head])),
    ]
    for other in (head - 1, head + 1):
        if 0 <= other < h:
            variants.append((f"patched from the wrong tensor: you wrote head {other}'s clean output "
                             f"into head {head}; take clean[:, ..., head]",
                             lambda z, o=other: put(z, where, head, clean[:, where, o])))
            variants.append((f"off by one head: you patched head {other}, not head {head}",
                             lambda z, o=other: put(z, where, o, clean[:, where, o])))
            variants.append((f"off by one head: you wrote head {head}'s clean output into head "
                             f"{other}'s slice; head `head`'s slice starts at head * head_dim",
                             lambda z, o=other: put(z, where, o, clean[:, where, head])))
    if position is not None:
        variants.append((f"patched every position, though position={position} was given: with a "
                         "position, only that position changes",
                         lambda z: put(z, slice(None), head, clean[:, :, head])))
        for other in (position + 1, position - 1):
            if 0 <= other < T:
                variants.append((f"wrong position: you patched position {other}, not {position}",
                                 lambda z, o=other: put(z, o, head, clean[:, o, head])))
    found = []
    for message, change in variants:
        try:
            found.append((message, _run_with(model, ids, layer, _replace_hook(change), "", "")))
        except CheckFailure:
            continue
    return found


@checker
def check_patching_hook(fn: Callable[..., Any]) -> None:
    """Check ``fn(head, num_heads, clean (B, T, h, hd), position=None) -> pre-hook`` against
    ``interp.patching_hook``, through a random attention-only GPT's logits on a corrupted run."""
    _no_raw_errors(_check_patching_hook)(fn)


def _check_patching_hook(fn: Callable[..., Any]) -> None:
    _refuse_reference(fn, "the patching hook")
    gen = torch.Generator().manual_seed(8)
    n = _HOOK_T // 2
    runs = {}  # num_heads -> (model, corrupted ids, clean head outputs, unpatched logits)
    for h in (4, 2, 3):
        model = _random_model(seed=21 + h, num_heads=h)
        clean_ids = repeated_tokens(3, n, model.config.vocab_size, gen)  # (3, 2n): [r, r]
        other = torch.randint(0, model.config.vocab_size, (3, n), generator=gen)
        corrupted = torch.cat([other, clean_ids[:, n:]], dim=1)  # [r', r]
        runs[h] = (model, corrupted, interp.head_outputs(model, clean_ids), model(corrupted))
    in_place = False
    try:
        for h, layer, head, position in _PATCH_CASES:
            model, corrupted, clean_z, unpatched = runs[h]
            where = "every position" if position is None else f"position={position}"
            case = f"layer {layer}, head {head} of {h}, {where}, clean {tuple(clean_z[layer].shape)}"
            args = (head, h, clean_z[layer].clone())
            if position is not None:
                args += (position,)
            try:
                hook, got = _learner_hook_output(
                    fn, args, interp.patching_hook, model, corrupted, layer, case, "Your function "
                    "calls course_lib's interp.patching_hook: fix the given hook instead.")
                with interp.hooked(model, layer, interp.patching_hook(head, h, clean_z[layer],
                                                                      position)):
                    expected = model(corrupted)
                if not _close(got, expected, 1e-5) and position == 0:
                    with interp.hooked(model, layer, interp.patching_hook(head, h, clean_z[layer])):
                        everywhere = model(corrupted)
                    if _close(got, everywhere, 1e-5):
                        raise CheckFailure(_POSITION_ZERO.format(head=head, case=case))
                if not _close(got, expected, 1e-5):
                    _hook_verdict(got, expected, unpatched,
                                  _patch_mistakes(model, corrupted, layer, head, clean_z[layer],
                                                  position), case, _UNCHANGED_PATCH)
            except CheckFailure as failure:
                if h == 4 or "course_lib" in str(failure):
                    raise
                raise _only_four_heads(failure, h, case) from failure
            in_place = in_place or _changes_its_input(hook, model, layer, tuple(corrupted.shape))
    finally:
        for model, *_ in runs.values():
            _remove_hooks(model)
    print(f"check_patching_hook: all {len(_PATCH_CASES)} cases (4, 2 and 3 heads) match course_lib's "
          "reference (the corrupted run's logits with your patch). Well done!")
    if in_place:
        print(_IN_PLACE_NOTE)


# ----------------------------------------------------------------------------------------------
# check_patching_table (build, ★★★)
# ----------------------------------------------------------------------------------------------


def _patching_inputs(vocab_size: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``clean = [r, r]`` and ``corrupted = [r', r]``, each ``(8, 2n)``."""
    gen = torch.Generator().manual_seed(seed)
    clean = repeated_tokens(8, n, vocab_size, gen)
    other = torch.randint(0, vocab_size, (8, n), generator=gen)
    return clean, torch.cat([other, clean[:, n:]], dim=1)


def _patching_models() -> list[tuple[str, GPT, int]]:
    """``(description, model, n)``: the lesson's trained model and a random 3-layer, 2-head one."""
    try:
        trained, _ = load_checkpoint()
    except FileNotFoundError as err:
        raise CheckFailure(f"The trained model is missing: {err}.") from err
    random = _random_model(seed=5, num_layers=3, num_heads=2, d_model=64)
    return [("the lesson's trained model", trained, 12),
            ("a random attention-only model with 3 layers of 2 heads", random, 10)]


def _table_mistakes(model: GPT, clean: torch.Tensor, corrupted: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """``(message, (num_layers, h) table)`` of the usual mistakes, in float64."""
    c = model.config
    L, h, n = c.num_layers, c.num_heads, clean.size(1) // 2

    def logits(ids: torch.Tensor, layer: int | None = None, hook: Any = None) -> torch.Tensor:
        if layer is None:
            return model(ids[:, :-1]).double()
        with interp.hooked(model, layer, hook):
            return model(ids[:, :-1]).double()  # (B, 2n-1, V)

    def second(lg: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(lg[:, n - 1:].transpose(1, 2), targets[:, n:])

    def whole(lg: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(lg.transpose(1, 2), targets[:, 1:])

    def rows(lg: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # (B,) per-row second half
        return F.cross_entropy(lg[:, n - 1:].transpose(1, 2), targets[:, n:], reduction="none").mean(1)

    z_clean = interp.head_outputs(model, clean[:, :-1])
    z_corr = interp.head_outputs(model, corrupted[:, :-1])
    lg_clean, lg_corr = logits(clean), logits(corrupted)
    patched = [[logits(corrupted, l, interp.patching_hook(k, h, z_clean[l])) for k in range(h)]
               for l in range(L)]
    swapped = [[logits(clean, l, interp.patching_hook(k, h, z_corr[l])) for k in range(h)]
               for l in range(L)]

    def all_heads(z: torch.Tensor) -> Callable[..., Any]:
        return lambda module, args: (z.reshape(args[0].shape),)

    layers = [logits(corrupted, l, all_heads(z_clean[l])) for l in range(L)]

    def table(loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], runs: list, formula,
              clean_targets_for_corrupted: bool = True) -> torch.Tensor:
        low_t = clean if clean_targets_for_corrupted else corrupted
        low, high = loss(lg_corr, low_t), loss(lg_clean, clean)
        return torch.stack([torch.stack([formula(low, high, loss(runs[l][k], low_t))
                                         for k in range(h)]) for l in range(L)])

    fraction = lambda low, high, x: (low - x) / (low - high)  # noqa: E731
    ref = table(second, patched, fraction)

    def late_positions(l: int, k: int) -> Callable[..., Any]:  # only positions n-1 .. 2n-2 patched
        def hook(module: Any, args: tuple) -> tuple:
            z = args[0].clone().view(*args[0].shape[:2], h, -1)
            z[:, n - 1:, k] = z_clean[l][:, n - 1:, k]
            return (z.view(args[0].shape),)
        return hook

    late = [[logits(corrupted, l, late_positions(l, k)) for k in range(h)] for l in range(L)]
    return [
        ("only positions n-1 .. 2n-2 are patched (the ones whose predictions are scored): patch the "
         "head's output at every position; a later layer reads the earlier positions too",
         table(second, late, fraction)),
        ("the table holds 1 - patched / corrupted (the share of the corrupted loss removed); the share "
         "of the GAP closed is (corrupted loss - patched loss) / (corrupted loss - clean loss)",
         table(second, patched, lambda low, high, x: 1 - x / low)),
        ("not normalised: that is the raw drop in loss (nats); divide it by the whole gap, "
         "corrupted loss - clean loss, so that 1 means the head recovers all of it",
         table(second, patched, lambda low, high, x: low - x)),
        ("the sign is reversed (you computed 1 - fraction: the part of the gap that stays); the "
         "fraction closed is (corrupted loss - patched loss) / (corrupted loss - clean loss)", 1 - ref),
        ("the sign is reversed: the fraction closed is (corrupted loss - patched loss) / (corrupted "
         "loss - clean loss), positive when the patch helps", -ref),
        ("the direction is swapped: you patched the corrupted run's head output into the clean run; "
         "patch the clean run's output into the corrupted run",
         table(second, swapped, lambda low, high, x: (low - x) / (low - high))),
        ("the direction is swapped: you patched the corrupted run's head output into the clean run; "
         "patch the clean run's output into the corrupted run",
         table(second, swapped, lambda low, high, x: (x - high) / (low - high))),
        ("scored over the whole sequence: only the second half's tokens can be predicted (by "
         "copying); score the predictions of tokens n .. 2n-1, logits[:, n-1:] against clean[:, n:]",
         table(whole, patched, fraction)),
        ("scored over the whole sequence against the corrupted run's own tokens: score only the "
         "second half, against the clean run's next tokens, logits[:, n-1:] against clean[:, n:]",
         table(whole, patched, fraction, clean_targets_for_corrupted=False)),
        ("scored one position late: logits[:, n:] predict tokens n+1 .. 2n-1; the second half's "
         "first token is predicted at position n-1, so take logits[:, n-1:] against clean[:, n:]",
         table(lambda lg, t: F.cross_entropy(lg[:, n:].transpose(1, 2), t[:, n + 1:]), patched,
               fraction)),
        ("each position scored against its own token, not the next: position t predicts token t+1",
         table(lambda lg, t: F.cross_entropy(lg[:, n:].transpose(1, 2), t[:, n:-1]), patched,
               fraction)),
        ("patched the whole layer: every head of the layer gets the same number; patch one head's "
         "slice of out_proj's input at a time",
         torch.stack([fraction(second(lg_corr, clean), second(lg_clean, clean),
                               second(layers[l], clean)).repeat(h) for l in range(L)])),
        ("the fraction is averaged over rows: compute the mean losses over the whole batch first, "
         "then one fraction from them",
         torch.stack([torch.stack([fraction(rows(lg_corr, clean), rows(lg_clean, clean),
                                            rows(patched[l][k], clean)).mean()
                                   for k in range(h)]) for l in range(L)])),
    ]


def _cropping(failure: CheckFailure, n: int, case: str) -> CheckFailure:
    """A crash whose message names both 2n and 2n - 1 positions (or n + 1 and n predictions): the
    runs were not all cropped to ``inputs[:, :-1]``; anything else stays as it was."""
    numbers = set(re.findall(r"\d+", str(failure).split("):", 1)[-1]))
    if {str(2 * n), str(2 * n - 1)} <= numbers:
        what = ("two lengths meet: 2n = {a} positions (a run on the whole input) and 2n-1 = {b} "
                "(a run on inputs[:, :-1])").format(a=2 * n, b=2 * n - 1)
    elif {str(n + 1), str(n)} <= numbers:
        what = (f"n + 1 = {n + 1} predictions met n = {n} targets: logits[:, n-1:] of a run on the "
                "whole input (2n positions) reach one past the last target")
    else:
        return failure
    return CheckFailure(f"Your code raised an error where {what} ({case}). Run the model on "
                        "inputs[:, :-1] every time (the clean run that keeps the head outputs, the "
                        "corrupted and the patched runs): position t predicts token t + 1, so the "
                        "last token is never an input. What PyTorch said: "
                        f"{str(failure).split(': ', 1)[-1]}")


@checker
def check_patching_table(fn: Callable[..., Any]) -> None:
    """Check ``fn(model, clean, corrupted) -> (num_layers, h)`` against ``interp.patching_table`` on
    the trained checkpoint and on a random model; no hook may stay on the model afterwards."""
    _no_raw_errors(_check_patching_table)(fn)


def _check_patching_table(fn: Callable[..., Any]) -> None:
    _refuse_reference(fn, "the patching table")
    models = _patching_models()
    for k, (description, model, n) in enumerate(models):
        clean, corrupted = _patching_inputs(model.config.vocab_size, n, seed=30 + k)
        L, h = model.config.num_layers, model.config.num_heads
        case = f"{description}, clean = [r, r] and corrupted = [r', r] of shape {tuple(clean.shape)}"
        try:
            # interp.patching_table is wrapped by torch.no_grad, whose code every such wrapper
            # shares: watch the function inside
            with calls_to([inspect.unwrap(interp.patching_table)]) as seen, torch.enable_grad():
                try:
                    raw = _call(fn, model, clean.clone(), corrupted.clone(), case=case,
                                hint="Run the clean model once to keep each layer's head outputs, "
                                "then one corrupted run per head with a patching hook.")
                except CheckFailure as failure:
                    raise _cropping(failure, n, case) from failure
            if seen:
                raise CheckFailure("Your function calls course_lib's interp.patching_table, the "
                                   "table this exercise asks you to build.")
            left = _hooks_on(model)
            if left:
                raise CheckFailure(
                    f"Your function left {left} hook(s) registered on the model ({case}): every later "
                    "run of the model would still be patched. Remove each hook when its run is done "
                    "(handle.remove() in a finally:, or interp.hooked(...) as a with block).")
        finally:
            _remove_hooks(model)
        if isinstance(raw, torch.Tensor) and raw.dim() == 2 and tuple(raw.shape) != (L, h):
            raise CheckFailure(f"Wrong output shape ({case}): {tuple(raw.shape)}, expected (num_layers, "
                               f"num_heads) = {(L, h)}: read both from model.config.")
        got = _as_tensor(raw, (L, h), f"the table ({case})", "One number per head: (num_layers, h).")
        expected = interp.patching_table(model, clean, corrupted)
        if _close(got, expected, 1e-4):
            continue
        for message, wrong in _table_mistakes(model, clean, corrupted):
            if _close(got, wrong, 1e-4):
                raise CheckFailure(f"Likely mistake ({case}): {message}.", mistake=message)
        raise CheckFailure(
            f"Your table differs from course_lib's reference ({case}): largest difference "
            f"{(got.double() - expected.double()).abs().max().item():.3g}. None of the usual mistakes "
            "explains it; print the clean, corrupted and one patched loss, and compare with "
            "interp.loss_per_position.")
    print(f"check_patching_table: both models ({len(models)} cases) match course_lib's reference. "
          "Well done!")


# ----------------------------------------------------------------------------------------------
# check_ov_circuit (build, ★★★)
# ----------------------------------------------------------------------------------------------


def _ov_models() -> list[tuple[str, GPT, list[tuple[int, int]]]]:
    """``(description, model, [(layer, head), ...])``: random models of other sizes, then the
    lesson's trained one."""
    four = _random_model(seed=41, num_heads=4, d_model=48)
    two = _random_model(seed=42, num_heads=2, d_model=48)
    torch.manual_seed(43)
    eight = GPT(induction_config(num_layers=2, num_heads=8, d_model=64, num_kv_heads=4,
                                 vocab_size=40)).eval()
    with torch.no_grad():
        for p in eight.parameters():
            p.add_(0.05 * torch.randn_like(p))
    try:
        trained, _ = load_checkpoint()
    except FileNotFoundError as err:
        raise CheckFailure(f"The trained model is missing: {err}.") from err
    return [("a random model with 4 heads of 12", four, [(0, 1), (1, 3)]),
            ("a random model with 2 heads of 24", two, [(1, 0), (0, 1)]),
            ("a random model with 8 query heads sharing 4 key/value heads (GQA), vocabulary 40",
             eight, [(1, 5), (0, 2)]),
            ("the lesson's trained model", trained, [(1, 2)])]


def _ov_mistakes(model: GPT, layer: int, head: int) -> list[tuple[str, torch.Tensor]]:
    """``(message, (V, V))`` of the usual mistakes, in float64."""
    block = model.blocks.layers[layer]
    attn = block.self_attn
    hd, group = attn.head_dim, attn.num_heads // attn.num_kv_heads
    kv = head // group
    w_e = model.embed.token.embedding.weight.double()  # (V, d)
    centred = w_e - w_e.mean(dim=-1, keepdim=True)
    g, g_f = block.norm1.weight.double(), model.blocks.norm.weight.double()
    v_w = attn.v_proj.weight.double()
    o_w = attn.out_proj.weight.double()
    w_v = v_w[kv * hd:(kv + 1) * hd].T  # (d, hd)
    w_v_query_index = v_w[head * hd:(head + 1) * hd].T if (head + 1) * hd <= v_w.size(0) else None
    w_o = o_w[:, head * hd:(head + 1) * hd].T  # (hd, d)
    w_u = model.lm_head.weight.double().T  # (d, V)
    circuit = (centred * g) @ w_v @ w_o @ (w_u * g_f[:, None])
    found = [
        ("the embeddings are not centred: LayerNorm subtracts each vector's mean before anything "
         "reads it", (w_e * g) @ w_v @ w_o @ (w_u * g_f[:, None])),
        ("the layer's LayerNorm gain (norm1.weight) is missing: it scales what W_V reads",
         centred @ w_v @ w_o @ (w_u * g_f[:, None])),
        ("the final LayerNorm's gain (model.blocks.norm.weight) is missing: it scales what W_U reads",
         (centred * g) @ w_v @ w_o @ w_u),
        ("both LayerNorm gains are missing", centred @ w_v @ w_o @ w_u),
        ("rows and columns are swapped: row a must be what the head adds to every logit when it "
         "attends to token a (the source token indexes the rows)", circuit.T),
        ("interleaved slicing: a head's numbers are a contiguous block, head * head_dim .. "
         "(head + 1) * head_dim - 1, of v_proj's rows and of out_proj's columns",
         (centred * g) @ v_w[kv::attn.num_kv_heads].T @ o_w[:, head::attn.num_heads].T
         @ (w_u * g_f[:, None])),
    ]
    if group > 1 and w_v_query_index is not None:
        found.append(("with grouped-query attention, query head `head` reads key/value head "
                      "head // (num_heads // num_kv_heads): v_proj has only num_kv_heads heads",
                      (centred * g) @ w_v_query_index @ w_o @ (w_u * g_f[:, None])))
    return found


@checker
def check_ov_circuit(fn: Callable[..., Any]) -> None:
    """Check ``fn(model, layer, head) -> (V, V)`` against ``interp.full_ov_circuit`` on random models
    of 4, 2 and 8 heads (GQA) and on the trained checkpoint."""
    _no_raw_errors(_check_ov_circuit)(fn)


def _check_ov_circuit(fn: Callable[..., Any]) -> None:
    _refuse_reference(fn, "the full OV circuit")
    count = 0
    for description, model, heads in _ov_models():
        V = model.config.vocab_size
        for layer, head in heads:
            case = f"{description}, head {layer}.{head}"
            attn = model.blocks.layers[layer].self_attn
            with calls_to([inspect.unwrap(interp.full_ov_circuit)]) as seen, torch.enable_grad():
                try:
                    raw = _call(fn, model, layer, head, case=case,
                                hint="Return the (V, V) product for head `head` of layer `layer`.")
                except CheckFailure as failure:
                    if attn.num_kv_heads == attn.num_heads or "ran for more than" in str(failure):
                        raise
                    raise CheckFailure(
                        f"Your code stopped on grouped-query attention ({case}): v_proj has only "
                        f"num_kv_heads * head_dim = {attn.num_kv_heads * attn.head_dim} rows here, and "
                        "query head h reads key/value head h // (num_heads // num_kv_heads). What the "
                        f"checker saw: {failure}") from failure
            if seen:
                raise CheckFailure("Your function calls course_lib's interp.full_ov_circuit, the "
                                   "circuit this exercise asks you to build.")
            got = _as_tensor(raw, (V, V), f"the circuit ({case})",
                             "One row and one column per token: (vocab_size, vocab_size).")
            expected = interp.full_ov_circuit(model, layer, head).double()
            scale = expected.abs().max().item()
            if _close(got / scale, expected / scale, 1e-5):
                count += 1
                continue
            for message, wrong in _ov_mistakes(model, layer, head):
                if _close(got / scale, wrong.detach() / scale, 1e-5):
                    raise CheckFailure(f"Likely mistake ({case}): {message}.", mistake=message)
            if _close(got / scale, -expected / scale, 1e-5):
                raise CheckFailure(f"The sign is reversed ({case}): row a must be what the head ADDS.")
            raise CheckFailure(
                f"Your circuit differs from course_lib's reference ({case}): largest difference "
                f"{(got.double() - expected).abs().max().item():.3g} (the entries reach {scale:.3g}). "
                "None of the usual mistakes explains it; compare the shapes of each factor with the "
                "definition, one step at a time.")
    print(f"check_ov_circuit: all {count} heads (4, 2 and 8 heads, GQA, the trained model) match "
          "course_lib's reference. Well done!")
