"""Helpers shared by the course_lib tests (imported, not a conftest): weight copying, tolerances.

A test module gets the seeding fixture with `from _helpers import seeded  # noqa: F401`.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

from course_lib.solutions import solution_source

ATOL = 1e-5  # the bound on max |ours - PyTorch|


def assert_close(got: torch.Tensor, expected: torch.Tensor, atol: float = ATOL) -> None:
    """Max absolute difference <= atol (no relative slack)."""
    torch.testing.assert_close(got, expected, atol=atol, rtol=0)


@torch.no_grad()
def copy_mha(ours, theirs: nn.MultiheadAttention) -> None:
    """course_lib.MultiHeadAttention -> nn.MultiheadAttention (in_proj = cat of q, k, v)."""
    theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
    theirs.out_proj.weight.copy_(ours.out_proj.weight)
    theirs.out_proj.bias.copy_(ours.out_proj.bias)


@torch.no_grad()
def copy_layer(ours, theirs) -> None:
    """EncoderLayer / DecoderLayer -> nn.TransformerEncoderLayer / TransformerDecoderLayer."""
    copy_mha(ours.self_attn, theirs.self_attn)
    if hasattr(ours, "cross_attn"):
        copy_mha(ours.cross_attn, theirs.multihead_attn)  # PyTorch's name for cross-attention
    theirs.linear1.load_state_dict(ours.feed_forward.linear1.state_dict())
    theirs.linear2.load_state_dict(ours.feed_forward.linear2.state_dict())
    for name in ("norm1", "norm2", "norm3"):
        if hasattr(ours, name):
            getattr(theirs, name).load_state_dict(getattr(ours, name).state_dict())


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def failure(check, candidate):
    """Run ``check(candidate)``, which must refuse it; return the ``CheckFailure`` (its message, its
    ``mistake``)."""
    from course_lib.checks import CheckFailure

    with pytest.raises(CheckFailure) as info:
        check(candidate)
    return info.value


def passes(check, candidate, *args, **kwargs) -> bool:
    """Run ``check(candidate, ...)``: True if it passed (checkers return None and raise on a mistake)."""
    from course_lib.checks import has_passed

    assert check(candidate, *args, **kwargs) is None  # a checker never returns a value to display
    return has_passed(candidate)


def assert_checkers_keep_random_state(pairs) -> None:
    """Each ``(check, solution)``: running the checker leaves torch's global random state as it was."""
    for check, solution in pairs:
        torch.manual_seed(123)
        check(solution)
        after = torch.rand(3)
        torch.manual_seed(123)
        assert torch.equal(after, torch.rand(3)), check.__name__


def solution_namespace(key: str) -> dict:
    """The names the solution block ``key`` ("NN.name") defines, run with the header imports of its
    lesson's solution file (course_lib/solutions/lessonNN.py), as the solutions run pastes it."""
    module = importlib.import_module(f"course_lib.solutions.lesson{key.split('.')[0]}")
    namespace: dict = dict(vars(module))
    exec(solution_source(key), namespace)  # noqa: S102  (our own solution file)
    return namespace


def as_library(fn, module: str):
    """``fn`` re-created as if defined in ``module`` (its calls then look like that library's): a
    learner's code that calls a library under the hood."""
    namespace = {"__name__": module}
    exec(f"def {fn.__name__}(*args):\n    return _impl(*args)\n", namespace)  # noqa: S102
    namespace["_impl"] = fn
    impostor = namespace[fn.__name__]
    impostor.__module__ = module
    return impostor


def running_children() -> list:
    """This process's descendants that still run: a zombie has ended (another module's child, not
    yet reaped by its owner) and a process gone meanwhile is not counted."""
    import psutil

    running = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                running.append(child)
        except psutil.NoSuchProcess:
            pass
    return running
