"""Store lesson 14's precision runs: lesson 09's recipe, shortened, in float32 and under CPU bf16
autocast, seeds 0-2 (a bf16 step costs several float32 steps on CPUs without native bf16, so the
lesson loads these runs instead of training them live).

    python scripts/precision_runs.py [--steps 40]     # writes course_lib/results/precision_runs.json

The file keeps one entry per float path (torch.backends.cpu.get_cpu_capability()): running it on
another path adds that path's runs and keeps the others.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from course_lib.parallel import precision_run
from course_lib.studies.stored import float_path
from course_lib.data.shakespeare import ShakespeareCorpus

OUT = Path(__file__).resolve().parent.parent / "course_lib" / "results" / "precision_runs.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    corpus = ShakespeareCorpus()
    path = float_path()
    runs = {}
    for seed in range(args.seeds):
        for name, bf16 in (("float32", False), ("bf16", True)):
            run = precision_run(corpus, seed, args.steps, bf16)
            runs[f"{name}/{seed}"] = run
            print(f"{name} seed {seed}: final loss {run['losses'][-1]:.4f}, "
                  f"{run['seconds_per_step'] * 1e3:.0f} ms per step", flush=True)
    stored = json.loads(OUT.read_text()) if OUT.exists() else {}
    stored[path] = {"steps": args.steps, "threads": 1, "machine": platform.machine(), "runs": runs}
    OUT.write_text(json.dumps(stored, indent=1) + "\n")
    print(f"wrote {OUT.name} ({path})")


if __name__ == "__main__":
    main()
