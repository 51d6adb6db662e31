"""Benchmark: grading a class in parallel, and the grader's overhead over a plain run.

    python benchmarks/grade.py                      (or: make benchmark; run it on a quiet machine)
    python benchmarks/grade.py --lesson 00 --n 4 --singles 1      (a quick try)

The class: N copies of one lesson's notebook with every stub replaced by its solution (the same work
in each, so a sample of single runs stands for all of them). With the grader's settings for W workers
(each kernel gets cores / W threads):
- a plain run: the notebook executed by nbclient in a fresh kernel, in a scratch folder, nothing else;
- a single graded run: ``grade_submission`` on one notebook (limits, the sandbox where bwrap works,
  the re-check, peek detection);
- the batch: ``python -m course_lib.grading``'s ``grade_all`` on all N with W workers.
Efficiency = (N x mean single graded run) / (W x batch wall time); target >= 0.80.
Overhead = mean single graded run / mean plain run; target <= 1.10.
- shards: the same class as ``python -m course_lib.grading --shard K/3`` runs (one after another, W
  workers each, as three machines would run them side by side), then ``course_lib.grading.merge``;
  its files must equal the batch's written by the same code (rows.json: all but the wall times).
  ``--shards-only`` skips the single runs (a quick check of this line).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from course_lib.grading.cli import choose_sandbox, cores, grade_all, write_outputs
from course_lib.grading.integrity import course_digest
from course_lib.grading.platforms import Platform
from course_lib.grading.lessons import read_lessons
from course_lib.grading.runner import Settings, configure_worker, grade_submission
from course_lib.solutions import solution_source


def make_class(lesson_id: str, n: int, folder: Path) -> list[Path]:
    lesson = read_lessons()[lesson_id]
    nb = nbformat.read(lesson.path, as_version=4)
    for cell in nb.cells:
        key = cell.get("metadata", {}).get("exercise")
        if key:
            cell.source = solution_source(key)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"learner{i:02d}.ipynb" for i in range(n)]
    for path in paths:
        nbformat.write(nb, path)
    return paths


def plain_run(path: Path) -> float:
    """Seconds to execute the notebook once in a fresh kernel in a scratch folder, as nbclient does."""
    folder = Path(tempfile.mkdtemp(prefix="plain-"))
    try:
        nb = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        NotebookClient(nb, timeout=1800, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": str(folder)}}).execute()
        return time.perf_counter() - start
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _rows(folder: Path) -> dict[str, object]:
    """What a run decided: its grades files, byte for byte, and each row's lesson, status,
    outcome per exercise and peeks (rows.json). Left out: wall times, and the checkers' messages,
    whose numbers may come from the re-check's seed, which every run draws afresh."""
    found: dict[str, object] = {p.name: p.read_bytes() for p in sorted(folder.glob("grades*.csv"))}
    rows = json.loads((folder / "rows.json").read_text(encoding="utf-8"))["rows"]
    found["rows"] = [(r["student"], r["lesson"], r["status"], {k: v["outcome"] for k, v in r["results"].items()},
                      r["peeked"]) for r in rows]
    return found


def shard_run(paths: list[Path], rows: list, n: int, workers: int, mode: str, line: str,
              folder: Path) -> tuple[float, bool]:
    """(seconds for the N shards one after another plus the merge, whether the merged files equal
    the batch's)."""
    options = ["--timeout", "1800", "--notebook-timeout", "7200", "--memory-gb", "8", "--workers", str(workers),
               "--sandbox", mode]
    start = time.perf_counter()
    for k in range(1, n + 1):
        subprocess.run([sys.executable, "-m", "course_lib.grading", "--out", str(folder / f"shard{k}"), *options,
                        "--shard", f"{k}/{n}", *map(str, paths)], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, "-m", "course_lib.grading.merge", "--out", str(folder / "merged"),
                    *(str(folder / f"shard{k}") for k in range(1, n + 1))], check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    write_outputs(folder / "one", rows, read_lessons(), line, Platform(), None, [p.stem for p in paths])
    return seconds, _rows(folder / "merged") == _rows(folder / "one")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lesson", default="01")
    parser.add_argument("--n", type=int, default=30, help="submissions in the class")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--singles", type=int, default=5, help="single runs of each kind to average")
    parser.add_argument("--sandbox", choices=["auto", "bwrap", "none"], default="auto")
    parser.add_argument("--shards", type=int, default=3, help="shards for the merge line (0: none)")
    parser.add_argument("--shards-only", action="store_true", help="skip the single runs and the efficiency line")
    args = parser.parse_args(argv)
    mode, line = choose_sandbox(args.sandbox)
    print(line)
    folder = Path(tempfile.mkdtemp(prefix="grade-bench-"))
    try:
        paths = make_class(args.lesson, args.n, folder)
        settings = Settings(cell_timeout=1800, notebook_timeout=7200, memory_bytes=8 * 2**30,
                            threads=max(1, cores() // args.workers), sandbox=mode,
                            scratch_root=str(folder), seed=0)
        settings.course_digest = course_digest()  # checked around each submission, as the command does
        configure_worker(settings.threads)
        plain, single = [], []
        for i in range(0 if args.shards_only else args.singles):  # alternate: a change of load hits both alike
            plain.append(plain_run(paths[i % len(paths)]))
            row = grade_submission(paths[i % len(paths)], settings)
            assert row.status == "graded" and all(row.marks().values()), (row.status, row.results)
            single.append(row.seconds)
        start = time.perf_counter()
        rows = grade_all(paths, settings, args.workers)
        wall = time.perf_counter() - start
        assert all(r.status == "graded" and all(r.marks().values()) for r in rows)
        if args.shards:
            shard_seconds, equal = shard_run(paths, rows, args.shards, args.workers, mode, line, folder / "shards")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    shards = (f"grade shards: {args.shards} shards merged in {shard_seconds:.0f} s, rows equal to one run: "
              f"{'yes' if equal else 'NO'} (one after another, {args.workers} workers each; one run: {wall:.0f} s)"
              if args.shards else "")
    if args.shards_only:
        print(shards)
        return 0
    efficiency = args.n * statistics.mean(single) / (args.workers * wall)
    overhead = statistics.mean(single) / statistics.mean(plain)
    print(f"single runs: plain {statistics.mean(plain):.1f} s, graded {statistics.mean(single):.1f} s "
          f"(means of {args.singles}; {settings.threads} thread(s) per kernel)")
    print(f"grade: {args.n} submissions of lesson {args.lesson} in {wall:.0f} s on {args.workers} workers, "
          f"sandbox {mode} "
          f"(efficiency {efficiency:.2f}; overhead {overhead:.2f}x a plain run)")
    ok = efficiency >= 0.80 and overhead <= 1.10
    print("targets (efficiency >= 0.80, overhead <= 1.10x):", "met" if ok else "NOT met")
    if shards:
        print(shards)
    return 0


if __name__ == "__main__":
    sys.exit(main())
