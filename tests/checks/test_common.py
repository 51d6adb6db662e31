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
