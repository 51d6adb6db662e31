"""``python -m course_lib.grading``: grade a class's notebooks (``cli.py``; docs/instructors.md)."""

from .cli import main

raise SystemExit(main())
