"""A re-statement, in Python, of what Canvas's gradebook importer requires of a CSV file.

Source: instructure/canvas-lms, app/models/gradebook_importer.rb (class GradebookImporter; the
stored snapshot read for issue #41 is the one with ASSIGNMENT_PRELOADED_FIELDS, override columns
and custom columns), and app/models/assignment.rb (Assignment.title_and_id). Each function below
names the Ruby method it re-states; line numbers drift between Canvas releases, the method names
do not. Left out: what needs Canvas's database (which assignments and students exist, grading
periods, read-only and custom columns, LastName/FirstName exports).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field

# GradebookImporter::NON_ASSIGNMENT_COLUMN_HEADERS; strip_non_assignment_columns drops any header
# that contains one of them (a regexp union), "Unposted ..." variants included.
NON_ASSIGNMENT_COLUMN_HEADERS = ["Current Score", "Current Points", "Current Grade", "Final Score",
                                 "Final Points", "Final Grade", "Override Score", "Override Grade",
                                 "Override Status"]
_MUTED = re.compile(r"^\s*(Muted|Manual Posting.*)?\s*$", re.I)  # check_for_non_student_row


class InvalidHeaderRow(ValueError):
    """GradebookImporter::InvalidHeaderRow: Canvas's import fails with "Invalid header row"."""


@dataclass
class Imported:
    """What the importer makes of a file (without Canvas's database)."""

    student_columns: int
    id_columns: dict[str, int]  # "ID", "SIS User ID", "SIS Login ID" -> column index
    assignments: list[tuple[str, str | None, int]]  # (title, assignment id or None, column index)
    points_possible: dict[int, str] = field(default_factory=dict)  # column index -> points
    students: list[dict[str, str]] = field(default_factory=list)  # identity cells and grades by header


def title_and_id(header: str) -> tuple[str, str | None]:
    """Assignment.title_and_id: ``/\\A(.*)\\s\\((\\d+)\\)\\z/`` -> (title, id), else (header, None)."""
    match = re.match(r"\A(.*)\s\((\d+)\)\Z", header)
    return (match.group(1), match.group(2)) if match else (header, None)


def delimiter(lines: list[str]) -> str:
    """identify_delimiter / semicolon_delimited?: over the first 3 lines, a separator counts if it
    splits every line into the same number of fields; ';' wins only with more fields than ','."""
    counts = {}
    for sep in (";", ","):
        counts[sep] = 0
        sizes = {len(next(csv.reader([line], delimiter=sep), [])) for line in lines[:3]}
        if len(sizes) == 1:
            counts[sep] = sizes.pop()
    return ";" if counts[";"] > counts[","] else ","


def parse_header(row: list[str]) -> tuple[int, dict[str, int]]:
    """row_has_student_headers?, update_column_count and header? (no custom columns, no
    LastName/FirstName): (the number of learner columns, where the id columns are)."""
    if not (len(row) > 3 and "Student" in row[0] and "ID" in row[1]):
        raise InvalidHeaderRow("the header must start with Student, ID (and have more than 3 columns)")
    columns, ids = 3, {"ID": 1}
    if re.search(r"SIS\s+Login\s+ID", row[2]):
        ids["SIS Login ID"] = 2
        columns += 1
    elif re.search(r"SIS\s+User\s+ID", row[2]) and re.search(r"SIS\s+Login\s+ID", row[3]):
        integration = 1 if len(row) > 4 and re.search(r"Integration\s+ID", row[4]) else 0
        ids["SIS User ID"], ids["SIS Login ID"] = 2, 3
        columns += 2 + integration
        if len(row) > 4 + integration and re.search(r"Root\s+Account", row[4 + integration]):
            columns += 1
    if "Section" not in row[columns - 1]:  # last_student_info_column(row).include?("Section")
        raise InvalidHeaderRow(f"the last learner column (column {columns}) must be Section, "
                               f"found {row[columns - 1]!r}")
    return columns, ids


def read(text: str) -> Imported:
    """csv_stream + parse!'s loop: the header, then each row: Points Possible, muted, or a learner."""
    lines = text.splitlines()
    sep = delimiter(lines)
    rows = [r for r in csv.reader(io.StringIO(text), delimiter=sep) if not re.fullmatch(r"[;, ]*", sep.join(r))]
    columns, ids = parse_header(rows[0])
    union = re.compile("|".join(NON_ASSIGNMENT_COLUMN_HEADERS))
    assignments = [(*title_and_id(h), i) for i, h in enumerate(rows[0]) if i >= columns and not union.search(h)]
    imported = Imported(columns, ids, assignments)
    for row in rows[1:]:
        if row and "Points Possible" in row[0]:  # process_pp
            imported.points_possible = {i: row[i] for _, _, i in assignments if i < len(row) and row[i]}
        elif all(_MUTED.match(cell) for cell in row):
            continue
        else:  # process_student reads the ids and the name; process_submissions each grade, stripped
            cells = {"Student": row[0], **{name: row[i] for name, i in ids.items() if i < len(row)}}
            cells.update({rows[0][i]: (row[i].strip() if i < len(row) else "") for _, _, i in assignments})
            imported.students.append(cells)
    return imported


def find_student(cells: dict[str, str], course: list[dict[str, str]]) -> dict[str, str] | None:
    """process_student: by Canvas's user ``ID``; else by ``SIS User ID``; else by ``SIS Login ID``;
    else by the name (``Student``: name or sortable name). None: an unknown student, whom the
    import's preview asks the instructor to match."""
    for column in ("ID", "SIS User ID", "SIS Login ID"):
        value = cells.get(column, "")
        if value:
            for person in course:
                if person.get(column) == value:
                    return person
    return next((p for p in course if cells["Student"] in (p.get("name"), p.get("Student"))), None)
