"""The setup files agree with each other: pins, the CI command, the Makefile's test target."""

import pathlib
from pathlib import Path
import re
import shlex

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _requirement_lines(text: str) -> set[str]:
    return {line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()}


def _requirements() -> set[str]:
    return _requirement_lines((ROOT / "requirements.txt").read_text())


def _environment_pip() -> set[str]:
    """The entries under `- pip:` in environment.yml (parsed by indentation, no YAML library needed)."""
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    indent = len(lines[start]) - len(lines[start].lstrip())
    entries = set()
    for line in lines[start + 1 :]:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if len(line) - len(line.lstrip()) <= indent:
            break
        assert line.strip().startswith("- "), line
        entries.add(line.strip()[2:].split("#")[0].strip())
    return entries


def _make_variable(name: str) -> str:
    """A Makefile variable's value, with backslash continuations joined."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    match = re.search(rf"^{name}\s*:?=\s*(.*)$", text, flags=re.M)
    assert match, f"{name} not found in the Makefile"
    return match.group(1)


def _recipe(target: str) -> list[str]:
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"^{re.escape(target)}\s*:", line))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


def test_environment_yml_pip_list_equals_requirements_txt():
    requirements, environment = _requirements(), _environment_pip()
    assert len(requirements) >= 10
    assert environment == requirements, (
        f"only in environment.yml: {sorted(environment - requirements)}; "
        f"only in requirements.txt: {sorted(requirements - environment)}"
    )


def test_every_requirement_is_pinned_exactly():
    for requirement in _requirements():
        assert re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[\w.\-+]+", requirement), requirement


def test_torch_is_pinned_to_2_13_0_everywhere():
    assert "torch==2.13.0" in _requirements()
    assert "torch==2.13.0" in _environment_pip()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"install .*torch==2\.13\.0", makefile)  # `make setup` installs torch first, pinned
    assert set(re.findall(r"torch==([\w.]+)", makefile)) == {"2.13.0"}


def test_ci_runs_make_test():
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert "make test" in commands
    assert "set -euo pipefail" in commands  # a failing test fails CI


def test_make_test_runs_pytest_with_strict_nbval():
    recipe = _recipe("test")
    assert any("pytest $(PYTEST_ARGS)" in line for line in recipe)
    args = shlex.split(_make_variable("PYTEST_ARGS"))
    assert "tests" in args  # the course_lib tests
    assert "--nbval" in args and args[args.index("--nbval") + 1] == "notebooks"
    assert "--nbval-current-env" in args
    assert "--nbval-sanitize-with" in args
    sanitize = args[args.index("--nbval-sanitize-with") + 1]
    assert sanitize == "tests/notebooks/nbval_sanitize.cfg" and (ROOT / sanitize).is_file()
    assert "--nbval-lax" not in args and "--nbval-lax" not in (ROOT / "Makefile").read_text()


def test_test_target_sets_up_first():
    text = (ROOT / "Makefile").read_text()
    assert re.search(r"^test:\s*setup\b", text, flags=re.M)


def test_readme_documents_the_same_test_command():
    """The README shows `make test` and the exact pytest command the Makefile runs."""
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and ".ci/run" in readme
    joined = readme.replace("\\\n", " ")
    match = re.search(r"-m pytest ([^\n`]+)", joined)
    assert match, "README has no `python -m pytest ...` line"
    assert shlex.split(match.group(1)) == shlex.split(_make_variable("PYTEST_ARGS"))
    assert "torch==2.13.0" in readme


def test_ci_installs_chromium_and_bubblewrap_and_runs_make_test_browser():
    """CI installs Debian's Chromium (make test-browser) and bubblewrap (the grader's sandboxed class),
    each only when it is missing, then runs make test before make test-browser."""
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands.index("make test") < commands.index("make test-browser")
    assert re.search(r"apt-get update", ci) and re.search(r"apt-get install -y .*\$missing", ci)
    assert 'command -v chromium >/dev/null 2>&1 || missing="$missing chromium"' in ci
    assert 'command -v bwrap >/dev/null 2>&1 || missing="$missing bubblewrap"' in ci


def _float_paths():
    import importlib.util

    spec = importlib.util.spec_from_file_location("float_paths", ROOT / "scripts" / "float_paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ci_runs_the_paired_plan_after_make_test_on_the_second_path():
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands.index("make test") < commands.index("make test-portability PATHS=second PLAN=paired")
    float_paths = _float_paths()
    # the path just below the CPU's own; a CPU with one path has no other
    assert float_paths.second_path(["default", "avx2", "avx512"]) == "avx2"
    assert float_paths.second_path(["default", "avx2"]) == "default"
    assert float_paths.second_path(["default"]) == "default"


def test_the_paired_plan_runs_every_training_test_once_and_every_lesson_solved():
    float_paths = _float_paths()
    runs = float_paths.runs("avx2", "paired")
    assert all(env["ATEN_CPU_CAPABILITY"] == "avx2" for _, env, _ in runs)
    assert {env["OMP_NUM_THREADS"] for _, env, _ in runs} == {"1", "2"}  # both thread counts
    named = [arg for _, _, args in runs for arg in args
             if arg.startswith("tests/") and Path(arg).name.startswith("test_")]
    assert sorted(named) == float_paths.training_tests()  # each once
    solutions = [args for _, _, args in runs if "tests/notebooks/notebooks_with_solutions.py" in args]
    assert len(solutions) == 1 and float_paths.GPT_RECIPE in solutions[0]
    assert float_paths.ROPE_LENGTHS in solutions[0]  # one thread, beside the lessons
    # the anchor's 2,000 steps: only in the full plan, which deselects nothing
    assert solutions[0][-2:] == ["-m", "not anchor"]
    assert not any("-m" in args for _, _, args in float_paths.runs("avx2", "full"))


def test_the_anchor_marker_is_registered_and_used_once():
    assert "anchor:" in (ROOT / "pyproject.toml").read_text()
    assert (ROOT / "tests" / "lib" / "test_gpt_recipe.py").read_text().count("@pytest.mark.anchor\n") == 1


def test_make_test_browser_runs_the_browser_test_on_every_lesson():
    assert re.search(r"^test-browser:\s*setup\b", (ROOT / "Makefile").read_text(), flags=re.M)
    assert "$(PY) scripts/browser_test.py notebooks/*.ipynb" in _recipe("test-browser")
    assert "build/" in (ROOT / ".gitignore").read_text().split()  # screenshots are not committed


def test_make_setup_installs_no_user_wide_kernel():
    """A user-wide kernel would run whichever clone ran setup last; the venv's own one cannot."""
    recipe = " ".join(_recipe("$(STAMP)"))
    installs = re.findall(r"ipykernel install([^;]*?)(?:$|\s\$\(|\s@)", recipe)
    assert installs, "make setup installs the kernel"
    for options in installs:
        assert "--sys-prefix" in options and "--user" not in options
        assert "--name python3" in options  # the kernelspec every notebook asks for


def test_vendored_javascript_is_pinned_by_version_and_hash():
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements-js.txt").read_text().splitlines()]
    pins = [line for line in lines if line]
    assert len(pins) == 2
    for pin in pins:
        assert re.fullmatch(r"[a-z0-9\-]+==[\w.]+ --hash=sha256:[0-9a-f]{64}", pin), pin
    assert "--require-hashes -r requirements-js.txt" in " ".join(_recipe("$(STAMP)"))
    from course_lib.bertviz_views import VENDORED

    assert {pin.split("==")[0] for pin in pins} == {dist for dist, _, _ in VENDORED.values()}


def test_repository_url_is_set_in_one_place():
    import tomllib

    course = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["course"]
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", course["repository"])
    assert course["branch"] and re.fullmatch(r"\d+\.\d+", course["torch_min"])
    # Nothing else hard-codes it: the notebooks get it from scripts/sync_notebooks.py.
    for path in [ROOT / "Makefile", ROOT / "scripts" / "sync_notebooks.py", *ROOT.glob("course_lib/*.py")]:
        assert course["repository"] not in path.read_text(), path
