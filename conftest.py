"""pytest configuration shared by the course_lib tests, nbval and the solutions run.

bertviz draws with JavaScript that embeds every attention weight and a random container id; that
JavaScript only runs in a browser, so nbval leaves it out of the output comparison. (Its HTML part is
still compared, with the random id sanitized by tests/notebooks/nbval_sanitize.cfg.)

`make test` is one pytest run: the test modules (``-m "not float_path"``: not those that train) and
strict nbval over every lesson. ``--with-solutions`` (or naming the file, `make test-solutions`)
collects the solutions run, tests/notebooks/notebooks_with_solutions.py: every lesson solved, cell by cell, on
the float path of ``--solutions-float-path``. ``-n 2 --dist loadscope`` runs them side by side:

* **Threads.** Each worker, and every kernel it starts, computes with one thread
  (``OMP_NUM_THREADS=1``) unless the caller set ``OMP_NUM_THREADS``: two one-thread workers on two
  cores do about twice the work of one two-thread process, because the course's models are small.
* **Units of work** (``unit_of``; pytest_xdist_make_scheduler gives them to ``--dist loadscope``): a
  notebook's cells share one kernel, so every cell of a notebook goes to one worker (the same for
  each lesson of the solutions run); a test module is one unit, so a module-scoped fixture (a trained
  model) is built once. Units start longest-first: the test modules that train (marked
  ``float_path``) or run for minutes (marked ``long``, e.g. ``pytestmark = pytest.mark.long``), then
  the solutions run and the notebooks (later lessons first: they train), then the rest, so that the
  last minutes are filled with short units.
* **Timings.** At the end, pytest prints the time of each lesson (strict nbval, the solutions run) and
  of the slowest test modules, and appends them to ``build/timings/runs.jsonl`` for
  ``make timings`` (scripts/timings.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the course never downloads from a hub
os.environ.setdefault("MPLBACKEND", "Agg")
if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker beside others: one thread each (see above)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parent
# tests/ mirrors the package in folders (lib, data, studies, checks, grading, notebooks, project);
# their shared helpers (tests/_helpers.py) are imported as `from _helpers import ...` from any folder.
sys.path.insert(0, str(ROOT / "tests"))
NOT_COMPARED = ("application/javascript",)
SOLUTIONS_FILE = "tests/notebooks/notebooks_with_solutions.py"


def _load(name: str, path: Path):
    """Import a script that is not on sys.path (scripts/float_paths.py, the solutions run)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Tests whose results depend on training (scripts/float_paths.py runs them on every float path):
# its list, and every module that marks itself `pytestmark = pytest.mark.float_path`.
FLOAT_PATH_MODULES = set(_load("float_paths", ROOT / "scripts" / "float_paths.py").training_tests())
TIMINGS = ROOT / "build" / "timings" / "runs.jsonl"


def pytest_addoption(parser):
    parser.addoption("--with-solutions", action="store_true",
                     help=f"also run every lesson with its solutions ({SOLUTIONS_FILE})")
    parser.addoption("--solutions-float-path", default="native",
                     choices=("default", "avx2", "avx512", "native"),
                     help="the float path (ATEN_CPU_CAPABILITY) of the solutions run's kernels; "
                          "`make test-solutions` runs them on `default`; CI on the path just below the "
                          "native one (scripts/float_paths.py --paths second)")


def pytest_collect_file(file_path, parent):
    """The solutions run (SOLUTIONS_FILE: every lesson solved, cell by cell) when `--with-solutions`
    is given or the file is named (`make test-solutions`). Its name does not match `test_*.py`, so
    `pytest tests` alone leaves it out."""
    if file_path == ROOT / SOLUTIONS_FILE and (parent.config.getoption("with_solutions")
                                                or parent.session.isinitpath(file_path)):
        return _load("notebooks_with_solutions", ROOT / SOLUTIONS_FILE).SolutionsRun.from_parent(
            parent, path=file_path)
    return None


def pytest_collectstart(collector):
    if hasattr(collector, "skip_compare"):  # nbval's notebook collector
        collector.skip_compare = tuple(collector.skip_compare) + NOT_COMPARED


def unit_of(nodeid: str) -> tuple[str, str]:
    """(kind, name) of the work unit a test belongs to: ('strict nbval', '01_attention'),
    ('solutions', '01_attention') or ('tests', 'tests/lib/test_attention.py')."""
    file = nodeid.split("::")[0]
    if file.endswith(".ipynb"):
        return "strict nbval", Path(file).stem
    if file.endswith(SOLUTIONS_FILE.split("/")[-1]):  # tests/notebooks/notebooks_with_solutions.py::LESSON::Cell N
        parts = nodeid.split("::")
        return "solutions", parts[1] if len(parts) > 1 else nodeid
    return "tests", file


def _lesson_rank(name: str) -> int:
    match = re.match(r"(\d+)_", name)
    return -int(match.group(1)) if match else 0  # later lessons first: they train more


@pytest.hookimpl(tryfirst=True)  # mark the tests that train before `-m "not float_path"` deselects them
def pytest_collection_modifyitems(config, items):
    early = set()  # test modules that train or mark themselves long: they start first
    for item in items:
        kind, name = unit_of(item.nodeid)
        if kind == "tests" and name in FLOAT_PATH_MODULES:
            item.add_marker(pytest.mark.float_path)
        if item.get_closest_marker("float_path") or item.get_closest_marker("long"):
            early.add(name)

    def rank(item):
        kind, name = unit_of(item.nodeid)
        if kind == "solutions":
            return (1, _lesson_rank(name))
        if kind == "strict nbval":
            return (2, _lesson_rank(name))
        return (0 if name in early else 3, 0)  # e.g. test_gpt_recipe (5 min) beside the lessons

    items.sort(key=rank)  # stable: a notebook's cells keep their order


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` with the course's units of work (unit_of), in collection order."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return ":".join(unit_of(nodeid))

        def _reschedule(self, node) -> None:
            # xdist keeps 3 tests queued per worker; a unit here can be one long test (a lesson's
            # solutions run), so a worker gets its next unit only when its current one is ending.
            if not node.shutting_down and self.workqueue and self._pending_of(self.assigned_work[node]) > 1:
                return
            super()._reschedule(node)

    config.option.loadscopereorder = False  # keep the longest-first order of the collection
    return ByUnit(config, log)


# ------------------------------------------------------------------------------------------------
# Timings: the controller (or a run without workers) adds up each unit's setup, call and teardown.
# ------------------------------------------------------------------------------------------------

_durations: dict[tuple[str, str], float] = {}
_outcomes: dict[str, int] = {}
_start = time.time()


def pytest_runtest_logreport(report):
    key = unit_of(report.nodeid)
    _durations[key] = _durations.get(key, 0.0) + report.duration
    if report.when == "call" or report.outcome != "passed":
        _outcomes[report.outcome] = _outcomes.get(report.outcome, 0) + 1


def _label() -> dict:
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    return {
        "float_path": os.environ.get("ATEN_CPU_CAPABILITY") or "native",
        "threads": os.environ.get("OMP_NUM_THREADS") or ("1" if workers else "all"),
    }


def _unit_path(config, kind: str) -> dict:
    """The float path of a solutions unit when it is not the run's (`make test-solutions`: `default`)."""
    path = config.getoption("solutions_float_path", "native")
    return {"float_path": path} if kind == "solutions" and path != "native" else {}


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if os.environ.get("PYTEST_XDIST_WORKER") or not _durations:
        return
    workers = getattr(config.option, "numprocesses", None) or 0
    label = _label()
    if workers:
        label["threads"] = os.environ.get("OMP_NUM_THREADS", "1")
    lessons = sorted({name for kind, name in _durations if kind != "tests"})
    write = terminalreporter.write_line
    terminalreporter.section("time per lesson and per unit of work")
    write(f"float path {label['float_path']}, {label['threads']} thread(s) per process, "
          f"{workers or 1} process(es) side by side; seconds on the process that ran it")
    solutions = "solutions" + "".join(f" ({p} path)" for p in _unit_path(config, "solutions").values())
    for lesson in lessons:
        parts = [f"{name} {_durations[(kind, lesson)]:6.1f} s"
                 for kind, name in (("strict nbval", "strict nbval"), ("solutions", solutions))
                 if (kind, lesson) in _durations]
        write(f"  {lesson:32s} " + "   ".join(parts))
    modules = sorted(((v, name) for (kind, name), v in _durations.items() if kind == "tests"), reverse=True)
    if modules:
        total = sum(v for v, _ in modules)
        write(f"  {'test modules':32s} {total:6.1f} s in {len(modules)} modules; slowest: "
              + ", ".join(f"{Path(name).stem} {v:.0f} s" for v, name in modules[:5]))
    record = {
        **label, "workers": workers, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": round(time.time() - _start, 1), "exit": int(exitstatus), "outcomes": _outcomes,
        "units": [{"kind": k, "name": n, "s": round(v, 1), **_unit_path(config, k)}
                  for (k, n), v in sorted(_durations.items())],
    }
    try:
        TIMINGS.parent.mkdir(parents=True, exist_ok=True)
        with TIMINGS.open("a") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as err:  # a read-only clone still runs its tests
        write(f"(timings not saved: {err})")
