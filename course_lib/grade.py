"""Grade a class's notebooks: ``python -m course_lib.grade --out DIR SUBMISSION.ipynb [...]``.

    python -m course_lib.grade --out build/grades submissions/*.ipynb
    python -m course_lib.grade --out build/grades --timeout 60 --workers 2 submissions/

Each submission (a notebook, or every file of a folder) runs in its own fresh kernel, in a scratch
copy of its lesson's folder, with a time limit per cell and per notebook and a memory limit; then the
grader re-runs every checker itself on the learner's objects. The file name's stem is the learner's
id; the lesson is recognised from the notebook's content. Writes DIR/grades.csv, DIR/grades_NN.csv
per lesson, DIR/report.html and DIR/feedback/<student>.html. See the README, "For instructors".
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from .grading.lessons import read_lessons
from .grading.report import write_all
from .grading.runner import Graded, Settings, configure_worker, grade_submission


def _submissions(args: list[str]) -> list[Path]:
    paths: list[Path] = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            paths += sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        elif path.is_file():
            paths.append(path)
        else:
            raise SystemExit(f"grade: {arg} does not exist")
    stems: dict[str, Path] = {}
    for p in paths:
        if p.stem in stems:
            raise SystemExit(f"grade: two submissions have the learner id {p.stem!r}: {stems[p.stem]} and "
                             f"{p}. A file's stem is the learner's id; rename one.")
        stems[p.stem] = p
    if not paths:
        raise SystemExit("grade: no submissions given")
    return paths


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def grade_all(paths: list[Path], settings: Settings, workers: int) -> list[Graded]:
    """Grade every submission, ``workers`` at a time, each worker in its own process."""
    rows = []
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=configure_worker,
                             initargs=(settings.threads,)) as pool:
        futures = [pool.submit(grade_submission, p, settings) for p in paths]
        for future in futures:
            row = future.result()
            marks = row.marks()
            print(f"{row.student}: lesson {row.lesson or '?'}, {sum(marks.values())} of {len(marks)} "
                  f"passed, {row.status} ({row.seconds:.0f} s)", flush=True)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.grade", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for grades.csv, report.html, feedback/")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per cell (default 300)")
    parser.add_argument("--notebook-timeout", type=float, default=3600,
                        help="seconds per notebook: no cell starts later (default 3600)")
    parser.add_argument("--workers", type=int, default=_cores(), help="notebooks at a time (default: one per core)")
    parser.add_argument("--memory-gb", type=float, default=None,
                        help="address-space limit per kernel (default: the machine's RAM / workers)")
    parser.add_argument("submissions", nargs="+", help="notebooks, or folders of them")
    args = parser.parse_args(argv)
    paths = _submissions(args.submissions)
    workers = max(1, min(args.workers, len(paths)))
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    memory = int(args.memory_gb * 2**30) if args.memory_gb else max(4 * 2**30, ram // workers)
    settings = Settings(cell_timeout=args.timeout, notebook_timeout=args.notebook_timeout,
                        memory_bytes=memory, threads=max(1, _cores() // workers))
    start = time.monotonic()
    rows = grade_all(paths, settings, workers)
    write_all(args.out, rows, read_lessons())
    graded = sum(r.status == "graded" for r in rows)
    print(f"grade: {len(rows)} submissions ({graded} graded cleanly) in {time.monotonic() - start:.0f} s on "
          f"{workers} worker(s); wrote {args.out}/grades.csv, report.html, feedback/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
