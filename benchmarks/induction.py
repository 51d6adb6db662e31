"""Benchmark: how fast lesson 12's attention-only model grows an induction head.

    python benchmarks/induction.py          (or: make benchmark)

Trains ``course_lib.induction``'s recipe (2 attention-only layers, 4 heads, d_model 128, RoPE,
64 random tokens, rows of a random block of 8..24 tokens repeated; AdamW 1e-3) from ``--seed``,
evaluating every 25 steps on 64 fixed rows ``[r, r]`` with ``|r| = 20``, and stops at the first
evaluation where layer 1's best induction score is above 0.3 and the repeated half's loss is below
half the first half's (``InductionRun.formed``), or after ``--steps``. The time counts training
and evaluations. Target: formation in <= 90 s on 2 cores (the issue's). The lesson trains the whole
recipe live (600 steps) and then reads ``make induction``'s checkpoint of the same run, so that its
head numbers are the same on every machine.

Last line, e.g.

    induction: induction score 0.82 (head 1.1) and repeated-half loss 0.80 nats vs first half 4.94 after 19 s (300 steps)
"""

from __future__ import annotations

import argparse

import torch

from course_lib import interp
from course_lib.induction import repeated_tokens, train_induction


def summary(model, run) -> str:
    """The last line: the best layer-1 induction head and the two half losses at the run's end."""
    probe = repeated_tokens(64, 20, model.config.vocab_size, torch.Generator().manual_seed(12345))
    scores = interp.induction_score(interp.attention_patterns(model, probe)[1], 20)  # (h,)
    formed = run.formed()
    when = f"after {run.seconds[-1]:.0f} s" if formed else f"not formed after {run.seconds[-1]:.0f} s"
    return (f"induction: induction score {scores.max():.2f} (head 1.{int(scores.argmax())}) and "
            f"repeated-half loss {run.second_half[-1]:.2f} nats vs first half {run.first_half[-1]:.2f} "
            f"{when} ({run.steps[-1]} steps)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, run = train_induction(steps=args.steps, seed=args.seed, eval_every=25, threads=None,
                                 stop_at_formation=True)
    print(summary(model, run))


if __name__ == "__main__":
    main()
