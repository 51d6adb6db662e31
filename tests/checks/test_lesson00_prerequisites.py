"""Lesson 00 self-check: right answers in several forms pass, each wrong answer is explained."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import passes
import torch
from torch import nn

from course_lib.checks import check_broadcast_shape, check_gradient_prediction, check_parameter_count
from course_lib.solutions import lesson00


# ---------------------------------------------------------------- broadcast shape

A, B = (2, 1, 4), (3, 1)


@pytest.mark.parametrize("answer", [(2, 3, 4), [2, 3, 4], torch.Size([2, 3, 4]), np.array([2, 3, 4])])
def test_broadcast_right_answers_pass(answer, capsys):
    assert passes(check_broadcast_shape, lambda: answer, A, B)
    assert "right, (2, 3, 4)" in capsys.readouterr().out


@pytest.mark.parametrize("answer", ["error", " Error "])
def test_broadcast_error_is_a_right_answer_when_it_fails(answer, capsys):
    assert passes(check_broadcast_shape, lambda: answer, (2, 1, 4), (3, 2))
    assert "right, an error" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    ("error", r"It does broadcast, to \(2, 3, 4\).*\(2, 1, 4\) and \(_, 3, 1\)"),
    ((2, 3), r"as many axes as the longer shape, 3"),
    ((3, 1, 4), r"Not \(3, 1, 4\), but \(2, 3, 4\): axis 0: 2 with 1 gives 2, not 3; axis 1: 1 with 3"),
    ((2, 3, 1), r"axis 2: 4 with 1 gives 4, not 1"),
    ((2, 1, 4), r"that is the shape of a unchanged.*every size-1 axis is stretched"),
    ((3, 1), r"that is the shape of b unchanged"),
    ((2, 1, 4, 3, 1), r"does not put the shapes side by side"),
    ([2, "x"], "Return a shape as a tuple"),
    ("x", "Return a shape as a tuple"),
])
def test_broadcast_wrong_answers_are_explained(answer, words):
    with pytest.raises(AssertionError, match=words):
        check_broadcast_shape(lambda: answer, A, B)


def test_broadcast_shape_that_fails_is_explained():
    with pytest.raises(AssertionError, match="do not broadcast.*two different sizes"):
        check_broadcast_shape(lambda: (2, 3, 4), (2, 1, 4), (3, 2))


# ---------------------------------------------------------------- gradient

def f(x):
    return (x ** 2).sum()


X = [1.0, 2.0, 3.0]


@pytest.mark.parametrize("answer", [[2, 4, 6], (2.0, 4.0, 6.0), torch.tensor([2.0, 4.0, 6.0]),
                                    np.array([2.0, 4.0, 6.0])])
def test_gradient_right_answers_pass(answer, capsys):
    assert passes(check_gradient_prediction, lambda: answer, f, X)
    assert "right, x.grad = [2.0, 4.0, 6.0]" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    (14.0, r"x.grad has 3 numbers.*14 is y itself"),
    (12.0, r"x.grad has 3 numbers, one per element; you returned 1\. x.grad holds"),
    ([1, 4, 9], r"are the values x_i \*\* 2, not their slopes"),
    ([2, 4, 5], r"Not \[2.0, 4.0, 5.0\].*here \[2.0, 4.0, 6.0\]"),
    ([1, 2, 3], r"is x itself"),
    ([1, 1, 1], r"All ones is the gradient of a plain sum"),
    ([2, 2, 2], r"2 for every element drops the x"),
    ([4, 8, 12], r"twice the gradient: what .grad holds after TWO backward passes"),
    ([0, 0, 0], r"All zeros would mean y does not change"),
    (None, r"None is what x.grad holds BEFORE any backward"),
    ("six", "Return one number per element of x"),
])
def test_gradient_wrong_answers_are_explained(answer, words):
    with pytest.raises(AssertionError, match=words):
        check_gradient_prediction(lambda: answer, f, X)


def test_gradient_truth_comes_from_autograd():
    assert passes(check_gradient_prediction, lambda: [3.0, 3.0], lambda x: (3 * x).sum(), [5.0, -1.0])


# ---------------------------------------------------------------- parameter count

class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(4, 8)
        self.out = nn.Linear(8, 2, bias=False)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


@pytest.mark.parametrize("answer", [56, 56.0, np.int64(56), torch.tensor(56)])
def test_parameter_count_right_answers_pass(answer, capsys):
    assert passes(check_parameter_count, lambda: answer, TwoLayer())
    assert "right, 56" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    (48, "You counted the weights only"),
    (58, "bias=False has no bias"),
    (40, "You counted one layer only"),
    (16, "You counted one layer only"),
    (14, r"counted the layers' sizes \(units\)"),
    (64, "A bias has one entry per OUTPUT feature"),
    (50, r"Not 50, but 56\..*hidden.weight \(8, 4\) = 32, hidden.bias \(8,\) = 8, out.weight \(2, 8\) = 16"),
    (56.5, "Return one whole number"),
    ("56", "Return one whole number"),
])
def test_parameter_count_wrong_answers_are_explained(answer, words):
    with pytest.raises(AssertionError, match=words):
        check_parameter_count(lambda: answer, TwoLayer())


# ---------------------------------------------------------------- stubs and solutions

def test_stubs_print_not_implemented(capsys):
    def predicted_parameter_count():
        raise NotImplementedError

    assert check_parameter_count(predicted_parameter_count, TwoLayer()) is None
    assert "`predicted_parameter_count` is not implemented yet" in capsys.readouterr().out


def test_solutions_pass():
    assert passes(check_broadcast_shape, lesson00.predicted_broadcast_shape, A, B)
    assert passes(check_gradient_prediction, lesson00.predicted_gradient, f, X)
    assert passes(check_parameter_count, lesson00.predicted_parameter_count, TwoLayer())


# ---------------------------------------------------------------- answers that lie (#49)

class EqualToAll(str):
    """A str subclass equal to everything, whose strip/lower keep it."""

    def __eq__(self, other):
        return True

    __hash__ = str.__hash__

    def strip(self, *chars):
        return self

    def lower(self):
        return self


class Flatterer(tuple):
    def __eq__(self, other):
        return True

    __hash__ = tuple.__hash__


class IntEqualToAll(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


class LyingTensor(torch.Tensor):
    """A tensor subclass for which every comparison says "equal"."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.allclose, torch.equal, torch.Tensor.allclose, torch.Tensor.equal, torch.Tensor.__eq__):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})


def test_answers_that_claim_equality_are_refused():
    assert torch.allclose(torch.zeros(3).as_subclass(LyingTensor), torch.ones(3))  # the lie, unchecked
    with pytest.raises(AssertionError, match="Return a shape as a tuple"):
        check_broadcast_shape(lambda: EqualToAll("anything"), (2, 1, 4), (3, 2))  # the truth is "error"
    with pytest.raises(AssertionError, match=r"Not \(9, 9\)"):
        check_broadcast_shape(lambda: Flatterer((9, 9)), A, B)
    with pytest.raises(AssertionError, match="All zeros would mean"):
        check_gradient_prediction(lambda: torch.zeros(3).as_subclass(LyingTensor), f, X)
    with pytest.raises(AssertionError, match="Not 1, but 56"):
        check_parameter_count(lambda: IntEqualToAll(1), TwoLayer())
    with pytest.raises(AssertionError, match="Not 1, but 56"):
        check_parameter_count(lambda: torch.tensor(1).as_subclass(LyingTensor), TwoLayer())


def test_plain_answers_of_subclasses_still_pass():
    """A subclass that does not lie is judged by its value."""
    assert passes(check_broadcast_shape, lambda: EqualToAll("error"), (2, 1, 4), (3, 2))
    assert passes(check_broadcast_shape, lambda: Flatterer((2, 3, 4)), A, B)
    assert passes(check_gradient_prediction, lambda: torch.tensor([2.0, 4.0, 6.0]).as_subclass(LyingTensor), f, X)
    assert passes(check_parameter_count, lambda: IntEqualToAll(56), TwoLayer())
