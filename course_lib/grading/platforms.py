"""The learning platforms' files and their options, shared by ``course_lib.grading`` and ``merge``.

Options: ``--points`` (course_lib.grading.points), ``--roster`` and ``--roster-key``
(roster), ``--canvas-assignment NN=ID`` (canvas), ``--moodle-id email|username|idnumber``
(moodle). ``grades_canvas_NN.csv`` is written when a Canvas assignment id is given, or a roster
that is Canvas's (``writes_canvas``); ``grades_moodle_NN.csv`` when ``--moodle-id`` is. A roster
that is neither (no Canvas column, no ``--moodle-id``) gets no platform file, and the log says so.
Every CSV cell goes through ``csvfile.write_csv`` (no cell opens as a formula in a spreadsheet).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .canvas import CANVAS_COLUMNS, write_canvas
from .lessons import Lesson
from .moodle import MOODLE_IDS, identity_column, write_moodle
from .points import parse_points
from .roster import DEFAULT_KEY, Roster, RosterMatch, describe, match, read_roster
from .runner import Graded


@dataclass
class Platform:
    """What the platform files need, resolved from the command line."""

    points: dict[str, float] = field(default_factory=dict)  # exercise -> weight (default 1)
    roster: Roster | None = None
    canvas_assignments: dict[str, str] = field(default_factory=dict)  # lesson -> assignment id, given
    moodle_id: str | None = None

    def record(self) -> dict[str, Any]:
        """What rows.json keeps of these options (for ``merge``)."""
        return {"points": self.points, "roster": str(self.roster.path.resolve()) if self.roster else None,
                "roster_key": self.roster.key if self.roster else DEFAULT_KEY,
                "canvas_assignments": self.canvas_assignments, "moodle_id": self.moodle_id}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The platform options, as ``course_lib.grading`` and ``merge`` take them."""
    parser.add_argument("--points", default=None, metavar="KEY=N,...|FILE",
                        help="points per exercise, e.g. 09.lm_train=3,09.generate=2, or a .json/.toml/.csv "
                             "file (default: 1 each)")
    parser.add_argument("--roster", type=Path, default=None,
                        help="the platform's roster export (Canvas: Grades > Export; Moodle's with --moodle-id), "
                             "to write grades_canvas_NN.csv (for Canvas's) or grades_moodle_NN.csv and to list "
                             "learners missing on either side")
    parser.add_argument("--roster-key", default=None,
                        help=f"the roster column that holds the file names' learner ids (default {DEFAULT_KEY!r})")
    parser.add_argument("--canvas-assignment", action="append", default=[], metavar="NN=ID",
                        help="the Canvas assignment id of lesson NN (repeatable or comma-separated); "
                             "default: a 'Lesson NN (ID)' column of the roster")
    parser.add_argument("--moodle-id", choices=sorted(MOODLE_IDS), default=None,
                        help="write grades_moodle_NN.csv, identifying learners by this field")


def parse_assignments(values: list[str]) -> dict[str, str]:
    """``["09=1234", "10=1240,11=1250"]`` -> {"09": "1234", ...}; ValueError saying what to fix."""
    found = {}
    for value in values:
        for pair in filter(None, (p.strip() for p in value.split(","))):
            lesson, sep, number = pair.partition("=")
            lesson, number = lesson.strip(), number.strip()
            if not sep or not (len(lesson) == 2 and lesson.isdigit()) or not number.isdigit():
                raise ValueError(f"--canvas-assignment: {pair!r} is not NN=ID with a two-digit lesson and the "
                                 "assignment's numeric id (in its Canvas address: .../assignments/1234)")
            found[lesson] = number
    return found


def from_arguments(args: argparse.Namespace, lessons: dict[str, Lesson],
                   recorded: dict[str, Any] | None = None) -> Platform:
    """Resolve the options; an option left out comes from ``recorded`` (the shards' rows.json)."""
    recorded = recorded or {}
    if args.points is not None:
        points = parse_points(args.points, lessons)
    else:
        points = {k: float(v) for k, v in (recorded.get("points") or {}).items()}
    roster_path = args.roster if args.roster is not None else recorded.get("roster")
    key = args.roster_key or recorded.get("roster_key") or DEFAULT_KEY
    if args.roster_key and roster_path is None:
        raise ValueError("--roster-key needs --roster")
    roster = read_roster(Path(roster_path), key) if roster_path else None
    given = parse_assignments(args.canvas_assignment) if args.canvas_assignment else \
        dict(recorded.get("canvas_assignments") or {})
    moodle_id = args.moodle_id or recorded.get("moodle_id")
    if roster is not None and moodle_id:
        identity_column(roster, moodle_id)  # fail now, before any grading, if the roster lacks it
    return Platform(points, roster, given, moodle_id)


def writes_canvas(platform: Platform) -> bool:
    """Whether a run writes grades_canvas_NN.csv: for a Canvas assignment id given, or for a roster
    that is Canvas's, one with a column Canvas finds its learners by (``Student``, ``ID``, ``SIS User
    ID``, ``SIS Login ID``). A Canvas file made from another roster (Moodle's export) would have
    every identity cell empty."""
    if platform.canvas_assignments:
        return True
    return platform.roster is not None and any(c in platform.roster.columns for c in CANVAS_COLUMNS[:4])


def write_platform(out: Path, rows: list[Graded], lessons: dict[str, Lesson], platform: Platform,
                   matched: RosterMatch | None) -> list[str]:
    """Write grades_canvas_NN.csv and grades_moodle_NN.csv per lesson; return the log's lines."""
    lines = []
    ids = {**(platform.roster.canvas_assignments() if platform.roster else {}), **platform.canvas_assignments}
    key = platform.roster.key if platform.roster else DEFAULT_KEY
    for lid in sorted({r.lesson for r in rows if r.lesson}):
        mine = [r for r in rows if r.lesson == lid]
        if writes_canvas(platform):
            write_canvas(out / f"grades_canvas_{lid}.csv", lessons[lid], mine, matched, key, platform.points,
                         ids.get(lid))
            lines.append(f"grades_canvas_{lid}.csv" + ("" if ids.get(lid) else
                         f" (no Canvas assignment id for lesson {lid}: the column is 'Lesson {lid}', which Canvas "
                         f"matches by title or imports as a new assignment; --canvas-assignment {lid}=ID)"))
        if platform.moodle_id:
            write_moodle(out / f"grades_moodle_{lid}.csv", lessons[lid], mine, platform.roster, matched,
                         platform.moodle_id, platform.points)
            lines.append(f"grades_moodle_{lid}.csv")
    if platform.roster is not None and not writes_canvas(platform) and not platform.moodle_id:
        lines.append(f"no platform file: the roster {platform.roster.path.name} has none of Canvas's columns "
                     f"({', '.join(CANVAS_COLUMNS[:4])}); for Moodle's, give --moodle-id")
    return lines


def roster_lines(matched: RosterMatch | None, key: str) -> list[str]:
    """The log's lines about learners on one side only."""
    if matched is None:
        return []
    lines = []
    if matched.not_in_roster:
        lines.append(f"{len(matched.not_in_roster)} submission(s) not in the roster (their rows are kept, "
                     f"marked): {', '.join(matched.not_in_roster)}")
    if matched.no_submission:
        lines.append(f"{len(matched.no_submission)} roster learner(s) with no submission: "
                     + "; ".join(describe(r, key) for r in matched.no_submission))
    return lines


def roster_match(platform: Platform, rows: list[Graded]) -> RosterMatch | None:
    return match(platform.roster, [r.student for r in rows]) if platform.roster else None
