"""Solutions to the exercises of lesson 14 (training at scale); see ``course_lib.solutions``."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.gpt import GPT, GPTConfig, lm_loss
from course_lib.parallel import average_gradients


# %% solution 14.accumulate
def my_accumulate(model, x, y, k):
    """Fill every p.grad with the gradient of lm_loss over the whole batch (B rows), from k
    micro-batches of B/k rows."""
    model.zero_grad()  # the previous step's gradients go first: backward adds into .grad
    for x_micro, y_micro in zip(x.chunk(k), y.chunk(k)):  # (B/k, T) each
        loss = lm_loss(model(x_micro), y_micro) / k  # a mean over B/k rows, weighted 1/k
        loss.backward()  # adds this micro-batch's share into .grad


# %% solution 14.average_gradients
def my_average_gradients(model):
    """On every rank after backward: each gradient becomes the mean over the ranks, in place."""
    world_size = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)  # in place: the sum over the ranks
            p.grad /= world_size  # each rank's loss is a mean over its share: average


# %% solution 14.zero1_bytes
def predicted_zero1_bytes():
    # AdamW keeps two float32 numbers per weight (exp_avg, exp_avg_sq): 2 * 4 = 8 bytes a weight.
    # ZeRO-1 on 2 ranks: each rank keeps them for half of the 217,344 weights.
    return 2 * 4 * 217_344 // 2


# %% solution 14.seeded_replicas
def train_by_hand(rank, world_size, batches):
    # The fix: every rank must start from the SAME weights. nanoGPT seeds each rank differently
    # (1337 + rank) and gets away with it because DDP copies rank 0's weights to every rank when it
    # wraps the model; averaging gradients by hand does not, so the replicas started apart and
    # stayed apart. Seed the model identically; a per-rank seed may come after (dropout, data).
    torch.manual_seed(1337)  # the same initial weights on every rank
    model = GPT(GPTConfig(vocab_size=67, max_len=16, d_model=32, num_heads=4, num_layers=2)).double()
    torch.manual_seed(1337 + rank)  # per-rank randomness from here on, if any is needed
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in batches:
        x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]  # this rank's share
        optimizer.zero_grad()
        lm_loss(model(x), y).backward()
        average_gradients(model)
        optimizer.step()
    return {name: p.detach() for name, p in model.named_parameters()}


# %% solution 14.parallel_mlp
class CopyToRanks(torch.autograd.Function):
    """Megatron's f: identity forward; backward sums x's gradient over the ranks. (The exercise
    before this one builds it as MyCopyToParallel; repeated here so that this solution stands
    alone: MyCopyToParallel.apply works as well.)"""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class SumOverRanks(torch.autograd.Function):
    """Megatron's g: forward sums the partial outputs over the ranks; backward is the identity.
    (MyReduceFromParallel of the exercise before.)"""

    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


class MyParallelMLP(nn.Module):
    """This rank's half of a dense FeedForward: (B, T, d) -> (B, T, d), equal to dense(x)."""

    def __init__(self, dense, rank, world_size):
        super().__init__()
        # linear1 split by output features (rows of its (d_ff, d) weight): whole hidden features,
        # so the activation needs nothing from the other ranks
        self.w1 = nn.Parameter(dense.linear1.weight.detach().chunk(world_size, 0)[rank].clone())
        self.b1 = nn.Parameter(dense.linear1.bias.detach().chunk(world_size)[rank].clone())
        # linear2 split by input features (columns of its (d, d_ff) weight): partial sums
        self.w2 = nn.Parameter(dense.linear2.weight.detach().chunk(world_size, 1)[rank].clone())
        self.b2 = nn.Parameter(dense.linear2.bias.detach().clone())  # added once, after the sum
        self.activation = dense.activation

    def forward(self, x):
        h = self.activation(F.linear(CopyToRanks.apply(x), self.w1, self.b1))  # (B, T, d_ff/N)
        return SumOverRanks.apply(F.linear(h, self.w2)) + self.b2  # (B, T, d)


# %% solution 14.f_and_g
class MyCopyToParallel(torch.autograd.Function):
    """Megatron's f: the identity forward; backward, the incoming gradient summed over the ranks."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)  # a new tensor object (a view): x itself is left as it is

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()  # all_reduce works in place: reduce a copy
        dist.all_reduce(grad)  # op=SUM by default: every rank's part of x's gradient counts whole
        return grad  # one gradient, for forward's one input


class MyReduceFromParallel(torch.autograd.Function):
    """Megatron's g: forward, the input summed over the ranks; backward, the identity."""

    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()  # the caller's tensor stays this rank's own partial result
        dist.all_reduce(total)  # in place on the copy: the sum over the ranks
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad  # each rank's input reaches the sum with weight 1


# %% solution 14.bucketed_ddp
class MyBucketedDDP(nn.Module):
    """Data parallel with buckets: all-reduces start during backward, one per bucket."""

    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        with torch.no_grad():  # every rank starts from rank 0's weights and buffers
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0)
        # buckets of at most bucket_size_mb MiB, the last parameters first (backward's order)
        cap = bucket_size_mb * 2**20
        self.buckets, size = [], 0
        for p in reversed(list(module.parameters())):
            if not p.requires_grad:  # frozen: no gradient, no hook
                continue
            nbytes = p.numel() * p.element_size()
            if not self.buckets or size + nbytes > cap:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += nbytes
        self.bucket_of = {p: i for i, bucket in enumerate(self.buckets) for p in bucket}
        for p in self.bucket_of:
            p.register_post_accumulate_grad_hook(self._grad_ready)
        self._reset()

    def _reset(self):
        self.waiting = [len(bucket) for bucket in self.buckets]  # gradients still to come
        self.pending = []  # (handle, flat, bucket) of the all-reduces in flight

    def _grad_ready(self, p):  # called by backward once p.grad is complete
        i = self.bucket_of[p]
        self.waiting[i] -= 1
        if self.waiting[i] == 0:  # the bucket's last gradient: send it now, do not wait
            bucket = self.buckets[i]
            flat = torch.cat([q.grad.flatten() for q in bucket])  # (numbers in the bucket,)
            handle = dist.all_reduce(flat, async_op=True)
            self.pending.append((handle, flat, bucket))

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def finish_gradient_synchronization(self):
        for handle, flat, bucket in self.pending:
            handle.wait()
            flat /= dist.get_world_size()  # the sum over the ranks -> the mean
            for q, g in zip(bucket, flat.split([q.numel() for q in bucket])):
                q.grad.copy_(g.view_as(q))
        self._reset()


# %% solution 14.sharded_optimizer
class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1 around any optimizer: each rank keeps the state of the parameters it owns only."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.owner = {}  # parameter -> the rank that steps it
        self.sizes = [0] * self.world_size  # numbers owned by each rank so far
        self.local = None  # this rank's optimizer, of its own parameters only
        super().__init__(params, kwargs)  # calls self.add_param_group for every group

    def add_param_group(self, param_group):
        super().add_param_group(param_group)  # the whole group, in self.param_groups
        group = self.param_groups[-1]
        mine = []
        for p in group["params"]:
            rank = self.sizes.index(min(self.sizes))  # the least loaded rank (the same on every rank)
            self.owner[p] = rank
            self.sizes[rank] += p.numel()
            if rank == self.rank:
                mine.append(p)
        options = {key: value for key, value in group.items() if key != "params"}  # lr, ...
        if self.local is None:
            self.local = self.optimizer_cls([{"params": mine, **options}], **self.kwargs)
        else:
            self.local.add_param_group({"params": mine, **options})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.local.step()  # this rank's parameters only (a .grad of None is skipped)
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p.data, src=self.owner[p])  # the owner's updated weights to all
        return loss


# %% solution 14.zero_mixed_bytes
def predicted_zero_mixed_bytes():
    # Every rank keeps the bf16 weight (2 bytes) and its bf16 gradient (2 bytes) whole; ZeRO-1
    # splits the 12 bytes of optimizer state (fp32 master weight, m, v) over the 64 ranks.
    return 2 + 2 + 12 / 64
