"""The setup files agree with each other: pins, the CI command, the Makefile's test target."""

import pathlib
import re
import shlex

ROOT = pathlib.Path(__file__).resolve().parent.parent


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
    assert sanitize == "tests/nbval_sanitize.cfg" and (ROOT / sanitize).is_file()
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
