"""Benchmark: train course_lib's default model on the copy task on the CPU and measure it.

    python benchmarks/copy_task.py            (or: make benchmark)

Task as in the Annotated Transformer: vocabulary of 11 ids (0 = pad, 1 = start symbol, 2..10 data
symbols), sequences of length 10. The model, optimizer and schedule are course_lib's defaults
(`course_lib.training.train_copy_task`). Only training is timed; then greedy decoding is scored on
1,000 held-out sequences that training never saw. The last line is the result, e.g.

    copy task: 100.0% exact match on 1000 held-out sequences after 12.3 s of training
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from course_lib import CopyTask, count_parameters, exact_match, train_copy_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    task = CopyTask(vocab_size=11, seq_len=10, num_heldout=1000)
    start = time.perf_counter()
    model, history = train_copy_task(task=task, seed=args.seed, progress=False)  # course_lib's defaults
    seconds = time.perf_counter() - start

    c = model.config
    print(f"model: {c.num_encoder_layers}+{c.num_decoder_layers} layers ({'pre' if c.norm_first else 'post'}-LN), "
          f"d_model {c.d_model}, {c.num_heads} heads, d_ff {c.d_ff}")
    print(f"parameters: {count_parameters(model):,}; steps: {len(history)}; final loss: {history[-1]:.4f}")
    accuracy = exact_match(model, task)
    print(f"copy task: {100 * accuracy:.1f}% exact match on {task.heldout.size(0)} held-out sequences "
          f"after {seconds:.1f} s of training")


if __name__ == "__main__":
    main()
