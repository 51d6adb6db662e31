"""Sharding the optimizer, and what each rank keeps and sends (lesson 14, ZeRO: Rajbhandari et al. 2020).

- ``ShardedOptimizer(params, optimizer_cls, **kwargs)``: ZeRO stage 1 around ANY ``torch.optim``
  optimizer (as CS336's sharded optimizer). Every parameter is owned by one rank; each rank builds
  ``optimizer_cls`` on the parameters it owns only, so it keeps their optimizer state only, steps
  them, then each owner broadcasts its updated parameters. Parameter groups (their own ``lr``,
  ``weight_decay``, ...) are kept, ``add_param_group`` included. ``reduce_gradients()`` sends each
  gradient to its owner only (``dist.reduce``): with it a step moves 2Ψ, as DDP, instead of 3Ψ.
- ``zero_bytes_per_parameter(stage, world_size)``: the ZeRO paper's memory per rank under mixed
  precision Adam: 2 bytes of bf16/fp16 weight + 2 of gradient + K = 12 of optimizer state (fp32
  master weight, m and v), i.e. 16Ψ for DDP, 4Ψ + 12Ψ/N for ZeRO-1, 2Ψ + 14Ψ/N for ZeRO-2 and
  16Ψ/N for ZeRO-3 (FSDP).
- ``CollectiveCounter``: counts every ``torch.distributed`` collective called inside a ``with``
  block and the bytes it carries; ``volume`` weighs them as the ZeRO paper does (an all-reduce
  carries its tensor twice: a reduce-scatter, then an all-gather).
- ``measure_communication(rank, world_size, engine)``: one training step's collectives for DDP,
  ZeRO-1 (gradients all-reduced, or reduced to their owners) and FSDP2, counted on the ranks.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .gpt import lm_loss
from .parallel import average_gradients, random_batches, rank_share, tiny_gpt

__all__ = ["ShardedOptimizer", "optimizer_state_bytes", "zero_bytes_per_parameter", "ZERO_STAGES",
           "CollectiveCounter", "COLLECTIVES", "measure_communication", "COMMUNICATION_ENGINES"]


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors in ``optimizer.state`` (AdamW's ``exp_avg`` and ``exp_avg_sq``, SGD's
    ``momentum_buffer``, ...); 0-D tensors (AdamW's ``step`` counters) are left out. For a
    ``ShardedOptimizer``: the state this rank keeps, in its local optimizer."""
    if isinstance(optimizer, ShardedOptimizer):
        optimizer = optimizer.local
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer_state_bytes: expected a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    total = 0
    for state in optimizer.state.values():
        for t in state.values():
            if isinstance(t, torch.Tensor) and t.dim() > 0:
                t = t.to_local() if hasattr(t, "to_local") else t  # an FSDP2 DTensor: its shard
                total += t.numel() * t.element_size()
    return total


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1 around any optimizer: ``ShardedOptimizer(params, optimizer_cls, **kwargs)``.

    ``params`` as for any ``torch.optim`` optimizer (parameters, or groups ``{"params": [...],
    "lr": ...}``); ``optimizer_cls`` is the optimizer to shard (``torch.optim.AdamW``,
    ``torch.optim.SGD``, ...), ``kwargs`` its defaults. Each parameter is given to the rank that
    holds the fewest numbers so far (in the order of the groups): ``owner[p]``. This rank's
    ``local`` optimizer, ``optimizer_cls(..., **kwargs)``, holds its own parameters, group by group
    with each group's options, and so keeps their state only (about 1/N of the whole).

    ``step()`` (the gradients already averaged over the ranks, or reduced to their owners by
    ``reduce_gradients()``): the local optimizer steps this rank's parameters (those whose ``.grad``
    is None are skipped by it, as on one process), then every owner broadcasts its parameters, so
    that every rank ends with every updated weight, equal to ``optimizer_cls`` on one process.
    ``param_groups`` holds every parameter (``zero_grad`` clears them all), and its options are
    copied to the local optimizer's groups at each step, so that a learning-rate schedule that
    changes ``param_groups[i]["lr"]`` is followed.

    Without a process group it runs as one rank (it owns everything).
    """

    def __init__(self, params: Iterable[nn.Parameter] | Iterable[dict[str, Any]],
                 optimizer_cls: type[torch.optim.Optimizer], **kwargs: Any) -> None:
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise TypeError(f"ShardedOptimizer: optimizer_cls must be a torch.optim.Optimizer class "
                            f"(torch.optim.AdamW, torch.optim.SGD, ...), got {optimizer_cls!r}")
        if isinstance(params, torch.Tensor):
            raise TypeError("ShardedOptimizer: params must be an iterable of parameters or of "
                            "parameter groups, got one tensor; wrap it in a list")
        initialized = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if initialized else 0
        self.world_size = dist.get_world_size() if initialized else 1
        self.optimizer_cls, self.kwargs = optimizer_cls, dict(kwargs)
        self.owner: dict[nn.Parameter, int] = {}
        self.loads = [0] * self.world_size  # numbers owned by each rank
        self.local: torch.optim.Optimizer | None = None
        super().__init__(params, dict(kwargs))  # calls add_param_group for every group

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (every rank's ``param_groups``), give each of its parameters an owner, and its
        owned share, with the group's options, to this rank's local optimizer."""
        super().add_param_group(param_group)  # checks it, fills in the defaults
        group = self.param_groups[-1]
        mine = []
        for p in group["params"]:
            owner = min(range(self.world_size), key=lambda r: (self.loads[r], r))
            self.owner[p] = owner
            self.loads[owner] += p.numel()
            if owner == self.rank:
                mine.append(p)
        local_group = {**{k: v for k, v in group.items() if k != "params"}, "params": mine}
        if self.local is None:
            self.local = self.optimizer_cls([local_group], **self.kwargs)
        else:
            self.local.add_param_group(local_group)

    def owned(self, rank: int | None = None) -> list[nn.Parameter]:
        """The parameters ``rank`` (this rank by default) owns, in the order of ``param_groups``."""
        rank = self.rank if rank is None else rank
        return [p for g in self.param_groups for p in g["params"] if self.owner[p] == rank]

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """After backward: each gradient summed on its owner only, and divided by N there (the
        other ranks' copies are left as they are, and the step reads only the owner's): a
        reduce-scatter by parameter, half an all-reduce's traffic. A parameter whose ``.grad`` is
        None is left alone: every rank runs the same model, so it is None on every rank."""
        if self.world_size == 1:
            return
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                dist.reduce(p.grad, dst=self.owner[p])
                if self.rank == self.owner[p]:
                    p.grad /= self.world_size

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """Step this rank's parameters with the local optimizer, then broadcast every parameter from
        its owner (one flat broadcast per owner and dtype). Returns ``closure()``'s loss, if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group, local in zip(self.param_groups, self.local.param_groups):  # one local group each
            local.update({k: v for k, v in group.items() if k != "params"})  # a scheduler's new lr
        self.local.step()
        if self.world_size > 1:
            for owner in range(self.world_size):
                by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
                for p in self.owned(owner):
                    by_dtype.setdefault(p.dtype, []).append(p)
                for dtype, params in by_dtype.items():
                    flat = torch.cat([p.detach().reshape(-1) for p in params])  # (numbers owned,)
                    dist.broadcast(flat, src=owner)
                    offset = 0
                    for p in params:
                        p.copy_(flat[offset: offset + p.numel()].view_as(p))
                        offset += p.numel()
        return loss

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank keeps (its local optimizer's tensors)."""
        return optimizer_state_bytes(self.local)


# --- what each rank keeps under mixed precision ---------------------------------------------------

ZERO_STAGES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3 (FSDP)"}


def zero_bytes_per_parameter(stage: int, world_size: int, weight_bytes: float = 2,
                             grad_bytes: float = 2, state_bytes: float = 12) -> float:
    """Bytes per parameter that each of ``world_size`` ranks keeps under mixed-precision Adam (the
    ZeRO paper's Figure 1): ``weight_bytes`` (bf16/fp16 weights, 2), ``grad_bytes`` (their
    gradients, 2) and ``state_bytes`` (K = 12: fp32 master weights, m and v, 4 each). Stage 0 (DDP)
    keeps everything: 16. Stage 1 shards the state (4 + 12/N), stage 2 the gradients too
    (2 + 14/N), stage 3 the weights too (16/N)."""
    if stage not in ZERO_STAGES:
        raise ValueError(f"zero_bytes_per_parameter: stage must be one of {sorted(ZERO_STAGES)} "
                         f"(0 is DDP), got {stage!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"zero_bytes_per_parameter: world_size must be an int >= 1, got {world_size!r}")
    n = world_size
    weights = weight_bytes / n if stage >= 3 else weight_bytes
    grads = grad_bytes / n if stage >= 2 else grad_bytes
    state = state_bytes / n if stage >= 1 else state_bytes
    return weights + grads + state


# --- counting what the collectives carry ---------------------------------------------------------

# How many times its tensor a collective carries (the ZeRO paper's accounting: an all-reduce is a
# reduce-scatter and an all-gather, each of which moves the whole tensor through the ring once).
# Each rank sends and receives (N - 1) / N of this; the volume counts the whole.
COLLECTIVES = {
    "all_reduce": 2, "reduce": 1, "broadcast": 1, "all_gather": 1, "all_gather_into_tensor": 1,
    "all_gather_single": 1, "reduce_scatter": 1, "reduce_scatter_tensor": 1,
    "reduce_scatter_single": 1, "all_to_all": 1, "all_to_all_single": 1,
}


def _payload_bytes(name: str, args: tuple, kwargs: dict) -> int:
    """Bytes of the whole (unsharded) tensor a call moves: the tensor itself (all_reduce, reduce,
    broadcast), the gathered output (all_gather*), the input before it is scattered
    (reduce_scatter*), what each rank sends (all_to_all*)."""
    def size(t: Any) -> int:
        if isinstance(t, torch.Tensor):
            return t.numel() * t.element_size()
        return sum(size(x) for x in t)  # a list of tensors

    values = list(args) + list(kwargs.values())
    if name in ("all_reduce", "reduce", "broadcast"):
        return size(values[0])
    if name == "all_gather":  # (tensor_list, tensor)
        return size(values[0])
    if name in ("all_gather_into_tensor", "all_gather_single"):  # (output, input)
        return size(values[0])
    if name == "reduce_scatter":  # (output, input_list)
        return size(values[1])
    if name in ("reduce_scatter_tensor", "reduce_scatter_single"):  # (output, input)
        return size(values[1])
    return size(values[1])  # all_to_all (outputs, inputs), all_to_all_single (output, input)


class CollectiveCounter:
    """Counts the ``torch.distributed`` collectives called inside ``with CollectiveCounter() as c:``
    (through ``torch.distributed.<name>``, as PyTorch's DDP comm hooks and FSDP2 call them; DDP's own
    C++ all-reduces are not seen: give DDP a comm hook that calls ``dist.all_reduce``).

    ``calls``: ``[(name, bytes)]`` in order, bytes of the whole tensor each call moves; ``volume``:
    their bytes weighed by ``COLLECTIVES`` (an all-reduce twice). A collective called from inside
    another (a deprecated name forwarding to the new one) counts once."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self._saved: dict[str, Callable[..., Any]] = {}
        self._depth = 0

    def __enter__(self) -> CollectiveCounter:
        for name in COLLECTIVES:
            original = getattr(dist, name, None)
            if original is None:  # an older PyTorch without this name
                continue
            self._saved[name] = original
            setattr(dist, name, self._wrap(name, original))
        return self

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:
                self.calls.append((name, _payload_bytes(name, args, kwargs)))
            self._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1

        return counted

    def __exit__(self, *exc: object) -> None:
        for name, original in self._saved.items():
            setattr(dist, name, original)
        self._saved.clear()

    @property
    def volume(self) -> int:
        """Bytes moved, the ZeRO paper's way: each call's tensor times ``COLLECTIVES[name]``."""
        return sum(COLLECTIVES[name] * n for name, n in self.calls)

    def by_name(self) -> dict[str, tuple[int, int]]:
        """``{name: (calls, bytes)}``."""
        out: dict[str, tuple[int, int]] = {}
        for name, n in self.calls:
            count, total = out.get(name, (0, 0))
            out[name] = (count + 1, total + n)
        return out


COMMUNICATION_ENGINES = ("ddp", "zero1", "zero1_reduce", "fsdp")


def measure_communication(rank: int, world_size: int, engine: str, seed: int = 0) -> dict[str, Any]:
    """One training step of ``tiny_gpt`` (float32) on this rank, its collectives counted (the step
    after a first, warm-up step: DDP's and FSDP2's set-up is not counted). ``engine``:

    - ``"ddp"``: ``DistributedDataParallel`` whose comm hook all-reduces each bucket;
    - ``"zero1"``: ``average_gradients`` (all-reduce), then ``ShardedOptimizer(AdamW)``;
    - ``"zero1_reduce"``: ``ShardedOptimizer.reduce_gradients`` (each gradient reduced to its
      owner), then its step;
    - ``"fsdp"``: FSDP2's ``fully_shard`` on every block and on the model.

    Returns ``{"parameter_bytes": Ψ in bytes, "volume": bytes, "calls": {name: (calls, bytes)}}``.
    """
    if engine not in COMMUNICATION_ENGINES:
        raise ValueError(f"measure_communication: engine must be one of {COMMUNICATION_ENGINES}, "
                         f"got {engine!r}")
    model = tiny_gpt(seed, torch.float32)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    trained: nn.Module = model
    if engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        def hook(state, bucket):  # no annotations: DDP checks them, and they are strings here
            work = dist.all_reduce(bucket.buffer().div_(world_size), async_op=True)
            return work.get_future().then(lambda fut: fut.value()[0])

        trained = DistributedDataParallel(model)
        trained.register_comm_hook(None, hook)
    if engine == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model.blocks.layers:
            fully_shard(layer)
        fully_shard(model)
    if engine.startswith("zero1"):
        optimizer: torch.optim.Optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW,
                                                            lr=1e-3)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    counter = CollectiveCounter()
    for step, (x, y) in enumerate(random_batches(2, 4 * world_size, seed=seed)):
        with counter if step == 1 else contextlib.nullcontext():
            optimizer.zero_grad()
            lm_loss(trained(rank_share(x, rank, world_size)), rank_share(y, rank, world_size)).backward()
            if engine == "zero1":
                average_gradients(model)
            elif engine == "zero1_reduce":
                optimizer.reduce_gradients()
            optimizer.step()
    return {"parameter_bytes": parameter_bytes, "volume": counter.volume, "calls": counter.by_name()}

