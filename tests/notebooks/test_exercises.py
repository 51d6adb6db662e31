"""How exercises are laid out in the notebooks (issue: solve, don't copy; solutions out of sight).

- Each stub cell (metadata ``"exercise": "NN.name"``) raises ``NotImplementedError`` and has a
  solution block in ``course_lib/solutions/lessonNN.py``; every solution block belongs to one stub.
- No notebook cell contains solution code: no cell tagged "solution", and no later cell redefines a
  name the stub defines (Run All leaves the learner's code as written).
- Each exercise has its commented ``# show_solution("NN.name")`` line, a difficulty mark (★) in the
  markdown above it, and lessons 01 on have at least three exercises, among them a "Predict" and a
  "Debug" exercise.

Answers stay out of sight until the learner has tried (issue #15):

- Every "Predict, then run" exercise (its heading says "Predict") has a **reveal cell** after its
  stub: the code cell that runs the experiment, with metadata ``"reveals": "NN.name"``. Between
  the stub and the reveal cell come only checker cells, so no demonstration sits under the question.
  Informal predictions in the prose ("which do you expect?") get reveal cells too, with a key of
  their own.
- A reveal cell stores no output (``scripts/execute_notebooks.py`` drops it), is tagged
  ``nbval-ignore-output`` so that nbval runs it without comparing, and asserts the claim.
- Its code compares what it measures with ``predicted_answer("NN.name")`` (the solution's value) or
  with a value computed another way, never with the answer written out: the learner reads the code
  before running it. The answer's literal may not appear from the question down to the reveal cell.
- The markdown cell right after a reveal cell opens with a collapsed
  ``<details><summary>…</summary>`` block holding the explanation, which JupyterLab, Colab and GitHub
  render closed.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import nbformat
import pytest

from course_lib.solutions import show_solution, solution_keys, solution_source

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
LESSONS = [p for p in NOTEBOOKS if not p.name.startswith("00_")]
DEFINES = re.compile(r"^(?:def|class)\s+(\w+)|^(\w+)\s*=(?!=)", re.M)


def exercise_cells(nb):
    return [(i, c) for i, c in enumerate(nb.cells) if c.get("metadata", {}).get("exercise")]


def defined_names(source: str) -> set[str]:
    return {a or b for a, b in DEFINES.findall(source)}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stubs_raise_and_have_solutions(path):
    nb = nbformat.read(path, as_version=4)
    lesson = path.name[:2]
    keys = []
    for _, cell in exercise_cells(nb):
        key = cell.metadata["exercise"]
        keys.append(key)
        assert cell.cell_type == "code", f"{key}: the stub must be a code cell"
        assert key.startswith(f"{lesson}."), f"{key} stands in {path.name}"
        assert "NotImplementedError" in cell.source, f"{key}: the stub must raise NotImplementedError"
        solution = solution_source(key)
        missing = defined_names(cell.source) - defined_names(solution)
        assert not missing, f"{key}: the solution does not define {missing}, which the stub defines"
    assert sorted(keys) == solution_keys(lesson), (
        f"{path.name}: stubs {sorted(keys)} but solutions {solution_keys(lesson)}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_solution_code_in_the_notebook(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        tags = cell.get("metadata", {}).get("tags", [])
        assert "solution" not in tags, f"{path.name}, cell {i}: a solution cell"
    for i, stub in exercise_cells(nb):
        names = defined_names(stub.source)
        for j, cell in enumerate(nb.cells):
            if j != i and cell.cell_type == "code":
                again = names & defined_names(cell.source)
                assert not again, (f"{path.name}: cell {j} redefines {sorted(again)} from the stub of "
                                   f"{stub.metadata['exercise']}, overwriting the learner's code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_exercise_is_marked_and_offers_its_solution(path):
    nb = nbformat.read(path, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for i, stub in exercise_cells(nb):
        key = stub.metadata["exercise"]
        assert f'# show_solution("{key}")' in code, f"{key}: no commented show_solution line"
        above = next(c.source for c in reversed(nb.cells[:i]) if c.cell_type == "markdown")
        assert "★" in above, f"{key}: the markdown cell above the stub has no difficulty mark (★)"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lessons_mix_kinds_of_exercise(path):
    nb = nbformat.read(path, as_version=4)
    cells = exercise_cells(nb)
    assert len(cells) >= 3, f"{path.name}: {len(cells)} exercises, at least 3 expected"
    headings = "\n".join(next(c.source for c in reversed(nb.cells[:i]) if c.cell_type == "markdown")
                         for i, _ in cells)
    for kind in ("Predict", "Debug"):
        assert kind in headings, f"{path.name}: no {kind!r} exercise"


@pytest.mark.parametrize("lesson", sorted({k[:2] for k in solution_keys()}))
def test_solution_files_import(lesson):
    importlib.import_module(f"course_lib.solutions.lesson{lesson}")


def test_show_solution_displays_without_defining(capsys):
    key = solution_keys()[0]
    show_solution(key)
    assert capsys.readouterr().out.strip().endswith(solution_source(key).strip())
    with pytest.raises(KeyError, match="no solution named"):
        solution_source("99.nothing")


REVEAL_TAG = "nbval-ignore-output"


def predict_exercises(nb) -> list[tuple[int, str]]:
    """``(stub index, key)`` of each exercise whose heading (the markdown above it) says Predict."""
    found = []
    for i, cell in exercise_cells(nb):
        heading = next(c.source for c in reversed(nb.cells[:i]) if c.cell_type == "markdown")
        if "Predict" in heading:
            found.append((i, cell.metadata["exercise"]))
    return found


def reveal_cells(nb) -> list[tuple[int, object]]:
    return [(i, c) for i, c in enumerate(nb.cells) if c.get("metadata", {}).get("reveals")]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_predict_exercise_has_a_reveal_cell_after_its_checker(path):
    nb = nbformat.read(path, as_version=4)
    reveals = {c.metadata["reveals"]: i for i, c in reveal_cells(nb)}
    for stub, key in predict_exercises(nb):
        assert key in reveals, (f"{path.name}: the Predict exercise {key} has no reveal cell "
                                f"(metadata \"reveals\": \"{key}\")")
        assert reveals[key] > stub, f"{key}: the reveal cell comes before the stub"
        for j in range(stub + 1, reveals[key]):
            cell = nb.cells[j]
            if cell.cell_type == "code":
                assert "check_" in cell.source, (
                    f"{path.name}, cell {j}: between the stub of {key} and its reveal cell only "
                    "checker cells may run; a demonstration here shows the answer before the learner "
                    "has tried")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_reveal_cells_store_nothing_assert_and_explain_behind_details(path):
    nb = nbformat.read(path, as_version=4)
    keys = [c.metadata["reveals"] for _, c in reveal_cells(nb)]
    assert len(keys) == len(set(keys)), f"{path.name}: two reveal cells share a key: {keys}"
    lesson = path.name[:2]
    for i, cell in reveal_cells(nb):
        key = cell.metadata["reveals"]
        where = f"{path.name}, cell {i} (reveals {key})"
        assert key.startswith(f"{lesson}."), f"{where}: the key must start with {lesson}."
        assert cell.cell_type == "code", f"{where}: a reveal cell is a code cell"
        assert not cell.outputs and cell.execution_count is None, (
            f"{where}: stores an output; run scripts/execute_notebooks.py, which drops it")
        assert REVEAL_TAG in cell.metadata.get("tags", []), (
            f"{where}: tag it {REVEAL_TAG}, or nbval compares its output with the empty stored one")
        assert re.search(r"^\s*assert\b", cell.source, re.M), f"{where}: asserts nothing"
        after = nb.cells[i + 1] if i + 1 < len(nb.cells) else None
        assert after is not None and after.cell_type == "markdown", (
            f"{where}: a markdown cell with the explanation behind <details> must follow")
        text = after.source.lstrip()
        assert text.startswith("<details>") and "<summary>" in text and "</details>" in text, (
            f"{where}: the next markdown cell must open with <details><summary>...</summary> and "
            "close it, so that the explanation is collapsed")
        assert "<details open" not in text, f"{where}: the <details> block must start closed"


def answer_needles(value) -> list[str]:
    """How the answer of a Predict exercise would be spelled out in a cell: the numbers of a tuple
    or list joined by ", ", an int of 10 or more (plain, with , or _ separators), a float as
    Python prints it, a string in quotes. Booleans and small ints alone are too common to search."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [str(value), f"{value:,}", f"{value:_}"] if abs(value) >= 10 else []
    if isinstance(value, float):
        return [repr(value)] if value not in (0.0, 1.0) else []
    if isinstance(value, str):
        return [f'"{value}"', f"'{value}'"]
    if isinstance(value, dict):
        return [n for v in value.values() for n in answer_needles(v)]
    if isinstance(value, (tuple, list)):
        flat = [v for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
        joined = [", ".join(map(str, value))] if len(flat) == len(value) >= 2 else []
        return joined + [n for v in value if not isinstance(v, (int, float))
                         for n in answer_needles(v)] + (
            answer_needles(value[0]) if len(value) == 1 else [])
    return []


def cell_text(cell) -> str:
    text = cell.source
    for output in cell.get("outputs", []):
        text += output.get("text", "") + output.get("data", {}).get("text/plain", "")
    return text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_predict_answers_are_not_spelled_out_before_the_learner_runs_the_reveal(path):
    """The solution's answer may not stand in the question, the cells up to the reveal cell (their
    source and stored output), nor in the reveal cell's own code, which the learner reads before
    running it: assert against a value computed another way, not against the literal answer."""
    nb = nbformat.read(path, as_version=4)
    reveals = {c.metadata["reveals"]: i for i, c in reveal_cells(nb)}
    for stub, key in predict_exercises(nb):
        namespace: dict = {}
        exec(solution_source(key), namespace)  # defines the stub's function(s)
        (name,) = defined_names(nb.cells[stub].source)
        answer = namespace[name]()
        heading = max(j for j in range(stub) if nb.cells[j].cell_type == "markdown")
        for j in range(heading, reveals.get(key, stub) + 1):
            if j == stub:
                continue
            text = cell_text(nb.cells[j])
            # A word answer ("it") is searched in quotes in the reveal cell only: the question and
            # the checker call may name the same token.
            needles = answer_needles(answer)
            if isinstance(answer, str) and j != reveals.get(key):
                needles = []
            for needle in needles:
                assert needle not in text, (
                    f"{path.name}, cell {j}: shows {needle}, the answer of {key}, before the learner "
                    "has run the reveal cell")
