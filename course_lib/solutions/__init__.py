"""Solutions to the exercises, kept out of the notebooks until a learner asks for one.

    show_solution("01.attention")   # displays the solution; your own code is left untouched

Each lesson's solutions are one file, ``lessonNN.py``. A solution is a block of code that starts with
the line ``# %% solution NN.name`` and runs to the next such line (or the end of the file); it defines
the same names as the exercise's stub cell. The file's header, above the first block, only imports
what the blocks use, so that the file is valid Python and the tests can import and check every
solution. The notebook's stub cell carries ``"exercise": "NN.name"`` in its metadata; the solution
test run (``tests/notebooks/notebooks_with_solutions.py``) puts each block in place of its stub and requires
every checker to pass.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

__all__ = ["show_solution", "solution_source", "solution_keys", "predicted_answer"]

_HERE = Path(__file__).parent
_MARKER = re.compile(r"^# %% solution (\d\d\.[\w.-]+)[ \t]*$", re.M)


def _blocks(path: Path) -> dict[str, str]:
    text = path.read_text(encoding="utf-8")
    marks = list(_MARKER.finditer(text))
    blocks = {}
    for mark, nxt in zip(marks, marks[1:] + [None]):
        body = text[mark.end():nxt.start() if nxt else len(text)]
        blocks[mark.group(1)] = body.strip("\n") + "\n"
    return blocks


def _all_blocks() -> dict[str, str]:
    blocks: dict[str, str] = {}
    for path in sorted(_HERE.glob("lesson[0-9][0-9].py")):
        for key, body in _blocks(path).items():
            if key in blocks:
                raise RuntimeError(f"solution {key!r} is defined twice (second time in {path.name})")
            if not path.stem.endswith(key[:2]):
                raise RuntimeError(f"solution {key!r} belongs in lesson{key[:2]}.py, found in {path.name}")
            blocks[key] = body
    return blocks


def solution_keys(lesson: str | None = None) -> list[str]:
    """All solution keys (``"01.attention"``, ...), or those of one lesson (``lesson="01"``)."""
    return sorted(k for k in _all_blocks() if lesson is None or k.startswith(f"{lesson}."))


def solution_source(key: str) -> str:
    """The code of one solution, exactly as the solution test run substitutes it for the stub."""
    blocks = _all_blocks()
    if key not in blocks:
        known = ", ".join(sorted(blocks)) or "none"
        raise KeyError(f"no solution named {key!r}; known solutions: {known}")
    return blocks[key]


def predicted_answer(key: str) -> Any:
    """The answer of a "Predict, then run" exercise: its solution's function, called.

    A reveal cell (the experiment after a prediction) asserts that what it measures equals this,
    so the code a learner reads before running it compares against the answer without showing it.
    Nothing is defined in the caller's namespace.
    """
    namespace: dict[str, Any] = {}
    exec(solution_source(key), namespace)  # a private namespace: the learner's names are untouched
    functions = [v for k, v in namespace.items()
                 if inspect.isfunction(v) and v.__module__ is None]  # defined by the block itself
    if len(functions) != 1 or any(p.default is p.empty
                                  for p in inspect.signature(functions[0]).parameters.values()):
        raise ValueError(f"solution {key!r} is not a Predict exercise (one function without "
                         f"arguments); it defines {len(functions)} functions")
    return functions[0]()


def show_solution(key: str) -> None:
    """Display one solution (as highlighted code in a notebook, as text elsewhere).

    It only shows the code: nothing is defined or run, so your own version stays as you wrote it.
    To try the solution, copy it into your exercise cell.
    """
    code = solution_source(key)
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:  # plain Python
        get_ipython = None  # noqa: N806
    if get_ipython is not None and get_ipython() is not None:
        display(Markdown(f"**Solution {key}** (shown only; your code is unchanged):\n\n"
                         f"```python\n{code}```"))
    else:
        print(f"# Solution {key}\n{code}", end="")
