"""``grades_canvas_NN.csv``: one lesson's points in the format of Canvas's gradebook import.

What Canvas's importer (``GradebookImporter``, app/models/gradebook_importer.rb in
instructure/canvas-lms) requires, and what this file does for each rule:
- the header row starts ``Student, ID`` and, with the SIS columns, ``SIS User ID, SIS Login ID``,
  then ``Section`` as the last learner column (``row_has_student_headers?``, ``update_column_count``,
  ``header?``): we write exactly ``Student, ID, SIS User ID, SIS Login ID, Section``;
- every other column is an assignment, ``Title (assignment id)`` (``Assignment.title_and_id``:
  ``/\\A(.*)\\s\\((\\d+)\\)\\z/``). With an id Canvas updates that assignment; without one it looks
  for an assignment whose title is the whole header (``Lesson 09``), and failing that proposes to
  create a new assignment of that name (``parse_assignments``). We write ``Lesson NN (id)`` when the
  id is known (``--canvas-assignment NN=ID``, or a ``Lesson NN (ID)`` column of the roster), else
  ``Lesson NN``;
- a row whose first cell holds ``Points Possible`` sets each assignment's points possible
  (``check_for_non_student_row``, ``process_pp``): we write it second, with the lesson's points;
- a learner is found by ``ID`` (Canvas's user id), else by ``SIS User ID``, else ``SIS Login ID``,
  else by the ``Student`` name (``process_student``); one nobody matches is shown as an unknown
  student in the import's preview. We copy all four from the roster; a submission that is not in
  the roster keeps its row, its ``Student`` cell marked ``(not in roster)`` and its id in the key
  column, so that Canvas can still find it or the instructor can match it in the preview;
- an empty grade cell means "no grade": roster learners without a submission are not written
  (the report lists them), so the import leaves their grades as they are.
"""

from __future__ import annotations

from pathlib import Path

from .csvfile import write_csv
from .lessons import Lesson
from .points import earned, possible
from .roster import RosterMatch
from .runner import Graded

CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
NOT_IN_ROSTER = "(not in roster)"


def assignment_column(lesson_id: str, assignment_id: str | None) -> str:
    """``Lesson 09 (1234)``, or ``Lesson 09`` when the Canvas assignment id is not known."""
    return f"Lesson {lesson_id} ({assignment_id})" if assignment_id else f"Lesson {lesson_id}"


def write_canvas(path: Path, lesson: Lesson, rows: list[Graded], matched: RosterMatch | None, key: str,
                 points: dict[str, float], assignment_id: str | None) -> None:
    """Write the rows of ``lesson`` (sorted by student) for Canvas; ``matched`` maps stems to
    roster rows (None: no roster, every row unmatched), ``key`` is the roster column of the stems."""
    id_column = key if key in CANVAS_COLUMNS[1:4] else "SIS Login ID"
    lines: list[list[object]] = [[*CANVAS_COLUMNS, assignment_column(lesson.lesson_id, assignment_id)],
                                 ["Points Possible", "", "", "", "", possible(lesson, points)]]
    found = matched.matched if matched else {}
    for row in sorted(rows, key=lambda r: (r.student not in found, r.student)):
        score = sum(earned(row.results, points).values())
        person = found.get(row.student)
        if person is not None:
            lines.append([person.get(c, "") for c in CANVAS_COLUMNS] + [score])
        else:
            cells = {"Student": f"{row.student} {NOT_IN_ROSTER}", id_column: row.student}
            lines.append([cells.get(c, "") for c in CANVAS_COLUMNS] + [score])
    write_csv(path, lines)
