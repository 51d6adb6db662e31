"""The grader's platform files (#41): points per exercise, the roster, Canvas's and Moodle's files,
and bad options. No kernel runs here: the rows are made by hand, as the grader makes them, and
written by the same functions the grader calls; the options go through course_lib.grading's own
command line (in this process, and once in a child process for the exit code and the absence of a
traceback). Canvas's file is read back by tests/grading/canvas_importer.py, a re-statement of Canvas's
GradebookImporter."""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from canvas_importer import InvalidHeaderRow, find_student, parse_header, read

from course_lib import grade
from course_lib.grading import platforms
from course_lib.grading.lessons import read_lessons
from course_lib.grading.points import parse_points
from course_lib.grading.roster import read_roster
from course_lib.grading.runner import Graded

ROOT = Path(__file__).resolve().parents[2]
L00 = ["00.broadcast", "00.gradient", "00.parameters"]
# Canvas's own export (Grades > Export), as an instructor downloads it: a byte-order mark, the
# learner columns, an assignment column with its id, computed columns, a Points Possible row, a
# test student without a login
CANVAS_EXPORT = ("\ufeffStudent,ID,SIS User ID,SIS Login ID,Section,Lesson 00 (5501),Current Score,Final Score\n"
                 "    Points Possible,,,,,3,(read only),(read only)\n"
                 '"Lovelace, Ada",101,S101,ada,Sec A,,,\n'
                 '"Turing, Alan",102,S102,alan,Sec A,,,\n'
                 '"Hopper, Grace",103,S103,grace,Sec B,,,\n'
                 '"Student, Test",999,,,Sec A,,,\n')
MOODLE_EXPORT = ("First name,Last name,ID number,Institution,Department,Email address,Lesson 00\n"
                 "Ada,Lovelace,1815,,,ada@uni.example,\nAlan,Turing,1912,,,alan@uni.example,\n")


def outcome(passed: bool) -> dict[str, str]:
    return ({"outcome": "passed", "message": "right", "mistake": "", "site": ""} if passed else
            {"outcome": "failed", "message": "x.grad is the values x_i ** 2", "mistake": "squares", "site": ""})


def row(student: str, marks: list[int], lesson: str = "00", status: str = "graded") -> Graded:
    return Graded(student=student, lesson=lesson, status=status, seconds=3.0,
                  results={k: outcome(bool(m)) for k, m in zip(L00, marks)})


CLASS = [row("ada", [1, 1, 1]), row("alan", [1, 0, 1]), row("stranger", [0, 1, 0]),
         Graded(student="word_file", status="not a notebook", notes=["could not read it"])]


def options(*argv: str) -> platforms.Platform:
    parser = argparse.ArgumentParser()
    platforms.add_arguments(parser)
    return platforms.from_arguments(parser.parse_args(list(argv)), read_lessons())


def write(tmp: Path, rows: list[Graded], *argv: str) -> list[str]:
    return grade.write_outputs(tmp, rows, read_lessons(), "grade: sandbox test", options(*argv), None,
                               [r.student for r in rows])


def csv_rows(path: Path) -> list[list[str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


# ----------------------------------------------------------------------------------------------
# Points
# ----------------------------------------------------------------------------------------------

def test_points_inline_and_from_each_file_format(tmp_path):
    lessons = read_lessons()
    expected = {"09.lm_train": 3.0, "00.gradient": 0.5}
    assert parse_points("09.lm_train=3, 00.gradient=0.5", lessons) == expected
    (tmp_path / "p.json").write_text(json.dumps({"09.lm_train": 3, "00.gradient": 0.5}))
    (tmp_path / "p.toml").write_text('[points]\n"09.lm_train" = 3\n"00.gradient" = 0.5\n')
    (tmp_path / "p.csv").write_text("exercise,points\n09.lm_train,3\n00.gradient,0.5\n")
    for name in ("p.json", "p.toml", "p.csv"):
        assert parse_points(str(tmp_path / name), lessons) == expected, name
    assert parse_points(None, lessons) == {}


@pytest.mark.parametrize("spec, words", [
    ("09.lm_trian=3", ["unknown exercise '09.lm_trian'", "09.lm_train", "09.generate"]),
    ("99.x=1", ["unknown exercise '99.x'", "00, 01, 02"]),
    ("09.lm_train=-1", ["must be a number >= 0"]),
    ("09.lm_train=nan", ["must be a number >= 0"]),
    ("09.lm_train=three", ["must be a number"]),
    ("09.lm_train", ["neither a file nor KEY=POINTS"]),
])
def test_bad_points_say_what_to_fix(spec, words):
    with pytest.raises(ValueError) as err:
        parse_points(spec, read_lessons())
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_total_is_the_sum_of_the_points_earned(tmp_path):
    write(tmp_path, CLASS, "--points", "00.gradient=2,00.parameters=0.5")
    rows = {r[0]: r for r in csv_rows(tmp_path / "grades.csv")}
    assert rows["student"] == ["student", "lesson", *L00, "total", "status"]
    assert rows["ada"][2:] == ["1", "2", "0.5", "3.5", "graded"]
    assert rows["alan"][2:] == ["1", "0", "0.5", "1.5", "graded"]
    assert rows["word_file"][2:] == ["", "", "", "0", "not a notebook"]
    # without --points every exercise is worth 1, as before
    write(tmp_path / "plain", CLASS)
    assert {r[0]: r for r in csv_rows(tmp_path / "plain" / "grades.csv")}["ada"][2:] == ["1", "1", "1", "3", "graded"]
    # the feedback page says the points when exercises are weighted, and only then
    assert "lesson 00: 2 of 3 exercises passed, 1.5 of 3.5 points." in (tmp_path / "feedback" / "alan.html").read_text()
    assert "lesson 00: 2 of 3 exercises passed.</p>" in (tmp_path / "plain" / "feedback" / "alan.html").read_text()


# ----------------------------------------------------------------------------------------------
# Canvas
# ----------------------------------------------------------------------------------------------

def test_canvas_reads_its_own_export_as_this_restatement_does():
    """The re-statement of the importer accepts Canvas's own export (its columns, its Points
    Possible row, its computed columns left out), so it tests the rules, not our file's habits."""
    imported = read(CANVAS_EXPORT.lstrip("\ufeff"))
    assert imported.student_columns == 5 and imported.assignments == [("Lesson 00", "5501", 5)]
    assert imported.points_possible == {5: "3"}
    assert [s["SIS Login ID"] for s in imported.students] == ["ada", "alan", "grace", ""]
    with pytest.raises(InvalidHeaderRow):
        parse_header(["Name", "ID", "SIS Login ID", "Section", "Lesson 00"])
    with pytest.raises(InvalidHeaderRow):
        parse_header(["Student", "ID", "SIS Login ID", "Group", "Lesson 00"])


def test_canvas_file_is_what_canvas_imports(tmp_path):
    (tmp_path / "roster.csv").write_text(CANVAS_EXPORT, encoding="utf-8")
    (tmp_path / "out").mkdir()
    log = write(tmp_path / "out", CLASS, "--roster", str(tmp_path / "roster.csv"), "--points", "00.gradient=2")
    text = (tmp_path / "out" / "grades_canvas_00.csv").read_text(encoding="utf-8")
    assert text.splitlines()[0] == "Student,ID,SIS User ID,SIS Login ID,Section,Lesson 00 (5501)"
    imported = read(text)
    assert imported.student_columns == 5 and imported.id_columns == {"ID": 1, "SIS User ID": 2, "SIS Login ID": 3}
    assert imported.assignments == [("Lesson 00", "5501", 5)]  # the id from the roster's own column
    assert imported.points_possible == {5: "4"}  # 1 + 2 + 1
    course = [{"ID": "101", "SIS User ID": "S101", "SIS Login ID": "ada", "name": "Ada Lovelace"},
              {"ID": "102", "SIS User ID": "S102", "SIS Login ID": "alan", "name": "Alan Turing"}]
    grades = {}
    for cells in imported.students:
        person = find_student(cells, course)
        grades[person["ID"] if person else cells["Student"]] = cells["Lesson 00 (5501)"]
    # each roster learner found by Canvas's user id, with the points earned; the stranger's row is
    # kept, marked, and Canvas's preview asks who it is; grace (no submission) is not written
    assert grades == {"101": "4", "102": "2", "stranger (not in roster)": "2"}
    assert imported.students[2]["SIS Login ID"] == "stranger"
    assert "Hopper" not in text and "word_file" not in text
    assert any("not in the roster" in line and "stranger" in line for line in log)
    assert any("no submission" in line and "Hopper, Grace (grace)" in line for line in log)


def test_canvas_assignment_id_from_the_command_line_or_none(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text(CANVAS_EXPORT.replace("Lesson 00 (5501)", "Quiz (77)"), encoding="utf-8")
    write(tmp_path / "a", CLASS, "--roster", str(roster), "--canvas-assignment", "00=4242")
    assert read((tmp_path / "a" / "grades_canvas_00.csv").read_text()).assignments == [("Lesson 00", "4242", 5)]
    # no id anywhere: "Lesson 00", which Canvas matches by title or offers to create (and says so)
    log = write(tmp_path / "b", CLASS, "--roster", str(roster))
    assert read((tmp_path / "b" / "grades_canvas_00.csv").read_text()).assignments == [("Lesson 00", None, 5)]
    assert any("no Canvas assignment id for lesson 00" in line for line in log)


def test_roster_key_picks_another_column(tmp_path):
    (tmp_path / "roster.csv").write_text(CANVAS_EXPORT, encoding="utf-8")
    rows = [row("S101", [1, 1, 1]), row("s102", [0, 0, 1])]  # SIS User IDs, one in another case
    write(tmp_path / "out", rows, "--roster", str(tmp_path / "roster.csv"), "--roster-key", "SIS User ID")
    imported = read((tmp_path / "out" / "grades_canvas_00.csv").read_text())
    assert [(s["ID"], s["Lesson 00 (5501)"]) for s in imported.students] == [("101", "3"), ("102", "1")]


def test_report_lists_who_is_on_one_side_only(tmp_path):
    (tmp_path / "roster.csv").write_text(CANVAS_EXPORT, encoding="utf-8")
    write(tmp_path, CLASS, "--roster", str(tmp_path / "roster.csv"))
    report = (tmp_path / "report.html").read_text(encoding="utf-8")
    section = report.split("<h2>The roster</h2>")[1]
    assert "Submissions not in the roster (2)" in section and "<li>stranger</li>" in section
    assert "<li>word_file</li>" in section
    assert "In the roster, no submission (2)" in section and "Hopper, Grace (grace)" in section
    assert "Student, Test (no SIS Login ID)" in section
    # grades.csv keeps every row, the roster or not
    assert sorted(r[0] for r in csv_rows(tmp_path / "grades.csv")[1:]) == ["ada", "alan", "stranger", "word_file"]


# ----------------------------------------------------------------------------------------------
# Moodle
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("identity, header, values", [
    ("email", "Email address", ["ada@uni.example", "alan@uni.example"]),
    ("idnumber", "ID number", ["1815", "1912"]),
])
def test_moodle_file_maps_the_chosen_identity(tmp_path, identity, header, values):
    (tmp_path / "moodle.csv").write_text(MOODLE_EXPORT, encoding="utf-8")
    rows = [row("ada@uni.example", [1, 1, 1]), row("alan@uni.example", [1, 0, 0]), row("x", [1, 1, 1])]
    write(tmp_path, rows, "--roster", str(tmp_path / "moodle.csv"), "--roster-key", "Email address",
          "--moodle-id", identity)
    lines = csv_rows(tmp_path / "grades_moodle_00.csv")
    assert lines == [[header, "Lesson 00"], [values[0], "3"], [values[1], "1"]]  # x: not in the roster


def test_moodle_without_roster_uses_the_file_names(tmp_path):
    write(tmp_path, CLASS, "--moodle-id", "username", "--points", "00.broadcast=10")
    assert csv_rows(tmp_path / "grades_moodle_00.csv") == [["Username", "Lesson 00"], ["ada", "12"], ["alan", "11"],
                                                          ["stranger", "1"]]
    assert not (tmp_path / "grades_canvas_00.csv").exists()  # no roster, no Canvas assignment: no Canvas file


# ----------------------------------------------------------------------------------------------
# Bad input: what to fix, exit code 2, no traceback
# ----------------------------------------------------------------------------------------------

def bad(tmp: Path, *argv: str, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        grade.main(["--out", str(tmp / "out"), *argv, str(tmp / "a.ipynb")])
    assert stop.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("roster, argv, words", [
    (CANVAS_EXPORT, ["--roster-key", "Email"], ["no column 'Email'", "'SIS Login ID'", "--roster-key"]),
    ("", [], ["is empty"]),
    ("Student,ID,SIS Login ID,Section\nAda,1,ada,A\nAda B,2,ADA,A\n", [], ["'ADA' is on rows 2 and 3"]),
    ("Student,ID,SIS Login ID,Section\nAda,1,ada,A,extra,cells\n", [], ["row 2 has 6 cells but the header has 4"]),
    ('Student,ID,SIS Login ID,Section\n"Ada,1,ada,A\n', [], ["well-formed CSV"]),
    (CANVAS_EXPORT, ["--moodle-id", "email"], ["no column 'Email address'"]),
    (None, ["--roster-key", "ID"], ["--roster-key needs --roster"]),
    (CANVAS_EXPORT, ["--canvas-assignment", "0=12"], ["NN=ID"]),
])
def test_bad_roster_options_exit_2_with_what_to_fix(tmp_path, capsys, roster, argv, words):
    (tmp_path / "a.ipynb").write_text("{}")
    if roster is not None:
        (tmp_path / "roster.csv").write_text(roster, encoding="utf-8")
        argv = ["--roster", str(tmp_path / "roster.csv"), *argv]
    err = bad(tmp_path, *argv, capsys=capsys)
    for word in words:
        assert word in err, (word, err)
    assert not (tmp_path / "out").exists()  # stopped before grading anything


def test_binary_roster_and_unknown_points_key(tmp_path, capsys):
    (tmp_path / "a.ipynb").write_text("{}")
    (tmp_path / "roster.xlsx").write_bytes(b"PK\x03\x04\xff\xfe\x00binary")
    assert "not a UTF-8 text file" in bad(tmp_path, "--roster", str(tmp_path / "roster.xlsx"), capsys=capsys)
    err = bad(tmp_path, "--points", "00.gradiant=2", capsys=capsys)
    assert "unknown exercise '00.gradiant'" in err and "00.broadcast, 00.gradient, 00.parameters" in err


def test_bad_input_from_the_command_line_has_no_traceback(tmp_path):
    (tmp_path / "roster.csv").write_text(CANVAS_EXPORT, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "course_lib.grading", "--out", str(tmp_path / "out"),
                           "--roster", str(tmp_path / "roster.csv"), "--roster-key", "E-mail", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "no column 'E-mail'" in done.stderr


def test_read_roster_skips_what_is_not_a_learner(tmp_path):
    (tmp_path / "r.csv").write_text(CANVAS_EXPORT.replace(",", ";"), encoding="utf-8")  # a ';' locale
    roster = read_roster(tmp_path / "r.csv")
    assert [r["Student"] for r in roster.rows] == ["Lovelace; Ada", "Turing; Alan", "Hopper; Grace", "Student; Test"]
    assert roster.canvas_assignments() == {"00": "5501"}


def test_two_files_for_one_roster_learner_stop_before_grading(tmp_path, capsys):
    (tmp_path / "roster.csv").write_text(CANVAS_EXPORT, encoding="utf-8")
    (tmp_path / "class").mkdir()
    for stem in ("Ada", "ada"):
        (tmp_path / "class" / f"{stem}.ipynb").write_text("{}")
    with pytest.raises(SystemExit) as stop:
        grade.main(["--out", str(tmp_path / "out"), "--roster", str(tmp_path / "roster.csv"), str(tmp_path / "class")])
    assert stop.value.code == 2
    assert "'Ada' and 'ada' both match the SIS Login ID 'ada'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------
# Files an instructor opens in a spreadsheet: no cell is a formula (#49)
# ----------------------------------------------------------------------------------------------

FORMULA_IDS = ["=2+5", "+1", "-x", "@SUM(A1)", "\tcmd", "\rcmd"]


def test_no_csv_cell_opens_as_a_formula(tmp_path):
    """A learner's id is the file's stem, which the learner chose: ``=2+5.ipynb`` must not be a
    formula in any file the grader writes (OWASP: a leading ``'`` for = + - @ tab CR)."""
    from course_lib.grading.csvfile import FORMULA_STARTS, cell

    rows = [row(stem, [1, 0, 1]) for stem in FORMULA_IDS] + [row("ada", [1, 1, 1])]
    roster = tmp_path / "roster.csv"
    roster.write_text("Student,ID,SIS User ID,SIS Login ID,Section\n"
                      + "".join(f'"{s} name",{i},S{i},"{s}",=HYPERLINK(1)\n' for i, s in enumerate(FORMULA_IDS[:4])),
                      encoding="utf-8")
    write(tmp_path / "canvas", rows, "--roster", str(roster), "--canvas-assignment", "00=12")
    write(tmp_path / "moodle", rows, "--moodle-id", "username")
    files = sorted((tmp_path / "canvas").glob("*.csv")) + sorted((tmp_path / "moodle").glob("*.csv"))
    assert {p.name for p in files} == {"grades.csv", "grades_00.csv", "grades_canvas_00.csv", "grades_moodle_00.csv"}
    for path in files:
        cells = [c for line in csv_rows(path) for c in line]
        assert not [c for c in cells if c.startswith(FORMULA_STARTS)], path.name
        for stem in FORMULA_IDS:
            assert "'" + stem in cells or f"'{stem} name" in cells or f"'{stem} (not in roster)" in cells, \
                (path.name, stem)
    grades = {r[0]: r for r in csv_rows(tmp_path / "canvas" / "grades.csv")}
    assert grades["'=2+5"][1:] == ["00", "1", "0", "1", "2", "graded"]  # the marks stay numbers
    canvas = {r[1]: r for r in csv_rows(tmp_path / "canvas" / "grades_canvas_00.csv")}
    assert canvas["0"] == ["'=2+5 name", "0", "S0", "'=2+5", "'=HYPERLINK(1)", "2"]  # roster cells are text too
    # numbers are written as numbers, a negative one too; only text gets the quote
    assert [cell(v) for v in (-1, -1.5, 3.0, 0, "-1", "a-b", "", None)] == \
        ["-1", "-1.5", "3", "0", "'-1", "a-b", "", ""]


def test_every_csv_the_grader_writes_goes_through_one_function():
    grading = ROOT / "course_lib" / "grading"
    writers = [p.name for p in grading.glob("*.py") if "csv.writer" in p.read_text(encoding="utf-8")]
    assert writers == ["csvfile.py"]


def test_a_moodle_roster_writes_only_moodles_file(tmp_path):
    (tmp_path / "moodle.csv").write_text(MOODLE_EXPORT, encoding="utf-8")
    moodle = ["--roster", str(tmp_path / "moodle.csv"), "--roster-key", "Email address"]
    rows = [row("ada@uni.example", [1, 1, 1])]
    log = write(tmp_path / "m", rows, *moodle, "--moodle-id", "email")
    assert (tmp_path / "m" / "grades_moodle_00.csv").exists()
    assert not (tmp_path / "m" / "grades_canvas_00.csv").exists()  # its identity cells would all be empty
    assert "grades_canvas" not in " ".join(log)
    # without --moodle-id, no platform file at all, and the log says why
    log = write(tmp_path / "none", rows, *moodle)
    assert not list((tmp_path / "none").glob("grades_*_00.csv"))
    assert any("no platform file: the roster moodle.csv has none of Canvas's columns" in line for line in log)
    # a Canvas assignment id asks for Canvas's file, whatever the roster; Canvas's roster gets both
    write(tmp_path / "both", rows, *moodle, "--moodle-id", "email", "--canvas-assignment", "00=7")
    assert (tmp_path / "both" / "grades_canvas_00.csv").exists()
    (tmp_path / "canvas.csv").write_text(CANVAS_EXPORT.replace("Section,", "Section,Username,").replace(
        ",Sec ", ",x,Sec "), encoding="utf-8")
    write(tmp_path / "canvas", [row("ada", [1, 1, 1])], "--roster", str(tmp_path / "canvas.csv"), "--moodle-id",
          "username")
    assert {p.name for p in (tmp_path / "canvas").glob("grades_*_00.csv")} == {"grades_canvas_00.csv",
                                                                              "grades_moodle_00.csv"}
