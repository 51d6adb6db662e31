"""Where the test time goes: each part of CI, each lesson, the test modules (`make timings`).

    python scripts/timings.py            print the tables from the last runs on this clone
    python scripts/timings.py --ci FILE  the same, with CI's parts first (.ci/run does this at its end)

It reads what the runs wrote, and runs nothing itself:

* ``build/timings/runs.jsonl``: one line per pytest run (conftest.py), with the float path, the
  threads per process, the number of processes side by side, and the seconds of each unit of work:
  each lesson's strict nbval and its solutions run, each test module. A unit's seconds are those of
  the process that ran it, with the other process busy beside it.
* ``build/timings/ci.tsv``: one line per part of ``.ci/run`` (part, seconds, passed or FAILED).

For each lesson and each kind of run (float path, threads), the table shows the latest run that
contained that lesson. A lesson over 120 s in strict nbval is marked: the course promises that each
lesson's Run All takes at most 2 minutes (nbval runs one kernel, cell after cell, as Run All does).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "build" / "timings" / "runs.jsonl"
CI = ROOT / "build" / "timings" / "ci.tsv"
RUN_ALL_LIMIT = 120.0  # seconds: "every lesson's Run All <= 2 min"


def minutes(seconds: float) -> str:
    return f"{seconds / 60:5.1f} min"


def load_runs(path: Path = RUNS) -> list[dict]:
    if not path.is_file():
        return []
    runs = []
    for line in path.read_text().splitlines():
        try:
            runs.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a run cut off while writing
    return runs


def ci_table(path: Path) -> list[str]:
    rows = [line.split("\t") for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        return []
    width = max(len(r[0]) for r in rows)
    out = ["CI (.ci/run), part by part:"]
    for name, seconds, *status in rows:
        out.append(f"  {name:{width}s}  {minutes(float(seconds))}  {status[0] if status else ''}")
    out.append(f"  {'total':{width}s}  {minutes(sum(float(r[1]) for r in rows))}")
    return out


def column(run: dict, unit: dict) -> str:
    side = f", {run['workers']} side by side" if run.get("workers") else ""
    # a unit names its own float path when it differs from its run's (`make test`'s solutions run)
    return f"{unit['kind']}, {unit.get('float_path', run['float_path'])}, {run['threads']} thr{side}"


def lesson_table(runs: list[dict]) -> list[str]:
    cells: dict[str, dict[str, float]] = {}  # column -> lesson -> seconds (the latest run wins)
    for run in runs:
        for unit in run["units"]:
            if unit["kind"] != "tests":
                cells.setdefault(column(run, unit), {})[unit["name"]] = unit["s"]
    if not cells:
        return []
    columns = sorted(cells, key=lambda c: (not c.startswith("strict nbval, native"), c))
    lessons = sorted({lesson for values in cells.values() for lesson in values})
    width = max(len(c) for c in columns)
    out = ["Seconds per lesson (latest run of each kind; * = strict nbval over 120 s, the Run All limit):"]
    for i, c in enumerate(columns):
        out.append(f"  [{i + 1}] {c:{width}s}")
    out.append("  " + f"{'lesson':28s}" + "".join(f"{'[' + str(i + 1) + ']':>9s}" for i in range(len(columns))))
    for lesson in lessons:
        row = ""
        for c in columns:
            seconds = cells[c].get(lesson)
            mark = "*" if seconds is not None and c.startswith("strict nbval") and seconds > RUN_ALL_LIMIT else " "
            row += f"{'' if seconds is None else f'{seconds:.0f}':>8s}{mark}"
        out.append(f"  {lesson:28s}{row}")
    return out


def run_table(runs: list[dict]) -> list[str]:
    latest: dict[tuple, dict] = {}
    for run in runs:
        kinds = tuple(sorted({u["kind"] for u in run["units"]}))
        latest[(run["float_path"], run["threads"], run.get("workers", 0), kinds)] = run
    if not latest:
        return []
    out = ["pytest runs (latest of each kind): wall time, tests, the slowest test modules:"]
    for run in sorted(latest.values(), key=lambda r: r["finished"]):
        kinds = sorted({u["kind"] for u in run["units"]})
        modules = sorted((u for u in run["units"] if u["kind"] == "tests"), key=lambda u: -u["s"])
        outcomes = ", ".join(f"{n} {k}" for k, n in sorted(run["outcomes"].items()))
        side = f", {run['workers']} side by side" if run.get("workers") else ""
        out.append(f"  {run['finished']}  {run['float_path']}, {run['threads']} thread(s){side}: "
                   f"{' + '.join(kinds)}; {minutes(run['wall_s'])}; {outcomes}; exit {run['exit']}")
        if modules:
            out.append(f"      test modules {sum(u['s'] for u in modules):.0f} s in {len(modules)}; slowest: "
                       + ", ".join(f"{Path(u['name']).stem} {u['s']:.0f} s" for u in modules[:6]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ci", type=Path, help="CI's part times (build/timings/ci.tsv), printed first")
    args = parser.parse_args()
    runs = load_runs()
    blocks = []
    ci = args.ci or (CI if CI.is_file() else None)
    if ci and ci.is_file():
        blocks.append(ci_table(ci))
    blocks += [run_table(runs), lesson_table(runs)]
    blocks = [b for b in blocks if b]
    if not blocks:
        print(f"no timings yet: `make test` (or .ci/run) writes them to {RUNS.parent.relative_to(ROOT)}/")
        return 0
    print("\n\n".join("\n".join(b) for b in blocks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
