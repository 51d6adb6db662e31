"""The solutions run's rules (tests/notebooks/notebooks_with_solutions.py): which cells it compares, what it
sanitizes, and the checkers' promise that makes the comparison possible (they leave the random
generators as they found them)."""

from __future__ import annotations

import importlib.util
import random
import re
from pathlib import Path

import nbformat
import pytest
import torch

from course_lib.checks.common import RESULTS, checker, yours_or_reference

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "solutions_run", ROOT / "tests" / "notebooks" / "notebooks_with_solutions.py")
solutions_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(solutions_run)


def test_exercise_and_checker_cells_are_not_compared_and_every_other_cell_is():
    stub = nbformat.v4.new_code_cell("def f():\n    raise NotImplementedError", metadata={"exercise": "01.x"})
    check = nbformat.v4.new_code_cell("check_attention(f)\n# show_solution(\"01.x\")")
    indented = nbformat.v4.new_code_cell("for f in fs:\n    check_attention(f)")
    uses = nbformat.v4.new_code_cell("attention = yours_or_reference(f, g)\nprint(attention(q))")
    mentions = nbformat.v4.new_code_cell("# check_attention(f) is above\nprint(1)")
    assert not solutions_run.compared(stub) and not solutions_run.compared(check)
    assert solutions_run.compared(uses) and solutions_run.compared(mentions)
    assert solutions_run.compared(indented)  # a checker call inside a loop is not a checker cell


def test_every_lesson_calls_its_checkers_at_the_start_of_a_line():
    """The rule above finds each lesson's checker cells: every checker call in a lesson stands at
    the start of a line (as the lessons write them), so none is compared by mistake."""
    for path in solutions_run.NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and not cell.metadata.get("exercise"):
                calls = re.findall(r"^\s*check_\w+\(", cell.source, flags=re.M)
                assert all(not c.startswith((" ", "\t")) for c in calls), (path.name, cell.source[:200])


def test_whose_version_line_is_sanitized_in_both_forms(capsys):
    def mine(x):
        return x

    def reference(x):
        return x

    yours_or_reference(mine, reference)
    pattern, replacement = solutions_run.WHOSE
    not_passed = capsys.readouterr().out
    checker(lambda fn: None)(mine)  # passes: mine is now "yours"
    yours_or_reference(mine, reference, name="course_lib.training.train (one step)")
    passed = capsys.readouterr().out
    RESULTS.pop()
    assert re.sub(pattern, replacement, not_passed) == re.sub(pattern, replacement, passed) == replacement
    yours_or_reference(mine, torch.softmax, owner="PyTorch")
    assert re.sub(pattern, replacement, capsys.readouterr().out) == replacement


@pytest.mark.parametrize("outcome", ["passes", "fails", "not implemented"])
def test_a_checker_leaves_the_random_generators_as_it_found_them(outcome):
    @checker
    def check_draws(fn):
        torch.randn(5), random.random()  # a checker's own test cases
        fn()

    def candidate():
        if outcome == "fails":
            raise AssertionError("wrong")
        if outcome == "not implemented":
            raise NotImplementedError

    torch.manual_seed(3)
    random.seed(3)
    expected = torch.randn(4), random.random()
    torch.manual_seed(3)
    random.seed(3)
    try:
        check_draws(candidate)
    except AssertionError:
        assert outcome == "fails"
    RESULTS.pop()
    after = torch.randn(4), random.random()
    assert torch.equal(after[0], expected[0]) and after[1] == expected[1]


def test_the_final_cell_asserts_every_checker_passed():
    source = solutions_run.final_check(3)
    RESULTS_before = list(RESULTS)
    try:
        RESULTS.clear()
        with pytest.raises(AssertionError, match="3 exercises but only 0 checker calls ran"):
            exec(source, {})
    finally:
        RESULTS[:] = RESULTS_before
