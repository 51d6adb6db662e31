"""Benchmark: lesson 14's DDP scaling from 1 to N processes, and what ZeRO-1 and FSDP keep per rank.

    python benchmarks/ddp.py [--processes 2] [--steps 60]

1. Throughput: ``python -m course_lib.train_ddp`` (lesson 09's GPT, the COURSE recipe's model,
   global batch 32 x 64 characters) on 1 process with T threads, then under ``torchrun`` on N
   processes with T threads each (T = cores / N), the same global batch; tokens per second over
   steps 2 on. Efficiency E = X / (N x Y): 1.0 is perfect scaling (goal: E >= 0.8 on 2 cores).
   Both runs' loss curves must agree (float32 rounding; the largest difference is printed).
2. Gradients: DDP on N gloo processes against one process on the whole batch, float64, the
   largest difference D of the first step's gradients.
3. Bytes per rank of weights, gradients and AdamW state under DDP, ZeRO-1 and FSDP2 (float64,
   the small GPT of the equality tests), measured on the ranks.

Every process it starts ends (course_lib.launch: run_on_ranks, run_command).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from course_lib.launch import run_command, run_on_ranks
from course_lib.parallel import random_batches, tiny_gpt, train_one_process, train_replica


def throughput(processes: int, threads: int, steps: int, folder: Path) -> dict:
    out = folder / f"run{processes}.json"
    args = ["-m", "course_lib.train_ddp", "--steps", str(steps), "--batch-size", "32",
            "--block-size", "64", "--threads", str(threads), "--log-every", str(steps)]
    launcher = (["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
                if processes > 1 else [])
    run_command([sys.executable, *launcher, *args, "--out", str(out)], timeout=3600)
    return json.loads(out.read_text())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    return parser.parse_args(argv)


def gradient_gap(processes: int) -> float:
    batches = random_batches(2, 4 * processes, seed=0)
    one = train_one_process(batches)
    ranks = run_on_ranks(train_replica, processes, ("ddp", batches), timeout=600)
    return max((r["grads"][n] - one["grads"][n]).abs().max().item() for r in ranks for n in one["grads"])


def bytes_per_rank(processes: int) -> dict[str, list[dict[str, int]]]:
    batches = random_batches(1, 4 * processes, seed=0)
    return {engine: [r["bytes"] for r in run_on_ranks(train_replica, processes, (engine, batches),
                                                        timeout=600)]
            for engine in ("ddp", "zero1", "fsdp")}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    n = args.processes
    cores = os.cpu_count() or 1
    threads = max(1, cores // n)
    with tempfile.TemporaryDirectory() as tmp:
        one = throughput(1, threads, args.steps, Path(tmp))
        many = throughput(n, threads, args.steps, Path(tmp))
    curve_gap = max(abs(a - b) for a, b in zip(one["losses"], many["losses"]))
    x, y = many["tokens_per_s"], one["tokens_per_s"]
    efficiency = x / (n * y)
    d = gradient_gap(n)
    print(f"ddp: {n} processes x {threads} threads: {x:,.0f} tokens/s vs {y:,.0f} for one "
          f"(efficiency {efficiency:.2f}); gradients equal to one process within {d:.1e}")
    sizes = bytes_per_rank(n)

    def kb(engine: str, part: str) -> str:
        return "/".join(f"{b[part] / 1e3:.0f}" for b in sizes[engine])

    numbers = sum(p.numel() for p in tiny_gpt(0).parameters())
    print(f"bytes per rank (kB, ranks 0/1, a float64 GPT of {numbers:,} parameters): weights DDP "
          f"{kb('ddp', 'parameters')}, "
          f"FSDP {kb('fsdp', 'parameters')}; AdamW state DDP {kb('ddp', 'optimizer')}, ZeRO-1 "
          f"{kb('zero1', 'optimizer')}, FSDP {kb('fsdp', 'optimizer')}")
    print(f"(loss curves of 1 and {n} processes agree within {curve_gap:.1e} over {args.steps} steps)")


if __name__ == "__main__":
    main()
