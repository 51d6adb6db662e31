"""The grader's bounds on one submission (#49), in this process, without a kernel.

- A notebook larger than ``--max-notebook-mb`` is not read: its row says "too large", with 0 marks
  (a sparse file: no real disk is used).
- The re-check has one budget for all of a notebook's exercises: in the kernel (kernel_recheck.recheck
  shares one deadline among the exercises), and in the grader, which waits for a kernel that stops
  answering no longer than that budget and a grace, however many exercises the lesson has (a fake
  kernel client on a fake clock: the real kernel's numbers are in the report of #49).
"""

from __future__ import annotations

import csv
import time
import tracemalloc
from pathlib import Path

import pytest

from course_lib.grading import cli, runner
from course_lib.grading.lessons import read_lessons

ROOT = Path(__file__).resolve().parents[2]
MB = 2**20


def _sparse(path: Path, size: int) -> Path:
    with path.open("wb") as f:
        f.truncate(size)
    return path


# ----------------------------------------------------------------------------------------------
# The notebook size limit
# ----------------------------------------------------------------------------------------------

def test_a_notebook_over_the_limit_is_not_read(tmp_path):
    path = _sparse(tmp_path / "huge.ipynb", 150 * MB)
    tracemalloc.start()
    try:
        row = runner.grade_submission(path, runner.Settings())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5 * MB  # the 150 MB were never read
    assert (row.status, row.lesson, row.results, row.marks()) == ("too large", "", {}, {})
    assert row.notes == ["too large: 150.0 MB, the limit is 50 MB (--max-notebook-mb); it was not read"]
    assert runner.read_notebook(path, 200 * MB)[1] == 150 * MB  # under a higher limit it would be read
    text, size = runner.read_notebook(_sparse(tmp_path / "small.ipynb", 10), 50 * MB)
    assert (text, size) == ("\0" * 10, 10)


def test_the_limit_is_an_option_and_the_row_gets_0(tmp_path, monkeypatch, capsys):
    """``--max-notebook-mb``: the command line reads no file over it (in-process grading stands in for
    the workers: no kernel is needed for rows that never start one)."""
    folder = tmp_path / "class"
    folder.mkdir()
    _sparse(folder / "huge.ipynb", 150 * MB)
    _sparse(folder / "mid.ipynb", MB)
    (folder / "word.ipynb").write_text("my homework", encoding="utf-8")

    def in_process(paths, settings, workers, contents=None, sizes=None):
        assert set(sizes) == {folder / "huge.ipynb", folder / "mid.ipynb"}  # found too large, not read
        assert set(contents) == {folder / "word.ipynb"}
        return [runner.grade_submission(p, settings, None, contents.get(p), sizes.get(p)) for p in paths]

    monkeypatch.setattr(cli, "grade_all", in_process)
    monkeypatch.setattr(cli, "choose_sandbox", lambda choice: ("none", "grade: NO SANDBOX (test)"))
    assert cli.main(["--out", str(tmp_path / "out"), "--max-notebook-mb", "0.5", str(folder)]) == 0
    with (tmp_path / "out" / "grades.csv").open(newline="", encoding="utf-8") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert {s: (r["total"], r["status"]) for s, r in rows.items()} == {
        "huge": ("0", "too large"), "mid": ("0", "too large"), "word": ("0", "not a notebook")}
    report = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "too large: 150.0 MB, the limit is 0.5 MB" in report and "too large: 1.0 MB" in report
    with pytest.raises(SystemExit) as stop:
        cli.main(["--out", str(tmp_path / "out2"), "--max-notebook-mb", "0", str(folder)])
    assert stop.value.code == 2 and "--max-notebook-mb 0: give a number above 0" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# The re-check's one budget
# ----------------------------------------------------------------------------------------------

def _grader() -> dict:
    from course_lib.grading.runner import kernel_source

    grader: dict = {"__name__": "grader"}
    exec(kernel_source(), grader)  # noqa: S102 (as the grader sends it)
    return grader


L00_SPEC = [{"key": e.key, "name": e.name, "checker": e.checker, "args": e.args}
            for e in read_lessons()["00"].exercises]
ENDLESS = "def predicted_broadcast_shape():\n    while True:\n        pass\n"
ENDLESS_TOO = "def predicted_gradient():\n    while True:\n        pass\n"
RIGHT = "def predicted_parameter_count():\n    return 4 * 8 + 8 + 8 * 2 + 2\n"


def _learner(cells: list[str]) -> dict:
    import torch
    from torch import nn

    class TwoLayer(nn.Module):  # lesson 00's network: Linear(4, 8), ReLU, Linear(8, 2)
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    namespace = {"torch": torch, "TwoLayer": TwoLayer, "f": lambda x: (x ** 2).sum()}
    for cell in cells:
        exec(compile(cell, "<cell>", "exec"), namespace)  # noqa: S102
    return namespace


def test_the_exercises_share_one_deadline(checkers_put_back):
    """Two endless loops and a right answer, 60 s per exercise, 3 s for the whole re-check: each loop
    is cut at its share, and the right answer is still checked, within the budget."""
    grader = _grader()
    restore = grader["snapshot"]()
    cells = [ENDLESS, ENDLESS_TOO, RIGHT]
    start = time.monotonic()
    results = grader["recheck"](L00_SPEC, 10_000, 60.0, restore, "nonce", str(ROOT / "course_lib" / "solutions"),
                                cells, user_ns=_learner(cells), publish=lambda payload: None, budget=3.0)
    spent = time.monotonic() - start
    outcomes = {k: (r["outcome"], r["message"][:60]) for k, r in results["exercises"].items()}
    assert outcomes["00.broadcast"][0] == outcomes["00.gradient"][0] == "failed", outcomes
    assert "Timed out: the checker did not finish within" in outcomes["00.broadcast"][1], outcomes
    assert outcomes["00.parameters"][0] == "passed", outcomes
    assert spent < 20, spent  # 3 s for the checks (and the re-check's own start), not 60 s per loop


def test_a_spent_budget_checks_nothing_more(checkers_put_back):
    grader = _grader()
    restore = grader["snapshot"]()
    cells = [RIGHT]
    results = grader["recheck"](L00_SPEC, 10_000, 60.0, restore, "nonce", str(ROOT / "course_lib" / "solutions"),
                                cells, user_ns=_learner(cells), publish=lambda payload: None, budget=1e-9)
    for result in results["exercises"].values():
        assert result["outcome"] == "failed" and "were spent before this one was checked" in result["message"]
        assert result["mistake"] == "grader: re-check time spent"


class _Clock:
    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def _stuck_kernel_client(clock: _Clock, stuck_from: int, waits: list[tuple[str, float]]):
    """A stand-in for nbclient's client whose kernel stops answering at the learner's code cell
    ``stuck_from``: every cell from then on is waited for its whole timeout (and nbclient's 4 s for
    the output), as nbclient does; each wait is recorded."""

    class Client:
        timeout = 0.0
        timed_out = False
        output_size = display_size = 0
        grader_cell = -1
        payloads: list[str] = []
        code_cells = 0

        def setup_kernel(self, **kwargs):
            import contextlib

            return contextlib.nullcontext()

        def execute_cell(self, cell, index):
            source = cell.source
            kind = "setup" if "['snapshot']()" in source else "recheck" if "['recheck'](" in source else "cell"
            if kind == "cell":
                self.code_cells += 1
            if kind != "setup" and (kind == "recheck" or self.code_cells >= stuck_from):
                clock.now += self.timeout + 4  # the timeout, then nbclient's iopub_timeout
                self.timed_out = True
                waits.append((kind, self.timeout))
            else:
                clock.now += 0.5
            return cell

    return Client()


@pytest.mark.parametrize("lesson_id, timeout, notebook_timeout", [("00", 20, 60), ("11", 20, 60), ("11", 300, 3600)])
def test_a_kernel_that_stops_answering_costs_the_notebook_limit_and_one_recheck_budget(
        tmp_path, monkeypatch, lesson_id, timeout, notebook_timeout):
    """#49: such a kernel cost the notebook limit + n x the cell limit + 300 s in the re-check (and
    more: 443 s for lesson 00 at --timeout 20 --notebook-timeout 60, measured); now the notebook
    limit, one cell's limit, and the re-check's one budget (RECHECK_SECONDS at most) and its grace,
    whatever the number of exercises n."""
    import nbformat

    lesson = read_lessons()[lesson_id]
    n = len(lesson.exercises)
    clock, waits = _Clock(), []
    monkeypatch.setattr(runner, "time", clock)
    monkeypatch.setattr(runner, "_client", lambda nb, scratch, sockets, settings: _stuck_kernel_client(
        clock, 3, waits))
    settings = runner.Settings(cell_timeout=timeout, notebook_timeout=notebook_timeout)
    row = runner.Graded(student="stuck")
    runner._run(nbformat.read(lesson.path, as_version=4), lesson, tmp_path, tmp_path, settings, row)
    budget = min(runner.RECHECK_SECONDS, n * timeout)
    assert [w for kind, w in waits if kind == "recheck"] == [budget + runner.RECHECK_GRACE]  # not n x timeout + 300
    # the setup cell and the cells before the kernel stopped (0.5 s each), the cells waited for until
    # the notebook's limit passed (one cell's limit past it at most), the re-check
    assert clock.now <= 3 * 0.5 + notebook_timeout + (timeout + 4) + (budget + runner.RECHECK_GRACE + 4), waits
    assert budget + runner.RECHECK_GRACE <= runner.RECHECK_SECONDS + runner.RECHECK_GRACE < n * timeout + 300
    assert row.status == "timeout" and all(r["outcome"] == "not checked" for r in row.results.values())
