"""What the grader knows about each lesson, read from the course's own notebooks.

For every exercise of a lesson notebook (a code cell with ``"exercise": "NN.name"`` in its metadata)
the grader needs: the name the stub defines (``my_attention``), and the checker call of the cell
below it (``check_scaled_dot_product_attention(my_attention)``), split into the checker's name and
the source of its other arguments. Only exercises with a checker call are graded ("checked").
A submission is matched to its lesson by what it holds: its cells' exercise keys, a lesson id in its
metadata, or (metadata stripped) the names its cells define.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
DEFINES = re.compile(r"^(?:def|class)\s+(\w+)", re.M)


@dataclass
class Exercise:
    """One checked exercise: its key, the name its stub defines, and how the notebook checks it."""

    key: str
    name: str
    checker: str
    args: list[str]  # the source of the checker's other arguments, evaluated in the learner's kernel
    stub_source: str


@dataclass
class Lesson:
    """A lesson notebook: its id ("01"), file, checked exercises in order, and its other code cells."""

    lesson_id: str
    path: Path
    exercises: list[Exercise]
    lesson_cells: list[str] = field(default_factory=list)  # code cells that are neither stub nor check

    @property
    def keys(self) -> list[str]:
        return [e.key for e in self.exercises]


def _checker_call(source: str, name: str) -> tuple[str, list[str]] | None:
    """``check_x(name, a, b)`` in ``source`` -> ("check_x", ["a", "b"]); None if there is none."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id.startswith("check_") and node.args
                and isinstance(node.args[0], ast.Name) and node.args[0].id == name):
            args = [ast.get_source_segment(source, a) for a in node.args[1:]]
            args += [f"{k.arg}={ast.get_source_segment(source, k.value)}" for k in node.keywords]
            return node.func.id, [a for a in args if a]
    return None


def _stub_name(source: str) -> str | None:
    found = DEFINES.findall(source)
    return found[0] if found else None


def read_lesson(path: Path) -> Lesson:
    """The checked exercises and lesson cells of one course notebook."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    exercises, skip = [], set()
    for i, cell in enumerate(code):
        key = cell.get("metadata", {}).get("exercise")
        if not key:
            continue
        skip.add(i)
        name = _stub_name(cell.source)
        for j in range(i + 1, min(i + 4, len(code))):
            call = _checker_call(code[j].source, name) if name else None
            if call:
                skip.add(j)
                exercises.append(Exercise(key, name, call[0], call[1], cell.source))
                break
    lesson_cells = [c.source for i, c in enumerate(code) if i not in skip and c.source.strip()]
    return Lesson(path.name[:2], path, exercises, lesson_cells)


@functools.lru_cache(maxsize=4)
def read_lessons(folder: Path = NOTEBOOK_DIR) -> dict[str, Lesson]:
    """Every lesson of the course by id ("00", "01", ...)."""
    lessons = [read_lesson(p) for p in sorted(folder.glob("[0-9][0-9]_*.ipynb"))]
    return {lesson.lesson_id: lesson for lesson in lessons if lesson.exercises}


def match_lesson(nb: Any, lessons: dict[str, Lesson]) -> str | None:
    """The lesson a submission belongs to, by content; None if it holds no exercise of the course."""
    owner = {e.key: lid for lid, lesson in lessons.items() for e in lesson.exercises}
    votes: dict[str, int] = {}
    for cell in nb.cells:
        lid = owner.get(cell.get("metadata", {}).get("exercise"))
        if lid:
            votes[lid] = votes.get(lid, 0) + 1
    claimed = str(nb.get("metadata", {}).get("lesson", ""))
    if not votes and claimed in lessons:
        return claimed
    if not votes:  # exercise metadata stripped: count the stub names the cells define
        defined = {n for c in nb.cells if c.cell_type == "code" for n in DEFINES.findall(c.source)}
        for lid, lesson in lessons.items():
            hits = sum(e.name in defined for e in lesson.exercises)
            if hits >= max(1, len(lesson.exercises) // 2):
                votes[lid] = hits
    if not votes:
        return None
    return max(sorted(votes), key=lambda lid: votes[lid])
