"""The grader on a generated class (tests/grade_class.py): every row of grades.csv, the report, feedback.

32 submissions of lessons 00, 01 and 02 are graded in one call of ``python -m course_lib.grade`` with
two workers, and an endless loop in a second call with a 5 s cell limit, started at the same time: it
spends most of its time running into its limit (the module alone took 172 s one after the other,
137 s side by side, on different days, with a 10 s limit). Both run once per session.

Not marked ``long`` (conftest.py starts those first): with two grading workers of its own it fills
both cores when it runs last, after the other worker's lessons. Started first, it ran beside lessons
12 and 11 as three processes on two cores (once measured: 204 s instead of 172, and those lessons
20-65% slower).
"""

from __future__ import annotations

import csv
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from grade_class import GRADIENT_MISTAKES, build, write

from course_lib.grading.lessons import read_lessons
from course_lib.grading.report import mistake_of

ROOT = Path(__file__).resolve().parent.parent


def _digest(folder: Path, pattern: str = "*") -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob(pattern)):
        if path.is_file():
            h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


def _start_grading(out: Path, folder: Path, *options: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "course_lib.grade", "--out", str(out), *options, str(folder)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def _finish_grading(process: subprocess.Popen) -> str:
    try:
        stdout, stderr = process.communicate(timeout=1500)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        raise AssertionError(f"the grader ran over 1,500 s\n{stdout}{stderr}") from None
    assert process.returncode == 0, stdout + stderr
    return stdout


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grade")
    main_class, slow = build()
    write(main_class, tmp / "class")
    write(slow, tmp / "slow")
    before = (_digest(tmp / "class"), _digest(ROOT / "notebooks", "0[0-2]_*.ipynb"))  # the class's lessons
    # The endless loop burns a core for its 5 s limit, twice (its cell, then the re-check); it runs
    # beside the class's call, not after it. Lesson 00's slowest cell takes under 1 s.
    slow_call = _start_grading(tmp / "out_slow", tmp / "slow", "--timeout", "5")
    try:
        log = _finish_grading(_start_grading(tmp / "out", tmp / "class", "--workers", "2", "--timeout", "120"))
    except BaseException:
        slow_call.kill()  # no grader left running behind a failed test
        slow_call.communicate()
        raise
    _finish_grading(slow_call)
    after = (_digest(tmp / "class"), _digest(ROOT / "notebooks", "0[0-2]_*.ipynb"))  # the class's lessons
    return {"tmp": tmp, "class": main_class, "slow": slow, "before": before, "after": after, "log": log}


def _rows(path: Path) -> tuple[list[str], dict[str, dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, {row["student"]: row for row in reader}


def test_the_class_is_big_enough():
    main_class, slow = build()
    assert len(main_class) + len(slow) >= 30
    assert {s.lesson for s in main_class} >= {"00", "01", "02"}


def test_every_row_of_grades_csv(graded):
    header, rows = _rows(graded["tmp"] / "out" / "grades.csv")
    lessons = read_lessons()
    keys = lessons["00"].keys + lessons["01"].keys + lessons["02"].keys
    assert header == ["student", "lesson", *keys, "total", "status"]
    assert sorted(rows) == sorted(s.student for s in graded["class"])
    for sub in graded["class"]:
        row = rows[sub.student]
        expected = {k: "" for k in keys} | {k: str(v) for k, v in sub.marks.items()}
        got = {k: row[k] for k in keys}
        assert (row["lesson"], got, row["status"]) == (sub.lesson, expected, sub.status), sub.student
        assert row["total"] == str(sum(sub.marks.values())), sub.student


def test_the_endless_loop_is_cut_and_the_rest_graded(graded):
    _, rows = _rows(graded["tmp"] / "out_slow" / "grades.csv")
    sub = graded["slow"][0]
    assert rows[sub.student]["status"] == sub.status == "timeout"
    assert {k: rows[sub.student][k] for k in sub.marks} == {k: str(v) for k, v in sub.marks.items()}


def test_one_csv_per_lesson_holds_only_that_lessons_columns(graded):
    header, rows = _rows(graded["tmp"] / "out" / "grades_01.csv")
    assert header == ["student", "lesson", *read_lessons()["01"].keys, "total", "status"]
    assert list(rows) == ["lesson01_reference_pasted"]


def test_the_submissions_and_the_lessons_are_untouched(graded):
    assert graded["before"] == graded["after"]


def test_report_ranks_the_named_mistakes_and_lists_peeks_and_problems(graded):
    report = (graded["tmp"] / "out" / "report.html").read_text(encoding="utf-8")
    assert "<svg" in report and "00.gradient" in report
    for _, words in GRADIENT_MISTAKES.values():
        assert words.split(" so ")[0].replace("'", "&#x27;") in report, words
    assert "8 of 31" not in report  # shares are over the learners graded for that lesson
    assert "<td>peeked</td><td>00.broadcast</td>" in report
    for sub in graded["class"]:
        if sub.status != "graded":
            assert f"<td>{sub.student}</td>" in report and sub.status in report
    # fakes are named: the checker's own message, or the grader's
    assert "calls course_lib&#x27;s solutions" in report
    assert "while it was being checked" in report


def test_mistake_names_come_from_the_checkers_messages():
    assert mistake_of("Likely mistake (3-D input): softmax over the wrong axis (dim=-2). Use dim=-1.") == (
        "softmax over the wrong axis (dim=-2)", "Use dim=-1.")


def test_feedback_says_passed_message_or_not_attempted(graded):
    page = (graded["tmp"] / "out" / "feedback" / "partial.html").read_text(encoding="utf-8")
    assert "1 of 3 exercises passed" in page
    assert page.count("not attempted") == 2 and "passed</span>" in page
    page = (graded["tmp"] / "out" / "feedback" / "mistake_squares.html").read_text(encoding="utf-8")
    assert "are the values x_i ** 2, not their slopes" in page
    page = (graded["tmp"] / "out" / "feedback" / "os_exit.html").read_text(encoding="utf-8")
    assert "kernel died" in page
