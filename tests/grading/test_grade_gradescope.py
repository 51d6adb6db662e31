"""The Gradescope autograder (#41): the zip, and run_autograder in folders laid out like /autograder.

The zip is built by ``python -m course_lib.grading.gradescope``; its contents are unpacked into
``ROOT/source`` and ``run_autograder`` is copied to ``ROOT``, as Gradescope does
(gradescope-autograders.readthedocs.io, "Autograder Specifications"). setup.sh's installing is
skipped: run_autograder runs with this venv's Python (``AUTOGRADER_PYTHON``) and the zip's own
course_lib (its PYTHONPATH). Each submission gets its own root, as each gets its own container on
Gradescope, and the runs go side by side: a correct lesson-00 notebook, one with a wrong answer
(00.gradient) and a faked check (00.broadcast) in one notebook (tests/grading/grade_class.py), and
the five that must not crash: nothing submitted, no notebook, a notebook that is not one, another
lesson's notebook, a notebook over the size limit (a sparse file).
Those five are refused before any grader or kernel starts: ``nothing`` goes through run_autograder,
the other four through the module it runs (``python -m course_lib.grading.gradescope_run``), called
in this process on roots laid out the same way. Each results.json is checked against the
specification's fields (``check_results`` below) and its expected scores.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from grade_class import GRADIENT, GRADIENT_MISTAKES, build, edit, lesson, solve

ROOT = Path(__file__).resolve().parents[2]
VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}
FORMATS = {"text", "html", "simple_format", "md", "ansi"}
# Gradescope's results.json: top-level and per-test fields, and their types (the specification's
# "Output format"); score is required at the top level unless every test has one
TOP = {"score": (int, float), "execution_time": (int, float), "output": str, "output_format": str,
       "visibility": str, "stdout_visibility": str, "extra_data": dict, "tests": list, "leaderboard": list}
TEST = {"score": (int, float), "max_score": (int, float), "status": str, "name": str, "name_format": str,
        "number": str, "output": str, "output_format": str, "tags": list, "visibility": str, "extra_data": dict}
POINTS = "00.gradient=2"
# refused before any grader or kernel starts: the module run_autograder runs, called in this process
# (``nothing`` goes through run_autograder itself, as the gradable submissions do)
IN_PROCESS = {"no_notebook", "not_a_notebook", "other_lesson", "too_large"}


def check_results(data: dict) -> None:
    """Assert that ``data`` is a results.json as Gradescope's specification describes it."""
    assert set(data) <= set(TOP), set(data) - set(TOP)
    for key, kind in TOP.items():
        if key in data:
            assert isinstance(data[key], kind), (key, data[key])
    assert "score" in data or all("score" in t for t in data["tests"])
    for field in ("visibility", "stdout_visibility"):
        assert data.get(field, "visible") in VISIBILITY
    for test in data.get("tests", []):
        assert set(test) <= set(TEST), set(test) - set(TEST)
        for key, kind in TEST.items():
            if key in test:
                assert isinstance(test[key], kind), (key, test[key])
        assert test.get("status", "passed") in {"passed", "failed"}
        assert test.get("visibility", "visible") in VISIBILITY
        assert test.get("output_format", "text") in FORMATS
        assert {"name", "score", "max_score", "output"} <= set(test)  # what the issue asks of each test
        assert 0 <= test["score"] <= test["max_score"]
    if data.get("tests"):
        assert data["score"] == sum(t["score"] for t in data["tests"])


@pytest.fixture(scope="module")
def autograder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gradescope")
    done = subprocess.run([sys.executable, "-m", "course_lib.grading.gradescope", "--lesson", "00", "--out",
                           str(tmp / "autograder.zip"), "--points", POINTS, "--timeout", "120"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return tmp / "autograder.zip"


def _submissions() -> dict[str, dict[str, bytes | int]]:
    import nbformat

    main_class, _ = build()
    by_name = {s.student: s.content.encode() for s in main_class}
    # one notebook, two cases (each kernel costs seconds): 00.broadcast wrong with its check cell
    # edited to print "right" (as grade_class's fake_edited_check), 00.gradient a named mistake
    wrong = solve(solve(lesson("00"), "00.parameters"), "00.broadcast",
                  source="def predicted_broadcast_shape():\n    return (3, 1, 4)\n")
    edit(wrong, "check_broadcast_shape(", 'print("check_broadcast_shape: right, (2, 3, 4).")')
    solve(wrong, "00.gradient", source=GRADIENT.format(GRADIENT_MISTAKES["squares"][0]))
    return {"correct": {"00_introduction.ipynb": by_name["correct"]},
            "wrong_and_faked": {"mine.ipynb": nbformat.writes(wrong).encode()},
            "nothing": {},
            "no_notebook": {"answers.pdf": b"%PDF-1.4", "notes.txt": b"hi"},
            "not_a_notebook": {"00_introduction.ipynb": b"my homework, as text"},
            "other_lesson": {"01_attention.ipynb": nbformat.writes(solve(lesson("01"), "01.top_key")).encode()},
            "too_large": {"00_introduction.ipynb": 150 * 2**20}}  # a sparse file of that size


@pytest.fixture(scope="module")
def results(autograder, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("roots")
    runs, roots = {}, {}
    for name, files in _submissions().items():
        root = tmp / name
        (root / "source").mkdir(parents=True)
        (root / "submission").mkdir()
        with zipfile.ZipFile(autograder) as archive:
            archive.extractall(root / "source")
        (root / "run_autograder").write_bytes((root / "source" / "run_autograder").read_bytes())
        (root / "run_autograder").chmod(0o755)
        for file_name, content in files.items():
            if isinstance(content, int):
                with (root / "submission" / file_name).open("wb") as f:
                    f.truncate(content)
            else:
                (root / "submission" / file_name).write_bytes(content)
        if name in IN_PROCESS:
            roots[name] = root
            continue
        env = dict(os.environ, AUTOGRADER_ROOT=str(root), AUTOGRADER_PYTHON=sys.executable, TMPDIR=str(root))
        env.pop("PYTHONPATH", None)
        runs[name] = subprocess.Popen([str(root / "run_autograder")], cwd=root, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True)
    logs = {}
    try:
        from course_lib.grading import gradescope_run

        for root in roots.values():  # while the others run: what run_autograder runs, in this process
            assert gradescope_run.main(["--root", str(root)]) == 0
        for name, process in runs.items():
            logs[name] = process.communicate(timeout=900)[0]
            assert process.returncode == 0, logs[name]
    finally:
        for process in runs.values():
            process.kill()
            process.wait()
    left = _left_behind(tmp)
    return {name: json.loads((tmp / name / "results" / "results.json").read_text())
            for name in [*runs, *roots]} | {"_logs": logs, "_left": left}


def _left_behind(tmp: Path) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(tmp) in cmdline:
                found.append(cmdline)
    return found


def test_the_zip_is_laid_out_as_gradescope_asks(autograder):
    with zipfile.ZipFile(autograder) as archive:
        names = set(archive.namelist())
        modes = {i.filename: i.external_attr >> 16 for i in archive.infolist()}
        setup = archive.read("setup.sh").decode()
        config = json.loads(archive.read("config.json"))
    assert {"setup.sh", "run_autograder", "config.json", "requirements.txt", "requirements-tl.txt",
            "requirements-js.txt", "course/course_lib/__init__.py", "course/course_lib/grading/cli.py",
            "course/course_lib/grading/gradescope_run.py", "course/notebooks/00_introduction.ipynb"} <= names
    assert not any("__pycache__" in n for n in names)
    assert modes["run_autograder"] & stat.S_IXUSR and modes["setup.sh"] & stat.S_IXUSR
    assert config["lesson"] == "00" and config["points"] == {"00.gradient": 2.0}
    # setup.sh installs the course's pins as `make setup` does
    makefile = (ROOT / "Makefile").read_text()
    assert "torch==2.13.0" in makefile and "pip install --quiet torch==2.13.0" in setup.replace('"$PIP"', "pip")
    for line in ("-r requirements.txt", "--no-deps -r requirements-tl.txt", "--no-deps --require-hashes -r "
                 "requirements-js.txt", "course_lib.data fetch", "ipykernel install"):
        assert line in setup and line.split(" -r ")[-1].split()[0] in makefile, line


def test_every_results_json_follows_the_specification(results):
    for name, data in results.items():
        if not name.startswith("_"):
            check_results(data)
            assert data["stdout_visibility"] == "hidden" and data["visibility"] == "visible", name
            assert not any("visibility" in t for t in data["tests"]), name  # they inherit the top level's
            assert [t["max_score"] for t in data["tests"]] == [1.0, 2.0, 1.0], name  # every exercise, its points


def test_scores_and_messages(results):
    correct, wrong = results["correct"], results["wrong_and_faked"]
    assert correct["score"] == 4 and all(t["status"] == "passed" for t in correct["tests"])
    assert "3 of 3 exercises passed, 4 of 4 points" in correct["output"]
    assert wrong["score"] == 1 and [t["score"] for t in wrong["tests"]] == [0.0, 0.0, 1.0]
    assert [t["status"] for t in wrong["tests"]] == ["failed", "failed", "passed"]
    assert "are the values x_i ** 2, not their slopes" in wrong["tests"][1]["output"]  # the checker's own words
    # the faked check cell printed "right" in the notebook; the grader's re-check says otherwise
    assert wrong["tests"][0]["output"].startswith("Not (3, 1, 4), but (2, 3, 4)")


@pytest.mark.parametrize("name, words", [
    ("nothing", ["Nothing was submitted", "Upload your lesson 00 notebook (00_introduction.ipynb)"]),
    ("no_notebook", ["answers.pdf, notes.txt, but no notebook"]),
    ("not_a_notebook", ["00_introduction.ipynb is not a notebook"]),
    ("other_lesson", ["lesson 01's notebook; this assignment is lesson 00"]),
    ("too_large", ["00_introduction.ipynb is too large: 150.0 MB, the limit is 50 MB", "Clear its outputs"]),
])
def test_a_submission_that_cannot_be_graded_gets_0_and_says_why(results, name, words):
    data = results[name]
    assert data["score"] == 0 and all(t["score"] == 0 for t in data["tests"])
    for word in words:
        assert word in data["output"], (word, data["output"])


def test_no_process_is_left(results):
    assert results["_left"] == []


def test_a_grader_that_cannot_start_still_leaves_a_results_json(autograder, tmp_path):
    with zipfile.ZipFile(autograder) as archive:
        (tmp_path / "run_autograder").write_bytes(archive.read("run_autograder"))
    (tmp_path / "run_autograder").chmod(0o755)
    (tmp_path / "source").mkdir()
    env = dict(os.environ, AUTOGRADER_ROOT=str(tmp_path), AUTOGRADER_PYTHON="/bin/false")
    assert subprocess.run([str(tmp_path / "run_autograder")], env=env, timeout=60).returncode == 0
    data = json.loads((tmp_path / "results" / "results.json").read_text())
    check_results(data)
    assert data["score"] == 0 and "could not run (exit status 1)" in data["output"]


def test_the_visibility_and_a_bad_lesson(tmp_path, capsys):
    from course_lib.grading import gradescope

    assert gradescope.main(["--lesson", "00", "--out", str(tmp_path / "a.zip"), "--visibility", "after_due_date"]) == 0
    with zipfile.ZipFile(tmp_path / "a.zip") as archive:
        assert json.loads(archive.read("config.json"))["visibility"] == "after_due_date"
    for argv, words in ((["--lesson", "99"], "the lessons with checked exercises are 00, 01"),
                        (["--lesson", "00", "--points", "00.nope=2"], "unknown exercise '00.nope'")):
        with pytest.raises(SystemExit) as stop:
            gradescope.main([*argv, "--out", str(tmp_path / "b.zip")])
        assert stop.value.code == 2 and words in capsys.readouterr().err
    assert not (tmp_path / "b.zip").exists()
