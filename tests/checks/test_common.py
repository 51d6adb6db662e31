"""What every checker shares (course_lib/checks/common.py): time limits that nest in the grader's.

The grader limits a whole checker with a SIGALRM timer (course_lib/grading/kernel_side.py). A checker's
own limits (``time_limit``, lesson 10's speed rule) run inside it: they must never cancel it, and the
earlier deadline must win.
"""

from __future__ import annotations

import signal
import time

import pytest
from _helpers import solution_namespace

from course_lib.checks import CheckFailure, check_bpe_encode
from course_lib.checks.common import alarm_within, time_limit


class OuterTimeout(BaseException):
    """What the grader's own handler raises."""


@pytest.fixture
def outer_timer():
    """A grader-like timer: ``start(seconds)`` arms it; it is always disarmed afterwards."""
    def raise_outer(signum, frame):  # noqa: ARG001
        raise OuterTimeout

    previous = signal.signal(signal.SIGALRM, raise_outer)
    yield lambda seconds: signal.setitimer(signal.ITIMER_REAL, seconds)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_a_checker_limit_leaves_the_graders_timer_running(outer_timer):
    outer_timer(2.0)
    with time_limit(30, "too slow"):
        _spin(0.1)
    left = signal.getitimer(signal.ITIMER_REAL)[0]
    assert 1.5 < left < 2.0, left  # put back with what it had left, not cancelled
    with pytest.raises(OuterTimeout):
        _spin(5)


def test_the_earlier_deadline_wins(outer_timer):
    outer_timer(0.2)
    with pytest.raises(OuterTimeout):  # the grader's limit first: its handler decides
        with time_limit(30, "too slow"):
            _spin(5)
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0  # spent: not armed again to fire a second time
    outer_timer(30)
    with pytest.raises(CheckFailure, match="too slow"):  # the checker's limit first
        with time_limit(0.2, "too slow"):
            _spin(5)
    assert signal.getitimer(signal.ITIMER_REAL)[0] > 25  # and the grader's still runs


def test_without_an_outer_timer_nothing_is_left_armed():
    def stop():
        raise CheckFailure("stopped")

    with pytest.raises(CheckFailure, match="stopped"):
        with alarm_within(0.1, stop):
            _spin(5)
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0


def test_lesson_10s_speed_rule_keeps_the_graders_timer(outer_timer):
    outer_timer(600.0)
    check_bpe_encode(solution_namespace("10.bpe_encode")["bpe_encode"])
    assert signal.getitimer(signal.ITIMER_REAL)[0] > 300  # the lesson 10 checker used to set it to 0


# ---------------------------------------------------------------- plain: a learner's answer as exact built-ins (#49)

def test_plain_copies_subclasses_into_their_base_types():
    import numpy as np
    import torch

    from course_lib.checks.common import plain

    class Liar(str):
        def __eq__(self, other):
            return True

        __hash__ = str.__hash__

    class Lying(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is torch.allclose:
                return True
            return super().__torch_function__(func, types, args, kwargs or {})

    class Number(float):
        def __eq__(self, other):
            return True

        __hash__ = float.__hash__

    got = plain([Liar("a"), (Number(1.5), torch.Size([2, 3])), None, True])
    assert got == ["a", (1.5, (2, 3)), None, True]
    assert [type(got[0]), type(got[1][0]), type(got[1][1])] == [str, float, tuple]
    assert plain(Liar("a")) != "b"
    tensor = plain(torch.zeros(3).as_subclass(Lying))
    assert type(tensor) is torch.Tensor and not torch.allclose(tensor, torch.ones(3))
    assert (plain(np.int64(5)), type(plain(np.int64(5)))) == (5, int)
    assert type(plain(np.arange(3))) is torch.Tensor
    other = object()
    assert plain(other) is other  # not a subclass of a plain type: the checker's own message refuses it


def test_plain_refuses_a_subclass_that_does_not_convert():
    import torch

    from course_lib.checks.common import plain

    class Broken(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            raise RuntimeError("no")

    class NoData(torch.Tensor):
        """A wrapper subclass: no storage of its own, every operation its __torch_dispatch__'s."""

        @staticmethod
        def __new__(cls, shape):
            return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.float32)

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise RuntimeError("no data")

    class Deep(list):
        pass

    nested: list = []
    for _ in range(20):
        nested = Deep([nested])
    with pytest.raises(CheckFailure, match="nested too deeply"):
        plain(nested)
    with pytest.raises(CheckFailure, match="a NoData, a subclass that does not convert to a plain Tensor"):
        plain(NoData((3,)))
    broken = torch.Tensor._make_subclass(Broken, torch.zeros(2))
    assert type(plain(broken)) is torch.Tensor  # its __torch_function__ is not consulted at all


def test_shared_comparisons_judge_plain_values():
    """compare() and close(), which lessons 02-14's checkers share, never run a subclass's own methods."""
    import torch

    from course_lib.checks.common import Mistake, close, compare

    class Lying(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func in (torch.allclose, torch.Tensor.__eq__, torch.equal):
                return True
            return super().__torch_function__(func, types, args, kwargs or {})

    liar = torch.zeros(2, 3).as_subclass(Lying)
    assert not close(liar, torch.ones(2, 3)) and not close((liar,), (torch.ones(2, 3),))
    with pytest.raises(CheckFailure, match="differs"):
        compare(liar, torch.ones(2, 3), (), [Mistake("unused", "", lambda: torch.full((2, 3), 5.0))], "a case")
    compare(torch.ones(2, 3).as_subclass(Lying), torch.ones(2, 3), (), [], "a case")  # right values pass


def test_a_lying_tensor_is_refused_by_a_lesson_02_checker():
    import torch

    from course_lib.checks import check_split_heads

    split = solution_namespace("02.split_heads")["split_heads"]

    class Lying(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func in (torch.allclose, torch.equal):
                return True
            return super().__torch_function__(func, types, args, kwargs or {})

    def lying_split(x, num_heads):
        return torch.zeros_like(split(x, num_heads)).as_subclass(Lying)

    with pytest.raises(CheckFailure):
        check_split_heads(lying_split)
    check_split_heads(split)


def test_calls_to_sees_a_reference_run_on_a_thread_started_inside():
    """#49: course_lib's RMSNorm run on a worker thread was not refused (11.rmsnorm)."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from course_lib.checks import check_rmsnorm
    from course_lib.checks.common import calls_to
    from course_lib.modern import RMSNorm

    def reference(x):
        return x * 2

    with calls_to([reference]) as seen:
        with ThreadPoolExecutor(1) as pool:
            pool.submit(reference, 1).result()
    assert seen == [reference]

    class OnAThread(torch.nn.Module):
        def __init__(self, d_model, eps=1e-6):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(d_model))
            self.eps = eps

        def forward(self, x):
            norm = RMSNorm(x.size(-1), eps=self.eps)
            norm.weight = self.weight
            with ThreadPoolExecutor(1) as pool:
                return pool.submit(norm, x).result()

    with pytest.raises(CheckFailure, match="RMSNorm"):
        check_rmsnorm(OnAThread)


def test_a_failed_check_shows_its_message_alone_in_jupyter(capsys):
    """IPython renders a CheckFailure by its message: no frame of the checker, whose source lines name
    the mistakes it tells apart (tryout 13h saw 35 lines and 4 course_lib frames per failure)."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        result = shell.run_cell("from course_lib.checks import check_score_bytes\n"
                                "check_score_bytes(lambda: 12)\n")
    finally:  # a shell left behind turns every later display() of this process into a repr
        InteractiveShell.clear_instance()
    shown = capsys.readouterr().out
    assert isinstance(result.error_in_exec, CheckFailure)
    assert shown.strip().startswith("CheckFailure: ") and str(result.error_in_exec) in shown
    assert "course_lib/checks" not in shown and "Traceback" not in shown and "raise" not in shown
