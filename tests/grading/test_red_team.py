"""scripts/red_team.py builds its class (no grading here: `make red-team` grades it, with and
without the sandbox, in several minutes): at least 30 submissions, each with the row it must get."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _red_team(monkeypatch):
    spec = importlib.util.spec_from_file_location("red_team", ROOT / "scripts" / "red_team.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "red_team", module)  # (its dataclass looks its module up)
    spec.loader.exec_module(module)
    return module


def test_the_red_team_class_has_30_submissions_each_with_its_row(tmp_path, monkeypatch):
    red_team = _red_team(monkeypatch)
    cases = red_team.build()
    names = [c.student for c in cases]
    assert len(cases) >= 30 and len(set(names)) == len(names)
    statuses = {"graded", "timeout", "memory limit", "kernel died", "results forged", "too large",
                "not a notebook", "grader error", "course changed"}
    for case in cases:
        for mode in ("bwrap", "none"):
            marks, status = case.expected(mode)
            assert status in statuses, (case.student, status)
            if case.lesson and status != "grader error":
                assert len(marks) == len(red_team.KEYS[case.lesson]) and set(marks) <= {0, 1}, case.student
        assert case.attack and case.content
    # the controls get full marks; at least 26 attacks
    controls = [c for c in cases if c.student.startswith("control_")]
    assert len(controls) >= 4 and all(set(c.marks) == {1} for c in controls)
    assert sum(not c.attack.startswith("none") for c in cases) >= 26
    red_team.write(cases, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}.ipynb" for n in names)
    assert "CLASS_DIR" not in (tmp_path / "reads_other_notebook.ipynb").read_text(encoding="utf-8")
