"""Store lesson 16's study: the plays model (lesson 09's recipe at 128 positions, seed 0) taught to
follow instructions by SFT (the prompt masked, and not), preference pairs sampled from it and judged,
DPO at three betas, seeds 0-2 (``course_lib.studies.instruct``; the lesson loads the results
instead of training them live).

    python scripts/instruct.py [--workers 3]     (make instruct; 1 thread per process)
    ATEN_CPU_CAPABILITY=default python scripts/instruct.py     (another float path)

Writes ``course_lib/results/instruct.json`` under the float path it ran on; the other paths' runs
stay in the file. Run it on every path the lesson should show.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from course_lib.studies.instruct import BETAS, DPO_STEPS, SFT_STEPS, run_instruct_study, save_instruct_results


def spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def summary(runs: list[dict]) -> None:
    """Mean [min, max] over seeds of each model's held-out scores and plays' loss."""
    def line(label: str, entries: list[dict]) -> str:
        return (f"  {label:<16} held out by play {spread([e['heldout']['all'] for e in entries])}  by kind "
                f"{spread([e['heldout_kind']['all'] for e in entries])}  plays loss "
                f"{spread([e['plays_loss'] for e in entries])}")

    print(line("base", [r["base"] for r in runs]))
    print(line("SFT", [r["sft"] for r in runs]))
    if all("sft_unmasked" in r for r in runs):
        print(line("SFT unmasked", [r["sft_unmasked"] for r in runs]))
    for i, d in enumerate(runs[0]["dpo"]):
        print(line(f"DPO beta {d['beta']}", [r["dpo"][i] for r in runs]))
    print("  pairs: " + ", ".join(f"seed {r['seed']} {r['pairs']['pairs']} of {r['pairs']['instructions']}"
                                  for r in runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--betas", type=float, nargs="+", default=list(BETAS))
    parser.add_argument("--sft-steps", type=int, default=SFT_STEPS)
    parser.add_argument("--dpo-steps", type=int, default=DPO_STEPS)
    parser.add_argument("--workers", type=int, default=1, help="seeds run in this many processes side by side")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the lessons' setting: a run repeats exactly on this machine
    start = time.perf_counter()
    runs = run_instruct_study(args.seeds, workers=args.workers, betas=args.betas, sft_steps=args.sft_steps,
                              dpo_steps=args.dpo_steps)
    print(f"-> {save_instruct_results(runs)}")
    summary(runs)
    print(f"instruct on {torch.backends.cpu.get_cpu_capability()}: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
