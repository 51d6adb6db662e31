"""Checkers for the five-minute self-check of lesson 00: what the course expects you to know.

Each question is "predict, then run": you return a value, the checker computes the truth itself
with PyTorch, compares, and explains the right answer.

* ``check_broadcast_shape(fn, shape_a, shape_b)``: ``fn()`` returns the shape of ``a + b`` for
  tensors of those shapes, or ``"error"`` if they do not broadcast.
* ``check_gradient_prediction(fn, f, x)``: ``fn()`` returns ``x.grad`` (one number per element of
  ``x``) after ``f(x).backward()``.
* ``check_parameter_count(fn, module)``: ``fn()`` returns the number of learnable numbers in
  ``module``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .common import CheckFailure, checker, plain, run_learner

__all__ = ["check_broadcast_shape", "check_gradient_prediction", "check_parameter_count"]


def _aligned(shape_a: Sequence[int], shape_b: Sequence[int]) -> str:
    """The shapes lined up from the right, as broadcasting compares them: (2, 1, 4), (_, 3, 1)."""
    n = max(len(shape_a), len(shape_b))
    padded = [["_"] * (n - len(shape)) + [str(s) for s in shape] for shape in (shape_a, shape_b)]
    return " and ".join("(" + ", ".join(cells) + ")" for cells in padded)


@checker
def check_broadcast_shape(
    fn: Callable[[], Any], shape_a: Sequence[int], shape_b: Sequence[int]
) -> None:
    """Predict: the shape of ``a + b`` (``a``: ``shape_a``, ``b``: ``shape_b``), or "error"."""
    shape_a, shape_b = tuple(shape_a), tuple(shape_b)
    # the learner's answer first: the truth is not yet in this frame for their code to read (#49)
    answer = plain(run_learner(fn, case="your prediction",
                               hint="predicted_broadcast_shape() takes no argument and returns a tuple."))
    try:
        truth: tuple[int, ...] | str = tuple(torch.broadcast_shapes(shape_a, shape_b))
    except RuntimeError:
        truth = "error"
    if isinstance(answer, str):
        if answer.strip().lower() != "error":
            raise CheckFailure(f"Return a shape as a tuple, e.g. (2, 3), or the string \"error\"; "
                               f"got {answer!r}.")
        got: tuple[int, ...] | str = "error"
    else:
        try:
            got = tuple(int(s) for s in answer)
        except (TypeError, ValueError):
            raise CheckFailure(f"Return a shape as a tuple, e.g. (2, 3), or the string "
                               f"\"error\"; got {answer!r}.") from None
    rule = (f"Broadcasting lines the shapes up from the right, {_aligned(shape_a, shape_b)}; in "
            "each column the sizes must be equal or one of them 1 (a missing axis counts as 1), "
            "and a 1 is stretched to the other size")
    if got == truth:
        result = "an error" if truth == "error" else str(truth)
        print(f"check_broadcast_shape: right, {result}. {rule}.")
        return
    if got == "error":
        raise CheckFailure(f"It does broadcast, to {truth}. {rule}: nothing clashes here.")
    if truth == "error":
        raise CheckFailure(f"These shapes do not broadcast: adding them raises an error. {rule}; "
                           "here one column holds two different sizes, neither of them 1.")
    if isinstance(got, tuple) and got in (shape_a, shape_b):
        raise CheckFailure(f"Not {got}: that is the shape of {'a' if got == shape_a else 'b'} unchanged. "
                           f"The result is {truth}: every size-1 axis is stretched to the other "
                           f"shape's size. {rule}.")
    if isinstance(got, tuple) and got == tuple(shape_a) + tuple(shape_b):
        raise CheckFailure(f"Not {got}: broadcasting does not put the shapes side by side, it lines "
                           f"them up from the right. The result is {truth}. {rule}.")
    if isinstance(got, tuple) and len(got) != len(truth):
        raise CheckFailure(f"Not {got}: the result has as many axes as the longer shape, "
                           f"{len(truth)}, so it is {truth}. {rule}.")
    n = len(truth)
    a_cols = [1] * (n - len(shape_a)) + list(shape_a)
    b_cols = [1] * (n - len(shape_b)) + list(shape_b)
    wrong = [f"axis {i}: {a} with {b} gives {t}, not {g}"
             for i, (a, b, t, g) in enumerate(zip(a_cols, b_cols, truth, got)) if t != g]
    raise CheckFailure(f"Not {got}, but {truth}: {'; '.join(wrong)}. {rule}.")


@checker
def check_gradient_prediction(
    fn: Callable[[], Any], f: Callable[[torch.Tensor], torch.Tensor], x: Sequence[float]
) -> None:
    """Predict: ``x.grad`` after ``y = f(x)`` and ``y.backward()`` for ``x = torch.tensor(x)``."""
    # the learner's answer first: the truth is not yet in this frame for their code to read (#49)
    answer = plain(run_learner(fn, case="your prediction",
                               hint="predicted_gradient() takes no argument and returns a list."))
    x_t = torch.tensor(list(x), dtype=torch.float32, requires_grad=True)
    y = f(x_t)
    y.backward()
    truth = x_t.grad.detach()
    meaning = ("x.grad holds dy/dx_i, how much y changes per unit change of each x_i, with the "
               "same shape as x")
    if answer is None:
        raise CheckFailure(f"None is what x.grad holds BEFORE any backward (the cell above prints it). "
                           f"y.backward() fills it. {meaning}: here {[round(v, 4) for v in truth.tolist()]}.")
    try:
        got = plain(torch.as_tensor(answer, dtype=torch.float32)).flatten()  # (a plain tensor, whatever
        # __torch_function__ the answer's own type has)
    except (TypeError, ValueError, RuntimeError):
        raise CheckFailure(f"Return one number per element of x, e.g. [0.5, 1.0, 1.5]; "
                           f"got {answer!r}.") from None
    values = [round(v, 4) for v in truth.tolist()]
    rule = f"{meaning}: here {values}"
    if got.shape == truth.shape and torch.allclose(got, truth, atol=1e-3):
        print(f"check_gradient_prediction: right, x.grad = {values}. {meaning}.")
        return
    if got.numel() != truth.numel():
        extra = ""
        if got.numel() == 1 and abs(got.item() - y.item()) < 1e-3:
            extra = f" {got.item():g} is y itself, the value of the function, not its slope."
        raise CheckFailure(f"x has {truth.numel()} elements, so x.grad has {truth.numel()} "
                           f"numbers, one per element; you returned {got.numel()}.{extra} {rule}.")
    with torch.no_grad():
        squares = x_t.detach() ** 2
    if not bool(got.any()):
        raise CheckFailure(f"All zeros would mean y does not change when x does. backward() writes the "
                           f"slopes into .grad right away; no optimizer step is needed. {rule}.")
    if torch.allclose(got, squares, atol=1e-3):
        raise CheckFailure(f"{got.tolist()} are the values x_i ** 2, not their slopes. {rule}.")
    if torch.allclose(got, x_t.detach(), atol=1e-3) and not torch.allclose(truth, x_t.detach()):
        raise CheckFailure(f"{got.tolist()} is x itself. The slope of each term is its derivative "
                           f"(for x_i ** 2 that is 2 * x_i), not the value of x_i. {rule}.")
    if torch.allclose(got, torch.full_like(got, 2.0), atol=1e-3):
        raise CheckFailure(f"2 for every element drops the x: the derivative of x_i ** 2 is 2 * x_i, "
                           f"which depends on x_i. {rule}.")
    if torch.allclose(got, torch.ones_like(got), atol=1e-3):
        raise CheckFailure(f"All ones is the gradient of a plain sum, x_1 + x_2 + x_3; here each term "
                           f"is a function of x_i, and the chain rule multiplies by its slope. {rule}.")
    if torch.allclose(got, 2 * truth, atol=1e-3):
        raise CheckFailure(f"{got.tolist()} is twice the gradient: what .grad holds after TWO "
                           f"backward passes, since they add up. After one backward: {rule}.")
    raise CheckFailure(f"Not {got.tolist()}. {rule}.")


def _breakdown(module: nn.Module) -> str:
    parts = [f"{name} {tuple(p.shape)} = {p.numel()}" for name, p in module.named_parameters()]
    return ", ".join(parts)


@checker
def check_parameter_count(fn: Callable[[], Any], module: nn.Module) -> None:
    """Predict: how many learnable numbers does ``module`` hold (the sum of ``p.numel()``)?"""
    # the learner's answer first: the truth is not yet in this frame for their code to read (#49)
    answer = plain(run_learner(fn, case="your prediction",
                               hint="predicted_parameter_count() takes no argument and returns an int."))
    params = dict(module.named_parameters())
    truth = sum(p.numel() for p in params.values())
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        answer = answer.item()
    if hasattr(answer, "item") and not isinstance(answer, (str, bytes)):  # a NumPy number
        answer = answer.item()
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or answer != int(answer):
        raise CheckFailure(f"Return one whole number, the count; got {answer!r}.")
    got = int(answer)
    rule = (f"nn.Linear(in_features, out_features) holds a weight (out_features, in_features) and, "
            f"unless bias=False, a bias (out_features,): {_breakdown(module)}")
    if got == truth:
        print(f"check_parameter_count: right, {truth}. {rule}.")
        return
    biases = sum(p.numel() for name, p in params.items() if name.endswith("bias"))
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    hints = []
    if got == truth - biases:
        hints.append("You counted the weights only: the biases are parameters too.")
    if any(m.bias is None and got == truth + m.out_features for m in linears):
        hints.append("A layer made with bias=False has no bias.")
    for m in linears:
        if (m.bias is None and got == truth + m.in_features) or (
                m.bias is not None and m.in_features != m.out_features
                and got == truth - m.out_features + m.in_features):
            hints.append("A bias has one entry per OUTPUT feature, (out_features,), and only when "
                         "bias=True.")
            break
    if got == sum(m.in_features for m in linears[:1]) + sum(m.out_features for m in linears):
        hints.append("You counted the layers' sizes (units), not the learnable numbers: every "
                     "input-output pair has its own weight.")
    for m in linears:
        own = sum(p.numel() for p in m.parameters())
        if got == own and own != truth:
            hints.append("You counted one layer only: every nn.Linear inside the module counts.")
            break
    raise CheckFailure(" ".join([f"Not {got}, but {truth}."] + hints + [f"{rule}."]))
