"""Lesson 06's measured comparison of Adam's beta1 (0.7, the recipe's, against the paper's 0.9).

    python scripts/adam_betas.py                              (make adam-betas: this CPU's own path)
    ATEN_CPU_CAPABILITY=default python scripts/adam_betas.py  (another float path, stored beside it)

Trains lesson 06's copy-task recipe with each beta1 on seeds 0-4, one thread, and stores the runs in
``course_lib/results/adam_betas.json`` under the float path it ran on (``course_lib.adam_betas``);
the other paths' runs stay in the file. About 2 minutes per path on one thread (AVX2); the lesson
loads the file and trains one of the runs live.
"""

from __future__ import annotations

import argparse
import time

import torch

from course_lib.adam_betas import BETAS, first_steps, run_betas, save_betas


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args()
    torch.set_num_threads(1)  # the lesson's setting: a run repeats exactly on this machine
    start = time.perf_counter()
    runs = run_betas(args.seeds)
    path = save_betas(runs)
    print(f"{torch.backends.cpu.get_cpu_capability()}: {len(runs)} runs in "
          f"{time.perf_counter() - start:.0f} s -> {path}")
    for betas in BETAS:
        print(f"  betas {betas}: first 100% at steps {first_steps(runs, betas)} (seeds {args.seeds})")


if __name__ == "__main__":
    main()
