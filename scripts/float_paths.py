"""The float-path matrix: the tests and lessons whose results depend on training, on every float path.

    python scripts/float_paths.py                    (make test-portability: every path this CPU offers)
    python scripts/float_paths.py --paths default    (one path, every combination)
    python scripts/float_paths.py --paths second --plan paired    (CI: what `make test` does not run)
    python scripts/float_paths.py --list             (print the paths and the runs, run nothing)

Why: PyTorch picks its CPU kernels when it starts (portable C++, AVX2 or AVX-512, whichever the CPU
has). The kernels add floats in different orders, so a training run drifts apart from one CPU to the
next in the last bits, and after a few hundred steps in its curves. The environment variable
``ATEN_CPU_CAPABILITY`` makes PyTorch use a lower path than the CPU's own, so one machine can run the
paths that learners' and instructors' machines run: ``default`` (portable, different on every x86 CPU
from the native path), ``avx2`` and, where the CPU has it, ``avx512``.

``--plan full`` (the default) runs on each path:

* the tests that train (``training_tests()``) and strict nbval over every lesson with 1 thread per
  process, two processes side by side (pytest-xdist; conftest.py keeps a notebook on one worker);
* the tests that train and strict nbval over the lessons that do not pin their thread count
  (``torch.set_num_threads``) with 2 threads, one process;
* every lesson with the solutions in place of the stubs, outputs compared
  (``tests/notebooks/notebooks_with_solutions.py``), 1 thread, two side by side.

``--paths second`` is the path just below this CPU's own: ``avx2`` on a CPU with AVX-512, ``default``
on one with AVX2. CI runs the paired plan on it: it differs from the native path like any other, and
the vectorised AVX2 kernels cost less than the portable ones. Measured on an AVX2 machine: one step of
the course's GPT recipe 87 ms against 180 ms (exact GELU and its gradient are 39% of the portable
step), the whole paired plan 13.7 min against 18.9.

``--plan paired`` pairs the dimensions instead of crossing them (CI runs it on the second path). `make
test` runs strict nbval over every lesson and the test modules that do not train, on the native path
with 1 thread per process; the paired plan runs what it leaves out, on each given path:

* every lesson with its solutions, 1 thread, two side by side. The run compares every output that is
  not a checker's with the stored one, as strict nbval does, so it is also each lesson's strict
  check on the second path (tests/notebooks/notebooks_with_solutions.py). The GPT recipe's test
  (tests/lib/test_gpt_recipe.py) runs in the same pool, first: the course's run against the anchor's
  recorded loss, not the anchor's own 2,000 steps (``-m "not anchor"``: the full plan runs them). With
  both runs it took 319 s with 2 threads and 527 s with one on `default`: 638 core-seconds against
  527, so one thread beside the lessons, with no core waiting, finishes sooner. Lesson 11's stored
  RoPE run, trained again (tests/studies/test_rope_lengths.py: 1 thread, as it was stored), runs there too;
* the other tests that train, with 2 threads (one process): the thread count is paired with them.

So both paths, both thread counts and every check run, not every combination: no lesson runs with
2 threads and the tests that train do not run on the native path (both are in the full plan).

It prints one line per run and a summary, and exits 1 if any run failed (pytest's exit code 5, "no
tests collected", is not a failure: e.g. no lesson pins its threads).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# Test modules whose results depend on training. A new one marks itself with
# `pytestmark = pytest.mark.float_path` (found by training_tests()); these four predate the mark.
TRAINING_TESTS = [
    "tests/lib/test_training.py", "tests/data/test_dates.py", "tests/lib/test_fused_attention.py",
    "tests/lib/test_gpt_recipe.py",
]
NBVAL = ["--nbval-current-env", "--nbval-sanitize-with", "tests/notebooks/nbval_sanitize.cfg",
         "--nbval-cell-timeout=600", "-p", "no:cacheprovider"]
SIDE_BY_SIDE = ["-n", "2", "--dist", "loadscope"]  # as `make test`: 2 workers, 1 thread each
# the path comes from ATEN_CPU_CAPABILITY, which runs() sets for the whole run
SOLUTIONS = ["tests/notebooks/notebooks_with_solutions.py", "--solutions-float-path", "native", *NBVAL]
ORDER = ["default", "avx2", "avx512"]  # PyTorch's names, lowest first
# The paired plan runs these in the solutions run's pool, collected first so that they start first:
# the GPT recipe, and lesson 11's stored RoPE run repeated (one thread, as it was stored).
GPT_RECIPE = "tests/lib/test_gpt_recipe.py"
ROPE_LENGTHS = "tests/studies/test_rope_lengths.py"
POOLED = [GPT_RECIPE, ROPE_LENGTHS]
NO_TESTS = 5  # pytest's exit code when nothing was collected


def training_tests() -> list[str]:
    """TRAINING_TESTS and every tests/**/test_*.py that marks itself ``pytest.mark.float_path``."""
    marked = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "tests").rglob("test_*.py"))
              if "mark.float_path" in p.read_text()]
    return sorted(set(TRAINING_TESTS) | set(marked))


def native_path() -> str:
    """The path PyTorch picks on this CPU when nothing is forced ('default', 'avx2' or 'avx512')."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                         capture_output=True, text=True, env=env, check=True).stdout.strip().lower()
    return out if out in ORDER else "default"


def paths_offered() -> list[str]:
    """Every path up to the native one: a CPU with AVX-512 also runs the AVX2 and portable kernels."""
    return ORDER[: ORDER.index(native_path()) + 1]


def second_path(offered: list[str]) -> str:
    """The fastest path that is not this CPU's own: the one just below the native path (``avx2`` on
    a CPU with AVX-512, ``default`` on one with AVX2). A CPU that offers one path has no second:
    then it is that path."""
    return offered[-2] if len(offered) > 1 else offered[-1]


def pins_threads(notebook: Path) -> bool:
    return "torch.set_num_threads(" in notebook.read_text()


def runs(path: str, plan: str = "full") -> list[tuple[str, dict[str, str], list[str]]]:
    """(label, environment changes, pytest arguments) for one float path."""
    every = [str(nb.relative_to(ROOT)) for nb in NOTEBOOKS]
    pinned = [str(nb.relative_to(ROOT)) for nb in NOTEBOOKS if pins_threads(nb)]
    free = [nb for nb in every if nb not in pinned]
    training = training_tests()
    one, two = {"ATEN_CPU_CAPABILITY": path, "OMP_NUM_THREADS": "1"}, \
        {"ATEN_CPU_CAPABILITY": path, "OMP_NUM_THREADS": "2"}
    solutions = ("every lesson with its solutions, outputs compared, 1 thread, 2 side by side", one,
                 [*SIDE_BY_SIDE, *SOLUTIONS])
    if plan == "paired":
        pooled = [t for t in training if t in POOLED]
        return [(f"{solutions[0]}, with {' and '.join(pooled)} (first; not the anchor run)", one,
                 [*SIDE_BY_SIDE, *pooled, *SOLUTIONS, "-m", "not anchor"]),
                ("the other training tests, 2 threads", two, [t for t in training if t not in pooled])]
    return [("training tests and strict nbval of every lesson, 1 thread, 2 side by side", one,
             [*SIDE_BY_SIDE, *training, "--nbval", *every, *NBVAL]),
            ("training tests and strict nbval of the lessons that do not pin threads, 2 threads", two,
             [*training, "--nbval", *free, *NBVAL]),
            solutions]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", nargs="+", choices=[*ORDER, "second"],
                        help="default: every path this CPU offers; second: the one just below the "
                             "native path (CI)")
    parser.add_argument("--plan", choices=["full", "paired"], default="full",
                        help="full: every combination; paired: what `make test` leaves (CI)")
    parser.add_argument("--list", action="store_true", help="print the paths and runs, run nothing")
    args = parser.parse_args()
    offered = paths_offered()
    paths = args.paths or offered
    if "second" in paths:
        second = second_path(offered)
        if second == offered[-1]:
            print(f"this CPU offers one float path ({second}): the second path's runs use it")
        paths = list(dict.fromkeys(second if p == "second" else p for p in paths))
    missing = [p for p in paths if p not in offered]
    if missing:
        print(f"this CPU's native path is {offered[-1]}; it cannot run {', '.join(missing)}")
        return 2
    print(f"float paths: {', '.join(paths)} (this CPU's native path: {offered[-1]}), plan {args.plan}",
          flush=True)
    failed, summary = [], []
    for path in paths:
        for label, env, pytest_args in runs(path, args.plan):
            name = f"[{path}] {label}"
            if args.list:
                print(name)
                continue
            print(f"\n=== {name}", flush=True)
            start = time.perf_counter()
            code = subprocess.run([sys.executable, "-m", "pytest", "-q", *pytest_args], cwd=ROOT,
                                  env={**os.environ, **env}).returncode
            seconds = time.perf_counter() - start
            status = {0: "passed", NO_TESTS: "none"}.get(code, "FAILED")
            summary.append(f"{status:6s} {seconds:6.0f} s  {name}")
            if status == "FAILED":
                failed.append(name)
    if not args.list:
        print("\nfloat-path matrix:\n" + "\n".join(summary))
        print(f"{len(summary) - len(failed)} runs passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
