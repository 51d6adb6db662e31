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
    """Megatron's f: identity forward; backward sums x's gradient over the ranks."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class SumOverRanks(torch.autograd.Function):
    """Megatron's g: forward sums the partial outputs over the ranks; backward is the identity."""

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
