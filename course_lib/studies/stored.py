"""Stored runs: results of training runs that a lesson loads instead of repeating them live, kept per
float path in ``course_lib/results/NAME.json`` (lesson 06's Adam runs, lesson 10's tokens against
characters).

    save_runs("adam_betas", runs)            # under this CPU's float path; other paths are kept
    load_runs("adam_betas")["paths"]         # {"avx2": {"torch": ..., "threads": 1, "runs": [...]}, ...}

Training drifts apart from one float path to the next (docs/developers.md, "Numbers on your machine"), so a
file keeps each path's runs under the path's name (``float_path()``), one run per line.

A float path is PyTorch's kernels *and* the CPU under them: ``ATEN_CPU_CAPABILITY=avx2`` on a
CPU with AVX-512 picks PyTorch's AVX2 kernels, but the matrix products (MKL, oneDNN) still take
the CPU's AVX-512 code, so its runs differ from those of a CPU whose best is AVX2.
``float_path()`` names them apart.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

__all__ = ["RESULTS_DIR", "float_path", "cpu_best_kernels", "save_runs", "load_runs",
           "read_results"]

RESULTS_DIR = Path(__file__).parent.parent / "results"  # course_lib/results


@functools.cache
def cpu_best_kernels() -> str:
    """The kernels PyTorch picks on this CPU when ``ATEN_CPU_CAPABILITY`` forces nothing: 'default',
    'avx2' or 'avx512' (lower case). When the variable is set, a fresh interpreter without it is
    asked (about a second, once per process); 'unknown' if that fails."""
    if "ATEN_CPU_CAPABILITY" not in os.environ:
        return torch.backends.cpu.get_cpu_capability().lower()
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    try:
        ask = "import torch; print(torch.backends.cpu.get_cpu_capability())"
        out = subprocess.run([sys.executable, "-c", ask], capture_output=True, text=True, env=env,
                             timeout=120, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip().lower() or "unknown"


def float_path() -> str:
    """The name of this machine's float path, under which stored runs are kept and found.

    On x86: 'avx512' (a CPU with AVX-512, its own kernels), 'avx2' and 'default' (PyTorch's AVX2 or
    portable kernels on a CPU whose best is AVX2); kernels forced below a CPU's best by
    ``ATEN_CPU_CAPABILITY`` elsewhere are named with the CPU's best, e.g. 'avx2-on-avx512', because
    the matrix products still use the CPU's own code. Other architectures add their name, e.g.
    'default-arm64'."""
    kernels = torch.backends.cpu.get_cpu_capability().lower()
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return f"{kernels}-{machine}"
    best = cpu_best_kernels()
    if kernels == best != "default" or (kernels, best) == ("default", "avx2"):
        return kernels
    return f"{kernels}-on-{best}"


def save_runs(name: str, runs: list[dict], folder: Path | str = RESULTS_DIR) -> Path:
    """Store ``runs`` in ``folder/name.json`` under this CPU's float path; returns the file."""
    path = Path(folder) / f"{name}.json"
    results = json.loads(path.read_text()) if path.is_file() else {"paths": {}}
    results["paths"][float_path()] = {"torch": torch.__version__,
                                      "threads": torch.get_num_threads(),
                                      "date": datetime.date.today().isoformat(), "runs": runs}
    path.parent.mkdir(parents=True, exist_ok=True)
    blocks = []
    for key, entry in sorted(results["paths"].items()):  # one run per line, for readable diffs
        fields = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in entry.items() if k != "runs"]
        head = ", ".join([*fields, '"runs": ['])
        runs_text = ",\n".join("   " + json.dumps(r) for r in entry["runs"])
        blocks.append(f"  {json.dumps(key)}: {{{head}\n{runs_text}\n  ]}}")
    path.write_text('{"paths": {\n' + ",\n".join(blocks) + "\n}}\n")
    return path


def read_results(path: Path | str, key: str, make: str, who: str) -> dict:
    """The JSON file at ``path``, which a make target wrote; a clear error if it is missing or its
    ``key`` is empty (``who``: the function that asks, for the message)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{who}: no results at {path}; run `make {make}` to write them")
    results = json.loads(path.read_text())
    if not results.get(key):
        raise ValueError(f"{who}: {path} holds no {key}")
    return results


def load_runs(name: str, folder: Path | str = RESULTS_DIR, make: str = "") -> dict:
    """``folder/name.json`` as stored: ``{"paths": {path: {"runs": [...], ...}}}``. ``make``: the
    make target that writes it, for the error message."""
    return read_results(Path(folder) / f"{name}.json", "paths", make or name, "load_runs")
