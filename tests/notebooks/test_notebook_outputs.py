"""Stored outputs that every machine reproduces (issue: every result holds on every CPU).

A cell whose output depends on the float path (PyTorch's CPU kernels differ between CPUs, and
training drifts apart) is tagged ``nbval-ignore-output``: nbval runs it but does not compare its
output. Such a cell must still check what the lesson teaches, so it must ``assert``; and docs/developers.md's
section "Numbers on your machine" lists every tagged cell with its reason, one table row each.
Reveal cells (metadata ``"reveals"``, see test_exercises.py) are tagged too, but store no output at
all, so docs/developers.md does not list them; they must assert like the others.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
TAG = "nbval-ignore-output"


def tagged_cells(path: Path, reveals: bool = True) -> list[tuple[int, str]]:
    """Code cells tagged TAG; ``reveals=False`` leaves out reveal cells (they store no output)."""
    nb = nbformat.read(path, as_version=4)
    return [(i, c.source) for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and TAG in c.get("metadata", {}).get("tags", [])
            and (reveals or not c.get("metadata", {}).get("reveals"))]


def readme_section() -> str:
    text = (ROOT / "docs" / "developers.md").read_text()
    match = re.search(r"^## Numbers on your machine\n(.*?)(?=^## )", text, re.M | re.S)
    assert match, "docs/developers.md has no section '## Numbers on your machine'"
    return match.group(1)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_cell_whose_output_is_not_compared_asserts(path):
    for i, source in tagged_cells(path):
        assert re.search(r"^\s*assert\b", source, re.M), (
            f"{path.name}, cell {i}: tagged {TAG} (its output is not compared) but it asserts "
            "nothing; assert the robust fact the lesson teaches")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_readme_lists_every_cell_whose_output_is_not_compared(path):
    rows = [line for line in readme_section().splitlines()
            if line.startswith("|") and f"`{path.stem}`" in line]
    stored = tagged_cells(path, reveals=False)
    assert len(rows) == len(stored), (
        f"{path.name} has {len(stored)} cells tagged {TAG} (not counting reveal cells), and the "
        f"docs/developers.md's 'Numbers on "
        f"your machine' table has {len(rows)} rows for `{path.stem}`: list each with its reason")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_outputs_name_no_local_path_or_machine(path):
    """A stored output that names this clone's folder, a home directory or /tmp differs on every
    other machine (nbval then fails there, as a warning's file path once did in CI)."""
    nb = nbformat.read(path, as_version=4)
    local = re.compile(r"(/home/|/Users/|/tmp/|/root/|/work/|[A-Z]:\\\\|" + re.escape(str(ROOT)) + ")")
    for i, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            text = str(output.get("text", "")) + str(output.get("data", {}).get("text/plain", ""))
            assert not local.search(text), f"{path.name} cell {i}: {local.search(text).group(0)!r}"
