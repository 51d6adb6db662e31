"""The second test run: every notebook with each exercise stub replaced by its solution.

    python -m pytest tests/notebooks_with_solutions.py      (make test-solutions; `make test` runs it too)

Instructors need to know that every solution is right, in the notebook where learners use it. For each
lesson this replaces every stub cell (metadata ``"exercise": "NN.name"``) by the solution block of
``course_lib/solutions/lessonNN.py``, runs the notebook top to bottom on a fresh kernel, and requires
that no cell fails and that every checker call passed: none says "not implemented yet", none failed,
and there are at least as many passing calls as exercises. The file name does not start with
``test_``, so ``pytest tests`` does not collect it: `make test` adds it with ``--with-solutions``
(conftest.py), which also makes each lesson here its own unit of work beside the others (pytest-xdist).
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from course_lib.solutions import solution_source

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
REPORT = (
    "import json\n"
    "from course_lib.checks._common import RESULTS\n"
    "print('CHECK-RESULTS=' + json.dumps([vars(r) for r in RESULTS]))\n"
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


def check_results(nb: nbformat.NotebookNode) -> list[dict]:
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream")
    line = next(l for l in text.splitlines() if l.startswith("CHECK-RESULTS="))
    return json.loads(line.removeprefix("CHECK-RESULTS="))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_checker_passes_with_the_solutions(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    keys = with_solutions(nb)
    nb.cells.append(nbformat.v4.new_code_cell(REPORT))
    client = NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # a failing cell raises CellExecutionError with its traceback
    results = check_results(nb)
    not_passed = [r for r in results if r["outcome"] != "passed"]
    assert not not_passed, f"{path.name}: checker calls that did not pass with the solutions: {not_passed}"
    assert len(results) >= len(keys), (
        f"{path.name}: {len(keys)} exercises but only {len(results)} checker calls ran: {results}")
