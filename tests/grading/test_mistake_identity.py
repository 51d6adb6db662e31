"""The grader's report groups a class's failures by the mistake a checker named (``CheckFailure.
mistake``), else by the line that raised (``CheckFailure.site``). A checker that names mistakes in a
loop (``for value, reason in named: ... raise CheckFailure(f"...{reason}")``) raises every one of
them from the same line, so without ``mistake=`` the report would lump them into one row."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from course_lib.checks import CheckFailure

CHECKS = Path(__file__).resolve().parents[2] / "course_lib" / "checks"
# loop variables that hold a named mistake's description, in the checkers' own words
MISTAKE_NAMES = {"reason", "message", "more", "mistake"}


def _raises_in_mistake_loops(path: Path) -> list[str]:
    """``file:line`` of each ``raise CheckFailure(...)`` without ``mistake=`` whose message uses the
    mistake variable of a loop around it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                and getattr(node.exc.func, "id", "") == "CheckFailure"):
            continue
        if any(k.arg == "mistake" for k in node.exc.keywords):
            continue
        loop_names, up = set(), parents.get(node)
        while up is not None and not isinstance(up, ast.FunctionDef):
            if isinstance(up, ast.For):
                loop_names |= {n.id for n in ast.walk(up.target) if isinstance(n, ast.Name)}
            up = parents.get(up)
        used = {n.id for n in ast.walk(node.exc) if isinstance(n, ast.Name)}
        if loop_names & used & MISTAKE_NAMES:
            found.append(f"{path.name}:{node.lineno}")
    return found


@pytest.mark.parametrize("path", sorted(CHECKS.glob("*.py")), ids=lambda p: p.name)
def test_mistakes_named_in_a_loop_carry_their_identity(path):
    assert _raises_in_mistake_loops(path) == []


def test_two_mistakes_from_one_line_are_two_mistakes():
    from course_lib.checks import check_initial_loss

    named = []
    for wrong in (math.log(65), math.log(256)):  # nanoGPT's vocabulary, bytes: one raise site
        with pytest.raises(CheckFailure) as failure:
            check_initial_loss(lambda wrong=wrong: wrong)
        named.append((failure.value.site, failure.value.mistake))
    assert named[0][0] == named[1][0]
    assert named[0][1] and named[1][1] and named[0][1] != named[1][1]
