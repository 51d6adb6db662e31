"""Checker for lesson 14's bucketed data-parallel container (the ★★★ Build).

* ``check_bucketed_ddp(cls)``: ``cls(module, bucket_size_mb)`` on 2 gloo processes, as
  ``course_lib.data_parallel.BucketedDDP``: ``forward`` runs the module; after ``loss.backward()``,
  ``finish_gradient_synchronization()`` leaves every rank with the whole batch's gradients. The
  checker draws the replicas from different seeds (rank 0's must win at construction), trains 3
  AdamW steps of a small float64 GPT and compares with one process (1e-12), with several buckets,
  then with one bucket and a frozen parameter. It counts every ``dist.all_reduce``: one per bucket
  of the documented size (the parameters in reverse order, each bucket at most ``bucket_size_mb`` MiB, or
  closed once it reaches it, as DDP's), asynchronous, launched during backward as soon as a bucket
  is complete, and not waited for until every bucket has been launched.

What it names, by what it observes: no broadcast at construction (of the buffers, of a frozen
parameter, or from another rank), the sum not divided by the world size or divided twice, each
all-reduce waited for right after its launch (or synchronous), buckets built in forward order or over
the cap (units: 10^6 bytes, numbers, float32, KiB, bits; no cap), the last bucket never launched (or
dropped when built), gradients not copied back from the flat buffer (left as they were, or only
divided), gradients zeroed or cleared by the container, hooks on parameters that do not require grad
or a frozen parameter counted in a bucket, one all-reduce per parameter, every all-reduce launched
after backward, forward not running the wrapped module (or missing), and state kept from the
previous step. PyTorch's ``DistributedDataParallel`` and course_lib's ``BucketedDDP`` are refused.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..data_parallel import MIB, BucketedDDP, plan_buckets
from ..gpt import lm_loss
from ..launch import RankFailed, RanksTimedOut, run_on_ranks
from ..parallel import BETAS, LR, WEIGHT_DECAY, random_batches, rank_share, tiny_gpt
from .common import CheckFailure, calls_to, checker, is_course_lib, one_thread, time_limit

__all__ = ["check_bucketed_ddp"]

TIMEOUT = 30.0  # seconds for the run on the ranks (about 1 s when right)
STEPS = 3
# (what the case is, bucket_size_mb, the position embedding frozen?); 2 ranks, replicas drawn from
# seeds 0 and 1, a 2-layer GPT of d_model 32 (float64, 28,128 numbers, 220 KiB)
CASES = [("several buckets: bucket_size_mb=0.05, 5 buckets", 0.05, False),
         ("one bucket: bucket_size_mb=25, the position embedding frozen (requires_grad=False)", 25.0,
          True)]
_COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "reduce",
                "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce_coalesced")
FROZEN = "embed.position.embedding.weight"


def _model(seed: int, frozen: bool) -> nn.Module:
    """tiny_gpt (float64, 35 parameters, the lm_head tied to the token table) with a buffer."""
    model = tiny_gpt(seed)
    model.register_buffer("marker", torch.full((3,), float(seed), dtype=torch.float64))
    if frozen:
        model.get_parameter(FROZEN).requires_grad_(False)
    return model


class _Watched:
    """A collective's work handle that records when it is waited for."""

    def __init__(self, work: Any, index: int, log: Callable[..., None]) -> None:
        self._work, self._index, self._log = work, index, log

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self._log("wait", self._index)
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _rank_run(rank: int, world_size: int, cls: Callable[..., Any], size: float, frozen: bool,
              batches: list) -> dict[str, Any]:
    """One case on this rank: build the learner's container around rank r's replica (seed r), then
    train; every collective logged with the phase and the number of gradients ready at the time.
    An error of the learner's code is returned (the other rank, running the same code, stops there
    too); NotImplementedError goes up (the stub)."""
    import torch.distributed.distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel

    record: dict[str, Any] = {"error": None, "steps": []}
    model = _model(rank, frozen)
    ready = [0]
    for p in model.parameters():  # registered first: they run before the learner's hooks
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda _: ready.__setitem__(0, ready[0] + 1))
    phase = ["build"]
    events: list[tuple] = []  # ("call" | "wait", index, phase, gradients ready, info)
    originals = {n: getattr(dist, n) for n in _COLLECTIVES if hasattr(dist, n)}

    def log(kind: str, index: int, **info: Any) -> None:
        events.append((kind, index, phase[0], ready[0], info))

    def counted(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            tensor = args[0] if args else kwargs.get("tensor")
            index = sum(1 for e in events if e[0] == "call")
            log("call", index, name=name, async_op=bool(kwargs.get("async_op", False)),
                numel=tensor.numel() if isinstance(tensor, torch.Tensor) else -1)
            work = original(*args, **kwargs)
            return _Watched(work, index, log) if work is not None else None
        return wrapper

    for name, original in originals.items():
        setattr(dist, name, counted(name, original))
        setattr(c10d, name, getattr(dist, name))
    refs = [BucketedDDP.__init__, BucketedDDP.forward, BucketedDDP.finish_gradient_synchronization,
            plan_buckets, DistributedDataParallel.__init__]
    try:
        with calls_to(refs) as seen:  # only while building: the profile hook is slow
            ddp = cls(model, size)
        record["refused"] = bool(seen) or isinstance(ddp, DistributedDataParallel) or (
            isinstance(ddp, nn.Module) and any(isinstance(m, DistributedDataParallel) for m in ddp.modules()))
        record["build"] = {"weights": {n: p.detach().clone() for n, p in model.named_parameters()},
                           "marker": model.marker.clone()}
        if record["refused"] or not callable(getattr(ddp, "finish_gradient_synchronization", None)):
            record["error"] = None if record["refused"] else ("missing", "", "build")
            return record
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
        for step, (x, y) in enumerate(batches):
            record["at_step"] = step
            optimizer.zero_grad()
            events.clear()
            ready[0] = 0
            phase[0] = "forward"
            loss = lm_loss(ddp(rank_share(x, rank, world_size)), rank_share(y, rank, world_size))
            phase[0] = "backward"
            loss.backward()
            if step == 0:
                record["after_backward"] = sum(p.grad is not None for p in model.parameters())
            phase[0] = "finish"
            ddp.finish_gradient_synchronization()
            phase[0] = "step"
            record["steps"].append(list(events))
            if step == 0:
                record["grads"] = {n: None if p.grad is None else p.grad.detach().clone()
                                   for n, p in model.named_parameters()}
            optimizer.step()
        record["weights"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    except NotImplementedError as err:
        if 'missing the required "forward"' not in str(err):
            raise
        record["error"] = ("no forward", str(err), phase[0])
    except Exception as err:  # noqa: BLE001 (reported to the learner by the parent)
        text = str(err).strip()
        record["error"] = (type(err).__name__, text.splitlines()[0] if text else "", phase[0])
        record["events"] = list(events)
        key = err.args[0] if isinstance(err, KeyError) and err.args else None
        record["key_param"] = next((n for n, p in model.named_parameters() if p is key or (
            isinstance(key, int) and id(p) == key)), None)
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
            setattr(c10d, name, original)
    return record


def _reference(seed: int, frozen: bool, batches: list, world: int) -> dict[str, Any]:
    """One process on the whole batches (first gradients, final weights); and each rank's own
    share's gradient at the first step."""
    model = _model(seed, frozen)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    grads = None
    for x, y in batches:
        optimizer.zero_grad()
        lm_loss(model(x), y).backward()
        if grads is None:
            grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    local = []
    for rank in range(world):
        model = _model(seed, frozen)
        x, y = batches[0]
        lm_loss(model(rank_share(x, rank, world)), rank_share(y, rank, world)).backward()
        local.append({n: p.grad for n, p in model.named_parameters()})
    return {"grads": grads, "weights": weights, "local": local}


def _partition(sizes: list[int], nbytes: list[int], cap: float, rule: str) -> list[int]:
    """Bucket sizes (numbers) of parameters taken in the given order: "at most" the cap (a bucket
    takes a parameter while it stays <= cap) or "reaches" it (closed once >= cap, DDP's rule)."""
    buckets: list[list[int]] = []
    total = 0
    for n, b in zip(sizes, nbytes):
        if not buckets or (rule == "at most" and total + b > cap) or (rule == "reaches" and total >= cap):
            buckets.append([])
            total = 0
        buckets[-1].append(n)
        total += b
    return [sum(bucket) for bucket in buckets]


def _close(a: Any, b: Any, tol: float) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and (a.double() - b.double()).abs().max().item() <= tol)


def _on_ranks(cls: Callable[..., Any], size: float, frozen: bool, batches: list,
              case: str) -> list[dict[str, Any]]:
    try:
        with time_limit(TIMEOUT + 10, f"The ranks ran for more than {TIMEOUT + 10:g} s ({case}) and "
                        "were stopped."):
            return run_on_ranks(_rank_run, 2, (cls, size, frozen, batches), timeout=TIMEOUT)
    except RanksTimedOut as err:
        raise CheckFailure(f"Your container did not finish on 2 ranks ({case}): {err}") from None
    except RankFailed as err:
        first = str(err).splitlines()[0]
        if "NotImplementedError" in first:
            raise NotImplementedError from None
        raise CheckFailure(f"Your container failed on 2 ranks ({case}): {first}") from None


@checker
def check_bucketed_ddp(cls: Callable[..., Any]) -> None:
    """Check ``cls(module, bucket_size_mb)``, a bucketed data-parallel container, on 2 gloo ranks
    (float64, 3 AdamW steps, to 1e-12), with its all-reduces counted and timed against backward."""
    from torch.nn.parallel import DistributedDataParallel

    if is_course_lib(cls) or (isinstance(cls, type) and issubclass(cls, BucketedDDP)):
        raise CheckFailure("That is course_lib's BucketedDDP: build your own container (the hooks, the "
                           "buckets, the asynchronous all-reduces).")
    if cls is DistributedDataParallel or (isinstance(cls, type) and issubclass(cls, DistributedDataParallel)):
        raise CheckFailure("That is PyTorch's DistributedDataParallel, the very thing to build: write your "
                           "own container (PyTorch's is welcome afterwards, in real training).")
    if not isinstance(cls, type):
        raise CheckFailure(f"Pass your container's class itself (MyBucketedDDP, not an instance or a "
                           f"call), got {type(cls).__name__}.")
    batches = random_batches(STEPS, 8, seed=5)  # 3 steps of 8 windows; each rank takes 4
    for case, size, frozen in CASES:
        with one_thread():  # first: the ranks fork with AdamW warmed up
            ref = _reference(0, frozen, batches, 2)
        records = _on_ranks(cls, size, frozen, batches, case)
        _check_case(records, ref, case, size, frozen)
    print(f"check_bucketed_ddp: on 2 ranks, replicas drawn apart end equal to one process after {STEPS} "
          "AdamW steps (1e-12), with one asynchronous all-reduce per bucket, launched during backward. "
          "Well done!")


def _check_case(records: list[dict[str, Any]], ref: dict[str, Any], case: str, size: float,
                frozen: bool) -> None:
    where = f"({case})"
    model = _model(0, frozen)
    named = [(n, p) for n, p in model.named_parameters()]
    trainable = [(n, p) for n, p in named if p.requires_grad]
    for rank, r in enumerate(records):
        if r.get("refused"):
            raise CheckFailure("Your container uses PyTorch's DistributedDataParallel or course_lib's "
                               "BucketedDDP (or its plan_buckets): build your own, from hooks and "
                               "dist.all_reduce.")
        if r["error"] is not None:
            done = r.get("at_step", 0)  # steps that ran to the end before the error
            if done:
                kind, message, phase = r["error"]
                raise CheckFailure(f"Observed {where}: your container ran step 1 (all-reduces "
                                   f"{_counts(r)}), then raised {kind} in step {done + 1} ({phase}) on "
                                   f"rank {rank}: {message}. Likely mistake: something kept from the "
                                   "previous step (the count of ready gradients, the handles, the "
                                   "buckets' buffers) is not reset after "
                                   "finish_gradient_synchronization().", mistake="state kept between steps")
            phase = r["error"][2]
            if r.get("key_param") and phase == "backward":
                _name_key_error(r["key_param"], trainable, size, where)
            if r.get("events") is not None and phase == "finish":
                _check_reduces(r["events"], r.get("after_backward"), trainable, size, where, frozen)
            _name_error(r["error"], rank, where, frozen)
    built = [r["build"] for r in records]
    apart = [n for n, _ in named if not torch.equal(built[1]["weights"][n], built[0]["weights"][n])]
    if apart == [FROZEN]:
        raise CheckFailure(f"Observed {where}: right after your container was built, the ranks agree on "
                           f"every trainable parameter, but the frozen one ({FROZEN}) still differs. "
                           "Likely mistake: only the parameters that require grad are broadcast; "
                           "broadcast every parameter (and buffer), frozen or not.",
                           mistake="frozen parameter not broadcast")
    if apart:
        raise CheckFailure(f"Observed {where}: right after your container was built, rank 1's weights "
                           "still differ from rank 0's (the checker draws rank r's replica from seed r). "
                           "Likely mistake: no broadcast of rank 0's parameters at construction.",
                           mistake="no broadcast at construction")
    if not all(torch.equal(built[0]["weights"][n], p.detach()) for n, p in named):
        raise CheckFailure(f"Observed {where}: after construction both ranks hold the same weights, but "
                           "not rank 0's (the ones drawn from seed 0). Likely mistake: the weights are "
                           "broadcast from another rank (src must be 0) or averaged.",
                           mistake="broadcast from the wrong rank")
    if not torch.equal(built[1]["marker"], built[0]["marker"]) or not torch.equal(
            built[0]["marker"], model.marker):
        raise CheckFailure(f"Observed {where}: after construction the ranks' weights agree, but the "
                           "model's buffer (model.marker) still differs from rank 0's. Likely mistake: "
                           "the buffers are not broadcast (module.buffers()).", mistake="buffers not broadcast")
    _check_reduces(records[0]["steps"][0], records[0].get("after_backward"), trainable, size, where,
                   frozen)
    for rank, r in enumerate(records):
        _check_grads(r["grads"], ref, rank, trainable, named, where, r.get("after_backward"))
    for rank, r in enumerate(records):
        diff = max((r["weights"][n] - ref["weights"][n]).abs().max().item() for n, _ in named)
        if diff > 1e-12:
            counts = _counts(r)
            if len(set(counts)) > 1:
                raise CheckFailure(
                    f"Observed {where}: your container called all_reduce {counts} times in steps 1, 2 and "
                    f"3, and rank {rank}'s weights after {STEPS} steps differ from one process's by "
                    f"{diff:.3g}. Likely mistake: something kept from the previous step (the count of "
                    "ready gradients, the handles, the buckets' buffers) is not reset after "
                    "finish_gradient_synchronization().", mistake="state kept between steps")
            raise CheckFailure(f"Observed {where}: the first step's gradients are right, and your "
                               f"container called all_reduce {counts[0]} times at every step, but rank "
                               f"{rank}'s weights after {STEPS} AdamW steps differ from one process's by "
                               f"{diff:.3g}. Likely mistake: something kept from the previous step (a "
                               "flat buffer added to rather than overwritten, old handles or buffers "
                               "copied back again) is not reset after finish_gradient_synchronization().",
                               mistake="state kept between steps")


def _name_error(error: tuple, rank: int, where: str, frozen: bool = False) -> None:
    kind, message, phase = error
    if kind == "missing":
        raise CheckFailure("Your container has no finish_gradient_synchronization() method: after "
                           "loss.backward() the checker calls it to wait for the all-reduces.")
    if kind == "no forward":
        raise CheckFailure(f"Observed {where}: calling your container raised NotImplementedError "
                           f"({message}). Likely mistake: no forward method (or it is misspelt): "
                           "forward(*inputs) must run the wrapped module and return its output.",
                           mistake="no forward")
    when = {"build": "while building your container", "forward": "in forward",
            "backward": "during loss.backward() (in a hook)", "finish": "in finish_gradient_synchronization()",
            "step": "in the optimizer step"}.get(phase, phase)
    low = message.lower()
    if phase == "build" and ("require" in low and "grad" in low):
        raise CheckFailure(f"Observed {where}: {kind} {when}: {message}. Likely mistake: a hook is "
                           "registered on a parameter that does not require grad (frozen); such a "
                           "parameter gets no gradient: leave it out of the hooks and the buckets.",
                           mistake="hook on a frozen parameter")
    if "nonetype" in low and frozen and phase in ("backward", "finish"):
        raise CheckFailure(f"Observed {where}: {kind} {when} on rank {rank}: {message}, only when a "
                           f"parameter is frozen ({FROZEN}, requires_grad=False); with every parameter "
                           "trainable your container ran. Likely mistake: the frozen parameter is in a "
                           "bucket: it never gets a .grad (None); leave parameters that do not require "
                           "grad out of the buckets.", mistake="frozen parameter in a bucket")
    if "nonetype" in low and "wait" in low and phase == "finish":
        raise CheckFailure(f"Observed {where}: {kind} {when} on rank {rank}: {message}. A bucket's "
                           "handle was None when waited for. Likely mistake: that bucket was never "
                           "launched (is every bucket, the last one too, launched from the hooks?).",
                           mistake="bucket never launched")
    if "does not require grad" in low and phase == "backward":
        raise CheckFailure(f"Observed {where}: {kind} {when} on rank {rank}: {message}. The loss has no "
                           "graph to the weights. Likely mistake: forward runs the module under "
                           "torch.no_grad() or detaches its output; return self.module(*inputs) as is.",
                           mistake="forward cut from the graph")
    if "nonetype" in low:
        raise CheckFailure(f"Observed {where}: {kind} {when} on rank {rank}: {message}. A .grad was None "
                           "where your code read it: frozen parameters (requires_grad=False) never get "
                           "one, and optimizer.zero_grad() sets every .grad to None between steps.")
    raise CheckFailure(f"Your container raised {kind} {when} on rank {rank} {where}: {message}")


def _counts(record: dict[str, Any]) -> list[int]:
    """How many all-reduces each completed step called."""
    return [sum(1 for e in s if e[0] == "call" and e[4]["name"] == "all_reduce") for s in record["steps"]]


def _name_key_error(name: str, trainable: list, size: float, where: str) -> None:
    """A hook raised KeyError for parameter ``name``: it is in none of the learner's buckets."""
    sizes = [p.numel() for _, p in trainable]
    nbytes = [p.numel() * p.element_size() for _, p in trainable]
    last = set()  # the parameters of the last bucket (the first ones in forward order)
    for rule in ("at most", "reaches"):
        left = _partition(sizes[::-1], nbytes[::-1], size * MIB, rule)[-1]
        for n, p in trainable:
            if left <= 0:
                break
            last.add(n)
            left -= p.numel()
    if name in last:
        raise CheckFailure(f"Observed {where}: your gradient hook raised KeyError for {name}, a parameter "
                           "of the last bucket (the first parameters, whose gradients come last). Likely "
                           "mistake: the last, partial bucket is dropped when the buckets are built, so "
                           "its parameters are in no bucket.", mistake="last partial bucket never launched")
    raise CheckFailure(f"Observed {where}: your gradient hook raised KeyError for {name}: that parameter "
                       "is in none of your buckets. Likely mistake: a parameter that requires grad is "
                       "left out when the buckets are built (every one must be in exactly one bucket).",
                       mistake="parameter in no bucket")


def _check_reduces(events: list, after_backward: int | None, trainable: list, size: float, where: str,
                   frozen: bool) -> None:
    """The all-reduces of the first step (rank 0's events): the buckets' sizes and order, async,
    during backward. ``after_backward``: how many parameters had a .grad right after backward."""
    sizes = [p.numel() for _, p in trainable]
    nbytes = [p.numel() * p.element_size() for _, p in trainable]
    total, cap = sum(sizes), size * MIB
    rev = (sizes[::-1], nbytes[::-1])
    expected = [_partition(*rev, cap, rule) for rule in ("at most", "reaches")]
    calls = [e for e in events if e[0] == "call" and e[4]["name"] == "all_reduce"]
    launched = [e[4]["numel"] for e in calls]
    if not calls and after_backward == 0:
        raise CheckFailure(f"Observed {where}: after loss.backward() no parameter of the wrapped module "
                           "has a .grad, and no all-reduce was launched. Likely mistake: forward does "
                           "not run the module given to your container (a copy, or another model); "
                           "forward(*inputs) must return self.module(*inputs).",
                           mistake="forward does not call the module")
    if frozen and sum(launched) < total:
        carried = (f"your all-reduces carry {launched} numbers, not all {total} gradients" if launched
                   else f"no all-reduce was launched (none of the {total} gradients averaged)")
        raise CheckFailure(f"Observed {where}: {carried}, only when a parameter is frozen ({FROZEN}, "
                           "requires_grad=False); with every parameter trainable every bucket was "
                           "launched. Likely mistake: the frozen parameter is counted in a bucket: it "
                           "gets no gradient, so its hook never runs and that bucket never completes; "
                           "leave parameters that do not require grad out of the buckets.",
                           mistake="frozen parameter in a bucket")
    if frozen and sum(launched) > total:
        raise CheckFailure(f"Observed {where}: your all-reduces carry {sum(launched)} numbers, more than "
                           f"the {total} gradients of the parameters that require grad, only when "
                           f"{FROZEN} is frozen. Likely mistake: the frozen parameter is in a bucket; "
                           "it has no gradient: leave it out of the buckets.",
                           mistake="frozen parameter in a bucket")
    if not calls:
        raise CheckFailure(f"Observed {where}: no dist.all_reduce during a training step. The checker "
                           "counts the calls made through dist.all_reduce (torch.distributed): call it "
                           "so, one per bucket.")
    sync = [e for e in calls if not e[4]["async_op"]]
    if sync and any(e[2] == "backward" for e in sync):
        raise CheckFailure(f"Observed {where}: {len(sync)} of your {len(calls)} all-reduces run "
                           "synchronously during backward (async_op=False): backward stops until each "
                           "one is done. Likely mistake: no overlap; launch them with async_op=True and "
                           "wait in finish_gradient_synchronization().", mistake="no overlap")
    if all(sorted(launched) != sorted(e) for e in expected):  # any launch order
        _name_buckets(launched, sizes, nbytes, cap, total, expected, trainable, where)
    if sync:
        raise CheckFailure(f"Observed {where}: your all-reduces are synchronous (async_op=False) in "
                           f"{sync[0][2]}: they must be launched with async_op=True during backward.",
                           mistake="synchronous all-reduce")
    phases = {e[2] for e in calls}
    if phases != {"backward"}:
        raise CheckFailure(f"Observed {where}: your all-reduces were launched in {sorted(phases)}, not "
                           "during loss.backward(). Likely mistake: no overlap; each bucket must leave "
                           "from a gradient hook as soon as its last gradient is ready.",
                           mistake="launched after backward")
    if len(calls) > 1:
        n_trainable = len(trainable)
        if calls[0][3] >= n_trainable:
            raise CheckFailure(f"Observed {where}: your first all-reduce starts only when all "
                               f"{n_trainable} gradients are ready, at the end of backward. Likely "
                               "mistake: the buckets wait for each other; each bucket must leave as soon "
                               "as its own gradients are ready.", mistake="launched at the end of backward")
        last_launch = max(i for i, e in enumerate(events) if e[0] == "call" and e[4]["name"] == "all_reduce")
        early = [e for e in events[:last_launch] if e[0] == "wait"]
        if early:
            raise CheckFailure(f"Observed {where}: {len(early)} all-reduce handle(s) waited for during "
                               "backward, before the next bucket was launched. Likely mistake: each "
                               "all-reduce is waited for right after its launch (in the hook), so backward "
                               "stops until it is done: no overlap. Wait in "
                               "finish_gradient_synchronization().", mistake="no overlap")


def _name_buckets(launched: list[int], sizes: list[int], nbytes: list[int], cap: float, total: int,
                  expected_all: list[list[int]], trainable: list, where: str) -> None:
    expected = expected_all[0]
    seen = f"Observed {where}: your all-reduces carry {launched} numbers, in launch order"
    if sorted(launched) == sorted(sizes) and len(launched) == len(sizes) and len(expected) < len(sizes):
        raise CheckFailure(f"{seen}: one per parameter ({len(sizes)}). The exercise asks for buckets: "
                           f"the parameters in reverse order, {len(expected)} bucket(s) of at most "
                           f"bucket_size_mb MiB here, {expected} numbers.", mistake="one all-reduce per parameter")
    forward = [_partition(sizes, nbytes, cap, rule) for rule in ("at most", "reaches")]
    if any(sorted(launched) == sorted(f) for f in forward):
        raise CheckFailure(f"{seen}: the buckets of the parameters taken in forward order "
                           f"({forward[0]}), not in reverse order ({expected}). Likely mistake: buckets "
                           "built in forward order; backward produces the last parameters' gradients "
                           "first.", mistake="buckets in forward order")
    for plan in expected_all:
        missing = Counter(plan) - Counter(launched)
        if missing and not Counter(launched) - Counter(plan):  # some buckets never launched
            left = sum(n * k for n, k in missing.items())
            if plan[-1] in missing:
                raise CheckFailure(
                    f"{seen}: {total - left} of the {total} gradients; the last bucket ({plan[-1]} "
                    f"numbers, with {trainable[0][0]}, the first parameter) is never all-reduced. "
                    "Likely mistake: the last bucket, smaller than the others, is never launched.",
                    mistake="last partial bucket never launched")
            raise CheckFailure(f"{seen}: {total - left} of the {total} gradients; bucket(s) of "
                               f"{sorted(missing)} numbers are never all-reduced. Likely mistake: a "
                               "bucket is never launched.", mistake="bucket never launched")
    rev_sizes, rev_bytes = sizes[::-1], nbytes[::-1]
    width = nbytes[0] // sizes[0]  # bytes a number (8, float64)
    if len(launched) == 1 and launched[0] == total and len(expected) > 1:
        raise CheckFailure(f"{seen}: one bucket of all {total} gradients ({total * width:,} bytes), where "
                           f"bucket_size_mb MiB holds {cap / width:g} float64 numbers ({expected}). "
                           "Likely mistake: the cap is not applied, or compared with a count of numbers "
                           "rather than bytes (numel() * element_size()), or turned into bits.",
                           mistake="buckets over the cap")
    for name, amounts, other_cap in (
            ("the cap counted in 10^6 bytes, not 2^20", rev_bytes, cap / MIB * 1e6),
            ("the cap counted in numbers, not bytes", rev_sizes, cap),
            ("the sizes counted at 4 bytes a number (float32), not p.element_size() (8 for float64)",
             [4 * n for n in rev_sizes], cap),
            ("the cap counted in KiB (2^10 bytes), not MiB (2^20)", rev_bytes, cap / 1024),
            ("the sizes counted in bits (x 8), the cap in bytes", [8 * b for b in rev_bytes], cap),
            ("the cap turned into bits (x 8), the sizes in bytes", rev_bytes, 8 * cap)):
        if any(sorted(launched) == sorted(_partition(rev_sizes, amounts, other_cap, r))
               for r in ("at most", "reaches")):
            raise CheckFailure(f"{seen}; with bucket_size_mb MiB of bytes (2^20 bytes a MiB, 8 bytes a "
                               f"float64) the buckets are {expected}. Likely mistake: {name}.",
                               mistake=name)
    over = [n for n in launched if n * width > cap + max(nbytes)]
    if over:
        raise CheckFailure(f"{seen}: bucket(s) of {over} numbers ({over[0] * width:,} bytes) are over "
                           f"bucket_size_mb = {cap / MIB:g} MiB ({cap:,.0f} bytes, {cap / width:g} "
                           f"float64 numbers); the buckets here are {expected}. Likely mistake: a bucket "
                           "is not closed when it is full (the cap compared with the wrong amount).",
                           mistake="buckets over the cap")
    raise CheckFailure(f"{seen}. The buckets for this bucket_size_mb are {expected} numbers: the "
                       "parameters that require grad in reverse order, a bucket taking parameters while "
                       "it stays at most bucket_size_mb MiB, one all-reduce per bucket.")


def _check_grads(g: dict, ref: dict, rank: int, trainable: list, named: list, where: str,
                 after_backward: int | None = None) -> None:
    names = [n for n, _ in trainable]
    missing = [n for n in names if g.get(n) is None]
    if missing and len(missing) == len(names) and after_backward:
        raise CheckFailure(f"Observed {where}: right after loss.backward() the parameters have their "
                           f".grad, but after finish_gradient_synchronization() rank {rank}'s .grad is "
                           "None for every one. Likely mistake: your container clears the gradients "
                           "(zero_grad() or p.grad = None) after the all-reduce; write the averaged "
                           "gradients into every p.grad.", mistake="gradients zeroed by the container")
    if missing:
        raise CheckFailure(f"Observed {where}: after finish_gradient_synchronization() rank {rank}'s "
                           f".grad is None for {missing[:3]}: write the averaged gradients into every "
                           "p.grad.")
    frozen = [n for n, p in named if not p.requires_grad and g.get(n) is not None]
    if frozen:
        raise CheckFailure(f"Observed {where}: the frozen parameter {frozen[0]} has a .grad after "
                           "finish_gradient_synchronization(); it requires no gradient: leave it out.",
                           mistake="gradient for a frozen parameter")
    expected, local = ref["grads"], ref["local"][rank]
    if all(_close(g[n], expected[n], 1e-12) for n in names):
        return
    if all(_close(g[n], 2 * expected[n], 1e-12) for n in names):
        raise CheckFailure(f"Observed {where}: every gradient is 2 times the whole batch's on 2 ranks: "
                           "the sum over the ranks. Likely mistake: the sum is not divided by the world "
                           "size (each rank's loss is a mean over its share).", mistake="sum not averaged")
    if all(_close(g[n], expected[n] / 2, 1e-12) for n in names):
        raise CheckFailure(f"Observed {where}: every gradient is half the whole batch's on 2 ranks. "
                           "Likely mistake: the sum is divided by the world size twice (say, the flat "
                           "buffer and again p.grad, or the loss scaled too).", mistake="divided twice")
    if all(_close(g[n], local[n], 1e-12) for n in names):
        raise CheckFailure(f"Observed {where}: your all-reduces ran, but rank {rank}'s gradients are still "
                           "those of its own share of the batch. Likely mistake: the averaged values "
                           "stay in the flat buffer; they are not copied back into each p.grad.",
                           mistake="not copied back from the flat buffer")
    if all(_close(g[n], local[n] / 2, 1e-12) for n in names):
        raise CheckFailure(f"Observed {where}: your all-reduces ran, but rank {rank}'s gradients are its "
                           "own share's gradients divided by 2 (the world size): the other rank's never "
                           "arrived. Likely mistake: the all-reduced flat buffer (torch.cat makes a "
                           "copy) is not copied back into each p.grad; p.grad is only divided.",
                           mistake="not copied back from the flat buffer")
    if all(g[n].abs().max().item() == 0 for n in names):
        raise CheckFailure(f"Observed {where}: every .grad is zero after finish_gradient_synchronization()."
                           " Likely mistake: your container zeroes the gradients (zero_grad, .zero_(), "
                           "or a zero buffer copied back before the all-reduced values are in it).",
                           mistake="gradients zeroed by the container")
    wrong = [n for n in names if not _close(g[n], expected[n], 1e-12)]
    own = [n for n in wrong if _close(g[n], local[n], 1e-12) or _close(g[n], local[n] / 2, 1e-12)]
    if own:
        raise CheckFailure(f"Observed {where}: {len(own)} parameter(s) keep rank {rank}'s own gradient "
                           f"({', '.join(own[:3])}{' ...' if len(own) > 3 else ''}); the others are "
                           "averaged. Is every bucket launched, waited for and copied back?",
                           mistake="some gradients not averaged")
    diff = max((g[n] - expected[n]).abs().max().item() for n in wrong)
    raise CheckFailure(f"Observed {where}: rank {rank}'s gradients after finish_gradient_synchronization() "
                       f"differ from one process's on the whole batch by up to {diff:.3g} "
                       f"({len(wrong)} of {len(names)} parameters), and none of the usual mistakes "
                       "explains it.")
