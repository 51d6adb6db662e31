"""course_lib.data_parallel: the bucketed DDP container equals one process's training (float64, to
1e-12) with one bucket and many, its construction broadcasts rank 0's weights and buffers, its buckets
follow the documented rule, tied, frozen and unused parameters follow theirs, bad input gets clear
errors, and its timeline records every bucket's all-reduce. No process is left."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _helpers import running_children
from torch import nn

from course_lib.data_parallel import (
    MIB, BucketedDDP, bucket_timeline, plan_buckets, train_bucketed_replica,
)
from course_lib.gpt import lm_loss
from course_lib.launch import RankFailed, run_on_ranks
from course_lib.parallel import random_batches, rank_share, tiny_gpt, train_one_process


@pytest.fixture(autouse=True)
def no_process_left():
    yield
    assert running_children() == [], "a test left a process running"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The references are tiny models: one thread is faster than two on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max((a[n] - b[n]).abs().max().item() for n in b)


# --- the buckets -----------------------------------------------------------------------------------

def test_plan_buckets_reverse_order_and_cap():
    params = list(tiny_gpt(0).parameters())  # float64: 8 bytes a number
    cap_mb = 0.05
    plan = plan_buckets(params, cap_mb)
    flat = [i for bucket in plan for i in bucket]
    assert flat == list(reversed(range(len(params))))  # every parameter once, last one first
    sizes = [sum(params[i].numel() * 8 for i in bucket) for bucket in plan]
    assert all(s <= cap_mb * MIB for s in sizes)
    for bucket, nxt in zip(plan, plan[1:]):  # a bucket closes only when the next would not fit
        assert sum(params[i].numel() * 8 for i in bucket) + params[nxt[0]].numel() * 8 > cap_mb * MIB
    assert len(plan_buckets(params, 25.0)) == 1


def test_plan_buckets_frozen_large_and_dtypes():
    a, b = nn.Parameter(torch.zeros(10)), nn.Parameter(torch.zeros(1000))  # float32: 40, 4000 bytes
    frozen = nn.Parameter(torch.zeros(5), requires_grad=False)
    c = nn.Parameter(torch.zeros(10, dtype=torch.float64))
    d = nn.Parameter(torch.zeros(10, dtype=torch.float64))
    plan = plan_buckets([a, b, frozen, c, d], 1000 / MIB)  # a cap of 1000 bytes
    assert plan == [[4, 3], [1], [0]]  # frozen left out; b, larger than the cap, alone; dtypes apart


@pytest.mark.parametrize("size", [0, -1.0, float("nan"), float("inf"), True, "1", None])
def test_bad_bucket_sizes(size):
    with pytest.raises(ValueError, match="bucket_size_mb"):
        plan_buckets(list(tiny_gpt(0).parameters()), size)


def test_bad_input_outside_and_inside_a_group():
    with pytest.raises(TypeError, match="nn.Module"):
        BucketedDDP("a model", 1.0)
    with pytest.raises(ValueError, match="bucket_size_mb"):
        BucketedDDP(nn.Linear(2, 2), 0)
    with pytest.raises(RuntimeError, match="no process group"):
        BucketedDDP(nn.Linear(2, 2), 1.0)


# --- equal to one process ------------------------------------------------------------------------

def _three_sizes(rank: int, world_size: int, batches: list) -> list:
    return [train_bucketed_replica(rank, world_size, batches, size, 0, True) for size in (25.0, 0.05, 0.004)]


def test_equals_one_process_with_one_bucket_and_many():
    batches = random_batches(3, 8, seed=3)
    one = train_one_process(batches)
    for runs in run_on_ranks(_three_sizes, 2, (batches,)):  # replicas drawn from seeds 0 and 1
        assert [r["buckets"] for r in runs] == [1, 5, 26]
        for r in runs:
            assert _max_diff(r["grads"], one["grads"]) <= 1e-15
            assert _max_diff(r["weights"], one["weights"]) <= 1e-12


def test_three_ranks_equal_one_process():
    batches = random_batches(2, 6, seed=4)
    one = train_one_process(batches, seed=2)
    for r in run_on_ranks(train_bucketed_replica, 3, (batches, 0.02, 2, True)):
        assert _max_diff(r["weights"], one["weights"]) <= 1e-12


# --- construction, ties, frozen and unused parameters, errors (one run on the ranks) -------------

class _Extra(nn.Module):
    """tiny_gpt plus a buffer, a frozen matrix and a layer used only where ``use`` says."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.gpt = tiny_gpt(seed)
        torch.manual_seed(seed)
        self.register_buffer("scale", torch.rand(3, dtype=torch.float64))
        self.frozen = nn.Parameter(torch.randn(4, 4, dtype=torch.float64), requires_grad=False)
        self.side = nn.Linear(32, 1).double()

    def forward(self, x: torch.Tensor, use: bool = False) -> torch.Tensor:
        logits = self.gpt(x)
        if use:
            logits = logits + self.side(self.gpt.embed(x)).mean()
        return logits


def _rules(rank: int, world_size: int) -> dict:
    out: dict = {}
    model = _Extra(seed=rank)  # replicas drawn apart
    ddp = BucketedDDP(model, 0.01)
    out["weights"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    out["scale"] = model.scale.clone()
    out["hooked"] = sum(len(b) for b in ddp.buckets)
    out["names"] = [n for b in ddp.buckets for n in b]
    x, y = random_batches(1, 4, seed=1)[0]
    x, y = rank_share(x, rank, world_size), rank_share(y, rank, world_size)
    # a parameter unused everywhere, without find_unused_parameters: a clear error
    lm_loss(ddp(x), y).backward()
    try:
        ddp.finish_gradient_synchronization()
    except RuntimeError as err:
        out["unused_error"] = str(err)
    model.zero_grad()
    for name, call in (("finish_first", lambda: ddp.finish_gradient_synchronization()),):
        try:
            call()
        except RuntimeError as err:
            out[name] = str(err)
    # find_unused_parameters=True: `side` used on rank 0 only (a fresh model: the first container's
    # hooks stay on the first one's parameters)
    model = _Extra(seed=rank)
    ddp = BucketedDDP(model, 0.01, find_unused_parameters=True)
    lm_loss(ddp(x, use=rank == 0), y).backward()
    out["side_local"] = None if model.side.weight.grad is None else model.side.weight.grad.clone()
    ddp.finish_gradient_synchronization()
    out["side_grad"] = model.side.weight.grad.clone()
    out["frozen_grad"] = model.frozen.grad
    out["gpt_grads"] = {n: p.grad.clone() for n, p in model.gpt.named_parameters()}
    # no rank uses `side`: its .grad stays None
    model.zero_grad(set_to_none=True)
    lm_loss(ddp(x), y).backward()
    ddp.finish_gradient_synchronization()
    out["side_none"] = model.side.weight.grad is None
    # forward again before finishing, and two backwards before finishing
    loss = lm_loss(ddp(x, use=True), y)
    loss.backward(retain_graph=True)
    try:
        ddp(x)
    except RuntimeError as err:
        out["forward_pending"] = str(err)
    try:
        loss.backward()
    except RuntimeError as err:
        out["second_backward"] = str(err)
    return out


def test_construction_ties_frozen_unused_and_errors():
    results = run_on_ranks(_rules, 2)
    reference = _Extra(seed=0)
    for r in results:  # rank 1 drew other weights and another buffer: now rank 0's
        for n, p in reference.named_parameters():
            assert torch.equal(r["weights"][n], p.detach()), n
        assert torch.equal(r["scale"], reference.scale)
        # the tied token/lm_head matrix once; the frozen matrix without a hook
        n_hooked = sum(1 for p in reference.parameters() if p.requires_grad)
        assert r["hooked"] == n_hooked and "frozen" not in r["names"]
        assert "side.weight" in r["unused_error"] and "find_unused_parameters" in r["unused_error"]
        assert "after loss.backward()" in r["finish_first"]
        assert r["frozen_grad"] is None and r["side_none"]
        assert "finish_gradient_synchronization" in r["forward_pending"]
        assert "second backward" in r["second_backward"]
    # `side` had a gradient on rank 0 only: every rank gets rank 0's / 2 (rank 1 counts zeros)
    assert results[1]["side_local"] is None
    for r in results:
        assert torch.allclose(r["side_grad"], results[0]["side_local"] / 2, rtol=0, atol=1e-15)
    # the GPT's gradients: the whole batch's (one process), `side` not in the loss of rank 1
    x, y = random_batches(1, 4, seed=1)[0]
    model = _Extra(seed=0)
    for rank in range(2):
        xs, ys = rank_share(x, rank, 2), rank_share(y, rank, 2)
        (lm_loss(model(xs, use=rank == 0), ys) / 2).backward()
    expected = {n: p.grad for n, p in model.gpt.named_parameters()}
    for r in results:
        assert _max_diff(r["gpt_grads"], expected) <= 1e-15


def _mismatched(rank: int, world_size: int) -> None:
    BucketedDDP(nn.Linear(4, 4 + rank), 1.0)


def test_different_models_on_the_ranks_are_refused():
    with pytest.raises(RankFailed, match="every rank must wrap the same model"):
        run_on_ranks(_mismatched, 2, timeout=30)


def _no_trainable(rank: int, world_size: int) -> None:
    BucketedDDP(nn.Linear(2, 2).requires_grad_(False), 1.0)


def test_a_module_without_trainable_parameters_is_refused():
    with pytest.raises(RankFailed, match="no parameter that requires grad"):
        run_on_ranks(_no_trainable, 2, timeout=30)


# --- the timeline ---------------------------------------------------------------------------------

def test_bucket_timeline_records_every_bucket():
    model = tiny_gpt(0, torch.float32, d_model=128, max_len=64, num_layers=2)
    expected = [sum(list(model.parameters())[i].numel() for i in b)
                for b in plan_buckets(list(model.parameters()), 0.25)]
    for cap, sizes in ((0.25, expected), (25.0, [413_568])):
        for t in run_on_ranks(bucket_timeline, 2, (cap,)):
            assert [n for _, _, n, _ in t["reduces"]] == sizes
            assert all(is_async for _, _, _, is_async in t["reduces"])
            assert all(0 <= s <= e <= t["finish_ms"] + 1e-6 for s, e, _, _ in t["reduces"])
            assert all(s <= t["backward_ms"] for s, _, _, _ in t["reduces"])  # launched in backward
            assert t["backward_ms"] <= t["finish_ms"]
    assert len(expected) >= 5


def test_bucket_timeline_bad_size():
    with pytest.raises(ValueError, match="bucket_size_mb"):
        bucket_timeline(0, 2, -1)
