"""``grades_moodle_NN.csv``: one lesson's points for Moodle's grade import (Grades > Import > CSV file).

Two columns: the learner's identity and ``Lesson NN``. In Moodle's import form, "Identify user"
maps the first column (*Map from*) to the user field it holds (*Map to*), and "Grade item
mappings" maps ``Lesson NN`` to the lesson's grade item (or a new one). ``--moodle-id`` chooses
the identity, and where it comes from:

=============  =====================  ===========================================================
--moodle-id    first column header    value: with --roster, the roster's column; without, the stem
=============  =====================  ===========================================================
email          ``Email address``      ``Email address`` (Moodle's grade export), or ``Email``
username       ``Username``           ``Username``
idnumber       ``ID number``          ``ID number`` (Moodle's grade export)
=============  =====================  ===========================================================

A submission that is not in the roster has no identity Moodle could map, so it is not written
here; the report and the grader's log list it (and grades.csv keeps its row).
"""

from __future__ import annotations

from pathlib import Path

from .csvfile import write_csv
from .lessons import Lesson
from .points import earned
from .roster import Roster, RosterMatch
from .runner import Graded

# --moodle-id -> (the file's identity header, the roster columns that may hold it, first found wins)
MOODLE_IDS = {"email": ("Email address", ["Email address", "Email", "email"]),
              "username": ("Username", ["Username", "username"]),
              "idnumber": ("ID number", ["ID number", "idnumber", "ID Number"])}


def identity_column(roster: Roster, identity: str) -> str:
    """The roster column that holds ``identity``; ValueError naming the roster's columns if none."""
    candidates = MOODLE_IDS[identity][1]
    for column in candidates:
        if column in roster.columns:
            return column
    raise ValueError(f"--moodle-id {identity}: the roster {roster.path} has no column "
                     f"{' or '.join(repr(c) for c in candidates)}; its columns are "
                     f"{', '.join(repr(c) for c in roster.columns[:12])}. Export the roster with that field, "
                     "or pick another --moodle-id")


def write_moodle(path: Path, lesson: Lesson, rows: list[Graded], roster: Roster | None,
                 matched: RosterMatch | None, identity: str, points: dict[str, float]) -> None:
    """Write the rows of ``lesson`` for Moodle: one line per learner that has an identity."""
    column = identity_column(roster, identity) if roster else None
    lines: list[list[object]] = [[MOODLE_IDS[identity][0], f"Lesson {lesson.lesson_id}"]]
    for row in sorted(rows, key=lambda r: r.student):
        if roster is None:
            value = row.student
        elif matched is not None and row.student in matched.matched:
            value = matched.matched[row.student][column]
        else:
            continue  # not in the roster: listed in the report
        lines.append([value, sum(earned(row.results, points).values())])
    write_csv(path, lines)
