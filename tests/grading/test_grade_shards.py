"""Grading a class in shards (#41): ``--shard K/N`` and ``python -m course_lib.grading.merge``.

The split is checked on its own (every learner in exactly one share, shares within one of each
other, independent of the files' order); the merge on rows made by hand (byte for byte what one
write of all the rows gives, and every way shard folders can fail to make one class); then end to
end: a small lesson-00 class (tests/grading/grade_class.py) graded once, and in 3 shards run side by side
and merged. The merged grades.csv, per-lesson, Canvas and Moodle files, report.html and feedback
pages must equal the single run's byte for byte; rows.json row for row, all but the wall times
(``seconds``), which are compared only for being there.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from grade_class import build, write

from course_lib.grading import merge
from course_lib.grading.runner import Graded
from course_lib.grading.shards import parse_shard, shard_of, write_rows

ROOT = Path(__file__).resolve().parents[2]
L00 = ["00.broadcast", "00.gradient", "00.parameters"]
# a Canvas export with a Username column added (for the Moodle file)
ROSTER = ("Student,ID,SIS User ID,SIS Login ID,Section,Lesson 00 (5501),Username\n    Points Possible,,,,,3,\n"
          '"Lovelace, Ada",101,S101,correct,A,,ada\n"Turing, Alan",102,S102,mistake_squares,A,,alan\n'
          '"Hopper, Grace",103,S103,absent,B,,grace\n')
OPTIONS = ["--points", "00.gradient=2", "--moodle-id", "username"]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_shards_split_the_class_once_in_equal_shares_whatever_the_order(n):
    stems = [f"s{i:04d}" for i in range(97)] + ["ada", "Ada", "émile"]
    shares = [shard_of(stems, k, n) for k in range(1, n + 1)]
    assert sorted(s for share in shares for s in share) == sorted(stems)  # each exactly once
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    shuffled = random.Random(n).sample(stems, len(stems))
    assert [shard_of(shuffled, k, n) for k in range(1, n + 1)] == shares


@pytest.mark.parametrize("text", ["4/3", "0/3", "3", "a/b", "1/0", "-1/2", "2/3/4"])
def test_a_bad_shard_says_what_to_fix(text, tmp_path, capsys):
    with pytest.raises(ValueError, match="--shard"):
        parse_shard(text)
    from course_lib import grade

    with pytest.raises(SystemExit) as stop:
        grade.main(["--out", str(tmp_path / "out"), "--shard", text, str(tmp_path)])
    assert stop.value.code == 2 and "--shard" in capsys.readouterr().err
    assert parse_shard("2/3") == (2, 3)


def _row(student: str, marks: list[int], seconds: float) -> Graded:
    results = {k: {"outcome": "passed" if m else "failed", "message": f"{k}: {'right' if m else 'no'}",
                   "mistake": "" if m else "m", "site": ""} for k, m in zip(L00, marks)}
    return Graded(student=student, lesson="00", results=results, seconds=seconds)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "rows.json"}


def _rows(folder: Path) -> dict:
    data = json.loads((folder / "rows.json").read_text(encoding="utf-8"))
    for row in data["rows"]:
        seconds = row.pop("seconds")  # kept, and the only field a second run may change
        assert seconds > 0 if row["lesson"] else seconds >= 0, row  # (not run: not a notebook)
    return data


def test_merge_writes_what_one_write_of_all_rows_writes(tmp_path):
    from course_lib.grading.cli import write_outputs
    from course_lib.grading.lessons import read_lessons

    rows = [_row(f"learner{i}", [i % 2, i % 3 == 0, 1], 1.0 + i) for i in range(10)]
    rows.append(Graded(student="word", status="not a notebook", notes=["no"], seconds=0.1))
    everyone = [r.student for r in rows]
    (tmp_path / "roster.csv").write_text(ROSTER.replace("correct", "learner1"), encoding="utf-8")
    argv = ["--roster", str(tmp_path / "roster.csv"), *OPTIONS]
    parser = __import__("argparse").ArgumentParser()
    merge.platforms.add_arguments(parser)
    platform = merge.platforms.from_arguments(parser.parse_args(argv), read_lessons())
    write_outputs(tmp_path / "one", rows, read_lessons(), "grade: line", platform, None, everyone)
    for k in (1, 2, 3):
        mine = shard_of(everyone, k, 3)
        write_outputs(tmp_path / f"s{k}", [r for r in rows if r.student in mine], read_lessons(), "grade: line",
                      platform, (k, 3), everyone)
    assert merge.main(["--out", str(tmp_path / "merged"), *(str(tmp_path / f"s{k}") for k in (3, 1, 2))]) == 0
    assert _files(tmp_path / "merged") == _files(tmp_path / "one")
    assert {"grades_canvas_00.csv", "grades_moodle_00.csv", "report.html"} <= set(_files(tmp_path / "one"))
    assert _rows(tmp_path / "merged") == _rows(tmp_path / "one")
    # an option given to the merge replaces its own; the others stay as the shards recorded them
    assert merge.main(["--out", str(tmp_path / "again"), "--points", "00.parameters=5",
                       *(str(tmp_path / f"s{k}") for k in (1, 2, 3))]) == 0
    canvas = (tmp_path / "again" / "grades_canvas_00.csv").read_text().splitlines()
    assert canvas[1] == "Points Possible,,,,,7" and (tmp_path / "again" / "grades_moodle_00.csv").exists()


def test_merge_refuses_shards_that_do_not_make_one_class(tmp_path, capsys):
    everyone = ["a", "b", "c", "d"]
    rows = {s: _row(s, [1, 1, 1], 1.0) for s in [*everyone, "e"]}

    def shard(name: str, k: int, n: int, stems=everyone, platform=None) -> str:
        mine = shard_of(stems, k, n)
        write_rows(tmp_path / name, [rows[s] for s in stems if s in mine], stems, (k, n), "line",
                   platform or {"points": {}, "roster": None, "roster_key": "SIS Login ID",
                                "canvas_assignments": {}, "moodle_id": None})
        return str(tmp_path / name)

    def refused(*folders: str) -> str:
        with pytest.raises(SystemExit) as stop:
            merge.main(["--out", str(tmp_path / "out"), *folders])
        assert stop.value.code == 2
        return capsys.readouterr().err

    one, two = shard("one", 1, 2), shard("two", 2, 2)
    assert "shard(s) 2/2 missing" in refused(one)
    assert "shard 1/2 is given twice" in refused(one, one, two)
    assert "different classes" in refused(one, shard("other", 2, 2, everyone + ["e"]))
    assert "different numbers of shares" in refused(one, shard("thirds", 2, 3))
    assert "no rows.json" in refused(one, str(tmp_path))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "rows.json").write_text('{"format": 1, "rows": [')
    assert "unreadable" in refused(one, str(tmp_path / "broken"))
    weighted = shard("weighted", 2, 2, platform={"points": {"00.gradient": 2.0}, "roster": None,
                                                 "roster_key": "SIS Login ID", "canvas_assignments": {},
                                                 "moodle_id": None})
    assert "different --points" in refused(one, weighted)
    assert merge.main(["--out", str(tmp_path / "out"), "--points", "00.gradient=3", one, weighted]) == 0
    assert not (tmp_path / "out" / "rows.json.part").exists()


def _grade(out: Path, folder: Path, *options: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "course_lib.grading", "--out", str(out), *options, str(folder)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=dict(os.environ, TMPDIR=str(out.parent)))


def _finish(process: subprocess.Popen) -> str:
    try:
        log, _ = process.communicate(timeout=900)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0, log
    return log


def test_three_shards_merged_equal_one_run(tmp_path):
    keep = ["correct", "mistake_squares", "not_a_notebook", "other_course"]  # two kernels, two refusals
    main_class, _ = build()
    write([s for s in main_class if s.student in keep], tmp_path / "class")
    (tmp_path / "roster.csv").write_text(ROSTER, encoding="utf-8")
    options = ["--roster", str(tmp_path / "roster.csv"), *OPTIONS, "--timeout", "120"]
    # the single run and the three shards side by side, one worker each (two cores)
    runs = [_grade(tmp_path / "one", tmp_path / "class", *options, "--workers", "1")]
    runs += [_grade(tmp_path / f"shard{k}", tmp_path / "class", *options, "--workers", "1", "--shard", f"{k}/3")
             for k in (1, 2, 3)]
    try:
        logs = [_finish(p) for p in runs]
    finally:
        for p in runs:
            p.kill()
            p.wait()
    assert all("platform files and roster lists are written by" in log for log in logs[1:])
    assert sum(len(json.loads((tmp_path / f"shard{k}" / "rows.json").read_text())["rows"]) for k in (1, 2, 3)) == 4
    done = subprocess.run([sys.executable, "-m", "course_lib.grading.merge", "--out", str(tmp_path / "merged"),
                           *(str(tmp_path / f"shard{k}") for k in (1, 2, 3))],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    merged, one = _files(tmp_path / "merged"), _files(tmp_path / "one")
    assert sorted(merged) == sorted(one)
    assert {"grades.csv", "grades_00.csv", "grades_canvas_00.csv", "grades_moodle_00.csv", "report.html",
            "feedback/correct.html"} <= set(one)
    for name in one:
        assert merged[name] == one[name], name
    assert _rows(tmp_path / "merged")["rows"] == _rows(tmp_path / "one")["rows"]
    grades = one["grades.csv"].decode()
    assert "correct,00,1,2,1,4,graded" in grades and "mistake_squares,00,1,0,1,2,graded" in grades
    assert "Hopper, Grace (absent)" in one["report.html"].decode()  # a roster learner without a submission
