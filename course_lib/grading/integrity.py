"""course_lib on disk stays as the run found it, or the run stops (#49).

Without the sandbox a learner's kernel runs as the grader's user and can rewrite course_lib's files.
Its own row is zeroed by the re-check (kernel_recheck.py: checkers and solutions rewritten on disk),
but every kernel started after it would import the changed files: a checker that passes anything, a
reference that agrees with a wrong answer. So the grader records ``course_digest()`` (course_lib's
files and the lesson notebooks, which say what each lesson's exercises are) when the run starts
(``Settings.course_digest``), and each worker compares it before a submission's kernel starts and
after its processes are ended (runner.grade_submission):

- changed before: the submission is not run (status ``NOT_GRADED``);
- changed after: its row gets 0 (status ``COURSE_CHANGED``): its code changed course_lib, or, with
  several workers, the code of a notebook graded beside it.

The command then stops (cli.main): the rows finished before the change are kept, every other
submission gets the status ``NOT_GRADED`` and 0, the log and report.html name the submission(s)
during (or after) which course_lib changed, and the journal records the event with the digest the
run began with: the same command refuses to resume (``refusal``) until course_lib is as it was,
then grades the rest (a suspect of a run with several workers is graded again, alone first; one
graded alone that changed course_lib keeps its 0).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from .lessons import NOTEBOOK_DIR, Lesson

COURSE_LIB = Path(__file__).resolve().parents[1]
COURSE_CHANGED = "course changed"  # a row's status, and the journal's event
NOT_GRADED = "not graded"
RESTORE = ("restore course_lib (e.g. `git status course_lib` and `git checkout -- course_lib` in the course's "
           "clone, or reinstall it), then run the same command again: it resumes")

__all__ = ["COURSE_LIB", "COURSE_CHANGED", "NOT_GRADED", "course_digest", "changed", "mark_changed",
           "not_graded_row", "refusal", "RESTORE"]


def course_digest(root: Path = COURSE_LIB, notebooks: Path | None = NOTEBOOK_DIR) -> str:
    """The SHA-256 of every file of course_lib (its checkers, solutions, references, the grader's
    own code and stored results; not ``__pycache__``) and of the lesson notebooks in ``notebooks``
    (the grader reads each lesson's exercises and cells from them), with their paths: any file
    changed, added or removed changes it. About 16 MB read: tens of milliseconds."""
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]  # (pruned as it walks: Python writes there)
        files += [Path(folder) / name for name in names]
    lessons = sorted(notebooks.glob("[0-9][0-9]_*.ipynb")) if notebooks is not None else []
    h = hashlib.sha256()
    for path in sorted(files) + lessons:
        try:
            data = path.read_bytes()
        except OSError:
            data = b"(unreadable)"
        name = path.relative_to(root).as_posix() if path in files else "notebooks/" + path.name
        h.update(name.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def changed(expected: str | None) -> bool:
    """Whether course_lib differs from ``expected`` (``Settings.course_digest``; None: not checked)."""
    return expected is not None and course_digest() != expected


def _zeroed(lesson: Lesson | None, outcome: str, message: str, mistake: str) -> dict[str, dict[str, str]]:
    if lesson is None:
        return {}
    return {key: {"outcome": outcome, "message": message, "mistake": mistake, "site": ""} for key in lesson.keys}


def mark_changed(row: Any, lesson: Lesson | None, alone: bool) -> None:
    """``row`` (a runner.Graded) after course_lib changed on disk while its kernel ran: 0, status
    COURSE_CHANGED. ``alone``: no other submission was graded at the same time."""
    beside = "" if alone else ", or that of a notebook graded at the same time,"
    row.status = COURSE_CHANGED
    row.notes.append(f"course_lib's files changed on disk while it ran (its code{beside} changed them): graded 0, "
                     "and the run stopped")
    row.results = _zeroed(lesson, "failed", f"course_lib's files changed on disk while your notebook ran (your "
                          f"notebook's code{beside} changed them); it is graded 0.",
                          "grader: changed course_lib on disk")


def not_graded_row(row: Any, lesson: Lesson | None, after: str) -> Any:
    """``row`` (a runner.Graded) of a submission not run because course_lib changed ``after``: 0,
    status NOT_GRADED, with why."""
    row.status = NOT_GRADED
    row.lesson = lesson.lesson_id if lesson is not None else row.lesson
    row.notes.append(f"not graded: course_lib's files changed on disk {after}, and a notebook is graded only with "
                     f"the course's own files; {RESTORE}")
    row.results = _zeroed(lesson, "not checked", "Not graded yet: the grader stopped before your notebook ran "
                          "(the course's files changed on disk during the run); it will be graded when the run "
                          "is resumed.", "")
    return row


def refusal(entries: list[dict[str, Any]], digest: str, journal_path: Path) -> str | None:
    """Why a run must not resume from a journal whose ``entries`` record that course_lib changed on
    disk during an earlier run (event COURSE_CHANGED) while course_lib is still not as that run
    began (``digest`` is today's); None if it may."""
    for entry in entries:
        if entry.get("event") == COURSE_CHANGED and entry.get("expected") != digest:
            after = ", ".join(map(str, entry.get("after") or [])) or "?"
            return (f"an earlier run of this journal stopped because course_lib's files changed on disk ({after}), "
                    f"and course_lib is still not as that run began: {RESTORE}. (To grade afresh with course_lib "
                    f"as it is now instead, delete {journal_path}.)")
    return None
