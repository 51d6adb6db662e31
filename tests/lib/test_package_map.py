"""The house rules of course_lib, checked on its code (docs/developers.md, "Finding a lesson's code").

- The map in ``course_lib/__init__.py``'s docstring names every module, with the lesson that builds it.
- Checkers and solutions are named by lesson (``checks/lessonNN_<concept>.py``, ``solutions/lessonNN.py``)
  for a lesson that exists.
- No module imports a private name (``_x``) from another file, or a module whose name is private.
- No file is over 800 lines.
- No building block imports a module that only a later lesson builds.
- The old module names that lessons imported before the move still import the same names.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import course_lib

PACKAGE = Path(course_lib.__file__).resolve().parent
NOTEBOOKS = PACKAGE.parent / "notebooks"
LESSONS = {p.name[:2] for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")}
# Deprecated one-line re-exports of names that lessons imported before the move (docs/developers.md).
OLD_NAMES = {"tasks", "stored", "adam_betas", "dates_remedy", "tokens_vs_chars", "ablation", "extrapolation",
             "grade"}
OLD_CHECKERS = {"gpt", "distributed"}  # checks/<old>.py: the library names lessons imported
MAP_LINE = re.compile(r"^\s+(\d\d)(?:-(\d\d))?\s+([\w.]+)\s", re.M)


def modules() -> list[str]:
    """Every module of the package as a dotted name below course_lib (``attention``, ``data.dates``)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] not in ("__init__", "__main__"):
            names.append(".".join(parts))
    return names


def mapped() -> dict[str, int]:
    """Module -> the first lesson that builds it, from the docstring's map."""
    return {m.group(3): int(m.group(1)) for m in MAP_LINE.finditer(course_lib.__doc__)}


def last_lessons() -> dict[str, int]:
    """Module -> the last lesson that adds to it, from the docstring's map."""
    return {m.group(3): int(m.group(2) or m.group(1)) for m in MAP_LINE.finditer(course_lib.__doc__)}


def test_the_map_names_every_module_with_its_lesson():
    table = mapped()
    by_lesson = re.compile(r"^(checks\.lesson(\d\d)_\w+|solutions\.lesson(\d\d))$")
    missing = []
    for name in modules():
        if (m := by_lesson.match(name)) is not None:
            assert (m.group(2) or m.group(3)) in LESSONS, f"{name}: no lesson {m.group(2) or m.group(3)}"
        elif name.split(".")[0] == "grading":  # the grader stands above the lessons: listed without one
            if not re.search(rf"^\s+{re.escape(name)}\s", course_lib.__doc__, re.M):
                missing.append(name)
        elif name == "checks.common" or name in OLD_NAMES or name in {f"checks.{o}" for o in OLD_CHECKERS}:
            assert name.split(".")[-1] in course_lib.__doc__ or name.startswith("checks."), name
        elif name not in table:
            missing.append(name)
    assert not missing, f"add these modules to course_lib/__init__.py's map, with their lesson: {missing}"
    assert set(table) <= set(modules()), f"the map names modules that do not exist: {set(table) - set(modules())}"


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(the module imported, the names taken) for every ``from ... import`` of a file inside course_lib."""
    package = ".".join(("course_lib", *path.relative_to(PACKAGE).parent.parts))
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((module, [a.name for a in node.names]))
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_name_crosses_a_file_and_no_file_is_too_long(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= 800, f"{path.name}: {lines} lines; split it by concept (no file in course_lib over 800)"
    for module, names in _imports(path):
        if not module.startswith("course_lib"):
            continue
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert not private, f"{path.name} imports {private} from {module}: make them public where both can see them"
        hidden = [p for p in module.split(".") if p.startswith("_") and not p.startswith("__")]
        assert not hidden, f"{path.name} imports the private module {module}"


def test_no_building_block_imports_a_later_lesson():
    table, last = mapped(), last_lessons()
    late = []
    for name, lesson in last.items():
        if name.startswith(("grading.", "studies.")):
            continue  # the grader and the studies stand above every lesson
        path = PACKAGE.joinpath(*name.split(".")).with_suffix(".py")
        for module, _ in _imports(path):
            imported = module.removeprefix("course_lib.")
            if imported in table and table[imported] > lesson:
                late.append(f"{name} (lesson {lesson:02d}) imports {imported} (lesson {table[imported]:02d})")
    assert not late, late


# What lessons imported from the old names, kept working for a learner's notebook from before the move.
OLD_IMPORTS = [
    ("course_lib.tasks", ["ShakespeareCorpus", "VariableLengthTask", "fetch_shakespeare", "read_plays",
                          "VALIDATION_PLAYS", "POEMS", "data_dir", "checked_file"]),
    ("course_lib.data", ["CopyTask", "Vocab", "pad_sequences", "CharVocab", "DatesCorpus", "DATE_FORMATS",
                         "TRAIN_FORMATS", "MONTHS_EN", "MONTHS_DE", "MONTHS_DE_ABBR", "make_translation_batch",
                         "TranslationBatch", "render_date", "iso_date"]),
    ("course_lib.stored", ["load_runs", "save_runs", "RESULTS_DIR"]),
    ("course_lib.adam_betas", ["first_steps", "load_betas"]),
    ("course_lib.dates_remedy", ["load_remedy"]),
    ("course_lib.tokens_vs_chars", ["load_tokens_vs_chars"]),
    ("course_lib.ablation", ["ROWS", "ablation_table", "load_ablation", "run_ablation"]),
    ("course_lib.extrapolation", ["TRAIN_MAX_LEN", "exact_match_by_length", "load_length_generalisation",
                                  "load_rope_lengths"]),
    ("course_lib.grade", ["main", "grade_all", "write_outputs"]),
]


@pytest.mark.parametrize("module, names", OLD_IMPORTS, ids=[m for m, _ in OLD_IMPORTS])
def test_old_module_names_still_import_what_lessons_imported(module, names):
    old = importlib.import_module(module)
    missing = [n for n in names if not hasattr(old, n)]
    assert not missing, f"{module} lost {missing}"
