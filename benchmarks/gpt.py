"""Benchmark: lesson 09's GPT on Shakespeare's characters, against nanoGPT's documented CPU recipe.

    python benchmarks/gpt.py                  (or: make benchmark)

Both recipes (``course_lib.lm_training.NANOGPT_CPU`` and ``COURSE``) run in this process, with the
course's code (``train_lm``), on the same corpus and split (``ShakespeareCorpus``: 33 training
plays, 4 whole validation plays), one after the other. The anchor is nanoGPT's README command for a
CPU (4 layers, 4 heads, d_model 128, block 64, batch 12, 2,000 iterations, no dropout) with the
rest of its ``config/train_shakespeare_char.py`` and ``train.py``: AdamW, learning rate 1e-3, betas
(0.9, 0.99), weight decay 0.1, 100 warm-up steps, cosine decay to 1e-4 at step 2,000, gradients
clipped at 1.0. nanoGPT's README reports a validation loss of 1.88 after about 3 minutes on its own
1 MB extract; on these 4.4 MB and a split by play the number differs.

Only training steps are timed. Every ``--eval-every`` steps the loss on the same fixed validation
windows (1,024 windows of 64 characters, the same for both recipes) is measured, off the clock.
Target: the course's recipe reaches the anchor's final validation loss in <= 1/3 of the anchor's
time and <= 60 s. The last line, e.g.

    gpt: 1.85 validation loss (bits/char 2.67) after 41.0 s; nanoGPT CPU recipe 1.88 after 150.2 s
"""

from __future__ import annotations

import argparse
import os
import platform

import torch

from course_lib import count_parameters
from course_lib.lm_training import COURSE, NANOGPT_CPU, LMRecipe, LMRun, bits_per_char, train_lm
from course_lib.data.shakespeare import ShakespeareCorpus

VAL_WINDOWS = 1024


def run_recipe(corpus: ShakespeareCorpus, recipe: LMRecipe, eval_every: int, seed: int = 0) -> LMRun:
    return train_lm(corpus, recipe, seed=seed, eval_every=eval_every, val_windows=VAL_WINDOWS,
                    progress=False)


def describe(name: str, recipe: LMRecipe, run: LMRun) -> str:
    curve = " ".join(f"{s}:{v:.3f}" for s, _, v in run.curve)
    layers = f"{recipe.num_layers} layer{'s' if recipe.num_layers > 1 else ''}"
    return (f"{name}: {layers}, d_model {recipe.d_model}, batch {recipe.batch_size} x "
            f"{recipe.block_size}, {recipe.num_steps} steps, peak lr {recipe.lr:g}; "
            f"{count_parameters(run.model):,} parameters; {run.train_seconds:.1f} s of training\n"
            f"  validation loss by step: {curve}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs, "
          f"{platform.processor() or platform.machine()}, {torch.backends.cpu.get_cpu_capability()}")
    corpus = ShakespeareCorpus()
    print(corpus)
    anchor = run_recipe(corpus, NANOGPT_CPU, args.eval_every)
    print(describe("nanoGPT CPU recipe", NANOGPT_CPU, anchor))
    course = run_recipe(corpus, COURSE, max(1, args.eval_every // 2))
    print(describe("course recipe", COURSE, course))
    target = anchor.curve[-1][2]
    reached = course.first_reaching(target)
    if reached is None:
        print(f"course recipe: never reached the anchor's {target:.3f} (it ended at {course.curve[-1][2]:.3f})")
    else:
        step, seconds = reached
        print(f"course recipe: reached the anchor's {target:.3f} at step {step}, after {seconds:.1f} s: "
              f"{seconds / anchor.train_seconds:.2f} of the anchor's {anchor.train_seconds:.1f} s "
              "(target <= 0.33 and <= 60 s)")
    final = course.curve[-1][2]
    print(f"gpt: {final:.2f} validation loss (bits/char {bits_per_char(final):.2f}) after "
          f"{course.train_seconds:.1f} s; nanoGPT CPU recipe {target:.2f} after {anchor.train_seconds:.1f} s")


if __name__ == "__main__":
    main()
