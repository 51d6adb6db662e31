"""Lesson-14 ZeRO checkers: three correct sharded optimizers pass, each named mistake is caught with
its own message, course_lib's and PyTorch's versions are refused, bad input gets a message, and no
process the checker starts is left running."""

from __future__ import annotations

import psutil
import pytest
import torch
import torch.distributed as dist
from torch import nn
from _helpers import assert_checkers_keep_random_state, passes, solution_namespace

from course_lib.checks import CheckFailure
from course_lib.checks.lesson14_zero import check_sharded_optimizer, check_zero_mixed_bytes
from course_lib.parallel import ZeRO1AdamW
from course_lib.sharding import ShardedOptimizer


@pytest.fixture(autouse=True)
def no_process_left():
    yield
    assert psutil.Process().children(recursive=True) == [], "a checker left a process running"


@pytest.fixture(scope="module")
def solution():
    return solution_namespace("14.sharded_optimizer")["ShardedOptimizer"]


class RoundRobin(torch.optim.Optimizer):
    """Another correct style: parameter i belongs to rank i % N, one optimizer_cls per parameter,
    built on the first step; the weights sent with one broadcast each."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.cls, self.kwargs, self.count = optimizer_cls, kwargs, 0
        self.mine = []  # (parameter, its group's options)
        self.owner = {}
        super().__init__(params, kwargs)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            self.owner[p] = self.count % dist.get_world_size()
            self.count += 1
            if self.owner[p] == dist.get_rank():
                options = {k: v for k, v in group.items() if k != "params"}
                self.mine.append(self.cls([{"params": [p], **options}], **self.kwargs))

    def step(self, closure=None):
        for optimizer in self.mine:
            optimizer.step()
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    dist.broadcast(p, src=self.owner[p])


class FlatSlices(torch.optim.Optimizer):
    """A third correct style, as the ZeRO paper: the parameters flattened into one vector, rank r
    owns the numbers [r * n/N, (r+1) * n/N) as copies that optimizer_cls steps (built at the first
    step, once every group is added); one all_gather sends the updated slices."""

    EXTRA = 0  # numbers each slice takes from the next (a mistake when > 0)

    def __init__(self, params, optimizer_cls, **kwargs):
        self.cls, self.kwargs, self.inner = optimizer_cls, kwargs, None
        super().__init__(params, kwargs)

    def _build(self):
        rank, world = dist.get_rank(), dist.get_world_size()
        self.n = sum(p.numel() for g in self.param_groups for p in g["params"])
        self.size = -(-self.n // world) + self.EXTRA
        start = rank * (self.size - self.EXTRA)
        end = min(start + self.size, self.n)
        self.pieces, groups, offset = [], [], 0
        for group in self.param_groups:
            copies = []
            for p in group["params"]:
                a, b = max(start - offset, 0), min(end - offset, p.numel())
                if a < b:
                    copy = nn.Parameter(p.detach().reshape(-1)[a:b].clone())
                    self.pieces.append((p, a, b, copy, offset + a - start))
                    copies.append(copy)
                offset += p.numel()
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": copies})
        self.inner = self.cls(groups, **self.kwargs)

    @torch.no_grad()
    def step(self, closure=None):
        if self.inner is None:
            self._build()
        for p, a, b, copy, _ in self.pieces:
            copy.grad = None if p.grad is None else p.grad.reshape(-1)[a:b].clone()
        self.inner.step()
        mine = torch.zeros(self.size, dtype=torch.float64)
        for _, a, b, copy, pos in self.pieces:
            mine[pos:pos + b - a] = copy
        slices = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(slices, mine)
        flat, offset = torch.cat(slices), 0
        for group in self.param_groups:
            for p in group["params"]:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()


def test_three_styles_pass(solution):
    assert passes(check_sharded_optimizer, solution)
    assert passes(check_sharded_optimizer, RoundRobin)
    assert passes(check_sharded_optimizer, FlatSlices)


def _variant(solution, **changes):
    """The solution with some methods replaced: a learner's mistake."""
    return type("ShardedOptimizer", (solution,), changes)


def _steps_everything(self, param_group):
    torch.optim.Optimizer.add_param_group(self, param_group)
    group = self.param_groups[-1]
    for p in group["params"]:
        self.owner[p] = 0
    options = {k: v for k, v in group.items() if k != "params"}
    if self.local is None:
        self.local = self.optimizer_cls([{"params": group["params"], **options}], **self.kwargs)
    else:
        self.local.add_param_group({"params": group["params"], **options})


def _no_broadcast(self, closure=None):
    self.local.step()


def _groups_lost(self, param_group):
    torch.optim.Optimizer.add_param_group(self, param_group)
    group = self.param_groups[-1]
    mine = []
    for p in group["params"]:
        rank = self.sizes.index(min(self.sizes))
        self.owner[p] = rank
        self.sizes[rank] += p.numel()
        mine += [p] if rank == self.rank else []
    if self.local is None:
        self.local = self.optimizer_cls(mine, **self.kwargs)  # the group's options dropped
    else:
        self.local.add_param_group({"params": mine})


def _overlapping(self, param_group):
    torch.optim.Optimizer.add_param_group(self, param_group)
    group = self.param_groups[-1]
    mine = []
    for i, p in enumerate(group["params"]):
        self.owner[p] = i % self.world_size
        if i % self.world_size == self.rank or i == 0:  # the first of each group on every rank
            mine.append(p)
    options = {k: v for k, v in group.items() if k != "params"}
    if self.local is None:
        self.local = self.optimizer_cls([{"params": mine, **options}], **self.kwargs)
    else:
        self.local.add_param_group({"params": mine, **options})


def _always_adamw(solution):
    def __init__(self, params, optimizer_cls, **kwargs):
        solution.__init__(self, params, torch.optim.AdamW, **kwargs)
    return _variant(solution, __init__=__init__)


def _only_init_groups(solution):
    """add_param_group not overridden: the groups of __init__ are shared out there, a later one never."""
    class OnlyInit(torch.optim.Optimizer):
        def __init__(self, params, optimizer_cls, **kwargs):
            super().__init__(params, kwargs)
            rank, world = dist.get_rank(), dist.get_world_size()
            self.owner, groups, i = {}, [], 0
            for group in self.param_groups:
                mine = []
                for p in group["params"]:
                    self.owner[p] = i % world
                    mine += [p] if i % world == rank else []
                    i += 1
                groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": mine})
            self.local = optimizer_cls(groups, **kwargs)

        def step(self, closure=None):
            self.local.step()
            with torch.no_grad():
                for p, owner in self.owner.items():
                    dist.broadcast(p, src=owner)
    return OnlyInit


def _zero_filled_grads(solution):
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)  # so that every rank has every gradient
        return solution.step(self, closure)
    return _variant(solution, step=step)


def _one_rank_owns_all(self, param_group):
    torch.optim.Optimizer.add_param_group(self, param_group)
    group = self.param_groups[-1]
    mine = []
    for p in group["params"]:
        self.owner[p] = 0
        mine += [p] if self.rank == 0 else []
    options = {k: v for k, v in group.items() if k != "params"}
    if self.local is None:
        self.local = self.optimizer_cls([{"params": mine, **options}], **self.kwargs)
    else:
        self.local.add_param_group({"params": mine, **options})


def _no_super_init(solution):
    """Keeps its own list of groups: Optimizer's __init__ never runs."""
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.owner, self.sizes, self.local = {}, [0] * self.world_size, None
        for group in params:
            self.add_param_group(group)
    return _variant(solution, __init__=__init__)


def _super_init_first(solution):
    """Optimizer's __init__ (which calls add_param_group) before the attributes it uses are set."""
    def __init__(self, params, optimizer_cls, **kwargs):
        torch.optim.Optimizer.__init__(self, params, kwargs)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.owner, self.sizes, self.local = {}, [0] * self.world_size, None
    return _variant(solution, __init__=__init__)


def _losing(*keys, later=False):
    """add_param_group that gives the wrapped optimizer a group without some of its options
    (``later``: every group after the first without its options)."""
    def add_param_group(self, param_group):
        torch.optim.Optimizer.add_param_group(self, param_group)
        group = self.param_groups[-1]
        mine = []
        for p in group["params"]:
            rank = self.sizes.index(min(self.sizes))
            self.owner[p] = rank
            self.sizes[rank] += p.numel()
            mine += [p] if rank == self.rank else []
        options = {k: v for k, v in group.items() if k != "params" and k not in keys}
        if self.local is None:
            kwargs = {} if "kwargs" in keys else self.kwargs
            self.local = self.optimizer_cls([{"params": mine, **options}], **kwargs)
        else:
            self.local.add_param_group({"params": mine, **({} if later else options)})
    return add_param_group


def _added_options_lost(solution):
    """The groups of __init__ shared out whole; add_param_group forgets the new group's options."""
    def add_param_group(self, param_group):
        if self.local is None or not hasattr(self, "built"):
            return solution.add_param_group(self, param_group)
        torch.optim.Optimizer.add_param_group(self, param_group)
        mine = []
        for p in self.param_groups[-1]["params"]:
            rank = self.sizes.index(min(self.sizes))
            self.owner[p] = rank
            self.sizes[rank] += p.numel()
            mine += [p] if rank == self.rank else []
        self.local.add_param_group({"params": mine})

    def __init__(self, params, optimizer_cls, **kwargs):
        solution.__init__(self, params, optimizer_cls, **kwargs)
        self.built = True
    return _variant(solution, __init__=__init__, add_param_group=add_param_group)


def _sent_from_rank_0(self, closure=None):
    self.local.step()
    for group in self.param_groups:
        for p in group["params"]:
            dist.broadcast(p.data, src=0)


def _zero_grad_own_share(self, set_to_none=True):
    self.local.zero_grad(set_to_none)


def _step_without_closure(solution):
    def step(self):
        return solution.step(self)
    return _variant(solution, step=step)


@pytest.mark.parametrize("make, words", [
    (_no_super_init, "torch.optim.Optimizer's own state was never set up"),
    (_super_init_first, r"runs before self.sizes is set"),
    (lambda s: _variant(s, add_param_group=_losing("lr")), "each group's lr is lost"),
    (lambda s: _variant(s, add_param_group=_losing("weight_decay")), "each group's weight_decay is lost"),
    (lambda s: _variant(s, add_param_group=_losing(later=True)),
     "the options of every group after the first are lost"),
    (lambda s: _added_options_lost(s), "the options of the group added by add_param_group"),
    (lambda s: _variant(s, add_param_group=_losing("lr", "weight_decay", "betas", "eps", "amsgrad",
                                                   "foreach", "maximize", "capturable",
                                                   "differentiable", "fused", "kwargs")),
     "built without the options"),
    (lambda s: _variant(s, zero_grad=_zero_grad_own_share), "still had a nonzero .grad"),
    (_step_without_closure, "step takes no closure"),
    (lambda s: _variant(s, step=_sent_from_rank_0), "the weights are sent from the wrong rank"),
])
def test_more_mistakes_are_named(solution, make, words):
    with pytest.raises(CheckFailure, match=words):
        check_sharded_optimizer(make(solution))


@pytest.mark.parametrize("make, words", [
    (lambda s: _variant(s, add_param_group=_steps_everything),
     "each rank keeps 1,136 bytes of optimizer state, as much as one process"),
    (lambda s: _variant(s, add_param_group=_one_rank_owns_all), "rank 0 keeps all 1,136 bytes"),
    (lambda s: _variant(s, step=_no_broadcast), "the two ranks' weights differ"),
    (lambda s: _variant(s, add_param_group=_groups_lost), "one lr and one weight decay for every"),
    (lambda s: _variant(s, add_param_group=_overlapping), r"a.bias is in the optimizer of ranks \[0, 1\]"),
    (_only_init_groups, "the parameter of the group added by add_param_group"),
    (_always_adamw, "never built the optimizer class it was given .optimizer_cls, here a subclass of "
                    "AdamW that the checker watches"),
    (_zero_filled_grads, "keeps state for unused.weight, whose .grad is None at every step"),
    (lambda s: type("FlatOverlap", (FlatSlices,), {"EXTRA": 3}), "Likely mistake: the ranks' shares overlap"),
])
def test_each_mistake_is_named(solution, make, words):
    with pytest.raises(CheckFailure, match=words):
        check_sharded_optimizer(make(solution))


def test_course_lib_and_pytorch_are_refused(solution):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    with pytest.raises(CheckFailure, match="course_lib's ShardedOptimizer"):
        check_sharded_optimizer(ShardedOptimizer)
    with pytest.raises(CheckFailure, match="course_lib's ShardedOptimizer"):
        check_sharded_optimizer(type("Mine", (ShardedOptimizer,), {}))

    class Wrapper(torch.optim.Optimizer):  # course_lib's, wrapped
        def __init__(self, params, optimizer_cls, **kwargs):
            super().__init__(params, kwargs)
            self.inner = ShardedOptimizer(self.param_groups, optimizer_cls, **kwargs)

        def step(self, closure=None):
            self.inner.step()

    with pytest.raises(CheckFailure, match="runs ShardedOptimizer inside"):
        check_sharded_optimizer(Wrapper)
    with pytest.raises(CheckFailure, match="course_lib's ZeRO1AdamW"):
        check_sharded_optimizer(ZeRO1AdamW)
    with pytest.raises(CheckFailure, match="PyTorch's ZeroRedundancyOptimizer"):
        check_sharded_optimizer(type("Mine", (ZeroRedundancyOptimizer,), {}))

    class Inside(torch.optim.Optimizer):  # PyTorch's, wrapped
        def __init__(self, params, optimizer_cls, **kwargs):
            super().__init__(params, kwargs)
            self.zero = ZeroRedundancyOptimizer([p for g in self.param_groups for p in g["params"]],
                                                optimizer_class=optimizer_cls, **kwargs)

        def step(self, closure=None):
            self.zero.step()

    with pytest.raises(CheckFailure, match="runs ZeroRedundancyOptimizer inside"):
        check_sharded_optimizer(Inside)


def test_course_lib_building_blocks_are_welcome(solution):
    from course_lib.parallel import average_gradients

    def step(self, closure=None):
        average_gradients  # noqa: B018 (reads a course_lib function: allowed)
        return solution.step(self, closure)

    assert passes(check_sharded_optimizer, _variant(solution, step=step))


def test_a_hang_is_stopped(solution, monkeypatch):
    import course_lib.checks.lesson14_zero as zero

    def step(self, closure=None):
        if self.rank == 0:
            dist.barrier()  # a collective only rank 0 calls
        return solution.step(self, closure)

    monkeypatch.setattr(zero, "TIME_LIMIT", 3.0)
    with pytest.raises(CheckFailure, match="on 2 ranks"):
        check_sharded_optimizer(_variant(solution, step=step))


def test_bad_input_gets_a_message(solution, capsys):
    with pytest.raises(CheckFailure, match="Hand in the class itself"):
        check_sharded_optimizer(lambda params, cls, **kw: None)
    with pytest.raises(CheckFailure, match="must be a torch.optim.Optimizer subclass"):
        check_sharded_optimizer(type("Plain", (), {}))

    class Stub(torch.optim.Optimizer):
        def __init__(self, params, optimizer_cls, **kwargs):
            raise NotImplementedError

    check_sharded_optimizer(Stub)
    assert "not implemented yet" in capsys.readouterr().out


def test_zero_mixed_bytes():
    assert passes(check_zero_mixed_bytes, solution_namespace("14.zero_mixed_bytes")["predicted_zero_mixed_bytes"])
    assert passes(check_zero_mixed_bytes, lambda: 4.19)  # rounded
    for wrong, words in [(16, "DDP"), (0.25, "ZeRO-3"), (2.21875, "ZeRO-2"), (0.1875, "state alone"),
                         (4.125, "master copy"), (8.125, "master weights are optimizer state"),
                         (10, "for 2 ranks"), (3, "Count what stays whole"),
                         (2.1875, "one of the two bf16 copies is missing"),
                         (8.1875, "master weights are counted twice"),
                         (6.1875, "counted at 4 bytes"),
                         (4.1875 * 7.5e9, "whole 7.5B-parameter model on one GPU"),
                         (3.14e10, "whole 7.5B-parameter model on one GPU"),
                         (31.40625, "in GB"), (33.5, "in bits"), (5.5, "for 8 ranks")]:
        with pytest.raises(CheckFailure, match=words):
            check_zero_mixed_bytes(lambda wrong=wrong: wrong)
    for bad in ("4.1875", None, float("nan"), True):
        with pytest.raises(CheckFailure, match="Return one number"):
            check_zero_mixed_bytes(lambda bad=bad: bad)


def test_checkers_keep_random_state(solution):
    assert_checkers_keep_random_state([
        (check_zero_mixed_bytes, solution_namespace("14.zero_mixed_bytes")["predicted_zero_mixed_bytes"]),
        (check_sharded_optimizer, solution),
    ])
