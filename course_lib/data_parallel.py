"""A data-parallel container built by hand (lesson 14): what PyTorch's ``DistributedDataParallel``
does, in one short class, as CS336's assignment 2 has it built, and a recorder of its timeline.

    ddp = BucketedDDP(model, bucket_size_mb=1.0)   # broadcasts rank 0's weights and buffers
    loss = lm_loss(ddp(x_share), y_share)
    loss.backward()                                # each full bucket's all-reduce starts here
    ddp.finish_gradient_synchronization()          # waits, divides by N, writes back into .grad
    optimizer.step()

- **Construction** broadcasts rank 0's parameters and buffers to every rank, so replicas drawn
  from different seeds start equal.
- **Buckets.** The parameters that require grad, in the *reverse* order of ``module.parameters()``
  (roughly the order in which backward produces their gradients), are grouped into buckets: a
  bucket takes parameters while its size stays at most ``bucket_size_mb`` MiB (2**20 bytes, as
  DDP's ``bucket_cap_mb``); a parameter larger than that gets a bucket of its own; a parameter of
  another dtype or device starts a new bucket. Frozen parameters (``requires_grad=False``) are left
  out: they get no hook and no gradient.
- **During backward**, a hook (``Tensor.register_post_accumulate_grad_hook``) marks each gradient
  ready. When every gradient of a bucket is ready, the bucket's gradients are flattened into one
  vector and its all-reduce starts asynchronously (``dist.all_reduce(..., async_op=True)``) while
  backward goes on with earlier layers. Buckets are launched in bucket order (as DDP's reducer
  does), so every rank issues the same collectives in the same order.
- **finish_gradient_synchronization()** waits for every bucket, divides the sums by the world size
  and copies the averages back into each ``p.grad``.

**Unused parameters** (a parameter that requires grad but takes no part in the loss): with
``find_unused_parameters=False`` (the default, as DDP), ``finish_gradient_synchronization`` raises a
RuntimeError naming them. With ``True``, the buckets still waiting are launched there, a missing
gradient counting as zeros, and one more all-reduce counts which ranks had a gradient: a parameter
that had one on some rank gets the average over all ranks (zeros from the others), one that had
none on any rank keeps ``.grad`` None, as one process on the whole batch would leave it.

``bucket_timeline`` runs a container (this one, or any class with the same interface, such as a
learner's) and records when each bucket's all-reduce started and finished against the backward
pass; ``train_bucketed_replica`` is one rank of a training run with it, to compare with
``course_lib.parallel.train_one_process``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .gpt import lm_loss
from .parallel import BETAS, LR, WEIGHT_DECAY, random_batches, rank_share, tiny_gpt

__all__ = ["BucketedDDP", "plan_buckets", "bucket_timeline", "train_bucketed_replica", "MIB"]

MIB = 2**20  # bytes in one MiB: bucket_size_mb counts these, as DDP's bucket_cap_mb


def plan_buckets(parameters: Sequence[torch.Tensor], bucket_size_mb: float) -> list[list[int]]:
    """The buckets, as lists of indices into ``parameters``: the ones that require grad, walked in
    reverse order; a bucket takes parameters while its size stays <= ``bucket_size_mb`` MiB (a larger
    parameter gets a bucket of its own); another dtype or device starts a new bucket."""
    _check_size(bucket_size_mb, "plan_buckets")
    cap = bucket_size_mb * MIB
    buckets: list[list[int]] = []
    size, kind = 0, None
    for i in reversed(range(len(parameters))):
        p = parameters[i]
        if not p.requires_grad:
            continue
        nbytes = p.numel() * p.element_size()
        if not buckets or size + nbytes > cap or (p.dtype, p.device) != kind:
            buckets.append([])
            size, kind = 0, (p.dtype, p.device)
        buckets[-1].append(i)
        size += nbytes
    return buckets


def _check_size(bucket_size_mb: object, where: str) -> None:
    if (isinstance(bucket_size_mb, bool) or not isinstance(bucket_size_mb, (int, float))
            or not math.isfinite(bucket_size_mb) or bucket_size_mb <= 0):
        raise ValueError(f"{where}: bucket_size_mb must be a number of MiB > 0 (25 is DDP's default), "
                         f"got {bucket_size_mb!r}")


class BucketedDDP(nn.Module):
    """Data parallel with buckets and overlap: ``BucketedDDP(module, bucket_size_mb)``.

    ``forward(*inputs, **kwargs)`` is ``module``'s. After ``loss.backward()`` call
    ``finish_gradient_synchronization()``: then every ``p.grad`` of ``module`` holds the mean over
    the ranks. Must be built inside a process group (``run_on_ranks``, ``torchrun``), with the same
    module on every rank. ``buckets`` lists each bucket's parameter names, in launch order.
    """

    def __init__(self, module: nn.Module, bucket_size_mb: float = 25.0,
                 find_unused_parameters: bool = False) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"BucketedDDP: module must be an nn.Module, got {type(module).__name__}")
        _check_size(bucket_size_mb, "BucketedDDP")
        if not isinstance(find_unused_parameters, bool):
            raise TypeError("BucketedDDP: find_unused_parameters must be True or False, got "
                            f"{find_unused_parameters!r}")
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("BucketedDDP: no process group: build it inside one "
                               "(course_lib.launch.run_on_ranks, or torchrun and init_process_group)")
        self.module = module
        self.find_unused_parameters = find_unused_parameters
        self.world_size = dist.get_world_size()
        named = list(module.named_parameters())  # a tied parameter is listed once
        if not any(p.requires_grad for _, p in named):
            raise ValueError("BucketedDDP: the module has no parameter that requires grad: there is "
                             "nothing to synchronize")
        self._same_module_everywhere(named)
        with torch.no_grad():  # rank 0's weights and buffers on every rank
            for t in [p for _, p in named] + list(module.buffers()):
                dist.broadcast(t.detach(), src=0)
        plan = plan_buckets([p for _, p in named], bucket_size_mb)
        self._params = [[named[i][1] for i in bucket] for bucket in plan]
        self.buckets = [[named[i][0] for i in bucket] for bucket in plan]
        self._where = {id(p): b for b, bucket in enumerate(self._params) for p in bucket}
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready)
                       for bucket in self._params for p in bucket]
        self._reset()

    def _same_module_everywhere(self, named: list[tuple[str, nn.Parameter]]) -> None:
        """Rank 0's number of parameters and numbers, compared on every rank (a clear error rather
        than a broadcast of mismatched shapes)."""
        mine = torch.tensor([len(named), sum(p.numel() for _, p in named)], dtype=torch.int64)
        theirs = mine.clone()
        dist.broadcast(theirs, src=0)
        if not torch.equal(mine, theirs):
            raise ValueError(f"BucketedDDP: rank {dist.get_rank()}'s module has {mine[0]} parameters "
                             f"({mine[1]} numbers), rank 0's {theirs[0]} ({theirs[1]}): every rank must "
                             "wrap the same model")

    def _reset(self) -> None:
        self._ready: list[set[int]] = [set() for _ in self._params]
        self._flat: list[torch.Tensor | None] = [None] * len(self._params)  # (bucket numel,)
        self._handles: list[Any] = [None] * len(self._params)
        self._next = 0  # the next bucket to launch: buckets leave in order on every rank

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if any(h is not None for h in self._handles):
            raise RuntimeError("BucketedDDP: the previous backward's all-reduces are still pending: "
                               "call finish_gradient_synchronization() after every backward, before "
                               "the next forward")
        return self.module(*inputs, **kwargs)

    def _grad_ready(self, p: torch.Tensor) -> None:
        """Post-accumulate-grad hook: ``p.grad`` is final for this backward."""
        b = self._where[id(p)]
        if id(p) in self._ready[b]:
            raise RuntimeError("BucketedDDP: a second backward before finish_gradient_synchronization(): "
                               "call it after every backward (gradient accumulation is not supported)")
        self._ready[b].add(id(p))
        while self._next < len(self._params) and len(self._ready[self._next]) == len(self._params[self._next]):
            self._launch(self._next)
            self._next += 1

    def _launch(self, b: int) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params[b]]
        flat = torch.cat([g.reshape(-1) for g in grads])  # (numel of the bucket,)
        self._flat[b] = flat
        self._handles[b] = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)

    def finish_gradient_synchronization(self) -> None:
        """Wait for every bucket's all-reduce; each ``p.grad`` becomes the mean over the ranks."""
        unused = [name for b, bucket in enumerate(self._params) for name, p in zip(self.buckets[b], bucket)
                  if id(p) not in self._ready[b]]
        if len(unused) == sum(len(b) for b in self._params):
            self._reset()
            raise RuntimeError("BucketedDDP: finish_gradient_synchronization() found no gradient: "
                               "call it after loss.backward()")
        if unused and not self.find_unused_parameters:
            self._reset()
            raise RuntimeError(f"BucketedDDP: {len(unused)} parameter(s) got no gradient in this "
                               f"backward ({', '.join(unused[:4])}{' ...' if len(unused) > 4 else ''}): "
                               "use every parameter in the loss, freeze it (requires_grad_(False)) "
                               "before wrapping, or pass find_unused_parameters=True")
        had_grad = None
        if self.find_unused_parameters:
            while self._next < len(self._params):  # the buckets held up by a missing gradient
                self._launch(self._next)
                self._next += 1
            had_grad = torch.tensor([p.grad is not None for bucket in self._params for p in bucket],
                                    dtype=torch.int64)
            dist.all_reduce(had_grad)  # on how many ranks each parameter had a gradient
        k = 0
        for b, bucket in enumerate(self._params):
            self._handles[b].wait()
            flat = self._flat[b] / self.world_size  # the sum over the ranks -> the mean
            offset = 0
            for p in bucket:
                average = flat[offset: offset + p.numel()].view_as(p)  # (numel,) -> p's shape
                offset += p.numel()
                if had_grad is not None and had_grad[k] == 0:
                    p.grad = None  # no rank had a gradient: as one process would leave it
                elif p.grad is None:
                    p.grad = average.clone()
                else:
                    p.grad.copy_(average)
                k += 1
        self._reset()


# --- the timeline and the training run ------------------------------------------------------------

def bucket_timeline(rank: int, world_size: int, bucket_size_mb: float,
                    ddp_class: Callable[..., Any] | None = None, steps: int = 3,
                    seed: int = 0) -> dict[str, Any]:
    """When a data-parallel container's all-reduces start and finish, against its backward pass.

    Runs ``steps`` steps of a float32 GPT (2 layers, d_model 128, 413,568 numbers, 1.58 MiB) on
    this rank's 8 of 16 windows of 64 tokens, wrapped in ``ddp_class(model, bucket_size_mb)``
    (``BucketedDDP`` by default; any class with ``forward`` and ``finish_gradient_synchronization``).
    Every ``dist.all_reduce`` call is stamped when it starts and, through its work's future, when it
    finishes. Returns, for the last step, in ms after ``backward()`` started: ``reduces``
    [(start, end, numbers, async?)] in call order, ``backward_ms`` (when backward returned) and
    ``finish_ms`` (when ``finish_gradient_synchronization`` returned).
    """
    _check_size(bucket_size_mb, "bucket_timeline")
    ddp_class = BucketedDDP if ddp_class is None else ddp_class
    model = tiny_gpt(seed, torch.float32, d_model=128, max_len=64, num_layers=2)
    x, y = random_batches(1, 16, 64, 67, seed)[0]  # (16, 64) ids and targets
    x, y = rank_share(x, rank, world_size), rank_share(y, rank, world_size)
    calls: list[dict[str, Any]] = []
    original = dist.all_reduce

    def stamped(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        call = {"start": time.perf_counter(), "end": None, "numel": tensor.numel(),
                "async": bool(kwargs.get("async_op", False))}
        calls.append(call)
        work = original(tensor, *args, **kwargs)
        if work is None:  # a synchronous call has finished when it returns
            call["end"] = time.perf_counter()
        else:
            work.get_future().add_done_callback(lambda _: call.__setitem__("end", time.perf_counter()))
        return work

    dist.all_reduce = stamped
    try:
        ddp = ddp_class(model, bucket_size_mb)
        result: dict[str, Any] = {}
        for _ in range(steps):
            model.zero_grad(set_to_none=True)
            loss = lm_loss(ddp(x), y)
            calls.clear()
            start = time.perf_counter()
            loss.backward()
            backward_end = time.perf_counter()
            ddp.finish_gradient_synchronization()
            finish_end = time.perf_counter()
            reduces = [((c["start"] - start) * 1e3,
                        ((c["end"] if c["end"] is not None else finish_end) - start) * 1e3,
                        c["numel"], c["async"]) for c in calls]
            result = {"reduces": reduces, "backward_ms": (backward_end - start) * 1e3,
                      "finish_ms": (finish_end - start) * 1e3}
    finally:
        dist.all_reduce = original
    return result


def train_bucketed_replica(rank: int, world_size: int,
                           batches: Sequence[tuple[torch.Tensor, torch.Tensor]], bucket_size_mb: float,
                           seed: int = 0, seed_per_rank: bool = False,
                           ddp_class: Callable[..., Any] | None = None) -> dict[str, Any]:
    """One rank of ``course_lib.parallel.train_one_process``'s run (``tiny_gpt(seed)``, AdamW, one
    step per batch), data parallel with ``ddp_class(model, bucket_size_mb)`` (``BucketedDDP`` by
    default): this rank's 1/N of each batch. ``seed_per_rank`` draws rank r's replica from
    ``seed + r``: the broadcast at construction must make them rank 0's. Returns the first step's
    averaged gradients, the final weights, and the number of buckets."""
    ddp_class = BucketedDDP if ddp_class is None else ddp_class
    model = tiny_gpt(seed + (rank if seed_per_rank else 0))
    ddp = ddp_class(model, bucket_size_mb)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    first_grads = None
    for x, y in batches:
        optimizer.zero_grad()
        lm_loss(ddp(rank_share(x, rank, world_size)), rank_share(y, rank, world_size)).backward()
        ddp.finish_gradient_synchronization()
        if first_grads is None:
            first_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
    return {"grads": first_grads, "weights": {n: p.detach().clone() for n, p in model.named_parameters()},
            "buckets": len(getattr(ddp, "buckets", []))}
