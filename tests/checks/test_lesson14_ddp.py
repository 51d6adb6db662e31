"""check_bucketed_ddp (lesson 14's ★★★ Build): two correct containers in different styles pass, each
named mistake is caught with its own message, PyTorch's DDP and course_lib's BucketedDDP are refused,
bad input gets a message, the stub is "not implemented", and no process is left running."""

from __future__ import annotations

import copy

import psutil
import pytest
import torch
import torch.distributed as dist
from _helpers import passes, solution_namespace
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course_lib.checks import CheckFailure
from course_lib.checks.lesson14_ddp import check_bucketed_ddp
from course_lib.data_parallel import BucketedDDP
from course_lib.parallel import tiny_gpt


@pytest.fixture(autouse=True)
def no_process_left():
    yield
    assert psutil.Process().children(recursive=True) == [], "a checker left a process running"


@pytest.fixture(scope="module", autouse=True)
def warm():
    """AdamW's first step imports torch._dynamo (seconds): once, before the ranks fork."""
    model = tiny_gpt(0)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    optimizer.step()


SOLUTION = solution_namespace("14.bucketed_ddp")["MyBucketedDDP"]


class InOrder(nn.Module):
    """Another style: DDP's bucket rule (closed once it reaches the cap), buckets launched in order,
    one preallocated flat buffer per bucket, and every .grad a view into it after the average."""

    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        for p in module.parameters():
            dist.broadcast(p.data, 0)
        for b in module.buffers():
            dist.broadcast(b, 0)
        cap = bucket_size_mb * 1024 * 1024
        params = [p for p in module.parameters() if p.requires_grad][::-1]
        self.buckets, nbytes = [[]], 0
        for p in params:
            if nbytes >= cap:
                self.buckets.append([])
                nbytes = 0
            self.buckets[-1].append(p)
            nbytes += p.numel() * p.element_size()
        self.flat = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype) for b in self.buckets]
        self.index = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        for p in params:
            p.register_post_accumulate_grad_hook(self.ready)
        self.count, self.next, self.works = [0] * len(self.buckets), 0, []

    def ready(self, p):
        self.count[self.index[id(p)]] += 1
        while self.next < len(self.buckets) and self.count[self.next] == len(self.buckets[self.next]):
            bucket, flat = self.buckets[self.next], self.flat[self.next]
            torch.cat([q.grad.reshape(-1) for q in bucket], out=flat)
            self.works.append(dist.all_reduce(flat, async_op=True))
            self.next += 1

    def forward(self, x):
        return self.module(x)

    def finish_gradient_synchronization(self):
        for work in self.works:
            work.wait()
        for bucket, flat in zip(self.buckets, self.flat):
            flat.div_(dist.get_world_size())
            start = 0
            for q in bucket:
                q.grad = flat[start:start + q.numel()].view_as(q)
                start += q.numel()
        self.count, self.next, self.works = [0] * len(self.buckets), 0, []


class Made(nn.Module):
    """A container with switches: each mistake is one switch away from a correct container."""

    broadcast_params = broadcast_buffers = divide = copy_back = reset = True
    wait_in_hook = sync = forward_order = drop_last = hook_frozen = per_param = in_finish = False
    count_frozen = divide_grad = divide_twice = zero_after = broadcast_trainable_only = False
    mb, width, cap_ignored, hook_all, reset_crashes = 2**20, None, False, False, False

    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for p in module.parameters() if self.broadcast_params else []:
                if p.requires_grad or not self.broadcast_trainable_only:
                    dist.broadcast(p, 0)
            for b in module.buffers() if self.broadcast_buffers else []:
                dist.broadcast(b, 0)
        cap = float("inf") if self.cap_ignored else bucket_size_mb * self.mb
        params = [p for p in module.parameters()
                  if p.requires_grad or self.hook_frozen or self.count_frozen]
        params = params if self.forward_order else params[::-1]
        self.buckets, current, size = [], [], 0
        for p in params:
            nbytes = p.numel() * (self.width or p.element_size())
            if current and (self.per_param or size + nbytes > cap):
                self.buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += nbytes
        if not self.drop_last:
            self.buckets.append(current)
        self.where = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        hooked = [p for p in module.parameters() if p.requires_grad] if self.hook_all else [
            p for b in self.buckets for p in b]
        for p in hooked:
            if p.requires_grad or not self.count_frozen:
                p.register_post_accumulate_grad_hook(self.hook)
        self.left, self.pending = [len(b) for b in self.buckets], []

    def hook(self, p):
        i = self.where[id(p)]
        self.left[i] -= 1
        if self.left[i] == 0 and not self.in_finish:
            self.launch(i)

    def launch(self, i):
        flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[i]])
        work = dist.all_reduce(flat, async_op=not self.sync)
        if self.wait_in_hook and work is not None:
            work.wait()
        self.pending.append((work, flat, self.buckets[i]))

    def forward(self, x):
        return self.module(x)

    def finish_gradient_synchronization(self):
        if self.in_finish:
            for i in range(len(self.buckets)):
                self.launch(i)
        for work, flat, bucket in self.pending:
            if work is not None:
                work.wait()
            if self.divide:
                flat /= dist.get_world_size() ** (2 if self.divide_twice else 1)
            start = 0
            for q in bucket:
                if self.copy_back:
                    q.grad.copy_(flat[start:start + q.numel()].view_as(q))
                if self.divide_grad:
                    q.grad /= dist.get_world_size()
                if self.zero_after:
                    q.grad.zero_()
                start += q.numel()
        if self.reset_crashes:
            self.pending = None  # a bug: "reset" to None, appended to at the next step
            return
        self.pending = []
        if self.reset:
            self.left = [len(b) for b in self.buckets]


def test_solutions_in_two_styles_pass_and_keep_the_random_state():
    """The solution, and another style (DDP's bucket rule, in-order launches, views as .grad)."""
    torch.manual_seed(123)
    assert passes(check_bucketed_ddp, SOLUTION)
    after = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(after, torch.rand(3))
    assert passes(check_bucketed_ddp, InOrder)


def _made(**switches):
    return type("MyBucketedDDP", (Made,), switches)


@pytest.mark.parametrize("switches, words", [
    (dict(broadcast_params=False), "no broadcast of rank 0's parameters at construction"),
    (dict(broadcast_buffers=False), "the buffers are not broadcast"),
    (dict(divide=False), "the sum is not divided by the world size"),
    (dict(wait_in_hook=True), "waited for right after its launch"),
    (dict(sync=True), "run synchronously during backward"),
    (dict(forward_order=True), "buckets built in forward order"),
    (dict(drop_last=True), "the last bucket, smaller than the others, is never launched"),
    (dict(copy_back=False), "not copied back into each p.grad"),
    (dict(hook_frozen=True), "registered on a parameter that does not require grad"),
    (dict(per_param=True), "one per parameter"),
    (dict(in_finish=True), "not during loss.backward()"),
    (dict(reset=False), "not reset after finish_gradient_synchronization"),
    (dict(mb=10**6), r"the cap counted in 10\^6 bytes"),
    (dict(count_frozen=True), "the frozen parameter is counted in a bucket"),
    (dict(drop_last=True, hook_all=True), "the last, partial bucket is dropped when the buckets are"),
    (dict(reset_crashes=True), "ran step 1 .all-reduces .5.., then raised TypeError in step 2"),
    (dict(copy_back=False, divide_grad=True), "own share's gradients divided by 2"),
    (dict(divide_twice=True), "divided by the world size twice"),
    (dict(zero_after=True), "your container zeroes the gradients"),
    (dict(cap_ignored=True), "the cap is not applied"),
    (dict(width=4), r"4 bytes a number \(float32\)"),
    (dict(mb=2**17), r"the sizes counted in bits \(x 8\)"),
    (dict(broadcast_trainable_only=True), "only the parameters that require grad are broadcast"),
])
def test_mistakes_are_named(switches, words):
    with pytest.raises(CheckFailure, match=words):
        check_bucketed_ddp(_made(**switches))


class WrapsDDP(nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.ddp = DistributedDataParallel(module, bucket_cap_mb=bucket_size_mb)

    def forward(self, x):
        return self.ddp(x)

    def finish_gradient_synchronization(self):
        pass


class WrapsOurs(nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.inner = BucketedDDP(module, bucket_size_mb)

    def forward(self, x):
        return self.inner(x)

    def finish_gradient_synchronization(self):
        self.inner.finish_gradient_synchronization()


def test_ready_made_containers_are_refused():
    with pytest.raises(CheckFailure, match="course_lib's BucketedDDP"):
        check_bucketed_ddp(BucketedDDP)
    with pytest.raises(CheckFailure, match="course_lib's BucketedDDP"):
        check_bucketed_ddp(type("Mine", (BucketedDDP,), {}))
    with pytest.raises(CheckFailure, match="PyTorch's DistributedDataParallel"):
        check_bucketed_ddp(DistributedDataParallel)
    for wrapper in (WrapsDDP, WrapsOurs):
        with pytest.raises(CheckFailure, match="build your own"):
            check_bucketed_ddp(wrapper)


class OnACopy(Made):
    """forward runs a copy of the module: the wrapped module's parameters get no gradient."""

    def __init__(self, module, bucket_size_mb):
        super().__init__(module, bucket_size_mb)
        self.copy = copy.deepcopy(module)

    def forward(self, x):
        return self.copy(x)


class NoForward(Made):
    forward = nn.Module.forward


def test_forward_mistakes_are_named():
    with pytest.raises(CheckFailure, match="forward does not run the module given"):
        check_bucketed_ddp(OnACopy)
    with pytest.raises(CheckFailure, match="no forward method"):
        check_bucketed_ddp(NoForward)


class NoFinish(nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)


class Stub(nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        raise NotImplementedError


def test_bad_input_and_the_stub(capsys):
    for bad in (None, "MyBucketedDDP", SOLUTION.__init__):
        with pytest.raises(CheckFailure, match="your container's class"):
            check_bucketed_ddp(bad)
    with pytest.raises(CheckFailure, match="no finish_gradient_synchronization"):
        check_bucketed_ddp(NoFinish)
    with pytest.raises(CheckFailure, match="raised TypeError while building"):
        check_bucketed_ddp(nn.Linear)
    check_bucketed_ddp(Stub)
    assert "not implemented yet" in capsys.readouterr().out
