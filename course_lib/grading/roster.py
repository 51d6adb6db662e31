"""The class roster: which platform identity each submission (its file stem) belongs to.

``--roster roster.csv`` is the learning platform's own export, as an instructor downloads it:
Canvas's gradebook export (Grades > Export: ``Student, ID, SIS User ID, SIS Login ID, Section``,
then one column per assignment, and a ``Points Possible`` row), or any CSV with a header row, such
as Moodle's grade export (``First name, Last name, ID number, ..., Email address``). Each
submission's stem is looked up in one column, ``--roster-key`` (default ``SIS Login ID``; ``ID``,
``SIS User ID``, ``Email address`` ...), ignoring case and surrounding spaces.

Rows that are not learners are skipped as Canvas's importer skips them: a row whose first cell
holds ``Points Possible``, and a row of nothing but ``Muted`` / ``Manual Posting`` cells.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_KEY = "SIS Login ID"
_NOT_A_LEARNER = re.compile(r"^\s*(Muted|Manual Posting.*)?\s*$", re.I)  # Canvas's own test of such rows
_CANVAS_ASSIGNMENT = re.compile(r"\ALesson\s+(\d{2})\b.*\s\((\d+)\)\Z")  # "Lesson 09 (1234)"


@dataclass
class Roster:
    """The learners of a roster file, and the column their ids are looked up in."""

    path: Path
    key: str
    columns: list[str]
    rows: list[dict[str, str]]  # the learners, in the file's order

    def canvas_assignments(self) -> dict[str, str]:
        """Assignment ids of the lessons the roster's header already holds: a column
        ``Lesson 09 (1234)`` (as Canvas exports an assignment named "Lesson 09") -> {"09": "1234"}."""
        found = {}
        for column in self.columns:
            match = _CANVAS_ASSIGNMENT.match(column.strip())
            if match:
                found.setdefault(match.group(1), match.group(2))
        return found


@dataclass
class RosterMatch:
    """Submissions matched to roster rows, and who is on one side only."""

    matched: dict[str, dict[str, str]] = field(default_factory=dict)  # stem -> roster row
    not_in_roster: list[str] = field(default_factory=list)  # stems with no roster row
    no_submission: list[dict[str, str]] = field(default_factory=list)  # roster rows with no submission


def _normal(value: str) -> str:
    return value.strip().casefold()


def read_roster(path: Path, key: str = DEFAULT_KEY) -> Roster:
    """Read a roster CSV. Raises ValueError saying what to fix: an unreadable or empty file, no
    header, no column ``key`` (the message lists the columns there are), or one id on two rows."""
    try:
        text = Path(path).read_bytes().decode("utf-8-sig")
    except OSError as err:
        raise ValueError(f"--roster: cannot read {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ValueError(f"--roster: {path} is not a UTF-8 text file; export the gradebook as CSV") from None
    first = text.split("\n", 1)[0]
    delimiter = ";" if first.count(";") > first.count(",") else ","  # some locales export with ';'
    try:
        table = [row for row in csv.reader(io.StringIO(text), delimiter=delimiter, strict=True)]
    except csv.Error as err:
        raise ValueError(f"--roster: {path} is not a well-formed CSV file ({err})") from None
    table = [row for row in table if any(cell.strip() for cell in row)]
    if not table:
        raise ValueError(f"--roster: {path} is empty; export the gradebook as CSV (Canvas: Grades > Export)")
    columns = [c.strip() for c in table[0]]
    if key not in columns:
        raise ValueError(f"--roster: {path} has no column {key!r}; its columns are "
                         f"{', '.join(repr(c) for c in columns[:12])}{' ...' if len(columns) > 12 else ''}. "
                         "Choose the one that holds the file names' learner ids with --roster-key")
    rows, seen = [], {}
    for number, cells in enumerate(table[1:], start=2):
        if (cells and "Points Possible" in cells[0]) or all(_NOT_A_LEARNER.match(c) for c in cells):
            continue
        if len(cells) > len(columns):
            raise ValueError(f"--roster: {path}, row {number} has {len(cells)} cells but the header has "
                             f"{len(columns)}; is it the CSV as the platform exported it?")
        row = dict(zip(columns, [c.strip() for c in cells] + [""] * (len(columns) - len(cells))))
        value = _normal(row[key])
        if value and value in seen:
            raise ValueError(f"--roster: {path}: the {key} {row[key]!r} is on rows {seen[value]} and {number}; "
                             "each learner needs a value of their own in the key column (--roster-key)")
        seen[value] = number
        rows.append(row)
    return Roster(Path(path), key, columns, rows)


def match(roster: Roster, stems: list[str]) -> RosterMatch:
    """Match each submission's stem to the roster row whose key column holds it. ValueError if two
    stems match one row (``Ada`` and ``ada``: the match ignores case)."""
    by_key = {_normal(row[roster.key]): row for row in roster.rows if row[roster.key].strip()}
    result = RosterMatch()
    owner: dict[int, str] = {}
    for stem in sorted(stems):
        row = by_key.get(_normal(stem))
        if row is None:
            result.not_in_roster.append(stem)
        elif id(row) in owner:
            raise ValueError(f"--roster: the submissions {owner[id(row)]!r} and {stem!r} both match the {roster.key} "
                             f"{row[roster.key]!r} (case is ignored); keep one file per learner")
        else:
            owner[id(row)] = stem
            result.matched[stem] = row
    found = {id(row) for row in result.matched.values()}
    result.no_submission = [row for row in roster.rows if id(row) not in found]
    return result


def describe(row: dict[str, str], key: str) -> str:
    """A roster row as the report and the log name it: ``Lovelace, Ada (ada)``."""
    name = row.get("Student") or " ".join(filter(None, (row.get("First name"), row.get("Last name"))))
    return f"{name} ({row[key] or 'no ' + key})" if name else (row[key] or "(a row without a name or id)")
