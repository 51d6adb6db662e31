"""The second run of every lesson: each exercise stub replaced by its solution, on the second float path,
every other output compared with the stored one.

    make test-solutions      (CI runs it on the portable float path after `make test`)

Instructors need to know that every solution is right, in the notebook where learners use it. For each
lesson this replaces every stub cell (metadata ``"exercise": "NN.name"``) by the solution block of
``course_lib/solutions/lessonNN.py`` and runs the notebook top to bottom on a fresh kernel, cell by
cell as nbval does (each cell is a test). It requires that

* no cell fails, and every checker call passed: none says "not implemented yet", none failed, and there
  are at least as many passing calls as exercises (a last cell added to the notebook asserts it);
* every other cell prints what the lesson stores, as strict nbval compares it (its tags, its sanitize
  file). Not compared: the exercise cells and the cells that call a checker (they print "not
  implemented yet" in the stored lesson), and the line of ``yours_or_reference`` that names whose
  version runs ("using your ..." here, "using course_lib's ..." in the stored lesson): the numbers
  under it are compared, so a solution that computes something else than course_lib is caught.

**The second float path.** The kernel runs other kernels than strict nbval's (``ATEN_CPU_CAPABILITY``,
``--solutions-float-path``; `make test-solutions` passes ``default``; CI sets the variable itself, to
the path just below the native one (``avx2`` on an AVX-512 CPU, ``default`` on an AVX2 one; see
scripts/float_paths.py), and passes ``native``), while `make test`'s strict nbval runs the native ones:
so CI executes each lesson twice, once as a learner opens it on this CPU's kernels and once solved on
other kernels, and compares both against the stored outputs (docs/developers.md, "Numbers on your machine").
``native`` keeps the caller's path.

The file name does not start with ``test_``, so ``pytest tests`` does not collect it: conftest.py
collects it with ``--with-solutions`` or when it is named on the command line; each lesson is one unit
of work for pytest-xdist. The nbval options (``--nbval-current-env``, the sanitize file, the cell time
limit) apply here as to strict nbval.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path

import nbformat
import pytest
from nbval.plugin import IPyNbCell, IPyNbFile, find_comment_markers, find_metadata_tags

from course_lib.solutions import solution_source

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
FLOAT_PATHS = ("default", "avx2", "avx512", "native")
NOT_COMPARED = ("application/javascript",)  # as strict nbval (conftest.py): bertviz's random ids
CHECKER_CALL = re.compile(r"^check_\w+\(", re.MULTILINE)  # a cell that calls a lesson's checker
# yours_or_reference's line (course_lib/checks/common.py) in both of its forms
WHOSE = (r"using your `[^`]+`\n|using [\w.' ]+'s `[^`]+`: yours \(`[^`]+`\) has not passed its checker yet\n",
         "WHOSE VERSION RUNS\n")


def final_check(num_exercises: int) -> str:
    """The cell added at the end: every checker call passed, and there were enough of them."""
    return (
        "from course_lib.checks.common import RESULTS as _results\n"
        "_not_passed = [vars(r) for r in _results if r.outcome != 'passed']\n"
        "assert not _not_passed, f'checker calls that did not pass with the solutions: {_not_passed}'\n"
        f"assert len(_results) >= {num_exercises}, "
        f"f'{num_exercises} exercises but only {{len(_results)}} checker calls ran: {{[vars(r) for r in _results]}}'\n"
    )


def with_solutions(nb: nbformat.NotebookNode) -> list[str]:
    """Replace each stub cell of ``nb`` by its solution, in place; return the exercise keys."""
    keys = []
    for cell in nb.cells:
        key = cell.get("metadata", {}).get("exercise")
        if key:
            cell.source = solution_source(key)
            keys.append(key)
    return keys


def compared(cell: nbformat.NotebookNode) -> bool:
    """Whether the solved lesson must print what the stored lesson shows under this cell."""
    return not (cell.get("metadata", {}).get("exercise") or CHECKER_CALL.search(cell.source))


class LessonWithSolutions(IPyNbFile):
    """One lesson, solved: nbval's collector with the solutions in place and the kernel on a float path."""

    def collect(self):
        self.skip_compare = tuple(self.skip_compare) + NOT_COMPARED
        self.nb = nbformat.read(self.lesson, as_version=4)
        checked = [compared(cell) for cell in self.nb.cells]
        keys = with_solutions(self.nb)
        self.nb.cells.append(nbformat.v4.new_code_cell(final_check(len(keys))))
        checked.append(False)
        code = [(cell, check) for cell, check in zip(self.nb.cells, checked) if cell.cell_type == "code"]
        for num, (cell, check) in enumerate(code):
            options = defaultdict(bool, find_metadata_tags(cell.metadata))
            options.update(find_comment_markers(cell.source))  # e.g. # NBVAL_IGNORE_OUTPUT, as nbval
            options.setdefault("check", self.compare_outputs)
            options["check"] = options["check"] and check
            yield IPyNbCell.from_parent(self, name=f"Cell {num}", cell_num=num, cell=cell, options=options)

    def setup(self):
        path = self.config.getoption("solutions_float_path")
        before = os.environ.get("ATEN_CPU_CAPABILITY")
        if path != "native":
            os.environ["ATEN_CPU_CAPABILITY"] = path  # the kernel inherits it when it starts
        try:
            super().setup()
        finally:
            if before is None:
                os.environ.pop("ATEN_CPU_CAPABILITY", None)
            else:
                os.environ["ATEN_CPU_CAPABILITY"] = before
        self.sanitize_patterns[WHOSE[0]] = WHOSE[1]


class SolutionsRun(pytest.File):
    """Every lesson with its solutions (this file, collected by conftest.py)."""

    def collect(self):
        for path in NOTEBOOKS:
            # the lesson's own path: its kernel starts in notebooks/, as strict nbval's does
            lesson = LessonWithSolutions.from_parent(self, path=path, name=path.stem,
                                                     nodeid=f"{self.nodeid}::{path.stem}")
            lesson.lesson = path
            yield lesson
