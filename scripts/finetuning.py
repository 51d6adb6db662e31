"""Store lesson 15's fine-tuning study: lesson 09's GPT (trained on the plays, seed 0) fine-tuned on
the poems by every mode (full, head, last block, BitFit, LoRA r = 4) and by LoRA at ranks 1-32 under
three scale rules (alpha = 2r, alpha = 8, rsLoRA), 300 steps, seeds 0-2
(``course_lib.studies.finetuning``; the lesson loads them instead of training them live).

    python scripts/finetuning.py [--parts modes|ranks]   (make finetuning; 1 thread, 25-60 min on a
                                                   2-core machine shared with other jobs)
    ATEN_CPU_CAPABILITY=default python scripts/finetuning.py     (another float path)

Writes ``course_lib/results/finetuning.json`` under the float path it ran on; the other paths' runs
stay in the file. Run it alone on a quiet machine, on every path the lesson should show.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from course_lib.studies.finetuning import PARTS, RANKS, run_finetuning_study, save_finetuning_results


def summary(study: dict) -> None:
    """Mean and range over seeds of the final poems and plays losses, per mode and per rank."""
    def line(label: str, runs: list[dict]) -> str:
        poems = [r["poems_val"][-1] for r in runs]
        plays = [r["plays_val"][-1] for r in runs]
        return (f"  {label:<22} poems {statistics.mean(poems):.4f} [{min(poems):.4f}, {max(poems):.4f}]  "
                f"plays {statistics.mean(plays):.4f} [{min(plays):.4f}, {max(plays):.4f}]  "
                f"trainable {runs[0]['trainable']:,}  optimizer {runs[0]['optimizer_bytes']:,} B  "
                f"step {1000 * statistics.median(r['step_seconds'] for r in runs):.0f} ms")

    for mode in dict.fromkeys(r["mode"] for r in study.get("modes", [])):
        print(line(mode, [r for r in study["modes"] if r["mode"] == mode]))
    for key in dict.fromkeys((r["r"], r["scaling_rule"]) for r in study.get("ranks", [])):
        print(line(f"lora r={key[0]} {key[1]}", [r for r in study["ranks"] if (r["r"], r["scaling_rule"]) == key]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--ranks", type=int, nargs="+", default=list(RANKS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS),
                        help="run only these parts (two processes can share the work; each merges its "
                             "part into the file)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # the lessons' setting: a run repeats exactly on this machine
    start = time.perf_counter()
    study = run_finetuning_study(args.seeds, args.steps, args.ranks, parts=args.parts)
    print(f"-> {save_finetuning_results(study)}")
    summary(study)
    print(f"finetuning on {torch.backends.cpu.get_cpu_capability()}: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
