"""Training beyond one process, by hand (lesson 14): gradient accumulation, data parallel, ZeRO-1 and
Megatron's tensor-parallel MLP, each proven equal to one process.

Everything here runs inside a process group (``course_lib.launch.run_on_ranks`` or ``torchrun``):

- ``accumulate_gradients``: k micro-batches, each loss divided by k, give one big batch's gradient.
- ``average_gradients``: data parallel by hand. Every rank holds the whole model and a 1/N share of
  the batch; after ``backward`` one ``all_reduce`` per gradient sums them and each rank divides by
  N, so every rank holds the whole batch's mean gradient and takes the same optimizer step.
- ``ZeRO1AdamW``: AdamW whose two moment tensors are split across the ranks (ZeRO stage 1,
  Rajbhandari et al. 2020): rank r keeps them for its 1/N slice of the flattened parameters, updates
  that slice, and an ``all_gather`` gives every rank every updated weight.
- ``CopyToParallel`` / ``ReduceFromParallel`` (Megatron-LM's f and g), ``ColumnParallelLinear``,
  ``RowParallelLinear`` and ``ParallelMLP``: lesson 04's ``FeedForward`` split over the ranks
  (Shoeybi et al. 2019), one all-reduce forward (g) and one backward (f).
- ``ParallelSelfAttention``: lesson 02's ``MultiHeadAttention`` split the same way, by heads.
- ``train_replica``: one rank's training run with any of these engines (or PyTorch's DDP / FSDP2),
  ``train_one_process``: the same run on one process, the reference.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .attention import MultiHeadAttention
from .gpt import GPT, GPTConfig, lm_loss
from .layers import FeedForward

__all__ = [
    "accumulate_gradients", "average_gradients", "ZeRO1AdamW", "CopyToParallel", "ReduceFromParallel",
    "copy_to_parallel", "reduce_from_parallel", "ColumnParallelLinear", "RowParallelLinear",
    "ParallelMLP", "ParallelSelfAttention", "tiny_gpt", "random_batches", "rank_share",
    "train_one_process", "train_replica",
    "adamw_state_bytes", "measure_zero1_bytes", "fsdp_expected_bytes", "ddp_bucket_timeline", "ENGINES",
    "precision_run", "saved_activation_bytes", "load_precision_runs",
]


# --- 1. gradient accumulation --------------------------------------------------------------------

def accumulate_gradients(model: nn.Module, loss_fn: Callable[..., torch.Tensor], x: torch.Tensor,
                         y: torch.Tensor, k: int) -> float:
    """Fill ``p.grad`` with the gradient of the mean loss over the whole batch ``(x, y)`` (B rows),
    computed from ``k`` micro-batches of B/k rows; return that loss. Each micro-batch's mean loss is
    divided by k, because ``backward`` *adds* into ``.grad``: k means of B/k rows, each over k, is
    the mean of B rows. ``B`` must be divisible by ``k`` (equal micro-batches, equal weights)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1 or x.size(0) % k != 0:
        raise ValueError(f"accumulate_gradients: k must be an int >= 1 dividing the batch size "
                         f"{x.size(0)}, got {k!r}")
    for p in model.parameters():
        p.grad = None
    total = 0.0
    for xs, ys in zip(x.chunk(k), y.chunk(k)):  # k micro-batches of (B/k, ...)
        loss = loss_fn(model(xs), ys) / k
        loss.backward()  # adds into p.grad
        total += loss.item()
    return total


# --- 2. data parallel by hand -------------------------------------------------------------------

def average_gradients(model: nn.Module) -> None:
    """After ``backward`` on this rank's share of the batch: every gradient becomes the mean over the
    ranks (one ``all_reduce`` SUM, then divided by the world size), in place, on every rank."""
    world = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world


def _check_rank(rank: object, world_size: object, where: str) -> None:
    """``world_size`` an int >= 1 and ``rank`` an int in ``0 .. world_size - 1``, else a ValueError
    (a rank of -1 would silently take the last share, as Python's negative indices do)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"{where}: world_size must be an int >= 1 (the number of ranks, "
                         f"dist.get_world_size()), got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"{where}: rank must be an int in 0 .. {world_size - 1} (world_size "
                         f"{world_size}), got {rank!r}; pass this process's dist.get_rank()")


def rank_share(x: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous 1/N of the batch (rows): ``(B, ...) -> (B / N, ...)``."""
    _check_rank(rank, world_size, "rank_share")
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        what = "a 0-D tensor" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"rank_share: x must be a tensor with the batch first, (B, ...), got {what}")
    if x.size(0) % world_size != 0:
        raise ValueError(f"rank_share: the batch of {x.size(0)} rows does not split into "
                         f"{world_size} equal shares")
    return x.chunk(world_size)[rank]


# --- 3. ZeRO-1: AdamW's state split across the ranks --------------------------------------------

class ZeRO1AdamW:
    """AdamW (``torch.optim.AdamW``'s update) with its state split over the ranks.

    The parameters are flattened into one vector of n numbers, padded to a multiple of N; rank r owns
    the slice ``[r * n/N, (r+1) * n/N)``. ``step()`` (gradients already averaged over the ranks)
    updates only that slice, with AdamW's moments for it alone, then ``all_gather`` brings every
    rank every updated slice. State per rank: 2 * n/N numbers instead of 2 * n.

    As ``torch.optim.AdamW``: ``params`` is an iterable of parameters or of parameter groups
    (dicts with ``"params"`` and any of ``lr``, ``betas``, ``eps``, ``weight_decay``; the arguments
    are the defaults), and a parameter whose ``.grad`` is None at a step is skipped (no weight decay,
    no moment update, its own step count unchanged). Inside, the slice is kept as one piece per
    parameter it covers, each AdamW's parameter with the state AdamW would give that parameter.
    """

    _GROUP_KEYS = ("lr", "betas", "eps", "weight_decay")

    def __init__(self, params: Sequence[nn.Parameter] | Sequence[dict[str, Any]], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01) -> None:
        groups = self._groups(params)
        self.params = [p for group in groups for p in group["params"]]
        if not self.params:
            raise ValueError("ZeRO1AdamW: no parameters to optimise")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / self.world)
        self.start = min(self.rank * self.shard_size, self.numel)
        self.end = min(self.start + self.shard_size, self.numel)
        self.dtype = self.params[0].dtype
        for p in self.params[1:]:
            self.dtype = torch.promote_types(self.dtype, p.dtype)  # what torch.cat of them gives
        # This rank's slice, one piece per parameter it overlaps: (parameter, first, last) numbers.
        self.pieces: list[tuple[nn.Parameter, int, int]] = []
        inner_groups, offset = [], 0
        for group in groups:
            shards = []
            for p in group["params"]:
                a, b = max(self.start - offset, 0), min(self.end - offset, p.numel())
                if a < b:
                    self.pieces.append((p, a, b))
                    shards.append(nn.Parameter(p.detach().reshape(-1)[a:b].clone()))  # (b - a,)
                offset += p.numel()
            options = {key: group[key] for key in self._GROUP_KEYS if key in group}
            inner_groups.append({"params": shards, **options})
        self.shards = [shard for group in inner_groups for shard in group["params"]]
        # AdamW of no parameter at all (a rank whose slice is only padding) is refused: one that
        # never steps stands in.
        self.inner = torch.optim.AdamW(
            [g for g in inner_groups if g["params"]] or [nn.Parameter(torch.zeros(0, dtype=self.dtype))],
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    @classmethod
    def _groups(cls, params: object) -> list[dict[str, Any]]:
        """``params`` as a list of groups ``{"params": [...], options}``, each parameter once."""
        where = "ZeRO1AdamW"
        if isinstance(params, torch.Tensor):
            raise TypeError(f"{where}: params must be an iterable of parameters or of parameter groups "
                            "(model.parameters(), or [{'params': [...], 'weight_decay': 0.0}, ...]), got "
                            "one tensor; wrap it in a list")
        items = list(params)
        if items and all(isinstance(item, dict) for item in items):
            groups = [dict(item) for item in items]
        elif any(isinstance(item, dict) for item in items):
            raise TypeError(f"{where}: params must be all parameters or all parameter groups (dicts), "
                            "not a mix; put the loose parameters in a group of their own")
        else:
            groups = [{"params": items}]
        seen: set[int] = set()
        for n, group in enumerate(groups):
            unknown = sorted(set(group) - {"params", *cls._GROUP_KEYS})
            if "params" not in group or unknown:
                raise ValueError(f"{where}: parameter group {n} must have 'params' and may set "
                                 f"{', '.join(cls._GROUP_KEYS)}; got keys {sorted(group)}: remove the "
                                 "others (AdamW's other options are not supported)")
            members = group["params"]
            members = [members] if isinstance(members, torch.Tensor) else list(members)
            for p in members:
                if not isinstance(p, torch.Tensor):
                    raise TypeError(f"{where}: parameter group {n} holds a {type(p).__name__}, not a "
                                    "parameter (pass model.parameters() or lists of parameters)")
                if id(p) in seen:
                    raise ValueError(f"{where}: a parameter (shape {tuple(p.shape)}) is listed twice; "
                                     "give each parameter once, in one group")
                seen.add(id(p))
            group["params"] = [p for p in members if p.requires_grad]
        return groups

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for (p, a, b), shard in zip(self.pieces, self.shards):
            # AdamW skips a parameter without a gradient: so does its piece (grad None)
            shard.grad = None if p.grad is None else p.grad.reshape(-1)[a:b].clone()
        self.inner.step()  # AdamW on this rank's slice only
        padded = torch.zeros(self.shard_size, dtype=self.dtype)
        if self.shards:
            padded[: self.end - self.start] = torch.cat([shard.detach() for shard in self.shards])
        gathered = [torch.empty_like(padded) for _ in range(self.world)]
        dist.all_gather(gathered, padded)  # every rank's updated slice
        flat = torch.cat(gathered)[: self.numel]  # (n,)
        offset = 0
        for p in self.params:
            p.copy_(flat[offset: offset + p.numel()].view_as(p))
            offset += p.numel()

    def state_bytes(self) -> int:
        """Bytes of AdamW's moments (exp_avg, exp_avg_sq) kept on this rank."""
        return adamw_state_bytes(self.inner)


def adamw_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of AdamW's two moment tensors in ``optimizer.state`` (the local shards for FSDP2's
    DTensors); the step counters are left out."""
    total = 0
    for state in optimizer.state.values():
        for name in ("exp_avg", "exp_avg_sq"):
            t = state[name]
            t = t.to_local() if hasattr(t, "to_local") else t
            total += t.numel() * t.element_size()
    return total


def measure_zero1_bytes(rank: int, world_size: int) -> int:  # noqa: ARG001 (run_on_ranks's signature)
    """``ZeRO1AdamW``'s state on this rank after one step of lesson 09's GPT (one layer): what
    lesson 14's reveal cell measures on 2 ranks, ``run_on_ranks(measure_zero1_bytes, 2)``, after
    ``check_zero1_bytes``."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=83, max_len=64, d_model=128, num_heads=4, num_layers=1))
    optimizer = ZeRO1AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 83, (2, 64))
    lm_loss(model(x), x).backward()
    average_gradients(model)
    optimizer.step()
    return optimizer.state_bytes()


# --- 4. tensor parallel: Megatron's MLP ---------------------------------------------------------

class CopyToParallel(torch.autograd.Function):
    """Megatron's f: the identity forward; backward, the all-reduce (sum) of the input's gradient,
    since every rank's half of the layer used the same input and contributed a part of its
    gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromParallel(torch.autograd.Function):
    """Megatron's g: forward, the all-reduce (sum) of the ranks' partial outputs; backward, the
    identity (each rank's partial output reaches the sum with weight 1)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def copy_to_parallel(x: torch.Tensor) -> torch.Tensor:
    return CopyToParallel.apply(x)


def reduce_from_parallel(x: torch.Tensor) -> torch.Tensor:
    return ReduceFromParallel.apply(x)


def _check_linear(dense: object, where: str) -> None:
    if not isinstance(dense, nn.Linear):
        raise TypeError(f"{where}: dense must be an nn.Linear (the layer to split), got "
                        f"{type(dense).__name__}")


class ColumnParallelLinear(nn.Module):
    """This rank's share of ``dense`` split by its OUTPUT features (Megatron's columns of A in
    ``Y = X A``; the rows of ``nn.Linear``'s ``(out, in)`` weight): ``(..., in) -> (..., out / N)``.
    The input enters through f, so that its gradient is summed over the ranks; ``copy_input=False``
    when the caller has already passed it through f once for several such layers (attention's Q, K
    and V read the same x: one f, one all-reduce in backward, not three)."""

    def __init__(self, dense: nn.Linear, rank: int, world_size: int,
                 copy_input: bool = True) -> None:
        super().__init__()
        _check_rank(rank, world_size, "ColumnParallelLinear")
        _check_linear(dense, "ColumnParallelLinear")
        self.copy_input = copy_input
        if dense.out_features % world_size != 0:
            raise ValueError(f"ColumnParallelLinear: {dense.out_features} output features do not "
                             f"split over {world_size} ranks")
        self.weight = nn.Parameter(dense.weight.detach().chunk(world_size, 0)[rank].clone())  # (out/N, in)
        self.bias = (nn.Parameter(dense.bias.detach().chunk(world_size)[rank].clone())
                     if dense.bias is not None else None)  # (out/N,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_parallel(x) if self.copy_input else x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's share of ``dense`` split by its INPUT features (Megatron's rows of A; the columns
    of ``nn.Linear``'s weight): ``(..., in / N) -> (..., out)``, a partial sum that g adds up over
    the ranks. The bias is added once, after the sum."""

    def __init__(self, dense: nn.Linear, rank: int, world_size: int) -> None:
        super().__init__()
        _check_rank(rank, world_size, "RowParallelLinear")
        _check_linear(dense, "RowParallelLinear")
        if dense.in_features % world_size != 0:
            raise ValueError(f"RowParallelLinear: {dense.in_features} input features do not split "
                             f"over {world_size} ranks")
        self.weight = nn.Parameter(dense.weight.detach().chunk(world_size, 1)[rank].clone())  # (out, in/N)
        self.bias = nn.Parameter(dense.bias.detach().clone()) if dense.bias is not None else None

    def forward(self, x_part: torch.Tensor) -> torch.Tensor:
        out = reduce_from_parallel(F.linear(x_part, self.weight))  # (..., out), summed over ranks
        return out + self.bias if self.bias is not None else out


class ParallelMLP(nn.Module):
    """Lesson 04's ``FeedForward`` split over the ranks: ``(B, T, d) -> (B, T, d)`` on every rank,
    equal to ``dense(x)``. ``linear1`` column-parallel, the activation on each rank's own features
    (a column split keeps whole features, so the nonlinearity needs no communication),
    ``linear2`` row-parallel: one all-reduce forward (g), one backward (f).

    ``FeedForward`` only (linear1, an elementwise activation, linear2), not lesson 11's ``SwiGLU``.
    No dropout: a ``FeedForward`` with dropout > 0 runs in eval mode only (where dropout does
    nothing); in train mode it is refused rather than silently run without its dropout."""

    def __init__(self, dense: FeedForward, rank: int, world_size: int) -> None:
        super().__init__()
        if not isinstance(dense, FeedForward):
            raise TypeError(f"ParallelMLP: dense must be a course_lib FeedForward (lesson 04's "
                            f"linear1, activation, linear2), got {type(dense).__name__}; a gated "
                            f"feed-forward such as SwiGLU (gate, up, linear2) is not supported")
        _check_rank(rank, world_size, "ParallelMLP")
        self.linear1 = ColumnParallelLinear(dense.linear1, rank, world_size)
        self.activation = dense.activation
        self.linear2 = RowParallelLinear(dense.linear2, rank, world_size)
        self.dropout_p = dense.dropout.p  # not applied: refused in train mode (forward)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.dropout_p > 0:
            raise ValueError(f"ParallelMLP: the FeedForward it splits has dropout p={self.dropout_p}, "
                             "which ParallelMLP does not apply, so in train mode it would differ from "
                             "the dense layer; build the FeedForward with dropout=0.0 to train it "
                             "split, or call .eval() to run it without dropout")
        return self.linear2(self.activation(self.linear1(x)))  # (B, T, d_ff/N) in between


class ParallelSelfAttention(nn.Module):
    """Lesson 02's ``MultiHeadAttention`` (self-attention; grouped-query and rotary too) split over
    the ranks by heads: ``(B, T, d_model) -> (B, T, d_model)`` on every rank, equal to
    ``dense(x, x, x, mask)``.

    With H query heads and H_kv key/value heads, rank r holds query heads r*H/N .. (r+1)*H/N - 1
    and the KV heads they read, r*H_kv/N .. (r+1)*H_kv/N - 1 (whole groups). ``q_proj``, ``k_proj``
    and ``v_proj`` are column-parallel behind one f (each head's features are a contiguous block of
    output features); each rank runs course_lib's ``MultiHeadAttention`` code on its H/N heads
    (heads never mix before the output projection); ``out_proj`` is row-parallel, its partial sums
    added by g. One all-reduce forward (g), one backward (f). H and H_kv must divide by N.
    Dropout on the weights draws on each rank's own generator: use 0 (or ``eval()``) for equality.
    """

    def __init__(self, dense: MultiHeadAttention, rank: int, world_size: int) -> None:
        super().__init__()
        if not isinstance(dense, MultiHeadAttention):
            raise TypeError(f"ParallelSelfAttention: dense must be a course_lib "
                            f"MultiHeadAttention, got {type(dense).__name__}")
        _check_rank(rank, world_size, "ParallelSelfAttention")
        H, H_kv, N = dense.num_heads, dense.num_kv_heads, world_size
        if H % N != 0 or H_kv % N != 0:
            raise ValueError(f"ParallelSelfAttention: {H} query heads and {H_kv} key/value heads "
                             f"must both divide by the world size {N} (each rank keeps whole heads "
                             f"and whole KV groups); choose a world size that divides "
                             f"{math.gcd(H, H_kv)}")
        self.d_model, self.num_heads = dense.d_model, H // N  # this rank's heads: (B, T, H/N * hd)
        self.first_head = rank * self.num_heads
        with torch.device("meta"):  # its four Linear layers are replaced below: no memory, no RNG
            self.attention = MultiHeadAttention(
                self.num_heads * dense.head_dim, self.num_heads, dense.dropout.p,
                fused=dense.fused, num_kv_heads=H_kv // N, rotary=dense.rotary)
        self.attention.q_proj = ColumnParallelLinear(dense.q_proj, rank, N, copy_input=False)
        self.attention.k_proj = ColumnParallelLinear(dense.k_proj, rank, N, copy_input=False)
        self.attention.v_proj = ColumnParallelLinear(dense.v_proj, rank, N, copy_input=False)
        self.attention.out_proj = RowParallelLinear(dense.out_proj, rank, N)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        """``x: (B, T, d_model)``; ``mask`` as ``MultiHeadAttention.forward``'s (True = may attend;
        a 4-D mask with one slice per head gives this rank its heads' slices). Returns
        ``(B, T, d_model)``, the same on every rank."""
        if x.dim() != 3 or x.size(-1) != self.d_model:
            raise ValueError(f"ParallelSelfAttention: x must be (B, T, d_model={self.d_model}), "
                             f"got {tuple(x.shape)}")
        if mask is not None and mask.dim() == 4 and mask.size(1) > 1:  # one slice per head
            mask = mask[:, self.first_head: self.first_head + self.num_heads]  # (B, H/N, T, T)
        x = copy_to_parallel(x)  # f, once for Q, K and V
        k, v = self.attention.project_kv(x, x)  # (B, H_kv/N, T, hd) each
        return self.attention.attend(x, k, v, mask, is_causal=is_causal)  # g inside out_proj


# --- models, data and the training runs that compare the engines -------------------------------

def tiny_gpt(seed: int = 0, dtype: torch.dtype = torch.float64, **sizes: Any) -> GPT:
    """A small GPT (lesson 09's class) for the equality tests: 2 layers, d_model 32, 4 heads,
    vocabulary 67, 16 positions, by default, drawn with ``seed``, in ``dtype``."""
    config = dict(vocab_size=67, max_len=16, d_model=32, num_heads=4, num_layers=2)
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**config, **sizes})).to(dtype)


def random_batches(steps: int, batch_size: int, block: int = 16, vocab: int = 67,
                   seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches ``(x, y)`` of random token ids ``(batch_size, block)``, y = x moved by one."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        ids = torch.randint(0, vocab, (batch_size, block + 1), generator=gen)  # (B, T+1)
        out.append((ids[:, :-1], ids[:, 1:]))
    return out


ENGINES = ("one", "hand", "ddp", "zero1", "fsdp")
LR, BETAS, WEIGHT_DECAY = 1e-2, (0.9, 0.99), 0.1


def _step_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return lm_loss(model(x), y)


def train_one_process(batches: Sequence[tuple[torch.Tensor, torch.Tensor]], seed: int = 0,
                      **sizes: Any) -> dict[str, Any]:
    """The reference: ``tiny_gpt(seed)`` trained by AdamW on one process, one step per batch.
    Returns the first step's gradients, the losses, the final weights and the optimizer's bytes."""
    model = tiny_gpt(seed, **sizes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    losses, first_grads = [], None
    for x, y in batches:
        optimizer.zero_grad()
        loss = _step_loss(model, x, y)
        loss.backward()
        if first_grads is None:
            first_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
        losses.append(loss.item())
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"grads": first_grads, "losses": losses, "weights": weights,
            "optimizer_bytes": adamw_state_bytes(optimizer)}


def train_replica(rank: int, world_size: int, engine: str,
                  batches: Sequence[tuple[torch.Tensor, torch.Tensor]], seed: int = 0,
                  **sizes: Any) -> dict[str, Any]:
    """One rank of a data-parallel run of ``train_one_process``'s training: every rank draws the
    same model (the same seed), takes its 1/N share of each batch and trains with ``engine``:

    - ``"hand"``: ``average_gradients`` after backward, then ``torch.optim.AdamW``;
    - ``"ddp"``: PyTorch's ``DistributedDataParallel`` (it averages in buckets, during backward);
    - ``"zero1"``: ``average_gradients``, then ``ZeRO1AdamW`` (the optimizer state split);
    - ``"fsdp"``: PyTorch's FSDP2 ``fully_shard`` on every block and the whole model (weights,
      gradients and optimizer state split; the weights gathered for each block's use).

    Returns the first step's (averaged) gradients, the global losses, the final weights (whole),
    and the bytes this rank kept: parameters, gradients, optimizer state.
    """
    if engine not in ENGINES[1:]:
        raise ValueError(f"train_replica: engine must be one of {ENGINES[1:]}, got {engine!r}")
    model = tiny_gpt(seed, **sizes)
    trained: nn.Module = model
    if engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        trained = DistributedDataParallel(model)
    if engine == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model.blocks.layers:
            fully_shard(layer)
        fully_shard(model)
    if engine == "zero1":
        optimizer: Any = ZeRO1AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    losses, first_grads, grad_bytes = [], None, 0
    for x, y in batches:
        optimizer.zero_grad()
        loss = _step_loss(trained, rank_share(x, rank, world_size), rank_share(y, rank, world_size))
        loss.backward()
        if engine in ("hand", "zero1"):
            average_gradients(model)
        if first_grads is None:
            first_grads = {n: _whole(p.grad).clone() for n, p in model.named_parameters()}
            grad_bytes = sum(_local(p.grad).numel() * p.grad.element_size() for p in model.parameters())
        optimizer.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        losses.append(mean_loss.item() / world_size)
    param_bytes = sum(_local(p).numel() * p.element_size() for p in model.parameters())
    opt_bytes = optimizer.state_bytes() if engine == "zero1" else adamw_state_bytes(optimizer)
    weights = {n: _whole(p.detach()).clone() for n, p in model.named_parameters()}
    return {"grads": first_grads, "losses": losses, "weights": weights,
            "bytes": {"parameters": param_bytes, "gradients": grad_bytes, "optimizer": opt_bytes}}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def fsdp_expected_bytes(model: nn.Module, rank: int, world_size: int) -> dict[str, int]:
    """What FSDP2 keeps on ``rank``, computed: each parameter is split along its first dimension in
    ``world_size`` chunks of ceil(rows / N) rows (``torch.chunk``; the last rank may get fewer, or
    none); its gradient is split the same way, and AdamW keeps two moments per local number."""
    params = 0
    for p in model.parameters():  # a tied matrix is listed once
        rows = p.shape[0]
        chunk = math.ceil(rows / world_size)
        local_rows = max(0, min(chunk, rows - rank * chunk))
        params += local_rows * (p.numel() // rows) * p.element_size()
    return {"parameters": params, "gradients": params, "optimizer": 2 * params}


def ddp_bucket_timeline(rank: int, world_size: int, bucket_cap_mb: float, steps: int = 3,
                        seed: int = 0) -> dict[str, Any]:
    """When DDP sends each bucket of gradients, against when backward ends (float32, a 2-layer
    GPT of d_model 128). A communication hook stamps each bucket as it becomes ready (all of its
    gradients computed) and starts its all-reduce; backward continues meanwhile. Returns, for the
    last step: ``buckets`` [(ms after backward started, numbers in the bucket)], ``backward_ms``."""
    from torch.nn.parallel import DistributedDataParallel

    model = tiny_gpt(seed, torch.float32, d_model=128, max_len=64, num_layers=2)
    stamps: list[tuple[float, int]] = []

    def hook(state, bucket):  # no annotations: DDP checks them, and they are strings here
        stamps.append((time.perf_counter(), bucket.buffer().numel()))
        buffer = bucket.buffer().div_(world_size)
        work = dist.all_reduce(buffer, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    ddp.register_comm_hook(None, hook)
    x, y = random_batches(1, 16, 64, 67, seed)[0]
    result: dict[str, Any] = {}
    for _ in range(steps):
        stamps.clear()
        loss = lm_loss(ddp(x), y)
        start = time.perf_counter()
        loss.backward()  # returns once every bucket's all-reduce has finished
        end = time.perf_counter()
        result = {"buckets": [((t - start) * 1e3, n) for t, n in stamps],
                  "backward_ms": (end - start) * 1e3}
        ddp.zero_grad()
    return result


# --- 5. lower precision and recomputation --------------------------------------------------------

def precision_run(corpus: Any, seed: int, steps: int, bf16: bool) -> dict[str, Any]:
    """Lesson 09's recipe (``COURSE``: 1 layer, batch 32, AdamW, warm-up + cosine, clipping, the
    same model and batches as ``train_lm`` with this seed), shortened to ``steps`` steps, in float32
    or with the forward pass and the loss under CPU bf16 autocast (matrix products in bf16; the
    weights, their gradients and AdamW stay float32). Returns the per-step losses and the seconds
    per step (steps 2 on)."""
    from dataclasses import replace

    from .lm_training import COURSE, lm_optimizer, warmup_cosine

    recipe = replace(COURSE, num_steps=steps, warmup=max(1, steps // 10))
    torch.manual_seed(seed)
    model = GPT(recipe.config(len(corpus.vocab)))
    optimizer = lm_optimizer(model, recipe.lr, recipe.betas, recipe.weight_decay)
    ratio = recipe.min_lr / recipe.lr
    gen = torch.Generator().manual_seed(seed)
    losses, start = [], 0.0
    for step in range(steps):
        if step == 1:
            start = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = recipe.lr * warmup_cosine(step, recipe.warmup, steps, ratio)
        x, y = corpus.train_batch(recipe.batch_size, recipe.block_size, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = lm_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
        optimizer.step()
        losses.append(loss.item())
    seconds = (time.perf_counter() - start) / max(1, steps - 1)
    return {"losses": losses, "seconds_per_step": seconds}


def saved_activation_bytes(model: nn.Module, ids: torch.Tensor, checkpoint: bool) -> int:
    """Bytes of the tensors autograd keeps for backward during ``lm_loss(model(ids), targets)``,
    with or without activation checkpointing of every block (``torch.utils.checkpoint``: a block
    keeps only its input and recomputes the rest in backward). Counted by a saved-tensors hook, so
    the number is exact and the same on every machine (weights saved for backward are left out)."""
    from torch.utils.checkpoint import checkpoint as run_checkpointed

    parameters = {p.data_ptr() for p in model.parameters()}
    seen: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in parameters:
            seen[(t.data_ptr(), t.numel())] = t.numel() * t.element_size()
        return t

    x_ids, targets = ids[:, :-1], ids[:, 1:]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        T = x_ids.size(1)
        from .masks import causal_mask

        x = model.embed(x_ids)  # (B, T, d)
        mask = causal_mask(T, ids.device)
        for layer in model.blocks.layers:
            x = (run_checkpointed(layer, x, mask, use_reentrant=False) if checkpoint
                 else layer(x, mask))  # (B, T, d)
        loss = lm_loss(model.lm_head(model.blocks.norm(x)), targets)
    loss.backward()
    return sum(seen.values())


def load_precision_runs(path: str | None = None) -> dict[str, Any]:
    """The stored precision runs (``scripts/precision_runs.py``) of this machine's float path, or of
    the first path stored if this one has none (the runs are used for their shape, not bit for
    bit). Returns ``{"path", "steps", "runs": {"float32/0": {"losses", "seconds_per_step"}, ...}}``."""
    import json
    from pathlib import Path

    file = Path(__file__).resolve().parent / "results" / "precision_runs.json"
    if not file.exists():
        raise FileNotFoundError(f"{file.name} is missing: run `python scripts/precision_runs.py`")
    stored = json.loads(file.read_text())
    wanted = path or torch.backends.cpu.get_cpu_capability().lower()
    name = wanted if wanted in stored else sorted(stored)[0]
    return {"path": name, **stored[name]}
