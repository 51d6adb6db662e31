"""Lesson 12's trained model: a 2-layer attention-only GPT with induction heads.

    python scripts/induction.py           (or: make induction; about 1-2 minutes on 1 thread)
    python scripts/induction.py --seed 1 --out /tmp/induction.pt

Trains ``course_lib.induction``'s recipe and writes the weights and the training curves to
``course_lib/results/induction.pt``, which the lesson loads. It prints the step and time at which
the induction head formed (layer 1's best induction score > 0.3 and the repeated half's loss below
half the first half's).

The search that found the recipe (1 thread, shared 2-core machine; V = 64, d_model 64, 4 heads):

- learned positions, rows [r, r] with |r| = 20: the repeated half's loss falls to 0.0 by step 300,
  but through a positional shortcut (attend to i - n + 1 by position): induction score 0.03;
- learned positions, rows of a random block of 8..32 (or 8..24) tokens tiled, lr 1e-3 or 3e-3,
  1,500 steps: no previous-token head (score <= 0.10), induction <= 0.06; the repeated half
  only reaches the "some earlier token" loss (about ln of the block length);
- sinusoidal positions, the same rows: no previous-token head beyond 0.23, no induction head;
- RoPE, the same rows (8..24), lr 3e-3: previous-token head 0.67 and induction head 0.88 at step
  500 (62 s on the shared machine), repeated half 0.44 nats vs 4.98 for the first half;
- the same recipe in course_lib.induction (other random draws): seeds 0 and 1, 1,000 steps: no
  induction head (score <= 0.06; the repeated half only falls to 2.9-3.2 nats, the "some earlier
  token" stage); 8 heads (seed 0) and lr 1e-2 (seed 0): the same. The phase change's step varies
  widely between seeds; a recipe that forms on every seed and float path is still to be found;
- seed 1 trained 800 steps further (fresh optimizer): the repeated half falls to 0.44 nats (first
  half 4.41), but NOT through an induction head (best score 0.19): layer-0 heads attend at fixed
  offsets 13 and 14, layer-1 heads at offset 6, which add up to n - 1 = 19 for the probe's n = 20.
  Tiled rows repeat every multiple of their period, so sums of fixed offsets pay off in training;
  zero-ablating head 0.2 (loss 4.03) or 1.3 (2.31) breaks it. Next to try: rows of fresh random
  tokens with ONE repeat of random length at a random place (no fixed offset works), learned or
  rotary positions, and a score that checks the offset distribution, not only i - n + 1.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from course_lib.induction import CHECKPOINT, save_checkpoint, train_induction


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=CHECKPOINT)
    args = parser.parse_args()
    model, run = train_induction(steps=args.steps, seed=args.seed, threads=args.threads)
    for s, t, a, b, i in zip(run.steps, run.seconds, run.first_half, run.second_half, run.induction):
        print(f"step {s:5d}  {t:6.1f} s  first half {a:.2f}  repeated half {b:.2f}  induction {i:.2f}")
    formed = run.formed()
    print(f"ln V = {math.log(model.config.vocab_size):.2f}; induction head formed at "
          + (f"step {formed[0]} after {formed[1]:.0f} s" if formed else "no step"))
    print("wrote", save_checkpoint(model, run, args.out))


if __name__ == "__main__":
    main()
