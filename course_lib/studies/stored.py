"""Stored runs: results of training runs that a lesson loads instead of repeating them live, kept per
float path in ``course_lib/results/NAME.json`` (lesson 06's Adam runs, lesson 10's tokens against
characters).

    save_runs("adam_betas", runs)            # under this CPU's float path; other paths are kept
    load_runs("adam_betas")["paths"]         # {"avx2": {"torch": ..., "threads": 1, "runs": [...]}, ...}

Training drifts apart from one float path to the next (docs/developers.md, "Numbers on your machine"), so a
file keeps each path's runs under the path's name (``torch.backends.cpu.get_cpu_capability()``),
one run per line.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import torch

__all__ = ["RESULTS_DIR", "save_runs", "load_runs", "read_results"]

RESULTS_DIR = Path(__file__).parent.parent / "results"  # course_lib/results


def save_runs(name: str, runs: list[dict], folder: Path | str = RESULTS_DIR) -> Path:
    """Store ``runs`` in ``folder/name.json`` under this CPU's float path; returns the file."""
    path = Path(folder) / f"{name}.json"
    results = json.loads(path.read_text()) if path.is_file() else {"paths": {}}
    capability = torch.backends.cpu.get_cpu_capability().lower()
    results["paths"][capability] = {"torch": torch.__version__, "threads": torch.get_num_threads(),
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
