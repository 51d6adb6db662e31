"""Benchmark: LoRA (lesson 15) against full fine-tuning of lesson 09's GPT on Shakespeare's poems.

    python benchmarks/lora.py          (or: make benchmark)

1. The base: lesson 09's GPT trained on the 33 training plays with the course's recipe
   (``course_lib.studies.finetuning.train_base``: ``COURSE``, 1 layer, d_model 128, 700 steps of 32
   windows of 64 characters, seed 0), inside this script (about 20 s on 2 quiet cores).
2. The new domain: the 5 poems the plays corpus leaves out (``POEMS``), split by poem, not by line
   (``course_lib.data.shakespeare.read_poems`` and ``VALIDATION_POEMS``):
   the Sonnets cut into their 154 sonnets, the others whole; sonnets 10, 20, ..., 150 and "A Lover's
   Complaint" are held out for validation (about 11% of the characters). Lines of asterisks (a gap in
   "The Passionate Pilgrim", the only character the plays never use) are dropped.
3. Two fine-tunings from the same base (``course_lib.studies.finetuning.finetune``, modes ``"full"``
   and ``"lora"``), the same ``--steps`` steps on the same batches (one seeded
   generator each, same seed), the same schedule (10% warm-up, cosine to 0.1 of the peak), AdamW
   with betas (0.9, 0.99) and weight decay 0.1 on the matrices, gradients clipped at 1.0, and the
   same fixed validation windows: **full** fine-tuning (every parameter, peak lr 3e-3) and **LoRA**
   (``course_lib.lora.add_lora``, rank ``--r``, alpha = 2r, on q, k, v, out_proj, linear1 and
   linear2; only A and B train; peak lr 1e-2). The rates: the best of {3e-4, 1e-3, 3e-3} for full
   fine-tuning and of {3e-3, 1e-2, 3e-2} for LoRA, by the poems' validation loss, seed 0, 300 steps.

Reported: the share of parameters LoRA trains, the poems' validation loss of each after the same
steps, the plays' validation loss before and after (forgetting), the bytes of AdamW's state
(``exp_avg``, ``exp_avg_sq``, ``step``) after training, and the median time of a training step
(forward, backward, clip, update; LoRA's backward still runs through the whole network, only the
weight gradients of the frozen matrices are skipped). Losses are seeded and the same on every run
of a float path; step times depend on the machine and its load. Target (issue 51): LoRA trains at
most 5% of the parameters, reaches a poems loss within 10% of full fine-tuning's at equal steps,
with an optimizer state at least 10x smaller. The last line, e.g. (2026-12-07, ``--threads 1``, on a
machine shared with six other jobs, load average 13 on 2 cores: the losses hold, the step-time ratio
is only indicative)

    lora: r=4 trains 4.2% of the parameters; poems loss 1.76 vs full fine-tuning 1.70 after 300 steps; optimizer state 23.6× smaller; step time 1.03× full

On this small model (217,344 parameters, 1 layer) a LoRA step costs about as much as a full one: the
backward pass still goes through every layer, and what it saves (the weight gradients of the frozen
matrices, AdamW's update of 217k numbers) is about what the extra A and B matmuls cost.
"""

from __future__ import annotations

import argparse
import os
import platform

import torch

from course_lib.studies.finetuning import LR, FinetuneRun, corpora, finetune, train_base


def describe_data() -> str:
    """One line: the poems' split (what trains, what is held out)."""
    _, poems = corpora()
    return (f"poems: {len(poems.train_plays)} poems, {len(poems.train_text):,} characters for training; "
            f"{len(poems.val_plays)} held out, {len(poems.val_text):,} characters (A Lover's Complaint, "
            "sonnets 10, 20, ..., 150)")


def describe_run(run: FinetuneRun) -> str:
    """One line per fine-tuning: rate, trainable parameters, AdamW's state, losses, step time."""
    return (f"{run.mode}: lr {run.lr:g}, {run.trainable:,} trainable parameters, AdamW state "
            f"{run.optimizer_bytes:,} bytes; after {run.num_steps} steps poems loss {run.poems_val[-1]:.3f}, "
            f"plays loss {run.plays_val[-1]:.3f}; median step {1000 * run.step_seconds:.1f} ms")


def benchmark_line(full: FinetuneRun, lora: FinetuneRun) -> str:
    """The benchmark's last line (issue 51's format)."""
    return (f"lora: r={lora.r} trains {100 * lora.trainable / lora.total:.1f}% of the parameters; poems loss "
            f"{lora.poems_val[-1]:.2f} vs full fine-tuning {full.poems_val[-1]:.2f} after {lora.num_steps} "
            f"steps; optimizer state {full.optimizer_bytes / lora.optimizer_bytes:.1f}× smaller; step time "
            f"{lora.step_seconds / full.step_seconds:.2f}× full")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--r", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr-full", type=float, default=LR["full"])
    parser.add_argument("--lr-lora", type=float, default=LR["lora"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs, "
          f"{platform.processor() or platform.machine()}, {torch.backends.cpu.get_cpu_capability()}")
    print(describe_data())
    base, _ = train_base(args.seed)
    full = finetune(base, "full", args.steps, lr=args.lr_full, seed=args.seed, eval_every=0)
    print(f"base: the course recipe on the plays; poems loss {full.poems_val[0]:.3f}, "
          f"plays loss {full.plays_val[0]:.3f}")
    lora = finetune(base, "lora", args.steps, lr=args.lr_lora, seed=args.seed, r=args.r, alpha=2 * args.r,
                    eval_every=0)
    for run in (full, lora):
        print(describe_run(run))
    print(benchmark_line(full, lora))


if __name__ == "__main__":
    main()
