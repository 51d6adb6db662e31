"""Benchmark: lesson 14's DDP scaling from 1 to N processes, and what ZeRO-1 and FSDP keep per rank.

    python benchmarks/ddp.py [--processes 2] [--batch-sizes 128 64 32] [--repeats 7]   # about 7 min

1. Throughput: ``python -m course_lib.train_ddp`` (lesson 09's GPT, the COURSE recipe's model, windows
   of 64 characters) on 1 process with T threads, then under ``torchrun`` on N processes with T
   threads each (T = cores / N), the same global batch B; tokens per second over steps 2 on, each
   run about ``--tokens`` tokens long. Efficiency E = X / (N x Y): 1.0 is perfect scaling. The goal
   E >= 0.8 on 2 cores is for the first B (128 windows of 64 characters by default, 4,096 tokens
   per rank per step); the smaller ones show why it depends
   on B: every step costs one all-reduce of all the gradients, whatever B, while the computation
   it is set against shrinks with B.
   One run is noisy (a single process varies by about 10% on a shared machine), so the 1- and
   N-process runs alternate, ``--repeats`` times each, and X and Y are medians; the spread of the
   repeats' own ratios is printed too. Every pair's loss curves must agree (float32 rounding).
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
import statistics
import sys
import tempfile
from pathlib import Path

from course_lib.launch import run_command, run_on_ranks
from course_lib.parallel import random_batches, tiny_gpt, train_one_process, train_replica

BLOCK = 64  # characters per window


def throughput(processes: int, threads: int, batch_size: int, steps: int, folder: Path) -> dict:
    out = folder / f"run{processes}.json"
    args = ["-m", "course_lib.train_ddp", "--steps", str(steps), "--batch-size", str(batch_size),
            "--block-size", str(BLOCK), "--threads", str(threads), "--log-every", str(steps)]
    launcher = (["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
                if processes > 1 else [])
    run_command([sys.executable, *launcher, *args, "--out", str(out)], timeout=3600)
    return json.loads(out.read_text())


def scaling(processes: int, threads: int, batch_size: int, steps: int, repeats: int) -> dict:
    """Alternate 1-process and N-process runs ``repeats`` times; medians, the ratios' spread, curve gap."""
    ones, manys, ratios, gap = [], [], [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            one = throughput(1, threads, batch_size, steps, Path(tmp))
            many = throughput(processes, threads, batch_size, steps, Path(tmp))
            gap = max(gap, max(abs(a - b) for a, b in zip(one["losses"], many["losses"])))
            ones.append(one["tokens_per_s"])
            manys.append(many["tokens_per_s"])
            ratios.append(many["tokens_per_s"] / (processes * one["tokens_per_s"]))
    x, y = statistics.median(manys), statistics.median(ones)
    return {"x": x, "y": y, "efficiency": x / (processes * y), "ratios": ratios, "curve_gap": gap}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[128, 64, 32],
                        help="global batches (windows); the first is the headline")
    parser.add_argument("--repeats", type=int, default=7, help="alternating runs of each side")
    parser.add_argument("--tokens", type=int, default=150_000, help="tokens per run (sets the steps)")
    args = parser.parse_args(argv)
    if args.processes < 2 or args.repeats < 1 or min(args.batch_sizes) < args.processes:
        parser.error("need --processes >= 2, --repeats >= 1 and every batch size >= --processes")
    return args


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
    runs = {}
    for b in args.batch_sizes:
        steps = max(20, round(args.tokens / (b * BLOCK)))
        runs[b] = scaling(n, threads, b, steps, args.repeats)
    d = gradient_gap(n)
    head = runs[args.batch_sizes[0]]
    print(f"ddp: {n} processes x {threads} threads: {head['x']:,.0f} tokens/s vs {head['y']:,.0f} for one "
          f"(efficiency {head['efficiency']:.2f}); gradients equal to one process within {d:.1e}")
    sizes = bytes_per_rank(n)

    def kb(engine: str, part: str) -> str:
        return "/".join(f"{b[part] / 1e3:.0f}" for b in sizes[engine])

    numbers = sum(p.numel() for p in tiny_gpt(0).parameters())
    print(f"bytes per rank (kB, ranks 0/1, a float64 GPT of {numbers:,} parameters): weights DDP "
          f"{kb('ddp', 'parameters')}, "
          f"FSDP {kb('fsdp', 'parameters')}; AdamW state DDP {kb('ddp', 'optimizer')}, ZeRO-1 "
          f"{kb('zero1', 'optimizer')}, FSDP {kb('fsdp', 'optimizer')}")
    for b, r in runs.items():
        print(f"(global batch {b} x {BLOCK}: efficiency {r['efficiency']:.2f}, medians of {args.repeats} "
              f"alternating runs; the runs' own ratios {min(r['ratios']):.2f}-{max(r['ratios']):.2f}; "
              f"loss curves of 1 and {n} processes within {r['curve_gap']:.1e})")


if __name__ == "__main__":
    main()
