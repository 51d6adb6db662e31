"""Deprecated name (kept until Part IV is complete): ``python -m course_lib.grade`` is ``python -m course_lib.grading``,
kept because instructors' scripts call it (docs/developers.md)."""

from .grading.cli import *  # noqa: F401,F403
from .grading.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
