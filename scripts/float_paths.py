"""The float-path matrix: the tests and lessons whose results depend on training, on every float path.

    python scripts/float_paths.py                    (make test-portability: every path this CPU offers)
    python scripts/float_paths.py --paths default    (CI: PyTorch's portable kernels only)
    python scripts/float_paths.py --list             (print the paths and the runs, run nothing)

Why: PyTorch picks its CPU kernels when it starts (portable C++, AVX2 or AVX-512, whichever the CPU
has). The kernels add floats in different orders, so a training run drifts apart from one CPU to the
next in the last bits, and after a few hundred steps in its curves. The environment variable
``ATEN_CPU_CAPABILITY`` makes PyTorch use a lower path than the CPU's own, so one machine can run the
paths that learners' and instructors' machines run: ``default`` (portable, different on every x86 CPU
from the native path), ``avx2`` and, where the CPU has it, ``avx512``.

On each path it runs:

* the tests that train (``TRAINING_TESTS``) with 1 and with 2 threads (``OMP_NUM_THREADS``): the
  recipes must hold whatever the thread count;
* strict nbval over every lesson: lessons that pin the thread count (``torch.set_num_threads``) once,
  the others with 1 and with 2 threads;
* every lesson again with the solutions in place of the stubs (``tests/notebooks_with_solutions.py``).

It prints one line per run and a summary, and exits 1 if any run failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
TRAINING_TESTS = [
    "tests/test_training.py", "tests/test_data_dates.py", "tests/test_fused_attention.py",
    "tests/test_gpt_recipe.py",
]
NBVAL = ["--nbval-current-env", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg",
         "--nbval-cell-timeout=600", "-p", "no:cacheprovider"]
ORDER = ["default", "avx2", "avx512"]  # PyTorch's names, lowest first


def native_path() -> str:
    """The path PyTorch picks on this CPU when nothing is forced ('default', 'avx2' or 'avx512')."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                         capture_output=True, text=True, env=env, check=True).stdout.strip().lower()
    return out if out in ORDER else "default"


def paths_offered() -> list[str]:
    """Every path up to the native one: a CPU with AVX-512 also runs the AVX2 and portable kernels."""
    return ORDER[: ORDER.index(native_path()) + 1]


def pins_threads(notebook: Path) -> bool:
    return "torch.set_num_threads(" in notebook.read_text()


def runs(path: str) -> list[tuple[str, dict[str, str], list[str]]]:
    """(label, environment changes, pytest arguments) for one float path."""
    pinned = [str(nb.relative_to(ROOT)) for nb in NOTEBOOKS if pins_threads(nb)]
    free = [str(nb.relative_to(ROOT)) for nb in NOTEBOOKS if not pins_threads(nb)]
    out = []
    for threads in ("1", "2"):
        env = {"ATEN_CPU_CAPABILITY": path, "OMP_NUM_THREADS": threads}
        out.append((f"training tests, {threads} thread(s)", env, [*TRAINING_TESTS, "-p", "no:cacheprovider"]))
        if free:
            out.append((f"nbval, lessons that do not pin threads, {threads} thread(s)", env,
                        ["--nbval", *free, *NBVAL]))
    env = {"ATEN_CPU_CAPABILITY": path}
    if pinned:
        out.append(("nbval, lessons that pin their threads", env, ["--nbval", *pinned, *NBVAL]))
    out.append(("every lesson with its solutions", env,
                ["tests/notebooks_with_solutions.py", "-p", "no:cacheprovider"]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", nargs="+", choices=ORDER, help="default: every path this CPU offers")
    parser.add_argument("--list", action="store_true", help="print the paths and runs, run nothing")
    args = parser.parse_args()
    offered = paths_offered()
    paths = args.paths or offered
    missing = [p for p in paths if p not in offered]
    if missing:
        print(f"this CPU's native path is {offered[-1]}; it cannot run {', '.join(missing)}")
        return 2
    print(f"float paths: {', '.join(paths)} (this CPU's native path: {offered[-1]})", flush=True)
    failed, summary = [], []
    for path in paths:
        for label, env, pytest_args in runs(path):
            name = f"[{path}] {label}"
            if args.list:
                print(name)
                continue
            print(f"\n=== {name}", flush=True)
            start = time.perf_counter()
            code = subprocess.run([sys.executable, "-m", "pytest", "-q", *pytest_args], cwd=ROOT,
                                  env={**os.environ, **env}).returncode
            seconds = time.perf_counter() - start
            summary.append(f"{'passed' if code == 0 else 'FAILED':6s} {seconds:6.0f} s  {name}")
            if code != 0:
                failed.append(name)
    if not args.list:
        print("\nfloat-path matrix:\n" + "\n".join(summary))
        print(f"{len(summary) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
