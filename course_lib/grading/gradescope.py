"""Build a Gradescope autograder: ``python -m course_lib.grading.gradescope --lesson NN --out autograder.zip``.

    python -m course_lib.grading.gradescope --lesson 09 --out autograder_09.zip --points 09.lm_train=3

The zip follows Gradescope's autograder specification (gradescope-autograders.readthedocs.io,
"Autograder Specifications"): ``setup.sh`` and ``run_autograder`` at its root; Gradescope unpacks
it to ``/autograder/source``, runs ``setup.sh`` once when it builds the image, then, for each
submission in a fresh container, ``/autograder/run_autograder``, which must write
``/autograder/results/results.json``. What the zip holds:

- ``setup.sh``: Python 3.11 (Ubuntu's, or the deadsnakes PPA's), a venv in ``/autograder/venv``,
  the course's pinned requirements as ``make setup`` installs them (torch 2.13.0's CPU build first,
  requirements.txt, requirements-tl.txt with --no-deps, requirements-js.txt by hash), the data
  lessons 09 and 10 fetch, and the ``python3`` Jupyter kernel;
- ``run_autograder``: grades the submitted notebook with ``course_lib.grading.gradescope_run``;
- ``course/``: course_lib's source and the lesson notebooks (sources only, outputs stripped: the
  grader reads their exercise cells, and recognises a notebook of another lesson);
- ``config.json``: the lesson, the points per exercise, the time limits, the visibility and the
  notebook size limit.
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from pathlib import Path

from .lessons import NOTEBOOK_DIR, read_lessons
from .points import parse_points
from .runner import MAX_NOTEBOOK_MB

ROOT = NOTEBOOK_DIR.parent
VISIBILITY = ["hidden", "after_due_date", "after_published", "visible"]  # Gradescope's values

SETUP_SH = r"""#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu).
set -euo pipefail
cd /autograder/source
export DEBIAN_FRONTEND=noninteractive
if ! command -v python3.11 >/dev/null; then
    apt-get update
    apt-get install -y --no-install-recommends software-properties-common
    add-apt-repository -y ppa:deadsnakes/ppa
fi
apt-get update
apt-get install -y --no-install-recommends python3.11 python3.11-venv
python3.11 -m venv /autograder/venv
PIP="/autograder/venv/bin/pip"
"$PIP" install --quiet --upgrade pip
# torch first and on its own, as `make setup` does; the CPU build (Gradescope has no GPU, and the
# default Linux wheel would pull several GB of CUDA libraries)
"$PIP" install --quiet torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
"$PIP" install --quiet -r requirements.txt
"$PIP" install --quiet --no-deps -r requirements-tl.txt
"$PIP" install --quiet --no-deps --require-hashes -r requirements-js.txt
export PYTHONPATH=/autograder/source/course
# the data lessons 09 and 10 read (checked by sha256), fetched now: nothing downloads while grading
/autograder/venv/bin/python -m course_lib.data fetch
/autograder/venv/bin/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (ipykernel)"
/autograder/venv/bin/python -c "import course_lib.grading.gradescope_run"
"""

RUN_AUTOGRADER = r"""#!/usr/bin/env bash
# Gradescope runs this for each submission; it writes $AUTOGRADER_ROOT/results/results.json.
# AUTOGRADER_ROOT (default /autograder) and AUTOGRADER_PYTHON (default its venv) exist for local tests.
ROOT="${AUTOGRADER_ROOT:-/autograder}"
PY="${AUTOGRADER_PYTHON:-$ROOT/venv/bin/python}"
export PYTHONPATH="$ROOT/source/course${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$ROOT/results"
cd "$ROOT/source" || exit 0
"$PY" -m course_lib.grading.gradescope_run --root "$ROOT"
status=$?
if [ ! -s "$ROOT/results/results.json" ]; then  # the grader itself could not start: say so, score 0
    message="The autograder could not run (exit status $status). Please tell your instructor."
    printf '{"score": 0, "output": "%s", "visibility": "visible", "stdout_visibility": "hidden", "tests": []}\n' \
        "$message" > "$ROOT/results/results.json"
fi
exit 0
"""

COPIED = ["requirements.txt", "requirements-tl.txt", "requirements-js.txt"]


def _course_lib_files() -> list[Path]:
    package = ROOT / "course_lib"
    return sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix not in (".pyc", ".pyo"))


def _stripped(path: Path) -> str:
    """A lesson notebook with its outputs removed (the grader reads only sources and metadata)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nbformat.writes(nb)


def _file(archive: zipfile.ZipFile, name: str, data: str | bytes, executable: bool = False) -> None:
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))  # the same zip for the same course
    info.external_attr = (0o100755 if executable else 0o100644) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, data)


def build(lesson_id: str, out: Path, points: dict[str, float], cell_timeout: float, notebook_timeout: float,
          visibility: str, max_notebook_mb: float = MAX_NOTEBOOK_MB) -> Path:
    """Write the autograder zip for ``lesson_id`` to ``out``."""
    lesson = read_lessons()[lesson_id]
    config = {"lesson": lesson_id, "notebook": lesson.path.name, "points": points, "cell_timeout": cell_timeout,
              "notebook_timeout": notebook_timeout, "visibility": visibility, "max_notebook_mb": max_notebook_mb}
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w") as archive:
        _file(archive, "setup.sh", SETUP_SH, executable=True)
        _file(archive, "run_autograder", RUN_AUTOGRADER, executable=True)
        _file(archive, "config.json", json.dumps(config, indent=1) + "\n")
        for name in COPIED:
            _file(archive, name, (ROOT / name).read_bytes())
        for path in _course_lib_files():
            _file(archive, f"course/{path.relative_to(ROOT).as_posix()}", path.read_bytes())
        for path in sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb")):
            _file(archive, f"course/notebooks/{path.name}", _stripped(path))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.grading.gradescope", description=__doc__.split("\n")[0])
    parser.add_argument("--lesson", required=True, help="the lesson's two-digit id, e.g. 09")
    parser.add_argument("--out", required=True, type=Path, help="the zip to write, e.g. autograder_09.zip")
    parser.add_argument("--points", default=None, help="points per exercise (as course_lib.grading's --points)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per cell (default 300)")
    parser.add_argument("--notebook-timeout", type=float, default=480,
                        help="seconds per notebook (default 480; keep it under the assignment's autograder "
                             "timeout, 10 minutes by default on Gradescope, at most 40)")
    parser.add_argument("--visibility", choices=VISIBILITY, default="visible",
                        help="when learners see their results (Gradescope's values; default visible)")
    parser.add_argument("--max-notebook-mb", type=float, default=MAX_NOTEBOOK_MB,
                        help=f"a larger notebook gets 0 and is not read (default {MAX_NOTEBOOK_MB:g})")
    args = parser.parse_args(argv)
    if not args.max_notebook_mb > 0:
        parser.error(f"--max-notebook-mb {args.max_notebook_mb:g}: give a size in MB above 0")
    lessons = read_lessons()
    if args.lesson not in lessons:
        parser.error(f"--lesson {args.lesson!r}: the lessons with checked exercises are {', '.join(sorted(lessons))}")
    try:
        points = parse_points(args.points, {args.lesson: lessons[args.lesson]})
    except ValueError as err:
        parser.error(str(err))
    out = build(args.lesson, args.out, points, args.timeout, args.notebook_timeout, args.visibility,
                args.max_notebook_mb)
    print(f"gradescope: wrote {out} ({out.stat().st_size / 2**20:.1f} MB) for lesson {args.lesson}: upload it as "
          "the assignment's autograder (Configure Autograder > Zip file upload). In its Autograder Settings, give "
          "it more memory than the default 768 MB (2 GB or more: the grader, a kernel and PyTorch share it), a "
          f"timeout above {args.notebook_timeout:g} s, and a whole CPU if the lesson trains")
    return 0


if __name__ == "__main__":
    sys.exit(main())
