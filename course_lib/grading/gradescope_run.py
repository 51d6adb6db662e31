"""Inside Gradescope's container: grade the submission, write ``results/results.json``.

``run_autograder`` calls ``python -m course_lib.grading.gradescope_run --root /autograder``. It
grades ``ROOT/submission/*.ipynb`` with ``python -m course_lib.grading`` (in a child process, so that
a submission that kills its grader still gets a results file) and writes, following Gradescope's
specification: one test per exercise of the lesson (``name``, ``score``, ``max_score``,
``status``, ``output``: the checker's message as the feedback page shows it), the overall
``score``, ``output`` (a summary), ``visibility`` (the builder's ``--visibility``; the tests set
none of their own, so they inherit it: a test's own "visible" would show it before the due date),
``stdout_visibility`` (hidden: the grader's log is for the instructor) and ``execution_time``. No notebook, a file that is not a notebook, a
notebook of another lesson, or a grader that fails: score 0 and a message that says what to do;
never a crash without a results file.

The grader runs with ``--sandbox none``: Gradescope already gives each submission a container of
its own, thrown away afterwards, that holds no other learner's work; and unprivileged user
namespaces, which bubblewrap needs, are usually not available inside a Docker container.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .lessons import match_lesson, read_lessons
from .points import number, worth
from .runner import MAX_NOTEBOOK_MB
from .shards import read_rows


def _result(tests: list[dict[str, Any]], output: str, config: dict[str, Any], seconds: float,
            extra: dict[str, Any]) -> dict[str, Any]:
    return {"score": sum(t["score"] for t in tests), "execution_time": round(seconds), "output": output,
            "visibility": config.get("visibility", "visible"), "stdout_visibility": "hidden",
            "extra_data": extra, "tests": tests}


def _zero_tests(lesson: Any, points: dict[str, float], output: str) -> list[dict[str, Any]]:
    """Every exercise of the lesson at 0, so that learners see what the assignment is worth."""
    return [{"name": f"{e.key} ({e.name})", "score": 0.0, "max_score": worth(e.key, points), "status": "failed",
             "output": output} for e in lesson.exercises]


def _output(result: dict[str, str]) -> str:
    """The checker's message as the feedback page shows it."""
    if result["outcome"] == "passed":
        return result.get("message") or "Passed."
    if result["outcome"] in ("not implemented", "missing"):
        return "Not attempted." if result["outcome"] == "not implemented" else result.get("message", "Not attempted.")
    return result.get("message", "")


def _which_lesson(path: Path, lessons: dict[str, Any]) -> str | None:
    """The lesson id the notebook at ``path`` belongs to; "" if none of the course's; None if it
    cannot be read as a notebook."""
    import warnings

    import nbformat

    warnings.filterwarnings("ignore", module="nbformat")
    try:
        nb = nbformat.reads(path.read_bytes().decode("utf-8", errors="replace"), as_version=4)
        if not isinstance(nb.get("cells"), list):
            return None
    except Exception:  # noqa: BLE001 (anything unreadable is "not a notebook")
        return None
    return match_lesson(nb, lessons) or ""


def grade(root: Path, config: dict[str, Any], python: str = sys.executable) -> dict[str, Any]:
    """The results.json content for the submission under ``root``."""
    start = time.monotonic()
    lessons = read_lessons()
    lesson = lessons[config["lesson"]]
    points = {k: float(v) for k, v in (config.get("points") or {}).items()}
    total = number(sum(worth(k, points) for k in lesson.keys))
    submitted = sorted(p for p in (root / "submission").rglob("*") if p.is_file()) \
        if (root / "submission").is_dir() else []
    notebooks = [p for p in submitted if p.suffix == ".ipynb" and ".ipynb_checkpoints" not in p.parts]
    if not notebooks:
        what = (f"Your submission holds {', '.join(p.name for p in submitted[:5])}, but no notebook (.ipynb)."
                if submitted else "Nothing was submitted.")
        message = f"{what} Upload your lesson {lesson.lesson_id} notebook ({lesson.path.name}). Score 0 of {total}."
        return _result(_zero_tests(lesson, points, message), message, config, time.monotonic() - start,
                       {"status": "no notebook"})
    chosen = notebooks[0]
    note = (f"You submitted {len(notebooks)} notebooks; {chosen.name} was graded. " if len(notebooks) > 1 else "")
    limit = float(config.get("max_notebook_mb", MAX_NOTEBOOK_MB))
    size = chosen.stat().st_size
    if size > limit * 2**20:  # not read at all (a 150 MB notebook would take the grader past 1 GB)
        message = (f"{note}{chosen.name} is too large: {size / 2**20:.1f} MB, the limit is {limit:g} MB. Clear its "
                   f"outputs (Edit > Clear Outputs of All Cells), save, and upload it again. Score 0 of {total}.")
        return _result(_zero_tests(lesson, points, message), message, config, time.monotonic() - start,
                       {"status": "too large"})
    found = _which_lesson(chosen, lessons)  # before any kernel: another lesson is not run at all
    if found != lesson.lesson_id:
        what = (f"lesson {found}'s notebook" if found else "not a notebook" if found is None else
                "a notebook that holds no exercise of this course")
        message = (f"{note}{chosen.name} is {what}; this assignment is lesson {lesson.lesson_id} "
                   f"({lesson.path.name}). Score 0 of {total}.")
        return _result(_zero_tests(lesson, points, message), message, config, time.monotonic() - start,
                       {"status": "wrong lesson" if found else "not a notebook" if found is None
                        else "unknown lesson", "lesson": found or ""})
    out = Path(tempfile.mkdtemp(prefix="gradescope-"))
    try:
        command = [python, "-m", "course_lib.grading", "--out", str(out / "grades"), "--sandbox", "none",
                   "--workers", "1", "--timeout", str(config.get("cell_timeout", 300)),
                   "--notebook-timeout", str(config.get("notebook_timeout", 480)),
                   "--max-notebook-mb", str(limit), str(chosen)]
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            log, _ = process.communicate(timeout=float(config.get("notebook_timeout", 480)) * 2 + 600)
        finally:  # the grader and anything left in its session end here, whatever happened
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except OSError:
                pass
            process.wait()
        print(log, flush=True)  # to Gradescope's stdout: the instructor's debugging view
        rows = read_rows(out / "grades")["rows"] if process.returncode == 0 else []
    except (subprocess.TimeoutExpired, ValueError, OSError) as err:
        print(f"gradescope_run: the grader failed: {err}", flush=True)
        rows = []
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if not rows:
        message = (f"{note}The autograder could not grade {chosen.name} (the grader stopped). Score 0 of {total}; "
                   "please tell your instructor.")
        return _result(_zero_tests(lesson, points, message), message, config, time.monotonic() - start,
                       {"status": "grader error"})
    row = rows[0]
    if row.lesson != lesson.lesson_id:
        found = (f"lesson {row.lesson}'s notebook" if row.lesson else
                 "a file that is not a notebook" if row.status == "not a notebook" else
                 "a notebook that holds no exercise of this lesson")
        message = (f"{note}{chosen.name} is {found}; this assignment is lesson {lesson.lesson_id} "
                   f"({lesson.path.name}). Score 0 of {total}. " + "; ".join(row.notes)).strip()
        return _result(_zero_tests(lesson, points, message), message, config, time.monotonic() - start,
                       {"status": row.status, "lesson": row.lesson})
    tests = []
    for ex in lesson.exercises:
        result = row.results.get(ex.key, {"outcome": "not checked", "message": "Not checked."})
        passed = result["outcome"] == "passed"
        tests.append({"name": f"{ex.key} ({ex.name})", "score": worth(ex.key, points) if passed else 0.0,
                      "max_score": worth(ex.key, points), "status": "passed" if passed else "failed",
                      "output": _output(result), "output_format": "text"})
    n_passed = sum(t["status"] == "passed" for t in tests)
    score = number(sum(t["score"] for t in tests))
    summary = (f"{note}Lesson {lesson.lesson_id}: {n_passed} of {len(tests)} exercises passed, "
               f"{score} of {total} points.")
    if row.status != "graded":
        summary += f" Note: {row.status}. " + "; ".join(row.notes)
    if row.peeked:
        summary += f" Solution shown before passing: {', '.join(row.peeked)}."
    return _result(tests, summary.strip(), config, time.monotonic() - start,
                   {"status": row.status, "lesson": row.lesson, "peeked": row.peeked})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.grading.gradescope_run")
    parser.add_argument("--root", type=Path, default=Path("/autograder"))
    args = parser.parse_args(argv)
    results = args.root / "results" / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {}
    try:
        config = json.loads((args.root / "source" / "config.json").read_text(encoding="utf-8"))
        data = grade(args.root, config)
    except Exception as err:  # noqa: BLE001 (whatever happens, Gradescope gets a results file)
        message = f"The autograder failed ({type(err).__name__}: {err}); score 0. Please tell your instructor."
        print(message, flush=True)
        data = {"score": 0.0, "output": message, "visibility": config.get("visibility", "visible"),
                "stdout_visibility": "hidden", "tests": []}
    results.write_text(json.dumps(data, indent=1), encoding="utf-8")
    print(f"gradescope_run: score {data['score']}; wrote {results}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
