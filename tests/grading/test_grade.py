"""The grader on a generated class (tests/grading/grade_class.py): every row of grades.csv, the report, feedback.

The class (lessons 00 and 01, all but one of lesson 00, the shortest to run) is graded in one call of
``python -m course_lib.grading`` with two workers and the sandbox where bwrap works (``auto``); an
endless loop and a kernel that kills its worker in a second call, one worker, a 3 s cell limit and
``--sandbox none``, started at the same time; then the process and sabotage cases again with
``--sandbox none`` in a third. Each call gets a TMPDIR of its
own, which must be empty afterwards; after them no process of the class (its marked sleeps, its
kernels) is left. Where the grader's path is the same, one notebook carries several cases, one
per exercise (grade_class.py, ``Submission.cases``). Two of the gradient mistakes lesson 00's
checker names are graded in kernels;
every one of them goes through the report in this process, with the checker's own verdict.
The re-check itself is tested in this process on every lesson's solutions (lesson 12 with the
lesson's trained model): a correct answer gets 1 from every checker through it.

Not marked ``long`` (conftest.py starts those first): with the grading workers of its own (two for
the class, then two for the plain call) it fills both cores when it runs last, after the
other worker's lessons.
"""

from __future__ import annotations

import csv
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from grade_class import (
    GRADIENT_MISTAKES,
    KERNEL_MISTAKES,
    MARK,
    build,
    build_killer,
    build_plain,
    build_sandboxed,
    write,
)

from course_lib.grading.cli import choose_sandbox
from course_lib.grading.lessons import read_lessons
from course_lib.grading.report import mistake_of
from course_lib.grading.runner import socket_folder, socket_root

ROOT = Path(__file__).resolve().parents[2]
SANDBOX = choose_sandbox("auto")[0] == "bwrap"
# the class's TMPDIR is long on purpose: its scratch folders' socket paths would pass a Unix
# socket's 107 characters, as pytest's own temporary folders do on some machines
TMP_CLASS = "tmp_class_" + "long" * 15
TMP_PLAIN = "tmp_plain_" + "long" * 15
TMP_SLOW = "tmp_slow_" + "long" * 15  # and with a worker killed under it (kills_grader)


def _digest(folder: Path, pattern: str = "*") -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob(pattern)):
        if path.is_file():
            h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


def _start_grading(out: Path, folder: Path, tmp: Path, *options: str) -> subprocess.Popen:
    tmp.mkdir()
    return subprocess.Popen([sys.executable, "-m", "course_lib.grading", "--out", str(out), *options, str(folder)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=dict(os.environ, TMPDIR=str(tmp)))


def _finish_grading(process: subprocess.Popen) -> str:
    try:
        stdout, stderr = process.communicate(timeout=1500)  # returns only once nothing holds its output
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        raise AssertionError(f"the grader ran over 1,500 s\n{stdout}{stderr}") from None
    assert process.returncode == 0, stdout + stderr
    return stdout + stderr


def _left_behind(tmp: Path) -> list[str]:
    """Command lines of living processes that the class started: its marked sleeps, and kernels or
    sandboxes whose command line names a scratch folder under the test's folder."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z" and (f"sleep {MARK}." in cmdline or str(tmp) in cmdline):
                found.append(cmdline)
    return found


def _socket_folders_of(tmp: Path) -> list[str]:
    """The runs' socket folders under /tmp (made when scratch paths are too long) that this test's
    grading runs left; each names its run's scratch root (other runs on the machine have theirs)."""
    left = []
    for folder in Path("/tmp").glob("grade-ipc-*"):
        try:
            if (folder / "scratch").read_text(encoding="utf-8").startswith(str(tmp)):
                left.append(str(folder))
        except OSError:
            continue
    return left


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grade")
    main_class, slow = build()
    if SANDBOX:
        main_class += build_sandboxed()
    plain = build_plain()
    slow += build_killer()  # (after the endless loop, on the same one worker: see build_killer)
    write(main_class, tmp / "class")
    write(slow, tmp / "slow")
    write(plain, tmp / "plain")
    before = (_digest(tmp / "class"), _digest(ROOT / "notebooks", "0[0-2]_*.ipynb"))  # the class's lessons
    # The endless loop burns a core for its 3 s limit, twice (its cell, then the re-check); it runs
    # beside the class's call, on one worker, without the sandbox, and then the kernel that kills
    # its worker (twice: it is tried again alone). The plain call comes after the class's: side by
    # side, the two calls' four workers oversubscribe the 2 cores that `make test` shares with the
    # lessons (measured: `make test` 13.2 min with them side by side). Lesson 00's slowest cell
    # takes under 1 s.
    calls = []
    try:
        calls.append(_start_grading(tmp / "out_slow", tmp / "slow", tmp / TMP_SLOW, "--timeout", "3",
                                    "--workers", "1", "--sandbox", "none"))
        calls.append(_start_grading(tmp / "out", tmp / "class", tmp / TMP_CLASS,
                                    "--workers", "2", "--timeout", "120"))
        log = _finish_grading(calls[-1])
        calls.append(_start_grading(tmp / "out_plain", tmp / "plain", tmp / TMP_PLAIN,
                                    "--workers", "2", "--timeout", "120", "--sandbox", "none"))
        plain_log = _finish_grading(calls[-1])
        slow_log = _finish_grading(calls[0])
    except BaseException:
        for call in calls:  # no grader left running behind a failed test
            if call.poll() is None:
                call.kill()
                call.communicate()
        raise
    after = (_digest(tmp / "class"), _digest(ROOT / "notebooks", "0[0-2]_*.ipynb"))  # the class's lessons
    left = _left_behind(tmp)
    tmp_files = [str(p) for d in (TMP_SLOW, TMP_CLASS, TMP_PLAIN) for p in (tmp / d).rglob("*")]
    tmp_files += _socket_folders_of(tmp)
    return {"tmp": tmp, "class": main_class, "slow": slow, "plain": plain, "before": before, "after": after,
            "log": log, "plain_log": plain_log, "slow_log": slow_log, "left": left, "tmp_files": tmp_files}


def _rows(path: Path) -> tuple[list[str], dict[str, dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, {row["student"]: row for row in reader}


def test_the_class_is_big_enough():
    main_class, slow = build()
    cases = [c for s in main_class + slow for c in s.cases]
    assert len(cases) >= 30 and len(set(cases)) == len(cases)  # cases, several in some notebooks
    assert {s.lesson for s in main_class} >= {"00", "01"}


@pytest.mark.parametrize("which", ["class", "plain", "slow"])
def test_every_row_of_grades_csv(graded, which):
    header, rows = _rows(graded["tmp"] / {"class": "out", "plain": "out_plain", "slow": "out_slow"}[which]
                         / "grades.csv")
    lessons = read_lessons()
    keys = [k for lid in ("00", "01", "02") if any(s.lesson == lid for s in graded[which])
            for k in lessons[lid].keys]
    assert header == ["student", "lesson", *keys, "total", "status"]
    assert sorted(rows) == sorted(s.student for s in graded[which])
    for sub in graded[which]:
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
    assert not (graded["tmp"] / "class" / "added.ipynb").exists()


def test_no_process_kernel_or_temporary_file_is_left(graded):
    assert graded["left"] == []
    assert graded["tmp_files"] == []


def test_sockets_go_where_their_paths_fit(tmp_path):
    short = Path(tempfile.mkdtemp(prefix="g-", dir="/tmp"))
    long = tmp_path / ("x" * 100)
    (long / "grade-1").mkdir(parents=True)
    try:
        assert socket_root(str(short)) is None
        assert socket_folder(short) == short / "ipc" and (short / "ipc").is_dir()
        root = socket_root(str(long))  # the run's own folder, named after its scratch root
        assert root and _socket_folders_of(tmp_path) == [root]
        outside = socket_folder(long / "grade-1", root)
        assert outside.parent == Path(root) and len(str(outside / "kernel-99")) <= 107
        assert not (long / "grade-1" / "ipc").exists()
        shutil.rmtree(root)
    finally:
        shutil.rmtree(short)


def test_the_first_line_says_whether_kernels_are_sandboxed(graded):
    assert graded["log"].startswith("grade: sandbox bwrap" if SANDBOX else "grade: NO SANDBOX")
    assert graded["plain_log"].startswith("grade: NO SANDBOX (--sandbox none)")
    assert graded["slow_log"].startswith("grade: NO SANDBOX (--sandbox none)")
    report = (graded["tmp"] / "out_plain" / "report.html").read_text(encoding="utf-8")
    assert "NO SANDBOX" in report
    assert "Kernel is running over TCP" not in graded["log"] + graded["plain_log"] + graded["slow_log"]
    assert "Task exception" not in graded["log"] + graded["plain_log"] + graded["slow_log"]
    assert f"[{len(graded['class'])}/{len(graded['class'])}]" in graded["log"]
    assert "s left]" in graded["log"]


def test_report_ranks_the_named_mistakes_and_lists_peeks_and_problems(graded):
    report = (graded["tmp"] / "out" / "report.html").read_text(encoding="utf-8")
    assert "<svg" in report and "00.gradient" in report
    for name in KERNEL_MISTAKES:  # (every mistake the checker names: test_report_names_every_gradient_mistake)
        words = GRADIENT_MISTAKES[name][1]
        assert words.split(" so ")[0].replace("'", "&#x27;") in report, words
    # shares are over the learners graded for that lesson, not over the class
    n_00 = sum(s.lesson == "00" for s in graded["class"])
    assert f" of {n_00}</td>" in report
    assert f" of {sum(bool(s.lesson) for s in graded['class'])}</td>" not in report
    assert "<td>peeked</td><td>00.broadcast</td>" in report
    for sub in graded["class"]:
        if sub.status != "graded":
            assert f"<td>{sub.student}</td>" in report and sub.status in report
    # fakes are named: the checker's own message, or the grader's
    assert "runs course_lib&#x27;s solutions" in report
    assert "while it was being checked" in report
    assert "its name is defined after its check cell" in report


def test_report_names_every_gradient_mistake_most_common_first(tmp_path):
    """Every mistake lesson 00's gradient checker names (GRADIENT_MISTAKES), as the re-check records
    it (message, mistake, site), through the report: each named, the most common first. The class
    grades two of them in kernels; the path from the kernel to the report is the same for all."""
    from course_lib.checks import check_gradient_prediction
    from course_lib.grading.report import write_all
    from course_lib.grading.runner import Graded

    def f(x):  # lesson 00's function: y = sum x_i^2 at x = [1, 2, 3]
        return (x ** 2).sum()

    passed = {"outcome": "passed", "message": "", "mistake": "", "site": ""}
    rows, order = [], []
    for count, (name, (answer, words)) in enumerate(reversed(GRADIENT_MISTAKES.items()), start=1):
        with pytest.raises(AssertionError) as failure:
            check_gradient_prediction(lambda answer=answer: eval(answer), f, [1.0, 2.0, 3.0])  # noqa: S307
        err = failure.value
        result = {"outcome": "failed", "message": str(err), "mistake": str(getattr(err, "mistake", "") or ""),
                  "site": str(getattr(err, "site", "") or "")}
        assert words in result["message"], (name, result["message"])
        rows += [Graded(student=f"{name}{i}", lesson="00", seconds=1.0,
                        results={"00.broadcast": passed, "00.gradient": result, "00.parameters": passed})
                 for i in range(count)]
        order.append((count, words.split(" so ")[0].replace("'", "&#x27;")))
    write_all(tmp_path, rows, read_lessons())
    report = (tmp_path / "report.html").read_text(encoding="utf-8")
    at = [report.find(words) for _, words in sorted(order, reverse=True)]
    assert -1 not in at and at == sorted(at), order  # each one named, the most common first
    for count, _ in order:
        assert f"<b>{count} learner{'s' * (count != 1)}</b>" in report


def test_mistakes_are_grouped_by_the_checkers_identity_not_its_prose():
    named = {"outcome": "failed", "message": "Likely mistake (3-D input): softmax over the wrong axis "
             "(dim=-2). Use dim=-1.", "mistake": "softmax over the wrong axis (dim=-2)", "site": "a.py:f:3"}
    other_case = dict(named, message="Likely mistake (4-D input): softmax over the wrong axis (dim=-2). x")
    assert mistake_of(named) == mistake_of(other_case) == (named["mistake"], named["mistake"])
    unnamed = {"outcome": "failed", "message": "Counts differ:\n  the: 3\n  a: 2", "mistake": "",
               "site": "tokenization.py:check_token_counts:88"}
    assert mistake_of(unnamed) == ("tokenization.py:check_token_counts:88", "Counts differ:")


def test_feedback_says_passed_message_or_not_attempted(graded):
    page = (graded["tmp"] / "out" / "feedback" / "partial.html").read_text(encoding="utf-8")
    assert "1 of 3 exercises passed" in page
    assert page.count("not attempted") == 2 and "passed</span>" in page
    page = (graded["tmp"] / "out" / "feedback" / "mistake_squares.html").read_text(encoding="utf-8")
    assert "are the values x_i ** 2, not their slopes" in page
    page = (graded["tmp"] / "out" / "feedback" / "os_exit.html").read_text(encoding="utf-8")
    assert "kernel died" in page
    assert "<div class='msg'>" in page  # messages keep their line breaks (white-space: pre-wrap)
    # each fake of issue 40 is named for what it is
    pages = {name: (graded["tmp"] / "out" / "feedback" / f"{name}.html").read_text(encoding="utf-8")
             for name in ("fakes_b_d_a", "fakes_f_d", "lesson01_reference_pasted", "frame_swap", "forged_results")}
    # (b): the imported solution, renamed, is found out as it runs: the solutions refuse to run (#49)
    assert "course_lib&#x27;s solutions cannot run while an exercise is graded" in pages["fakes_b_d_a"]
    assert "runs a copy of course_lib&#x27;s solutions" in pages["fakes_b_d_a"]  # (a)
    assert "A thread your notebook started earlier" in pages["fakes_b_d_a"]  # (d)
    assert "runs course_lib&#x27;s solutions" in pages["fakes_f_d"]  # (d), a new thread
    assert "defined after the cell that checks it" in pages["fakes_f_d"]  # (f)
    assert "is not code from your notebook&#x27;s cells" in pages["lesson01_reference_pasted"]  # (c)
    assert "results forged" in pages["forged_results"]


# ----------------------------------------------------------------------------------------------
# The re-check itself, in this process, on every lesson's solutions
# ----------------------------------------------------------------------------------------------

# 00 and 01 check objects the notebook builds (f, TwoLayer, query): the class's submissions take
# them through the kernel's re-check. 08's are given the notebook's PHRASES and a briefly trained
# translator, as the notebook builds them (the checker compares with greedy decoding on the same model).
IN_PROCESS = ["02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "12"]


def _notebook_constant(lesson: str, name: str) -> object:
    """The literal a lesson's notebook assigns to ``name`` (e.g. lesson 08's PHRASES)."""
    import ast
    import json

    nb = json.loads(next((ROOT / "notebooks").glob(f"{lesson}_*.ipynb")).read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and "".join(cell["source"]).startswith(f"{name} ="):
            tree = ast.parse("".join(cell["source"]))
            return ast.literal_eval(tree.body[0].value)
    raise AssertionError(f"lesson {lesson} assigns no {name}")


def _learner_namespace(lesson_id: str, keys: list[str]) -> tuple[dict, list[str]]:
    """A namespace as the notebook leaves it: the names the lesson's solutions file imports, then
    every solution block run as a cell (compiled from its text, as the kernel compiles a cell)."""
    import importlib
    import inspect

    from course_lib.solutions import solution_source

    module = importlib.import_module(f"course_lib.solutions.lesson{lesson_id}")
    namespace = {k: v for k, v in vars(module).items()
                 if not k.startswith("__") and (inspect.ismodule(v) or getattr(v, "__module__", None)
                                                != module.__name__)}
    cells = [solution_source(key) for key in keys]
    for cell in cells:
        exec(compile(cell, "<cell>", "exec"), namespace)  # noqa: S102 (our own solutions)
    return namespace, cells


@pytest.mark.parametrize("lesson_id", IN_PROCESS)
def test_every_checker_passes_a_correct_answer_through_the_recheck(lesson_id, checkers_put_back):
    from course_lib.grading.runner import kernel_source

    grader: dict = {"__name__": "grader"}
    exec(kernel_source(), grader)  # noqa: S102 (as the grader sends it)
    restore = grader["snapshot"]()
    lesson = read_lessons()[lesson_id]
    user_ns, cells = _learner_namespace(lesson_id, lesson.keys)
    if lesson_id == "11":  # the notebook's names for the learner's own passed functions
        user_ns["rope_at"], user_ns["attend"] = user_ns["apply_rope"], user_ns["grouped_query_attention"]
    if lesson_id == "08":  # the notebook's phrases, its corpus and a translator trained for a few steps
        from course_lib.data.dates import DatesCorpus
        from course_lib.training import train_dates

        user_ns["PHRASES"] = _notebook_constant("08", "PHRASES")
        user_ns["corpus"] = DatesCorpus()
        user_ns["model"] = train_dates(user_ns["corpus"], num_steps=30, warmup=10, cooldown=10,
                                       progress=False).model
    if lesson_id == "12":  # the lesson's trained model and its [r, r] batch, as the notebook builds them
        import torch

        from course_lib.induction import load_checkpoint, repeated_tokens

        user_ns["model"] = load_checkpoint()[0]
        user_ns["ids"] = repeated_tokens(8, 20, 64, torch.Generator().manual_seed(0))
    spec = [{"key": e.key, "name": e.name, "checker": e.checker, "args": e.args} for e in lesson.exercises]
    published: list[str] = []
    results = grader["recheck"](spec, 10_000, 300.0, restore, "nonce", str(ROOT / "course_lib" / "solutions"),
                                cells, user_ns=user_ns, publish=published.append)
    failing = {k: r["message"][:400] for k, r in results["exercises"].items() if r["outcome"] != "passed"}
    assert not failing and list(results["exercises"]) == lesson.keys, failing
    assert len(published) == len(spec)
    if lesson_id == "08":  # its training loop's progress bar started tqdm's monitor: the re-check stops it
        import threading

        assert not [t for t in threading.enumerate() if type(t).__name__ == "TMonitor" and t.is_alive()]


def test_answers_recorded_while_the_notebook_ran_are_not_replayed(checkers_put_back, capsys):
    """(e) of issue 40: a function that returns the outputs recorded for the notebook's own inputs
    passes the notebook's check, and fails the re-check, whose inputs come from other seeds."""
    import torch

    from course_lib.checks import check_split_heads
    from course_lib.grading.runner import kernel_source

    solution, _ = _learner_namespace("02", ["02.split_heads"])
    recorded: list[tuple[tuple, torch.Tensor]] = []

    def recording(*args):
        out = solution["split_heads"](*args)
        recorded.append((args, out))
        return out

    check_split_heads(recording)  # what the notebook's run shows: every input with its output

    def split_heads(*args):  # the replay: no computing, a look-up of what was recorded
        for seen, out in recorded:
            if len(seen) == len(args) and all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
                                              for a, b in zip(seen, args)):
                return out.clone()
        raise ValueError("not recorded")

    check_split_heads(split_heads)
    assert "check_split_heads: " in capsys.readouterr().out  # the replay passes the notebook's check
    grader: dict = {"__name__": "grader"}
    exec(kernel_source(), grader)  # noqa: S102 (as the grader sends it)
    restore = grader["snapshot"]()
    spec = [{"key": "02.split_heads", "name": "split_heads", "checker": "check_split_heads", "args": []}]
    results = grader["recheck"](spec, 10_000, 60.0, restore, "nonce", str(ROOT / "course_lib" / "solutions"),
                                [Path(__file__).read_text(encoding="utf-8")], user_ns={"split_heads": split_heads},
                                publish=lambda payload: None)
    result = results["exercises"]["02.split_heads"]
    assert result["outcome"] == "failed" and "not recorded" in result["message"], result  # the checker's verdict
