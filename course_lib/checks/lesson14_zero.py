"""Checkers for lesson 14's ZeRO exercises (sharded optimizer state).

* ``check_sharded_optimizer(cls)``: ``cls(params, optimizer_cls, **kwargs)``, a
  ``torch.optim.Optimizer`` that wraps any optimizer class and gives each rank the state of its
  share of the parameters only (ZeRO-1, as CS336's sharded optimizer), on 2 gloo processes:
  AdamW and SGD with momentum, two parameter groups with their own lr and weight decay and a third
  added by ``add_param_group``, parameters whose ``.grad`` is None, sizes that do not split
  evenly. Every rank must end with one process's weights (float64, 1e-12).
* ``check_zero_mixed_bytes(fn)``: ``fn() -> float``, the bytes per parameter each of 64 ranks keeps
  under ZeRO-1 with mixed-precision Adam (a "predict, then run" question; the reveal cell computes
  the ZeRO paper's table with ``course_lib.sharding.zero_bytes_per_parameter``).

Named mistakes: Optimizer's __init__ never run (super().__init__ missing), state not sharded, one
rank owning everything, overlapping shares, a parameter in no share, state for a parameter without
gradient, updated parameters never sent, the groups' options lost (all of them, lr or weight_decay
only, those of the later or the added group, or every option), zero_grad clearing only the rank's
share, the wrapped class ignored, step without closure. For the bytes: DDP, ZeRO-2/3, the state
alone, the wrong world size, a missing bf16 copy, fp32 weights counted twice, 4-byte bf16, the whole
7.5B model's bytes, GB, GiB or bits.

The checker watches what the learner's class builds: it passes its own subclasses of
``torch.optim.AdamW`` and ``torch.optim.SGD`` as ``optimizer_cls``, which record on each rank which
parameters every instance holds and what state it keeps. Every process it starts has ended when it
returns, whatever the learner's code did.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..launch import RankFailed, RanksTimedOut, run_on_ranks
from ..parallel import ZeRO1AdamW, average_gradients, rank_share
from ..sharding import ShardedOptimizer, zero_bytes_per_parameter
from .common import CheckFailure, calls_to, checker, is_course_lib, one_thread, run_learner, time_limit

__all__ = ["check_sharded_optimizer", "check_zero_mixed_bytes"]

TIME_LIMIT = 30.0  # seconds for one case on the ranks (well under one second when right)
STEPS = 4


@functools.cache
def _optimizer_attributes() -> frozenset[str]:
    """What torch.optim.Optimizer.__init__ sets on self (an AttributeError naming one: it never ran).
    Built on first use: an optimizer's constructor imports torch._dynamo (about a second), which
    every kernel that imports the checkers would otherwise pay."""
    return frozenset(vars(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)))


# What each rank's optimizer_cls instances are (reset in every rank's process).
_BUILT: list[torch.optim.Optimizer] = []


class WatchedAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` that records each instance built (the checker's ``optimizer_cls``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _BUILT.append(self)


class WatchedSGD(torch.optim.SGD):
    """``torch.optim.SGD`` that records each instance built (the checker's ``optimizer_cls``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _BUILT.append(self)


# name, the class handed in, the real class, its defaults (kwargs), the groups' own options
CASES = {
    "AdamW": (WatchedAdamW, torch.optim.AdamW, {"lr": 1e-2, "betas": (0.9, 0.99), "weight_decay": 0.05},
              ({"weight_decay": 0.1}, {"lr": 3e-2, "weight_decay": 0.0}, {"lr": 5e-3})),
    "SGD with momentum": (WatchedSGD, torch.optim.SGD, {"lr": 5e-2, "momentum": 0.9, "weight_decay": 0.05},
                          ({"weight_decay": 0.1}, {"lr": 2e-1, "weight_decay": 0.0}, {"lr": 2e-2})),
}
NEVER_GRAD = ("unused.weight", "unused.bias")  # .grad is None at every step
ADDED = "scale"  # the parameter of the group added by add_param_group


def _model() -> nn.Module:
    """float64: ``a`` (5 -> 7) used at every step, ``b`` (7 -> 3) from the second step on (no
    gradient at step 0), ``unused`` (3 -> 3) never, and ``scale`` (5,) from the third group:
    parameters of 35, 7, 21, 3, 9, 3 and 5 numbers, 83 in all (odd: no even split)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = nn.ModuleDict({"a": nn.Linear(5, 7), "b": nn.Linear(7, 3), "unused": nn.Linear(3, 3)})
        model.scale = nn.Parameter(torch.randn(5))
    return model.double()


def _groups(model: nn.Module, options: tuple[dict, ...]) -> tuple[list[dict], dict]:
    """The first two groups (weights; biases) and the one added later (``scale``)."""
    first = [{"params": [model[n].weight for n in ("a", "b", "unused")], **options[0]},
             {"params": [model[n].bias for n in ("a", "b", "unused")], **options[1]}]
    return first, {"params": [model.scale], **options[2]}


def _train(model: nn.Module, optimizer: Any, rank: int = 0, world_size: int = 1,
           kept: set[str] | None = None) -> None:
    """4 steps; ``kept`` collects the parameters whose .grad is neither None nor zero right after
    optimizer.zero_grad()."""
    gen = torch.Generator().manual_seed(11)
    for step in range(STEPS):
        x = rank_share(torch.randn(6, 5, generator=gen, dtype=torch.float64), rank, world_size)
        optimizer.zero_grad()
        if kept is not None:
            kept.update(n for n, p in model.named_parameters()
                        if p.grad is not None and bool(p.grad.ne(0).any()))
        h = model["a"](x)
        if step > 0:
            h = model["b"](torch.tanh(h))
        loss = h.square().mean() + (x * model.scale).square().mean()
        loss.backward()
        if world_size > 1:
            average_gradients(model)  # the gradients are averaged before the step, as in DDP
        optimizer.step()


def _names(model: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def _state_bytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values()
               if isinstance(t, torch.Tensor) and t.dim() > 0)


def _sharded_case(rank: int, world_size: int, cls: type, case: str) -> dict[str, Any]:
    """One rank: the learner's class around the case's watched optimizer, 4 steps; what it built."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    watched, _, kwargs, options = CASES[case]
    _BUILT.clear()
    model = _model()
    first, added = _groups(model, options)
    refused = [ShardedOptimizer.__init__, ZeRO1AdamW.__init__, ZeroRedundancyOptimizer.__init__]
    with calls_to(refused) as seen:
        optimizer = cls(first, watched, **kwargs)
        if not isinstance(optimizer, torch.optim.Optimizer):
            return {"not_optimizer": type(optimizer).__name__}
        optimizer.add_param_group(added)
        kept: set[str] = set()
        _train(model, optimizer, rank, world_size, kept)
    names = _names(model)
    built = []
    for inst in _BUILT:
        held = [names.get(id(p), "a copy") for g in inst.param_groups for p in g["params"]]
        state: dict[str, int] = {}  # bytes per parameter (all copies of pieces under "a copy")
        for p, s in inst.state.items():
            key = names.get(id(p), "a copy")
            state[key] = state.get(key, 0) + _state_bytes(s)
        built.append({"held": held, "state": state})
    groups = getattr(optimizer, "param_groups", None)
    listed = sorted(names.get(id(p), "?") for g in groups or [] for p in g.get("params", []))
    return {"weights": {n: p.detach().clone() for n, p in model.named_parameters()}, "built": built,
            "refused": sorted({f.__qualname__.split(".")[0] for f in seen}), "listed": listed,
            "kept": sorted(kept)}


def _reference(case: str, one_group: bool = False,
               lost: str = "") -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """One process: the real optimizer on the whole batches; weights and state bytes per parameter.
    ``one_group``: every parameter in one group with the defaults (the groups' options lost);
    ``lost``: "kwargs" (the real class's own defaults, no kwargs), "lr" or "weight_decay" (that
    option of every group lost), "added" (the added group's options lost), "later" (the options of
    every group after the first lost)."""
    _, real, kwargs, options = CASES[case]
    model = _model()
    if lost in ("lr", "weight_decay"):
        options = tuple({k: v for k, v in o.items() if k != lost} for o in options)
    if lost == "later":  # every group after the first with the defaults
        options = (options[0], {}, {})
    first, added = _groups(model, options)
    if lost == "kwargs":
        optimizer = real([p for g in first for p in g["params"]])
        optimizer.add_param_group({"params": added["params"]})
    elif one_group:
        optimizer = real([p for g in first for p in g["params"]], **kwargs)
        optimizer.add_param_group({"params": added["params"]})
    else:
        optimizer = real(first, **kwargs)
        optimizer.add_param_group({"params": added["params"]} if lost == "added" else added)
    _train(model, optimizer)
    names = _names(model)
    state = {names[id(p)]: _state_bytes(s) for p, s in optimizer.state.items()}
    return {n: p.detach().clone() for n, p in model.named_parameters()}, state


def _run_case(cls: type, case: str) -> list[dict[str, Any]]:
    hint = ("" if case == "AdamW" else "This case wraps torch.optim.SGD(momentum=0.9): build the class "
            "you are given, optimizer_cls(..., **kwargs), whatever it is.")
    try:
        with time_limit(TIME_LIMIT + 10, f"The ranks ran for more than {TIME_LIMIT + 10:g} s ({case}) "
                        "and were stopped."):
            return run_on_ranks(_sharded_case, 2, (cls, case), timeout=TIME_LIMIT)
    except RanksTimedOut as err:
        raise CheckFailure(f"Your optimizer did not finish on 2 ranks ({case}): {err}") from None
    except RankFailed as err:
        first = str(err).splitlines()[0]
        if "NotImplementedError" in first:
            raise NotImplementedError from None
        missing = re.search(r"AttributeError: '\w+' object has no attribute '(\w+)'", first)
        if missing and missing.group(1) in _optimizer_attributes():
            raise CheckFailure(
                f"Observed ({case}): {first}. torch.optim.Optimizer's own __init__ is what sets "
                f"self.{missing.group(1)} (and defaults, param_groups, state, its hooks): "
                "torch.optim.Optimizer's own state was never set up. Likely mistake: "
                "__init__ never calls super().__init__(params, kwargs) (or calls it too late).",
                mistake="super().__init__ never called") from None
        text = str(err)
        if missing and "optimizer.py" in text and "self.add_param_group" in text:
            raise CheckFailure(
                f"Observed ({case}): {first}, in your add_param_group, called from "
                "torch.optim.Optimizer's __init__ (it calls self.add_param_group for every group). "
                f"Likely mistake: super().__init__(params, kwargs) runs before self.{missing.group(1)} "
                "is set; set what add_param_group needs first, then call super().__init__.",
                mistake="attributes set after super().__init__") from None
        raise CheckFailure(f"Your optimizer failed on 2 ranks ({case}): {first}. {hint}".strip()) from None


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[n] - b[n]).abs().max().item() for n in b)


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tol: float = 1e-12) -> bool:
    return _max_diff(a, b) <= tol


def _check_shares(results: list[dict[str, Any]], state: dict[str, int], case: str) -> list[int]:
    """What the ranks' optimizers hold and keep; returns the state bytes per rank."""
    whole = sum(state.values())
    stepped = sorted(state)  # the parameters that had a gradient at some step
    per_rank = [sum(b for inst in r["built"] for b in inst["state"].values()) for r in results]
    for rank, r in enumerate(results):
        if not r["built"]:
            message = "the optimizer class passed as optimizer_cls is never built"
            raise CheckFailure(
                f"Observed ({case}): rank {rank} never built the optimizer class it was given "
                f"(optimizer_cls, here a subclass of {CASES[case][1].__name__} that the checker watches). Likely mistake: {message}: the "
                "class you wrap must be the one passed in, optimizer_cls(..., **kwargs), not one "
                "you chose (always AdamW, say).", mistake="wrapped class ignored")
    held = [{n for inst in r["built"] for n in inst["held"]} for r in results]
    by_param = all("a copy" not in h for h in held)
    if all(b >= whole for b in per_rank):
        message = ("every rank's optimizer steps every parameter: the state is not sharded; give each "
                   "rank's optimizer_cls only the parameters that rank owns")
        raise CheckFailure(f"Observed ({case}): each rank keeps {per_rank[0]:,} bytes of optimizer state, "
                           f"as much as one process ({whole:,}). Likely mistake: {message}.",
                           mistake="state not sharded")
    if by_param:
        for name in stepped:
            owners = [rank for rank, h in enumerate(held) if name in h]
            if len(owners) > 1:
                raise CheckFailure(
                    f"Observed ({case}): {name} is in the optimizer of ranks {owners}. Likely mistake: "
                    "the shares overlap; each parameter must belong to exactly one rank (the same "
                    "assignment computed on every rank).", mistake="shares overlap")
            if not owners:
                if name == ADDED:
                    raise CheckFailure(
                        f"Observed ({case}): {name}, the parameter of the group added by "
                        "add_param_group after construction, is in no rank's optimizer (it never "
                        "moves). Likely mistake: only the groups given to __init__ are shared out; "
                        "add_param_group must give its parameters to the ranks too (Optimizer's "
                        "__init__ calls add_param_group for every group, so overriding it covers "
                        "both).", mistake="parameter in no share")
                raise CheckFailure(f"Observed ({case}): {name} is in no rank's optimizer, so it never "
                                   "moves. Likely mistake: a parameter in no share; every parameter "
                                   "must belong to one rank.", mistake="parameter in no share")
        for rank, r in enumerate(results):
            for inst in r["built"]:
                for name in NEVER_GRAD:
                    if name in inst["state"]:
                        message = ("a parameter whose .grad is None gets optimizer state: on one "
                                   "process the optimizer skips it (no state, no step, no weight "
                                   "decay); leave its .grad None, do not fill it with zeros")
                        raise CheckFailure(
                            f"Observed ({case}): rank {rank}'s optimizer keeps state for {name}, whose "
                            f".grad is None at every step. Likely mistake: {message}.",
                            mistake="state for a parameter without gradient")
    if any(b >= whole for b in per_rank):
        rank = next(i for i, b in enumerate(per_rank) if b >= whole)
        raise CheckFailure(f"Observed ({case}): rank {rank} keeps all {whole:,} bytes of optimizer state, "
                           f"the other rank {min(per_rank):,}. Likely mistake: one rank owns every "
                           "parameter; split the parameters between the ranks (balance their sizes).",
                           mistake="state not sharded")
    if not by_param and sum(per_rank) != whole:
        more = sum(per_rank) > whole
        message = ("the ranks' shares overlap" if more else
                   "some numbers are in no rank's share (or the state is not the optimizer's)")
        raise CheckFailure(f"Observed ({case}): the ranks keep {' + '.join(f'{b:,}' for b in per_rank)} "
                           f"bytes of optimizer state, one process {whole:,}. Likely mistake: {message}.",
                           mistake="shares overlap" if more else "parameter in no share")
    return per_rank


def _check_weights(results: list[dict[str, Any]], case: str) -> None:
    expected, _ = _reference(case)
    start = {n: p.detach().clone() for n, p in _model().named_parameters()}
    w0, w1 = results[0]["weights"], results[1]["weights"]
    if not _close(w0, w1):
        apart = [n for n in w0 if not torch.allclose(w0[n], w1[n], rtol=0, atol=1e-12)]
        message = ("each rank updates only its own parameters and never sends them: after the local "
                   "step, broadcast each parameter from the rank that owns it (or all-gather)")
        raise CheckFailure(f"Observed ({case}): after {STEPS} steps the two ranks' weights differ ({', '.join(apart)} "
                           f"by up to {_max_diff(w0, w1):.3g}). Likely mistake: {message}.",
                           mistake="updated parameters never sent")
    if _close(w0, expected):
        return
    for name in NEVER_GRAD:
        if not torch.equal(w0[name], start[name]):
            message = ("a parameter whose .grad is None is stepped (weight decay moves it): the "
                       "optimizer on one process skips it; leave its .grad None")
            raise CheckFailure(f"Observed ({case}): {name}, whose .grad is None at every step, moved. "
                               f"Likely mistake: {message}.", mistake="parameter without gradient moved")
    stuck = [n for n in expected if n not in NEVER_GRAD and torch.equal(w0[n], start[n])]
    if stuck and len(stuck) < len(expected) - len(NEVER_GRAD):
        raise CheckFailure(f"Observed ({case}): every rank ends with the same weights, but "
                           f"{', '.join(stuck)} never moved although they have gradients (the others "
                           "did). "
                           "Likely mistake: their owner's update is overwritten: the weights are sent "
                           "from the wrong rank (the src of each broadcast must be the parameter's "
                           "owner).", mistake="sent from the wrong rank")
    for kept in (results[0].get("kept", []), results[1].get("kept", [])):
        if kept:
            raise CheckFailure(
                f"Observed ({case}): right after your optimizer's zero_grad(), {', '.join(kept)} still "
                "had a nonzero .grad. Likely mistake: zero_grad is overridden and clears only the "
                "wrapped optimizer's share (or nothing); leave Optimizer's own zero_grad, which reads "
                "param_groups (every parameter), or call it: super().zero_grad(set_to_none).",
                mistake="zero_grad not forwarded")
    options = {"lr": "each group's lr is lost (every group stepped with kwargs' lr), its weight decay "
                     "kept",
               "weight_decay": "each group's weight_decay is lost (every group with kwargs' "
                               "weight_decay), its lr kept",
               "added": "the options of the group added by add_param_group (its lr) are lost: the "
                        "wrapped optimizer got its parameters with the defaults",
               "later": "the options of every group after the first are lost: the wrapped optimizer "
                        "is built with the first group's, and its add_param_group gets the later "
                        "groups' parameters without their options (lr, weight_decay)",
               "kwargs": "the wrapped optimizer is built without the options: optimizer_cls(params) "
                         "with its own defaults, neither kwargs nor the groups' options"}
    matches = [why for lost, why in options.items() if _close(w0, _reference(case, lost=lost)[0])]
    if len(matches) == 1:
        raise CheckFailure(f"Observed ({case}): the weights are one process's with some options changed. "
                           f"Likely mistake: {matches[0]}; give each rank's optimizer its share of every "
                           "group with all the group's options (lr, weight_decay, ...).",
                           mistake="hyperparameters not passed")
    one_group, _ = _reference(case, one_group=True)
    if _close(w0, one_group):
        message = ("the parameter groups' own options are lost: every parameter is stepped with the "
                   "defaults (kwargs); give each rank's optimizer its share of every group, with the "
                   "group's options (lr, weight_decay, ...)")
        raise CheckFailure(f"Observed ({case}): the weights are one process's with one lr and one weight "
                           f"decay for every parameter. Likely mistake: {message}.",
                           mistake="parameter groups lost")
    wrong = [n for n in expected if not torch.allclose(w0[n], expected[n], rtol=0, atol=1e-12)]
    raise CheckFailure(f"Every rank ends with the same weights, but they differ from one "
                       f"{CASES[case][1].__name__}'s by up to {_max_diff(w0, expected):.3g} ({case}; "
                       f"{', '.join(wrong)}), and none of the usual mistakes explains it.")


@checker
def check_sharded_optimizer(cls: Any) -> None:
    """Check ``cls(params, optimizer_cls, **kwargs)`` on 2 gloo ranks, with AdamW and with SGD
    (momentum): each rank's optimizer_cls holds only its share of the parameters, and after 4 steps
    every rank has one process's weights (float64, 1e-12)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if not inspect.isclass(cls):
        raise CheckFailure(f"Hand in the class itself (ShardedOptimizer, not ShardedOptimizer(...)); got "
                           f"{type(cls).__name__}.")
    if issubclass(cls, ZeroRedundancyOptimizer):
        raise CheckFailure("That is PyTorch's ZeroRedundancyOptimizer, which does the whole job: build "
                           "the sharding yourself, with torch.distributed's collectives.")
    if is_course_lib(cls) or issubclass(cls, ShardedOptimizer):
        name = "ShardedOptimizer" if issubclass(cls, ShardedOptimizer) else cls.__name__
        raise CheckFailure(f"That is course_lib's {name}: build the sharding yourself (other "
                           "course_lib helpers are fine, the sharded optimizer is the exercise).")
    if not issubclass(cls, torch.optim.Optimizer):
        raise CheckFailure(f"{cls.__name__} must be a torch.optim.Optimizer subclass "
                           f"(class {cls.__name__}(torch.optim.Optimizer), with super().__init__(params, "
                           "kwargs)), so that zero_grad, param_groups and schedulers work as usual.")
    try:
        inspect.signature(cls.step).bind(None, None)  # (self, closure)
    except (TypeError, ValueError):
        raise CheckFailure(f"{cls.__name__}.step takes no closure: write step(self, closure=None), as "
                           "the text asks (any optimizer's step takes one; return closure's loss "
                           "when given).") from None
    summary = []
    with torch.random.fork_rng(devices=[]), one_thread():
        for case in CASES:
            results = _run_case(cls, case)
            for r in results:
                if "not_optimizer" in r:
                    raise CheckFailure(f"{cls.__name__}(...) built a {r['not_optimizer']}, not a "
                                       "torch.optim.Optimizer.")
                if r["refused"]:
                    raise CheckFailure(f"Your class runs {', '.join(r['refused'])} inside (course_lib's "
                                       "or PyTorch's own sharded optimizer): build the sharding "
                                       "yourself, with torch.distributed's collectives.")
            expected, state = _reference(case)
            if results[0]["listed"] != sorted(expected):
                raise CheckFailure(
                    f"Your optimizer's param_groups hold {results[0]['listed']}, not every parameter "
                    f"({sorted(expected)}) ({case}): keep every group whole in param_groups "
                    "(super().__init__(params, kwargs) and super().add_param_group(group)), and give "
                    "each rank's inner optimizer its share.")
            per_rank = _check_shares(results, state, case)
            _check_weights(results, case)
            summary.append(f"{case}: {' + '.join(f'{b:,}' for b in per_rank)} bytes of state on the 2 "
                           f"ranks (one process: {sum(state.values()):,})")
    print("check_sharded_optimizer: every rank ends with one process's weights (to 1e-12, float64), "
          "each keeping the state of its own parameters only; " + "; ".join(summary) + ". Well done!")


# --- Predict: ZeRO-1's bytes per parameter under mixed precision ---------------------------------

WORLD = 64


@checker
def check_zero_mixed_bytes(fn: Callable[[], Any]) -> None:
    """Check ``fn() -> float``: the bytes per parameter each of 64 ranks keeps under ZeRO-1 with
    mixed-precision Adam (bf16 weights and gradients, fp32 master weights, m and v)."""
    got = run_learner(fn, case="your prediction", hint="Return one number of bytes per parameter.")
    if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got):
        raise CheckFailure(f"Return one number (bytes per parameter), got {got!r}.")
    got = float(got)
    right = zero_bytes_per_parameter(1, WORLD)
    if abs(got - right) <= 0.01:
        print(f"check_zero_mixed_bytes: right, {right:g} bytes per parameter on each of {WORLD} ranks: "
              f"2 (bf16 weight) + 2 (bf16 gradient) on every rank, and 12/{WORLD} of the 12 bytes of "
              "fp32 master weight, m and v.")
        return
    named = [
        (16, "that is every byte on every rank (DDP): ZeRO-1 shards the optimizer state"),
        (zero_bytes_per_parameter(3, WORLD), "that is ZeRO-3 (FSDP), which shards the weights and the "
                                             "gradients too; ZeRO-1 shards only the optimizer state"),
        (zero_bytes_per_parameter(2, WORLD), "that is ZeRO-2, which shards the gradients too; ZeRO-1 "
                                             "shards only the optimizer state"),
        (12 / WORLD, "that is the optimizer state alone; every rank still keeps the whole bf16 weights "
                     "and gradients"),
        (4 + 8 / WORLD, "the optimizer state of mixed precision is 12 bytes: m and v (4 each) and the "
                        "fp32 master copy of the weight (4)"),
        (8 + 8 / WORLD, "the fp32 master weights are optimizer state too, sharded with m and v"),
        (zero_bytes_per_parameter(1, 2), "that is for 2 ranks; the question asks for 64"),
        (4 + 8 + 4 / WORLD, "fp32 master weights, m and v are the state that ZeRO-1 shards"),
        (16 / 2, "that shards everything over 2 ranks"),
        (2 + 12 / WORLD, "one of the two bf16 copies is missing: every rank keeps both the bf16 "
                         "weights (2 bytes) and the bf16 gradients (2 bytes) whole"),
        (2 + 2 + 4 + 12 / WORLD, "the fp32 master weights are counted twice: once whole (4 bytes) and "
                                 "once in the 12 bytes of optimizer state; they are only state"),
        (2 + 4 + 12 / WORLD, "a bf16 copy (weights or gradients) is counted at 4 bytes; bf16 is 2 bytes"),
    ]
    named += [(zero_bytes_per_parameter(1, n), f"that is for {n} ranks; the question asks for {WORLD}")
              for n in (4, 8, 16, 32, 128, 256, 512, 1024)]
    matches = [reason for value, reason in named if abs(got - value) <= 0.005]
    if len(matches) == 1:
        reason = matches[0]
        raise CheckFailure(f"Not quite: {got:g} bytes per parameter. Hint: {reason}.", mistake=reason)
    scaled = [(7.5e9, "that looks like the bytes of the whole 7.5B-parameter model on one GPU; the "
                      "question asks for bytes per parameter"),
              (7.5, "that is the whole 7.5B-parameter model in GB (10^9 bytes); the question asks for "
                    "bytes per parameter"),
              (7.5e9 / 2**30, "that is the whole 7.5B-parameter model in GiB; the question asks for "
                              "bytes per parameter"),
              (8, "that is in bits (8 a byte); the question asks for bytes"),
              (7.5e9 * 8, "that is the whole 7.5B-parameter model in bits; the question asks for bytes "
                          "per parameter"),
              (1e-9, "that is in GB per parameter; the question asks for bytes")]
    matches = [reason for factor, reason in scaled if abs(got - right * factor) <= 2e-3 * right * factor]
    if len(matches) == 1:
        raise CheckFailure(f"Not quite: {got:g}. Hint: {matches[0]}.", mistake=matches[0])
    raise CheckFailure(f"Not quite: {got:g} bytes per parameter. Count what stays whole on every rank "
                       "(bf16 weights and gradients) and what ZeRO-1 splits over the "
                       f"{WORLD} ranks (the 12 bytes of optimizer state).")
