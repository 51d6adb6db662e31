"""Merge the shards of a class: ``python -m course_lib.grading.merge --out DIR SHARD_DIR...``.

    python -m course_lib.grading --out build/shard1 --shard 1/3 submissions/     (on machine 1)
    python -m course_lib.grading --out build/shard2 --shard 2/3 submissions/     (on machine 2) ...
    python -m course_lib.grading.merge --out build/grades build/shard1 build/shard2 build/shard3

Reads each shard's rows.json and writes grades.csv, grades_NN.csv, report.html, feedback/ and the
platform files (grades_canvas_NN.csv, grades_moodle_NN.csv) exactly as one run over the whole class
would have. The platform options (--points, --roster, --roster-key, --canvas-assignment,
--moodle-id) are the ones the shards were started with; each one given here replaces its own.
Checks first that the folders are the N shards of one class, each once, and that together they
hold every learner exactly once; otherwise it says what is missing (exit code 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from . import platforms
from .cli import write_outputs
from .lessons import read_lessons
from .shards import read_rows


def combine(shards: list[dict[str, Any]], folders: list[Path]) -> tuple[list, list[str], str, dict[str, Any] | None]:
    """(rows, class stems, sandbox line, the platform options the shards recorded, or None if they
    differ) of the whole class; ValueError saying what to fix if the shards do not make one class."""
    classes = {tuple(s["class"]) for s in shards}
    if len(classes) != 1:
        raise ValueError("the shards were given different classes (different files); start every shard on the "
                         "same submissions")
    counts = {(s["shard"] or [1, 1])[1] for s in shards}
    if len(counts) != 1:
        raise ValueError(f"the shards split the class in different numbers of shares: {sorted(counts)}")
    n = counts.pop()
    seen: dict[int, Path] = {}
    for data, folder in zip(shards, folders):
        k = (data["shard"] or [1, 1])[0]
        if k in seen:
            raise ValueError(f"shard {k}/{n} is given twice: {seen[k]} and {folder}")
        seen[k] = folder
    missing = sorted(set(range(1, n + 1)) - set(seen))
    if missing:
        raise ValueError(f"shard(s) {', '.join(f'{k}/{n}' for k in missing)} missing: give all {n} shard folders")
    rows = [row for data in shards for row in data["rows"]]
    stems = [r.student for r in rows]
    everyone = list(classes.pop())
    twice = sorted({s for s in stems if stems.count(s) > 1})
    if twice or sorted(stems) != sorted(everyone):
        lost = sorted(set(everyone) - set(stems))
        raise ValueError("the shards do not hold every learner exactly once"
                         + (f"; graded twice: {', '.join(twice)}" if twice else "")
                         + (f"; graded by none: {', '.join(lost)}" if lost else "")
                         + "; run the shards again on the same class")
    sandboxes = list(dict.fromkeys(s["sandbox"] for s in shards))  # one line, or each distinct one
    records = [s["platform"] for s in shards]
    return rows, everyone, " / ".join(sandboxes), records[0] if all(r == records[0] for r in records) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.grading.merge", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for the merged files")
    platforms.add_arguments(parser)
    parser.add_argument("shards", nargs="+", type=Path, help="the shards' --out folders")
    args = parser.parse_args(argv)
    lessons = read_lessons()
    try:
        shards = [read_rows(folder) for folder in args.shards]
        rows, everyone, sandbox, recorded = combine(shards, args.shards)
        explicit = any(v not in (None, []) for v in (args.points, args.roster, args.roster_key,
                                                        args.canvas_assignment, args.moodle_id))
        if recorded is None and not explicit:
            raise ValueError("the shards were started with different --points/--roster/--canvas-assignment/"
                             "--moodle-id options; give the ones to use to merge")
        platform = platforms.from_arguments(args, lessons, recorded or {})  # each option given replaces its own
    except ValueError as err:
        parser.error(str(err))
    for line in write_outputs(args.out, rows, lessons, sandbox, platform, None, everyone):
        print(f"merge: {line}")
    print(f"merge: {len(rows)} rows from {len(shards)} shard(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
