"""The batch survives a kernel that kills the grader, without the sandbox (#49).

Without the sandbox a kernel runs as the grader's user and can SIGKILL the grader's main process:
nothing prevents the kill. What holds (course_lib/grading/journal.py): nothing of the run is left
running (its workers and kernels die with it), and the same command run again completes the batch:
the rows finished before the kill come from the journal, the submission that was being graded gets
0 with the status "grader stopped" (it is not run again: it would kill the grader again), the rest
is graded, and neither the journal nor the dead run's scratch folder is left.

Lesson 00 only, one worker, small limits: three kernels in all. The same for a kernel that changes
course_lib on disk (integrity.py): the run stops, and resumes only once course_lib is restored.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from course_lib.grading import journal
from course_lib.grading.lessons import read_lessons
from course_lib.grading.runner import Graded, Settings
from tests._helpers import running_children
from tests.grading.grade_class import IMPORTS, L00, insert_after, lesson, solve

pytestmark = pytest.mark.long  # two grading runs, three kernels: 2.5 min on 2 cores busy with 12 processes
ROOT = Path(__file__).resolve().parents[2]
# Walks up from the kernel and SIGKILLs the grader's main process (``python -m course_lib.grading``),
# then stops: the worker between them is not touched (it must die with the grader by itself).
KILLER = """import os, signal
pid = os.getppid()
while pid > 1:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read()
    parent = int(stat[stat.rindex(b")") + 2:].split()[1])
    if b"-m\\0course_lib.grading\\0" in cmdline:
        os.kill(pid, signal.SIGKILL)
        break
    pid = parent
"""


def _ours(tmp: Path) -> list[str]:
    """Living processes of the grading runs of this test: their TMPDIR is under ``tmp`` (the grader,
    its workers, multiprocessing's resource tracker, the kernels, whose TMPDIR is their scratch
    folder's), or their command line names it."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
            if stat[stat.rindex(b")") + 2:].split()[0] == b"Z":
                continue
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if any(v.startswith(f"TMPDIR={tmp}".encode()) for v in environ) or str(tmp).encode() in cmdline:
            found.append(cmdline.decode(errors="replace"))
    return found


def _socket_folders_of(tmp: Path) -> list[Path]:
    """Socket folders under /tmp that name a scratch root under ``tmp`` (runner.socket_root)."""
    found = []
    for folder in Path("/tmp").glob("grade-ipc-*"):
        try:
            if (folder / "scratch").read_text(encoding="utf-8").startswith(str(tmp)):
                found.append(folder)
        except OSError:
            continue
    return found


def _none_left(tmp: Path, seconds: float = 15.0) -> list[str]:
    """Wait (a killed process's children die a moment later) until none of the run's processes is
    left; return those still there after ``seconds``."""
    deadline = time.monotonic() + seconds
    while (left := _ours(tmp)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _grade(out: Path, folder: Path, tmp: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "course_lib.grading", "--out", str(out), "--sandbox", "none",
               "--workers", "1", "--timeout", "60", "--notebook-timeout", "120", "--recheck-timeout", "60",
               str(folder)]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=dict(os.environ, TMPDIR=str(tmp)))


def test_a_kernel_that_kills_the_grader_stops_one_run_not_the_batch(tmp_path):
    folder, out, tmp = tmp_path / "class", tmp_path / "out", tmp_path / "tmp"
    folder.mkdir()
    tmp.mkdir()
    # processed in this order by the one worker: a finished row, the killer, one never reached
    (folder / "a_first.ipynb").write_text(nbformat.writes(solve(lesson("00"), *L00)), encoding="utf-8")
    killer = insert_after(solve(lesson("00"), *L00), IMPORTS, KILLER)
    (folder / "b_killer.ipynb").write_text(nbformat.writes(killer), encoding="utf-8")
    (folder / "c_third.ipynb").write_text(nbformat.writes(solve(lesson("00"), "00.broadcast")), encoding="utf-8")
    before = len(running_children())

    first = _grade(out, folder, tmp)
    log = first.stdout + first.stderr
    assert first.returncode == -9, log  # the kernel killed it: no grades.csv
    assert not (out / "grades.csv").exists()
    assert _none_left(tmp) == [], log  # its worker and the killer's kernel died with it
    assert len(running_children()) <= before
    lines = [json.loads(line) for line in (out / journal.JOURNAL_FILE).read_text().splitlines()]
    events = [(e["event"], e.get("student")) for e in lines]
    assert events == [("run", None), ("started", "a_first"), ("finished", "a_first"), ("started", "b_killer")]
    assert lines[2]["row"]["status"] == "graded"
    assert [p.name.split("-")[0] + "-run" for p in tmp.glob("grade-run-*")] == ["grade-run"]  # the dead run's

    second = _grade(out, folder, tmp)
    log = second.stdout + second.stderr
    (tmp_path / "second.log").write_text(log)
    assert second.returncode == 0, log
    assert ("resumed: 1 row(s) taken from the journal of an earlier run that stopped (not graded again); "
            "1 not run again, status 'grader stopped'") in log
    assert re.search(r"removed [12] scratch or socket folder\(s\) of grading runs that died", log)
    assert "[1/1" in log and "c_third" in log and "b_killer: lesson" not in log  # only c_third ran
    with (out / "grades.csv").open(newline="", encoding="utf-8") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert {s: (r["00.broadcast"], r["00.gradient"], r["00.parameters"], r["total"], r["status"])
            for s, r in rows.items()} == {
        "a_first": ("1", "1", "1", "3", "graded"),
        "b_killer": ("0", "0", "0", "0", "grader stopped"),
        "c_third": ("1", "0", "0", "1", "graded")}
    report = (out / "report.html").read_text(encoding="utf-8")
    assert "resumed: 1 row(s)" in report and "its code may have killed it" in report
    assert "can kill the grader: then run the same command again" in report  # the sandbox line
    assert not (out / journal.JOURNAL_FILE).exists()
    assert list(tmp.iterdir()) == []  # no scratch folder, of either run
    assert _socket_folders_of(tmp) == []  # nor a socket folder (TMPDIR is long here: they go to /tmp)
    assert _none_left(tmp, 5) == []


# ----------------------------------------------------------------------------------------------
# The journal itself, without a kernel
# ----------------------------------------------------------------------------------------------

def _journal_of(out: Path, key: str, digests: dict[str, str]) -> journal.Resumed:
    j = journal.Journal(out, key)
    try:
        return journal.resume(j.open(), key, digests)
    finally:
        j.close(remove=False)


def _finished_run(out: Path, key: str, student: str, digest: str) -> None:
    j = journal.Journal(out, key)
    j.open()
    journal.record_started(j.for_workers(), student, digest)
    journal.record_finished(j.for_workers(), Graded(student=student, lesson="00", results={
        "00.broadcast": {"outcome": "passed", "message": "", "mistake": ""}}), digest)
    j.close(remove=False)


def test_a_journal_of_other_settings_or_other_files_is_ignored(tmp_path):
    lessons = read_lessons()
    key = journal.settings_key(Settings(cell_timeout=60), lessons)
    assert journal.settings_key(Settings(cell_timeout=60, seed=3, threads=4), lessons) == key  # not marks
    other = journal.settings_key(Settings(cell_timeout=30), lessons)
    assert other != key and journal.settings_key(Settings(cell_timeout=60, sandbox="bwrap"), lessons) != key
    _finished_run(tmp_path, other, "ada", "sha-ada")
    _finished_run(tmp_path, key, "bob", "sha-bob-old")
    found = _journal_of(tmp_path, key, {"ada": "sha-ada", "bob": "sha-bob-new"})
    assert (found.rows, found.stopped, found.alone) == ({}, {}, [])  # both graded afresh
    assert found.ignored == 5  # ada's three lines (other settings), bob's started and finished (another file)
    found = _journal_of(tmp_path, other, {"ada": "sha-ada"})
    assert list(found.rows) == ["ada"] and found.rows["ada"].marks() == {"00.broadcast": 1}


def test_a_torn_last_line_is_ignored_and_not_appended_to(tmp_path):
    key = "k"
    _finished_run(tmp_path, key, "ada", "sha-ada")
    path = tmp_path / journal.JOURNAL_FILE
    whole = path.read_bytes()
    torn = json.dumps({"v": 1, "event": "finished", "run": "x", "settings": key, "student": "bob",
                       "file": "sha-bob", "row": {"student": "bob"}})[:40]
    path.write_bytes(whole + torn.encode())  # a line cut short by a crash
    j = journal.Journal(tmp_path, key)
    found = journal.resume(j.open(), key, {"ada": "sha-ada", "bob": "sha-bob"})
    journal.record_started(j.for_workers(), "bob", "sha-bob")
    j.close(remove=False)
    assert list(found.rows) == ["ada"] and "bob" not in found.stopped
    lines = path.read_text().splitlines()
    assert lines[-3] == torn  # ended, and the next lines are whole
    assert [json.loads(line)["event"] for line in lines[-2:]] == ["run", "started"]


def test_who_is_run_again_after_a_run_stopped(tmp_path):
    """Killed with one submission in flight: it is not run again. Killed with two in flight (two
    workers): both are graded again, alone; in flight when a second run stops: not again. A run that
    caught a signal (Ctrl-C, SIGTERM): what it was grading is graded again."""
    def run(*started: str, caught: bool = False) -> None:
        j = journal.Journal(tmp_path, "k")
        j.open()
        for student in started:
            journal.record_started(j.for_workers(), student, f"sha-{student}")
        if caught:
            j.write({"event": "caught", "signal": "SIGTERM"})
        j.close(remove=False)

    digests = {s: f"sha-{s}" for s in ("ada", "bob", "cyd", "dan")}
    run("ada", "bob")
    found = _journal_of(tmp_path, "k", digests)
    assert (sorted(found.alone), found.stopped) == (["ada", "bob"], {})
    run("ada")
    found = _journal_of(tmp_path, "k", digests)
    assert (found.alone, sorted(found.stopped)) == (["bob"], ["ada"])
    assert found.stopped["ada"].status == journal.STOPPED == "grader stopped"
    run("cyd", caught=True)
    assert "cyd" in _journal_of(tmp_path, "k", digests).alone
    run("dan")
    assert "dan" in _journal_of(tmp_path, "k", digests).stopped


def test_one_run_at_a_time_per_output_folder(tmp_path):
    j = journal.Journal(tmp_path, "k")
    j.open()
    try:
        other = journal.Journal(tmp_path, "k")
        try:
            other.open()
        except RuntimeError as err:
            assert "another grading run is writing to" in str(err)
        else:
            raise AssertionError("a second run opened a locked journal")
    finally:
        j.close(remove=True)
    assert not (tmp_path / journal.JOURNAL_FILE).exists()


def test_only_a_dead_runs_scratch_folder_is_removed(tmp_path):
    dead, live, unclaimed = (tmp_path / f"grade-run-{n}" for n in ("dead", "live", "unclaimed"))
    for folder in (dead, live, unclaimed):
        (folder / "grade-1").mkdir(parents=True)
    journal.claim_scratch_root(str(live))  # this process: alive
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (dead / journal.OWNER_FILE).write_text(f"{gone.pid} 1\n")  # a pid that ran, with its start time: gone
    assert str(dead) in journal.remove_stale(str(tmp_path))
    assert not dead.exists() and live.exists() and unclaimed.exists()


# ----------------------------------------------------------------------------------------------
# course_lib changed on disk by a kernel (no sandbox): the run stops (course_lib/grading/integrity.py)
# ----------------------------------------------------------------------------------------------

# Appends a comment to a checker file of the course_lib copy the kernel imported (the test's own
# copy: the cell refuses any other), after the lesson's cells ran: the kernel's own re-check zeroes
# this notebook; every kernel started after it would import the changed file.
REWRITER = """import course_lib.checks.common as _common
assert _common.__file__.startswith({copy!r}), _common.__file__  # the test's copy, never the clone
with open(_common.__file__, "a", encoding="utf-8") as _f:
    _f.write("\\n# changed by a learner's kernel\\n")
"""


def test_course_lib_changed_on_disk_stops_the_run_until_it_is_restored(tmp_path):
    """Three lesson-00 notebooks, one worker, no sandbox, on a copy of course_lib: the second
    appends to a checker file. The run stops after it (exit 3): the first's row is kept, the second
    gets 0 (status "course changed"), the third is not run ("not graded"); the same command refuses
    to resume while the file is changed (exit 2), and once it is restored grades only the third."""
    copy = tmp_path / "course"
    shutil.copytree(ROOT / "course_lib", copy / "course_lib", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "notebooks").mkdir()
    shutil.copy(next((ROOT / "notebooks").glob("00_*.ipynb")), copy / "notebooks")
    common = copy / "course_lib" / "checks" / "common.py"
    original = common.read_bytes()
    folder, out, tmp = tmp_path / "class", tmp_path / "out", tmp_path / "tmp"
    folder.mkdir()
    tmp.mkdir()
    (folder / "a_first.ipynb").write_text(nbformat.writes(solve(lesson("00"), *L00)), encoding="utf-8")
    rewriter = solve(lesson("00"), *L00)
    rewriter.cells.append(nbformat.v4.new_code_cell(REWRITER.format(copy=str(copy))))
    (folder / "b_rewriter.ipynb").write_text(nbformat.writes(rewriter), encoding="utf-8")
    (folder / "c_third.ipynb").write_text(nbformat.writes(solve(lesson("00"), "00.broadcast")), encoding="utf-8")

    def grade() -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "course_lib.grading", "--out", str(out), "--sandbox", "none",
                   "--workers", "1", "--timeout", "60", "--notebook-timeout", "120", "--recheck-timeout", "60",
                   str(folder)]
        return subprocess.run(command, capture_output=True, text=True, cwd=copy, timeout=600,
                              env=dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(copy)))

    def rows() -> dict[str, tuple[str, ...]]:
        with (out / "grades.csv").open(newline="", encoding="utf-8") as f:
            return {r["student"]: (r["00.broadcast"], r["00.gradient"], r["00.parameters"], r["status"])
                    for r in csv.DictReader(f)}

    first = grade()
    log = first.stdout + first.stderr
    assert common.read_bytes() != original, log  # the kernel changed the copy (and only the copy)
    assert first.returncode == 3, log
    assert "STOPPED: course_lib's files changed on disk while b_rewriter was graded" in log
    assert rows() == {"a_first": ("1", "1", "1", "graded"), "b_rewriter": ("0", "0", "0", "course changed"),
                      "c_third": ("0", "0", "0", "not graded")}
    assert "c_third: lesson 00, 0 of 3 passed, not graded" in log  # its kernel never started
    report = (out / "report.html").read_text(encoding="utf-8")
    assert "STOPPED: course_lib&#x27;s files changed on disk" in report and "not graded" in report
    events = [json.loads(line) for line in (out / journal.JOURNAL_FILE).read_text().splitlines()]
    assert [(e["event"], e.get("student")) for e in events] == [
        ("run", None), ("started", "a_first"), ("finished", "a_first"), ("started", "b_rewriter"),
        ("finished", "b_rewriter"), ("course changed", None)]
    assert events[-1]["after"] == ["b_rewriter"]

    refused = grade()  # course_lib still changed: no resume, nothing run
    log = refused.stdout + refused.stderr
    assert refused.returncode == 2, log
    assert "course_lib is still not as that run began" in log and "a_first" not in log

    common.write_bytes(original)
    last = grade()
    log = last.stdout + last.stderr
    assert last.returncode == 0, log
    assert "resumed: 2 row(s) taken from the journal" in log and "[1/1" in log and "c_third" in log
    assert rows() == {"a_first": ("1", "1", "1", "graded"), "b_rewriter": ("0", "0", "0", "course changed"),
                      "c_third": ("1", "0", "0", "graded")}
    assert not (out / journal.JOURNAL_FILE).exists() and list(tmp.iterdir()) == []
    assert _none_left(tmp, 5) == []


def test_a_change_to_course_lib_is_seen_and_refuses_a_resume(tmp_path):
    """The digest: any file of course_lib or lesson notebook changed, added or removed changes it
    (not __pycache__); a journal that recorded a change refuses a resume until the digest is the
    run's first again."""
    from course_lib.grading import integrity

    root, notebooks = tmp_path / "course_lib", tmp_path / "notebooks"
    (root / "checks" / "__pycache__").mkdir(parents=True)
    notebooks.mkdir()
    (root / "checks" / "common.py").write_text("x = 1\n")
    (notebooks / "00_intro.ipynb").write_text("{}")
    first = integrity.course_digest(root, notebooks)
    (root / "checks" / "__pycache__" / "common.cpython-311.pyc").write_bytes(b"\0")
    (notebooks / "notes.txt").write_text("not a lesson")
    assert integrity.course_digest(root, notebooks) == first
    for path, text in ((root / "checks" / "new.py", ""), (notebooks / "01_more.ipynb", "{}")):
        path.write_text(text)  # a file added
        assert integrity.course_digest(root, notebooks) != first, path
        path.unlink()
    assert integrity.course_digest(root, notebooks) == first
    (notebooks / "00_intro.ipynb").write_text('{"cells": []}')
    assert integrity.course_digest(root, notebooks) != first
    (notebooks / "00_intro.ipynb").write_text("{}")
    (root / "checks" / "common.py").write_text("x = 2\n")
    assert integrity.course_digest(root, notebooks) != first
    entries = [{"event": "run"}, {"event": "course changed", "expected": first, "after": ["bob"]}]
    why = integrity.refusal(entries, integrity.course_digest(root, notebooks), tmp_path / "journal.jsonl")
    assert why and "(bob)" in why and "restore course_lib" in why and "delete" in why
    assert integrity.refusal(entries, first, tmp_path / "journal.jsonl") is None
    assert not integrity.changed(None)  # no digest recorded (a caller of grade_submission alone): not checked


def test_the_suspects_of_a_course_change_are_graded_again_alone(tmp_path):
    """Two submissions in flight when course_lib changed (two workers): neither finished in the
    journal, both graded again, alone, by the next run (integrity.py)."""
    j = journal.Journal(tmp_path, "k")
    j.open()
    for student in ("ada", "bob"):
        journal.record_started(j.for_workers(), student, f"sha-{student}")
    j.write({"event": "course changed", "expected": "d", "after": ["ada", "bob"]})
    j.close(remove=False)
    found = _journal_of(tmp_path, "k", {"ada": "sha-ada", "bob": "sha-bob"})
    assert (sorted(found.alone), found.stopped, found.rows) == (["ada", "bob"], {}, {})
