"""Train lesson 09's GPT on Shakespeare with PyTorch's DDP (or FSDP2), started by ``torchrun`` (lesson 14).

One script that runs unchanged on 1 process or many (nanoGPT's ``train.py``): ``torchrun`` sets
``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` in each process's environment; without them the script
is one plain process.

    python -m course_lib.train_ddp                                        # 1 process
    torchrun --standalone --nproc-per-node 2 -m course_lib.train_ddp      # 2 CPU processes (gloo)
    torchrun --standalone --nproc-per-node 8 -m course_lib.train_ddp --batch-size 256   # a GPU node (nccl)
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29500 --rdzv-id run1 -m course_lib.train_ddp                 # on each of 2 nodes

``--fsdp`` shards the model with FSDP2's ``fully_shard`` instead of wrapping it in DDP. With CUDA the
backend is nccl and rank r uses GPU ``LOCAL_RANK``; on CPU it is gloo and each process computes with
``--threads`` threads (default: the cores divided by the processes on this node).

``--batch-size`` is the GLOBAL batch B: each of N ranks trains on B/N windows per step. Every rank
draws the same B windows from the same seeded generator and keeps its share, so N processes follow
the same loss curve as one process with batch B (up to float rounding: the gradients are summed in
another order). A real run would give each rank other data instead (``DistributedSampler``).
It prints the loss every ``--log-every`` steps and the throughput (tokens per second) at the end;
``--out`` writes the losses and the throughput as JSON (rank 0).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from .gpt import GPT, lm_loss
from .lm_training import COURSE, warmup_cosine

__all__ = ["main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m course_lib.train_ddp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=COURSE.num_steps, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=COURSE.batch_size, help="GLOBAL batch (windows)")
    parser.add_argument("--block-size", type=int, default=COURSE.block_size)
    parser.add_argument("--num-layers", type=int, default=COURSE.num_layers)
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: the recipe's, capped)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard instead of DDP")
    parser.add_argument("--threads", type=int, default=0, help="threads per process (0: cores / processes)")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--out", default="", help="write losses and throughput as JSON here (rank 0)")
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "block_size", "num_layers", "log_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    ddp = int(os.environ.get("RANK", -1)) != -1  # started by torchrun?
    cuda = torch.cuda.is_available()
    if ddp:
        rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=5))
    else:
        rank, local_rank, world_size, local_world = 0, 0, 1, 1
        device = torch.device("cuda" if cuda else "cpu")
    try:
        return _train(args, rank, world_size, local_world, device, ddp)
    finally:
        if ddp:
            dist.destroy_process_group()


def _mean_over_ranks(values: torch.Tensor, world_size: int, ddp: bool) -> torch.Tensor:
    """The mean of ``values`` (any shape) over the ranks; each rank's equal share makes it the global mean."""
    if not ddp:
        return values
    values = values.clone()
    dist.all_reduce(values)
    return values / world_size


def _train(args: argparse.Namespace, rank: int, world_size: int, local_world: int,
           device: torch.device, ddp: bool) -> dict:
    from .data.shakespeare import ShakespeareCorpus

    master = rank == 0
    if args.batch_size % world_size != 0:
        raise SystemExit(f"--batch-size {args.batch_size} must be divisible by the {world_size} processes")
    threads = args.threads or max(1, (os.cpu_count() or 1) // local_world)
    torch.set_num_threads(threads)
    corpus = ShakespeareCorpus()
    recipe = COURSE
    warmup = args.warmup if args.warmup is not None else min(recipe.warmup, args.steps // 10)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    config = recipe.config(len(corpus.vocab))
    config.num_layers = args.num_layers
    config.max_len = args.block_size
    model = GPT(config).to(device)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        if ddp:
            for layer in model.blocks.layers:
                fully_shard(layer)
            fully_shard(model)
        trained = model
    else:
        trained = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": recipe.weight_decay},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=recipe.lr, betas=recipe.betas)
    ratio = recipe.min_lr / recipe.lr
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine(s, warmup, args.steps, ratio))
    gen = torch.Generator().manual_seed(args.seed)  # the same global batches on every rank
    share = args.batch_size // world_size
    local_losses: list[torch.Tensor] = []
    if master:
        engine = ("FSDP2" if args.fsdp else "DDP") if ddp else "one process"
        print(f"{engine}: {world_size} process(es) x {threads} thread(s), {device.type}, global batch "
              f"{args.batch_size} ({share} per process) x {args.block_size} characters, {args.steps} steps",
              flush=True)
    start = time.perf_counter()
    timed_from = None
    for step in range(args.steps):
        if step == 1:
            timed_from = time.perf_counter()  # the first step builds buckets and warms up: not timed
        x, y = corpus.train_batch(args.batch_size, args.block_size, gen)  # (B, T) on every rank
        x = x[rank * share:(rank + 1) * share].to(device)  # this rank's share: (B/N, T)
        y = y[rank * share:(rank + 1) * share].to(device)
        loss = lm_loss(trained(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP: gradients averaged over the ranks here, bucket by bucket
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
        optimizer.step()
        scheduler.step()
        local_losses.append(loss.detach())  # this rank's mean over its share
        if step % args.log_every == 0 or step == args.steps - 1:
            logged = _mean_over_ranks(loss.detach(), world_size, ddp)  # every rank takes part
            if master:
                print(f"step {step:4d}  loss {logged.item():.4f}", flush=True)
    end = time.perf_counter()
    # The curve over all ranks, in one all-reduce at the end rather than one per step: a per-step
    # reduction would be a second message after the gradients' and would wait for the slowest rank.
    losses = _mean_over_ranks(torch.stack(local_losses), world_size, ddp).tolist()
    timed_steps = args.steps - 1 if timed_from is not None else args.steps
    seconds = end - (timed_from if timed_from is not None else start)
    tokens_per_s = args.batch_size * args.block_size * timed_steps / seconds if seconds > 0 else math.nan
    result = {"world_size": world_size, "threads": threads, "fsdp": args.fsdp, "losses": losses,
              "tokens_per_s": tokens_per_s, "batch_size": args.batch_size, "steps": args.steps}
    if master:
        print(f"throughput: {tokens_per_s:,.0f} tokens/s ({world_size} process(es) x {threads} "
              f"thread(s), steps 2-{args.steps})", flush=True)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as file:
                json.dump(result, file)
    return result


if __name__ == "__main__":
    main()
