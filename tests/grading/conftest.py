"""Fixtures shared by the grader's tests: the re-check run in this process."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture
def checkers_put_back():
    """The re-check re-imports course_lib.checks; put this process's modules back after it."""
    import signal

    import course_lib.checks  # noqa: F401

    saved = {n: m for n, m in sys.modules.items() if n.startswith("course_lib.checks")}
    handler = signal.getsignal(signal.SIGALRM)
    try:
        yield
    finally:
        for name in [n for n in sys.modules if n.startswith("course_lib.checks")]:
            del sys.modules[name]
        sys.modules.update(saved)
        import course_lib

        course_lib.checks = saved["course_lib.checks"]
        signal.signal(signal.SIGALRM, handler)
