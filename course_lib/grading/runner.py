"""Grade one submission: run it in a fresh, limited kernel in a scratch folder, then re-check it.

``grade_submission(path, settings)`` returns a ``Graded`` row. Nothing it meets stops a batch: a file
that is not a notebook, an unknown lesson, an endless loop, a dead kernel or a flood of output each
become a short ``status``. The learner's notebook is read, never written; it runs as a copy in a
scratch folder that holds a copy of the lesson folder's other files, and the folder is removed after.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .lessons import NOTEBOOK_DIR, Lesson, match_lesson, read_lessons

_HERE = Path(__file__).resolve().parent
COURSE_LIB = _HERE.parent
# The most important problem first: a row shows one status.
STATUS_ORDER = ["not a notebook", "unknown lesson", "kernel died", "timeout", "memory limit",
                "output too large", "cells deleted", "cells reordered", "graded"]


@dataclass
class Settings:
    cell_timeout: float = 120.0  # seconds per cell (and per exercise in the re-check)
    notebook_timeout: float = 1800.0  # no cell starts after this many seconds
    memory_bytes: int = 8 * 2**30  # address space of the kernel
    output_bytes: int = 2 * 2**20  # printed output kept per notebook (50 x for all output)
    threads: int = 1  # torch / OpenMP threads per kernel
    seed: int = 0


@dataclass
class Graded:
    """One submission's row, plus what the report and the feedback page show."""

    student: str
    lesson: str = ""
    status: str = "graded"
    results: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> outcome, message
    peeked: list[str] = field(default_factory=list)  # keys whose solution was shown before passing
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def marks(self) -> dict[str, int]:
        return {k: int(r["outcome"] == "passed") for k, r in self.results.items()}


def _worse(current: str, new: str) -> str:
    return min(current, new, key=STATUS_ORDER.index)


def _kernel_manager(settings: Settings) -> Any:
    from jupyter_client.manager import AsyncKernelManager

    launcher = str(_HERE / "limits.py")

    class LimitedKernelManager(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
            command = super().format_kernel_cmd(extra_arguments)
            return [sys.executable, launcher, str(settings.memory_bytes), "--", *command]

    return LimitedKernelManager(kernel_name="python3")


def _client(nb: Any, folder: Path, settings: Settings) -> Any:
    from nbclient import NotebookClient

    class Client(NotebookClient):
        """nbclient, counting timeouts and keeping at most ``output_bytes`` of output."""

        timed_out = False
        output_size = 0  # printed text
        display_size = 0  # everything, figures and HTML views included (lessons show a few MB)

        async def _async_handle_timeout(self, timeout: int, cell: Any = None) -> Any:
            self.timed_out = True
            return await super()._async_handle_timeout(timeout, cell)

        def output(self, outs: list, msg: dict, display_id: str | None, cell_index: int) -> Any:
            size = len(json.dumps(msg.get("content", {}), default=str))
            if msg["msg_type"] == "stream":
                self.output_size += size
            self.display_size += size
            if self.output_size > settings.output_bytes or self.display_size > 50 * settings.output_bytes:
                return None  # dropped: the grader's memory stays bounded
            return super().output(outs, msg, display_id, cell_index)

    error = {"ename": "TimeoutError", "evalue": f"cell exceeded {settings.cell_timeout:g} s",
             "traceback": []}
    return Client(nb, timeout=settings.cell_timeout, allow_errors=True, interrupt_on_timeout=True,
                  error_on_timeout=error, km=_kernel_manager(settings), record_timing=False,
                  resources={"metadata": {"path": str(folder)}})


def _structure(nb: Any, lesson: Lesson) -> str:
    """"cells deleted" if a lesson cell (neither stub nor check) is missing or edited,
    "cells reordered" if they are out of order, else "graded"."""
    found = {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            found.setdefault(cell.source.strip(), i)
    positions = [found.get(source.strip()) for source in lesson.lesson_cells]
    if any(p is None for p in positions):
        return "cells deleted"
    return "graded" if positions == sorted(positions) else "cells reordered"


def _events(cells: list[Any], lesson: Lesson) -> list[tuple[str, str]]:
    """("shown", key) and ("passed", key) in the order the cells' outputs happened."""
    events = []
    for cell in cells:
        for ex in lesson.exercises:
            if f"{ex.checker}(" in cell.get("source", ""):
                errors = any(o.get("output_type") == "error" for o in cell.get("outputs", []))
                text = "".join(o.get("text", "") for o in cell.get("outputs", []))
                if cell.get("outputs") and not errors and "not implemented yet" not in text:
                    events.append(("passed", ex.key))
        for out in cell.get("outputs", []):
            shown = str(out.get("data", {}).get("text/markdown", "")) + str(out.get("text", ""))
            for ex in lesson.exercises:
                if f"Solution {ex.key}" in shown:
                    events.append(("shown", ex.key))
    return events


def _peeked(graded_cells: list[Any], stored_cells: list[Any], lesson: Lesson, passed: set[str]) -> list[str]:
    """Exercises passed in the re-check whose solution was shown before the notebook's first pass:
    in the grading run (top to bottom), or in the learner's own session (stored outputs, in order
    of their execution counts)."""
    session = sorted((c for c in stored_cells if c.get("execution_count")),
                     key=lambda c: c["execution_count"])
    peeked = set()
    for events in (_events(graded_cells, lesson), _events(session, lesson)):
        done: set[str] = set()
        for kind, key in events:
            if kind == "passed":
                done.add(key)
            elif key not in done:
                peeked.add(key)
    return [k for k in lesson.keys if k in peeked and k in passed]


def _run(nb: Any, lesson: Lesson, folder: Path, settings: Settings, row: Graded) -> None:
    """Execute the cells in a limited kernel, then the re-check; fill ``row``."""
    from nbclient.exceptions import DeadKernelError
    from nbformat.v4 import new_code_cell

    token = secrets.token_hex(6)
    grader = f"_g{token}"
    source = (_HERE / "kernel_side.py").read_text(encoding="utf-8")
    setup = (f"def {grader}():\n    ns = {{'__name__': 'grader'}}\n    exec({source!r}, ns)\n"
             f"    ns['restore'] = ns['snapshot']()\n    return ns\n{grader} = {grader}()")
    results_file = Path(tempfile.mkdtemp(prefix="grade-results-")) / f"{token}.json"
    spec = [{"key": e.key, "name": e.name, "checker": e.checker, "args": e.args} for e in lesson.exercises]
    recheck = (f"{grader}['recheck']({spec!r}, {str(results_file)!r}, {settings.seed}, "
               f"{settings.cell_timeout}, {grader}['restore'], {str(COURSE_LIB / 'solutions')!r})")
    client = _client(nb, folder, settings)
    start = time.monotonic()
    alive = True
    learner_cells = list(nb.cells)
    try:
        with client.setup_kernel():
            nb.cells.append(new_code_cell(setup))  # the grader's cells run last in the list, and
            client.timeout = max(settings.cell_timeout, 300)  # (it imports torch)
            client.execute_cell(nb.cells[-1], len(nb.cells) - 1)  # leave the learner's indices as they are
            client.timeout = settings.cell_timeout
            for index, cell in enumerate(learner_cells):
                if cell.cell_type != "code":
                    continue
                if time.monotonic() - start > settings.notebook_timeout:
                    row.notes.append(f"stopped after {settings.notebook_timeout:g} s for the notebook")
                    client.timed_out = True
                    break
                client.execute_cell(cell, index)
            nb.cells[-1] = new_code_cell(recheck)
            client.timeout = settings.cell_timeout * len(spec) + 300  # it re-imports course_lib
            client.execute_cell(nb.cells[-1], len(nb.cells) - 1)
    except DeadKernelError:
        alive = False
        row.status = _worse(row.status, "kernel died")
        row.notes.append("the kernel died (os._exit, a crash, or killed for its memory)")
    except Exception as err:  # noqa: BLE001 (the batch goes on; the row says what happened)
        alive = False
        row.status = _worse(row.status, "kernel died")
        row.notes.append(f"the run stopped: {type(err).__name__}: {str(err)[:200]}")
    del nb.cells[len(learner_cells):]
    if client.timed_out:
        row.status = _worse(row.status, "timeout")
    if client.output_size > settings.output_bytes or client.display_size > 50 * settings.output_bytes:
        row.status = _worse(row.status, "output too large")
        row.notes.append(f"{client.output_size / 2**20:.1f} MB of printed output (limit "
                         f"{settings.output_bytes / 2**20:.0f} MB), {client.display_size / 2**20:.1f} MB "
                         f"in all (limit {50 * settings.output_bytes / 2**20:.0f} MB); the rest was dropped")
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error" and (
                    out.get("ename") == "MemoryError" or "can't allocate memory" in out.get("evalue", "")):
                row.status = _worse(row.status, "memory limit")
    checked = {}
    if alive and results_file.is_file():
        checked = json.loads(results_file.read_text(encoding="utf-8"))
        if checked.get("patched_before"):
            row.notes.append("undid the notebook's changes to " + ", ".join(checked["patched_before"][:5]))
    shutil.rmtree(results_file.parent, ignore_errors=True)
    for ex in lesson.exercises:
        row.results[ex.key] = checked.get("exercises", {}).get(
            ex.key, {"outcome": "not checked", "message": "The grader could not re-check this exercise "
                     f"({row.status})."})


def grade_submission(path: Path, settings: Settings, lessons: dict[str, Lesson] | None = None) -> Graded:
    """Grade one submitted notebook; never raises for a bad submission."""
    import nbformat

    warnings.filterwarnings("ignore", module="nbformat")  # a learner's notebook format is not our news
    began = time.monotonic()
    row = Graded(student=path.stem)
    lessons = lessons or read_lessons()
    try:
        nb = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
        if not isinstance(nb.get("cells"), list):
            raise ValueError("no cells")
    except Exception as err:  # noqa: BLE001
        row.status = "not a notebook"
        row.notes.append(f"could not read it as a notebook: {str(err)[:200]}")
        return row
    lesson_id = match_lesson(nb, lessons)
    if lesson_id is None:
        row.status = "unknown lesson"
        row.notes.append("it holds no exercise of this course")
        return row
    lesson = lessons[lesson_id]
    row.lesson = lesson_id
    row.status = _structure(nb, lesson)
    stored = list(nbformat.reads(path.read_text(encoding="utf-8"), as_version=4).cells)
    folder = Path(tempfile.mkdtemp(prefix=f"grade-{row.student[:40]}-"))
    try:
        shutil.copytree(lesson.path.parent, folder, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.ipynb", ".ipynb_checkpoints"))
        nbformat.write(nb, folder / lesson.path.name)
        _run(nb, lesson, folder, settings, row)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    passed = {k for k, r in row.results.items() if r["outcome"] == "passed"}
    row.peeked = _peeked(nb.cells, stored, lesson, passed)
    row.seconds = time.monotonic() - began
    return row


def configure_worker(threads: int) -> None:
    """Environment for the kernels a worker starts: its share of the cores, no GUI backends."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = str(threads)
    os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"


__all__ = ["Settings", "Graded", "grade_submission", "configure_worker", "STATUS_ORDER", "NOTEBOOK_DIR"]
