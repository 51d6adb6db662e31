"""Lesson 11's measured tables: the block ablation and the length generalisation, 3 seeds each.

    python scripts/ablation.py            (or: make ablation; run it alone on a quiet machine)
    python scripts/ablation.py --part length --seeds 0 1 2 3
    python scripts/ablation.py --part length --positionals sinusoidal   (rerun one kind; the others
                                                                       are kept from the file)

Writes ``course_lib/results/ablation.json`` and ``ablation.md`` (``course_lib.studies.ablation``: lesson
09's Shakespeare setup, GPT-2's block changed one part per row at equal parameter count) and
``course_lib/results/length_generalisation.json`` (``course_lib.studies.extrapolation``: copy lengths
1..20 trained, 1..40 tested, for each kind of positions; the sinusoidal table scaled to the init
RMS of the learned one, 0.02). The ablation's rows are cumulative: each adds one change to the row
above. The lesson loads and explains them.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from course_lib.studies.ablation import ROWS, ablation_table, run_ablation, save_ablation
from course_lib.studies.extrapolation import (TRAIN_MAX_LEN, length_generalisation, load_length_generalisation, save_length_generalisation)
from course_lib.gpt import POSITIONAL
from course_lib.data.shakespeare import ShakespeareCorpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "ablation", "length"), default="all")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: small models, and it repeats exactly)")
    parser.add_argument("--length-steps", type=int, default=1500)
    parser.add_argument("--positionals", nargs="+", choices=POSITIONAL, default=list(POSITIONAL),
                        help="the kinds of positions to (re)run; the others are kept from the file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs, "
          f"{platform.processor() or platform.machine()}, {torch.backends.cpu.get_cpu_capability()}")
    if args.part in ("all", "ablation"):
        t0 = time.perf_counter()
        results = run_ablation(ShakespeareCorpus(), ROWS, args.seeds)
        paths = save_ablation(results)
        print(ablation_table(results))
        print(f"ablation: {len(ROWS)} rows x {len(args.seeds)} seeds in {time.perf_counter() - t0:.0f} s"
              f" -> {', '.join(str(p) for p in paths)}")
    if args.part in ("all", "length"):
        t0 = time.perf_counter()
        results = length_generalisation(args.positionals, args.seeds, args.length_steps)
        runs = {}
        if set(args.positionals) != set(POSITIONAL):  # keep the other kinds' stored runs
            stored = load_length_generalisation()
            if stored["steps"] != args.length_steps:
                raise SystemExit(f"the stored runs used {stored['steps']} steps, not "
                                 f"{args.length_steps}: rerun every kind")
            old = {p: stored.get("runs", {}).get(p, {k: stored[k] for k in
                                                     ("torch", "cpu_capability", "threads", "date")})
                   for p in POSITIONAL if p not in args.positionals}
            runs.update(old)
            results = {p: results[p] if p in results else stored["results"][p] for p in POSITIONAL}
        path = save_length_generalisation(results, args.length_steps, runs=runs)
        for positional, by_seed in results.items():
            inside = min(min(v for n, v in acc.items() if n <= TRAIN_MAX_LEN) for acc in by_seed.values())
            beyond = max(max(v for n, v in acc.items() if n > TRAIN_MAX_LEN) for acc in by_seed.values())
            print(f"{positional:>10}: exact match at lengths <= {TRAIN_MAX_LEN} >= {inside:.2f} on every "
                  f"seed; at lengths > {TRAIN_MAX_LEN} <= {beyond:.2f}")
        print(f"length generalisation: {len(args.positionals)} positional(s) x {len(args.seeds)} seeds in "
              f"{time.perf_counter() - t0:.0f} s -> {path}")


if __name__ == "__main__":
    main()
