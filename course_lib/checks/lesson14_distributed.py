"""Checkers for lesson 14 (training beyond one core).

* ``check_accumulation(fn)``: ``fn(model, x, y, k)`` fills every ``p.grad`` with the whole batch's
  gradient from k micro-batches (float64, from stale gradients).
* ``check_average_gradients(fn)``: ``fn(model)`` on every rank after backward: every rank's gradients
  become one process's on the whole batch (2 and 3 gloo processes).
* ``check_zero1_bytes(fn)``: ``fn() -> int``, the predicted bytes of AdamW's state per rank with
  ZeRO-1 on 2 ranks (a "predict, then run" question; the reveal cell measures it with
  ``course_lib.parallel.measure_zero1_bytes``).
* ``check_seeded_replicas(fn)``: the fixed ``fn(rank, world_size, batches) -> {name: weight}`` (the
  Debug exercise): both ranks end with one process's weights.
* ``check_parallel_mlp(cls)``: ``cls(dense, rank, world_size)``, Megatron's MLP on 2 ranks: the dense
  ``FeedForward``'s output and gradients, half of each matrix per rank (copies: no memory shared
  with the dense layer), one all-reduce each way.

The checkers of the distributed exercises run the learner's code on 2 gloo processes themselves
(``course_lib.launch.run_on_ranks``: forked from the notebook's kernel on Linux, so a function
defined in a cell runs there as it is), each run under a time limit; every process they start has
ended when they return, whatever the learner's code did.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..gpt import GPT, GPTConfig, lm_loss
from ..launch import RankFailed, RanksTimedOut, run_on_ranks
from ..layers import FeedForward
from ..parallel import (
    ColumnParallelLinear, CopyToParallel, ParallelMLP, ReduceFromParallel, RowParallelLinear,
    accumulate_gradients, average_gradients, random_batches, rank_share,
)
from .common import (
    CheckFailure, calls_to, checker, is_course_lib, one_thread, plain, run_learner, time_limit,
)
from .lesson14_megatron_mistakes import (
    mlp_layout, name_mlp_layout, name_scale, name_zero1_bytes, watch_mlp_calls,
)
from .lesson14_mistakes import (
    describe_rows, fit_micro_weights, label_rank_gradients, name_accumulation, name_averaging,
    replica_runs,
)

__all__ = ["check_accumulation", "check_average_gradients", "check_zero1_bytes",
           "check_seeded_replicas", "check_parallel_mlp", "LESSON_GPT_PARAMETERS"]

TIME_LIMIT = 60.0  # seconds for one run on the ranks (a few tenths of a second when right)
# Lesson 09's recipe (COURSE): a 1-layer GPT of d_model 128 on 83 characters, float32.
LESSON_GPT_PARAMETERS = 217_344


def _small_gpt(seed: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=67, max_len=16, d_model=32, num_heads=4, num_layers=2)).double()


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[n].double() - b[n].double()).abs().max().item() for n in b)


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tol: float = 1e-12) -> bool:
    return set(a) == set(b) and all(a[n].shape == b[n].shape for n in b) and _max_diff(a, b) <= tol


def _on_ranks(fn: Callable[..., Any], world_size: int, args: tuple, case: str, hint: str = "") -> list:
    """Run a checker's rank function; the learner's error, a hang or a crash becomes a CheckFailure."""
    try:
        with time_limit(TIME_LIMIT + 10, f"The ranks ran for more than {TIME_LIMIT + 10:g} s ({case}) "
                        "and were stopped."):
            return run_on_ranks(fn, world_size, args, timeout=TIME_LIMIT)
    except RanksTimedOut as err:
        raise CheckFailure(f"Your code did not finish on {world_size} ranks ({case}): {err}") from None
    except RankFailed as err:
        text = str(err)
        if "NotImplementedError" in text.splitlines()[0]:
            raise NotImplementedError from None
        first = text.splitlines()[0]
        raise CheckFailure(f"Your code failed on {world_size} ranks ({case}): {first}. {hint}".strip()) from None


# --- 1. gradient accumulation (one process) -----------------------------------------------------

@checker
def check_accumulation(fn: Callable[..., Any]) -> None:
    """Check ``fn(model, x, y, k)``: fills every ``p.grad`` with the whole batch's gradient, from k
    micro-batches of B/k rows, in float64 (to 1e-12), starting from stale gradients."""
    if is_course_lib(fn):
        raise CheckFailure("That is course_lib's accumulate_gradients: write the loop yourself.")
    with torch.random.fork_rng(devices=[]), one_thread():
        cases = [("B=12, k=2", 12, 2, 0), ("B=6, k=3", 6, 3, 2), ("B=12, k=4", 12, 4, 1)]
        for case, batch, k, seed in cases:
            x, y = random_batches(1, batch, seed=seed)[0]
            reference = _small_gpt(seed)
            reference.zero_grad()
            lm_loss(reference(x), y).backward()
            expected = {n: p.grad for n, p in reference.named_parameters()}
            model = _small_gpt(seed)
            stale = {n: torch.full_like(p, 0.5) for n, p in model.named_parameters()}
            for n, p in model.named_parameters():
                p.grad = stale[n].clone()  # the previous step's gradients, still there
            fed: list[torch.Tensor] = []
            handle = model.register_forward_pre_hook(
                lambda m, args, kwargs: _record_input(fed, args, kwargs), with_kwargs=True)
            try:
                with time_limit(60.0, f"Your code ran for more than 60 s ({case}) and was stopped."):
                    run_learner(fn, model, x, y, k, case=case)
            finally:
                handle.remove()
            grads = {n: p.grad for n, p in model.named_parameters()}
            if any(g is None for g in grads.values()):
                raise CheckFailure(f"Some .grad is None after your function ({case}): call backward on "
                                   "each micro-batch's loss (and do not set the gradients to None "
                                   "after the last one).")
            _accumulation_rows(fed, x, k, case)
            if _close(grads, expected):
                continue
            _name_accumulation_mistake(grads, fed, x, y, stale, seed, k, case)
            raise CheckFailure(f"Your gradients differ from the whole batch's by up to "
                               f"{_max_diff(grads, expected):.3g} ({case}), and none of the usual "
                               "mistakes explains it.")
    print(f"check_accumulation: all {len(cases)} cases equal one big batch (to 1e-12 in float64). "
          "Well done!")


def _record_input(fed: list[torch.Tensor], args: tuple, kwargs: dict) -> None:
    """A forward pre-hook's note of the token ids the model is called with, positional or not."""
    given = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    if given:
        fed.append(given[0].detach().clone())


def _accumulation_rows(fed: list[torch.Tensor], x: torch.Tensor, k: int, case: str) -> None:
    """Refuse micro-batches that are not k pieces of B/k rows, or that do not hold every row once."""
    batch, block = x.shape
    about = describe_rows([tuple(t.shape) for t in fed], batch, block, k)
    if about is not None:
        raise CheckFailure(f"Observed ({case}): {about}.", mistake=about)
    seen = torch.cat(fed)  # (B, T), the rows in the order the model saw them
    counts = [int((seen == row).all(dim=1).sum()) for row in x]
    if counts != [1] * batch and len({tuple(r.tolist()) for r in x}) == batch:
        missing = [i for i, c in enumerate(counts) if c == 0]
        twice = [i for i, c in enumerate(counts) if c > 1]
        message = (f"the micro-batches do not hold every row of x once: rows {missing} of x are in none, "
                   f"rows {twice} in more than one")
        raise CheckFailure(f"Observed ({case}): {message}.", mistake="micro-batches miss rows")


def _name_accumulation_mistake(grads: dict[str, torch.Tensor], fed: list[torch.Tensor],
                               x: torch.Tensor, y: torch.Tensor, stale: dict[str, torch.Tensor],
                               seed: int, k: int, case: str) -> None:
    """Fit the learner's .grad as a mix of the micro-batches' gradients and the stale ones; name it."""
    micro = []
    for xs in fed:  # the targets of the rows the model saw
        index = torch.stack([(x == row).all(dim=1).nonzero()[0, 0] for row in xs])
        micro.append(_micro_grad(seed, xs, y[index]))
    fit = fit_micro_weights(grads, micro, stale)
    if fit is None:
        return
    observed, mistake = name_accumulation(fit[0], fit[1], x.size(0), k)
    raise CheckFailure(f"Observed ({case}): {observed}. Likely mistake: {mistake}.", mistake=mistake)


def _micro_grad(seed: int, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    model = _small_gpt(seed)
    lm_loss(model(x), y).backward()
    return {n: p.grad for n, p in model.named_parameters()}


# --- 2. data parallel by hand -------------------------------------------------------------------

def _average_case(rank: int, world_size: int, fn: Callable[..., Any], seed: int,
                  batch: int) -> dict[str, Any]:
    """One rank: the same model, this rank's share of the batch, backward, then the learner's fn."""
    model = _small_gpt(seed)
    x, y = random_batches(1, batch, seed=seed)[0]
    lm_loss(model(rank_share(x, rank, world_size)), rank_share(y, rank, world_size)).backward()
    local = {n: p.grad.clone() for n, p in model.named_parameters()}
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    with calls_to([average_gradients]) as seen:
        fn(model)
    grads = {n: (p.grad.clone() if p.grad is not None else None) for n, p in model.named_parameters()}
    moved = any(not torch.equal(p.detach(), weights[n]) for n, p in model.named_parameters())
    return {"grads": grads, "local": local, "course_lib": bool(seen), "moved": moved}


@checker
def check_average_gradients(fn: Callable[..., Any]) -> None:
    """Check ``fn(model)``, called on every rank after backward on the rank's share of the batch:
    afterwards every rank's gradients equal one process's on the whole batch (1e-12, float64), on
    2 and on 3 gloo processes."""
    if is_course_lib(fn):
        raise CheckFailure("That is course_lib's average_gradients: write it yourself with "
                           "dist.all_reduce.")
    cases = [("2 ranks, batch of 8", 2, 8, 0), ("3 ranks, batch of 6", 3, 6, 1)]
    for case, world, batch, seed in cases:
        results = _on_ranks(_average_case, world, (fn, seed, batch), case)
        if any(r["course_lib"] for r in results):
            raise CheckFailure("Your function calls course_lib's average_gradients: write it yourself "
                               "with dist.all_reduce.")
        with one_thread():
            model = _small_gpt(seed)
            x, y = random_batches(1, batch, seed=seed)[0]
            lm_loss(model(x), y).backward()
        expected = {n: p.grad for n, p in model.named_parameters()}
        for rank, r in enumerate(results):
            if any(g is None for g in r["grads"].values()):
                raise CheckFailure(f"Some .grad is None on rank {rank} after your function ({case}): "
                                   "change the gradients in place, do not remove them.")
            if any(r["grads"][n].shape != expected[n].shape for n in expected):
                raise CheckFailure(f"Some .grad changed its shape on rank {rank} after your function "
                                   f"({case}): each p.grad must keep p's shape.")
            if r["moved"]:
                raise CheckFailure(f"Your function changed the weights on rank {rank} ({case}); it "
                                   "should change only the gradients (p.grad), not p itself.")
        if all(_close(r["grads"], expected) for r in results):
            continue
        _name_averaging_mistake(results, expected, world, case)
    print("check_average_gradients: on 2 and 3 ranks, every rank's gradients equal one process's on the "
          "whole batch (to 1e-12 in float64). Well done!")


def _name_averaging_mistake(results: list, expected: dict[str, torch.Tensor], world: int,
                            case: str) -> None:
    """Every rank's gradients against what each likely mistake gives; always raises CheckFailure."""
    for src in range(world):
        if all(_close(x["grads"], results[src]["local"]) for x in results):
            message = (f"the gradients are broadcast from rank {src} (every rank gets rank {src}'s "
                       "share's gradient), not averaged: all_reduce sums every rank's, then "
                       "divide by the world size")
            raise CheckFailure(f"Observed ({case}): every rank's gradients equal rank {src}'s own "
                               f"share's gradients. Likely mistake: {message}.",
                               mistake="broadcast of the gradients")
    locals_ = [r["local"] for r in results]
    labels = [label_rank_gradients(r["grads"], locals_, rank) for rank, r in enumerate(results)]
    named = name_averaging(labels, world, len(expected), {n: t.numel() for n, t in expected.items()})
    if named is not None:
        observed, mistake = named
        raise CheckFailure(f"Observed ({case}): {observed}. Likely mistake: {mistake}.", mistake=mistake)
    for rank, r in enumerate(results):
        grads = r["grads"]
        if _close(grads, expected):
            continue
        if _close(grads, r["local"]):
            raise CheckFailure(
                f"Likely mistake ({case}): rank {rank}'s gradients are still those of its own "
                "share of the batch: nothing was all-reduced into p.grad. (dist.all_reduce works "
                "in place on the tensor you give it: a copy, or p instead of p.grad, leaves "
                "p.grad unchanged.)")
        raise CheckFailure(f"Rank {rank}'s gradients differ from one process's on the whole batch "
                           f"by up to {_max_diff(grads, expected):.3g} ({case}), and none of the "
                           "usual mistakes explains it.")


# --- 3. ZeRO-1's optimizer state (Predict) -------------------------------------------------------

def zero1_state_bytes(parameters: int, world_size: int, bytes_per_number: int = 4) -> int:
    """AdamW's two moments for this rank's 1/N of the parameters (ZeRO-1), in bytes."""
    return 2 * math.ceil(parameters / world_size) * bytes_per_number


@checker
def check_zero1_bytes(fn: Callable[[], Any]) -> None:
    """Check ``fn() -> int``: the bytes of AdamW's state per rank with ZeRO-1 on 2 ranks, for lesson
    09's GPT (217,344 float32 parameters)."""
    got = plain(run_learner(fn, case="your prediction", hint="Return one number of bytes."))
    if isinstance(got, torch.Tensor) and got.numel() == 1 and not got.is_complex():
        got = got.item()  # torch.tensor(869376)
    if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got):
        raise CheckFailure(f"Return one number (bytes), got {got!r}.")
    n = LESSON_GPT_PARAMETERS
    right = zero1_state_bytes(n, 2)
    if abs(got - right) < 1e-6 * right:  # 869376.0 too
        print(f"check_zero1_bytes: right, {right:,} bytes on each rank. AdamW keeps two float32 numbers "
              f"(exp_avg, exp_avg_sq) per weight: 8 bytes x {n:,} = {8 * n:,} on one process; ZeRO-1 "
              "keeps each rank's half.")
        return
    message = name_zero1_bytes(got, n, 2)
    if message:
        raise CheckFailure(message, mistake=message.split("Likely mistake: ")[-1][:80])
    raise CheckFailure(f"Not quite: {got:,} bytes. Count AdamW's numbers per weight, the bytes per "
                       f"float32, and which share of the {n:,} weights one of 2 ranks keeps.")


# --- 4. Debug: one seed per rank ----------------------------------------------------------------

def _replica_case(rank: int, world_size: int, fn: Callable[..., Any],
                  batches: list) -> dict[str, torch.Tensor]:
    out = fn(rank, world_size, batches)
    return {n: t.detach().clone() for n, t in dict(out).items()}


def _one_process_replica(batches: list, seed: int = 1337, zero: bool = True,
                         share: int | None = None) -> dict[str, torch.Tensor]:
    """One process's weights after the steps (share: train on that half of each batch only)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(GPTConfig(vocab_size=67, max_len=16, d_model=32, num_heads=4, num_layers=2)).double()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in batches:
        if share is not None:
            x, y = x.chunk(2)[share], y.chunk(2)[share]
        if zero:
            optimizer.zero_grad()
        lm_loss(model(x), y).backward()
        optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _weights_averaged_replica(batches: list) -> dict[str, torch.Tensor]:
    """Two ranks seeded 1337 + rank, gradients averaged, then the weights averaged after each step."""
    models = []
    with torch.random.fork_rng(devices=[]):
        for rank in range(2):
            torch.manual_seed(1337 + rank)
            models.append(GPT(GPTConfig(vocab_size=67, max_len=16, d_model=32, num_heads=4,
                                        num_layers=2)).double())
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in models]
    for x, y in batches:
        for rank, (model, optimizer) in enumerate(zip(models, optimizers)):
            optimizer.zero_grad()
            lm_loss(model(x.chunk(2)[rank]), y.chunk(2)[rank]).backward()
        for p0, p1 in zip(models[0].parameters(), models[1].parameters()):
            p0.grad = p1.grad = (p0.grad + p1.grad) / 2
        for optimizer in optimizers:
            optimizer.step()
        with torch.no_grad():
            for p0, p1 in zip(models[0].parameters(), models[1].parameters()):
                mean = (p0 + p1) / 2
                p0.copy_(mean)
                p1.copy_(mean)
    return {n: p.detach().clone() for n, p in models[0].named_parameters()}


def _initial_replicas(fn: Callable[..., Any]) -> list | None:
    """Both ranks' weights when the function gets no batches (its starting point), or None if that
    does not run."""
    try:
        with time_limit(25.0, "stopped"):
            return run_on_ranks(_replica_case, 2, (fn, []), timeout=15.0)
    except Exception:  # noqa: BLE001 - only a clue: a function that needs batches gives none
        return None


def _name_replica_mistake(results: list, batches: list, fn: Callable[..., Any]) -> None:
    """Name a known wrong fix of the Debug exercise: what is observed, then the mistake it matches
    (never the fix)."""
    agree = _max_diff(results[0], results[1]) <= 1e-10
    if not agree:
        if all(_max_diff(r, _one_process_replica(batches, share=rank)) <= 1e-10
               for rank, r in enumerate(results)):
            raise CheckFailure(
                "Observed: after 3 steps, rank 0's and rank 1's weights differ; each rank's weights equal "
                "one process trained from seed 1337 on that rank's share of each batch only. Likely "
                "mistake: the ranks' gradients are not averaged.", mistake="no averaging")
        start = _initial_replicas(fn)
        if start is not None and _max_diff(start[0], start[1]) > 1e-10:
            raise CheckFailure(
                f"Observed: after 3 steps, rank 0's and rank 1's weights differ by up to "
                f"{_max_diff(results[0], results[1]):.3g}; they differ before the first step already: "
                f"given no batches, the function returns weights that differ by up to "
                f"{_max_diff(start[0], start[1]):.3g} on the two ranks. Data parallel needs every rank "
                "to hold the same model at every step.", mistake="replicas start apart")
        return
    candidates = [
        (lambda: _one_process_replica(batches, seed=1338),
         "they equal one process trained on the whole batches from torch.manual_seed(1338), rank 1's "
         "initial weights, not 1337's", "the weights are broadcast from rank 1"),
        (lambda: _one_process_replica(batches, zero=False),
         "they equal one process whose gradients are never zeroed between steps",
         "no zero_grad: each step's gradients add to the previous ones"),
        (lambda: _one_process_replica(batches, share=0),
         "they equal one process trained on the first half of each batch only",
         "every rank trains on the same share"),
        (lambda: _one_process_replica(batches, share=1),
         "they equal one process trained on the second half of each batch only",
         "every rank trains on the same share"),
        (lambda: replica_runs(batches, seeds=(1337, 1337), combine="sum")[0],
         "they equal one process whose gradient at every step is the SUM of the two ranks' share "
         "gradients, twice their average", "the ranks' gradients are summed, not averaged"),
        (lambda: replica_runs(batches, seeds=(1337, 1337), shares="time")[0],
         "they equal two replicas whose shares are the first and the second half of the time steps "
         "(x.chunk(2, dim=1)), all the rows each", "each rank's share is half of the time steps "
         "(dim 1) of every row"),
        (lambda: replica_runs([batches[0]] * len(batches), seeds=(1337, 1337))[0],
         "they equal one process trained on the FIRST batch at every step",
         "every step trains on the shares of the first batch"),
        (lambda: replica_runs(batches)[0],
         "they equal rank 0's weights of the function as it was given (replicas drawn from seeds "
         "1337 and 1338, the gradients averaged at every step): the ranks trained apart, and rank "
         "0's weights were copied to both after training", "rank 0's weights are copied to rank 1 "
         "after training, when the replicas have trained apart"),
        (lambda: replica_runs(batches)[1],
         "they equal rank 1's weights of the function as it was given (replicas drawn from seeds "
         "1337 and 1338, the gradients averaged at every step): the ranks trained apart, and rank "
         "1's weights were copied to both after training", "rank 1's weights are copied to rank 0 "
         "after training, when the replicas have trained apart"),
        (lambda: replica_runs(batches, copy_after_step=0)[0],
         "they equal two replicas drawn from seeds 1337 and 1338 whose weights are set to rank 0's "
         "after every step", "rank 0's weights are copied to rank 1 after each step, from replicas "
         "that took their first step apart"),
        (lambda: _weights_averaged_replica(batches),
         "they equal two replicas seeded 1337 and 1338 whose weights are averaged after each step",
         "the weights are averaged after each step, from replicas that started apart"),
    ]
    for weights, what, mistake in candidates:
        if _max_diff(results[0], weights()) <= 1e-10:
            raise CheckFailure(f"Observed: both ranks agree, but their weights differ from one process "
                               f"trained on the whole batches from torch.manual_seed(1337): {what}. "
                               f"Likely mistake: {mistake}.", mistake=mistake)
    observed = (f"Observed: both ranks agree, but their weights differ from one process trained on the "
                f"whole batches from torch.manual_seed(1337) by up to "
                f"{_max_diff(results[0], _one_process_replica(batches)):.3g}")
    start = _initial_replicas(fn)
    initial = _one_process_replica([])
    if start is not None and _max_diff(start[0], start[1]) <= 1e-10 and _max_diff(start[0], initial) > 1e-10:
        raise CheckFailure(f"{observed}; given no batches, both ranks return the same weights, but not "
                           "those of torch.manual_seed(1337)'s model: they start from other weights.",
                           mistake="replicas start from other weights")
    try:
        with time_limit(25.0, "stopped"):
            first = run_on_ranks(_replica_case, 2, (fn, batches[:1]), timeout=15.0)
    except Exception:  # noqa: BLE001 - only a clue
        return
    if _max_diff(first[0], _one_process_replica(batches[:1])) <= 1e-10:
        raise CheckFailure(f"{observed}; given only the first batch, they equal one process's weights "
                           "after that step: the first step is right, a later one is not.",
                           mistake="later steps differ")
    raise CheckFailure(f"{observed}; given only the first batch, they differ already after that step: "
                       "the first step differs from one process's.", mistake="first step differs")


@checker
def check_seeded_replicas(fn: Callable[..., Any]) -> None:
    """Check the fixed ``fn(rank, world_size, batches) -> {name: weight}`` on 2 gloo processes: both
    ranks end with the weights of one process trained on the whole batches (seed 1337), 1e-10."""
    batches = random_batches(3, 8, seed=5)
    results = _on_ranks(_replica_case, 2, (fn, batches), "2 ranks, 3 steps")
    with one_thread():
        expected = _one_process_replica(batches)
    if not all(set(r) == set(expected) for r in results):
        raise CheckFailure("Return the model's weights as {name: tensor} (model.named_parameters()), as "
                           "the function did.")
    apart = _max_diff(results[0], results[1])
    if apart > 1e-10 or _max_diff(results[0], expected) > 1e-10:
        with one_thread():
            _name_replica_mistake(results, batches, fn)
    if apart > 1e-10:
        raise CheckFailure(
            f"Observed: after 3 steps, rank 0's and rank 1's weights differ by up to {apart:.3g}. "
            "Data parallel needs every rank to hold the same model at every step.")
    diff = _max_diff(results[0], expected)
    if diff > 1e-10:
        raise CheckFailure(
            f"Observed: both ranks agree, but their weights differ from one process trained on the "
            f"whole batches (from torch.manual_seed(1337)) by up to {diff:.3g}.")
    print("check_seeded_replicas: both ranks end with one process's weights (to 1e-10). Well done!")


# --- 5. ★★★ tensor parallel: Megatron's MLP -----------------------------------------------------

def _mlp_case(rank: int, world_size: int, cls: Callable[..., Any], d_model: int, d_ff: int,
              activation: str, seed: int) -> dict[str, Any]:
    """One rank: the learner's module from a dense FeedForward; forward and backward counted."""
    dense = _random_dense(d_model, d_ff, activation, seed)
    x = torch.randn(2, 5, d_model, dtype=torch.float64)
    counts: dict[str, int] = {}
    phase = ["build"]
    refs = [ParallelMLP.__init__, ParallelMLP.forward, ColumnParallelLinear.__init__,
            ColumnParallelLinear.forward, RowParallelLinear.__init__, RowParallelLinear.forward,
            CopyToParallel.forward, CopyToParallel.backward, ReduceFromParallel.forward,
            ReduceFromParallel.backward]
    with calls_to(refs) as seen, watch_mlp_calls(cls, counts, phase):
        module = cls(dense, rank, world_size)
        phase[0] = "forward"
        xs = x.clone().requires_grad_(True)
        out = module(xs)
        phase[0] = "backward"
        if isinstance(out, torch.Tensor) and out.requires_grad and out.shape == x.shape:
            g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
            # out's gradient is exactly g; out.backward(g) would import sympy (seconds a rank)
            (out * g).sum().backward()
    params = [(n, p.detach().clone(), None if p.grad is None else p.grad.clone())
              for n, p in module.named_parameters()] if isinstance(module, nn.Module) else []
    shared = []  # (parameter, dense parameter) pairs that are the same object or share memory
    if isinstance(module, nn.Module):
        for n, p in module.named_parameters():
            for dn, dp in dense.named_parameters():
                if p is dp or _overlaps(p, dp):
                    shared.append((n, dn, p is dp))
                    break
    return {"out": out.detach().clone() if isinstance(out, torch.Tensor) else out,
            "x_grad": None if xs.grad is None else xs.grad.clone(),
            "params": params, "counts": counts, "course_lib": bool(seen), "shared": shared,
            "is_module": isinstance(module, nn.Module)}


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' bytes overlap (a view of the other, or of the same storage)."""
    try:
        sa, sb = a.untyped_storage(), b.untyped_storage()
        return sa.nbytes() > 0 and sa.data_ptr() == sb.data_ptr()
    except (RuntimeError, NotImplementedError):
        return a.data_ptr() == b.data_ptr()


def _random_dense(d_model: int, d_ff: int, activation: str, seed: int) -> FeedForward:
    torch.manual_seed(seed)
    dense = FeedForward(d_model, d_ff, dropout=0.0, activation=activation).double()
    with torch.no_grad():
        for p in dense.parameters():
            p.normal_(0, 0.5)
    return dense


def _dense_reference(d_model: int, d_ff: int, activation: str, seed: int, world: int) -> dict[str, Any]:
    dense = _random_dense(d_model, d_ff, activation, seed)
    x = torch.randn(2, 5, d_model, dtype=torch.float64).requires_grad_(True)
    out = dense(x)
    g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    out.backward(g)
    w1, b1, w2, b2 = dense.linear1.weight, dense.linear1.bias, dense.linear2.weight, dense.linear2.bias
    partial_out, partial_grad, swapped = [], [], []
    for r in range(world):  # what each rank's half alone gives (no communication)
        w1r, b1r, w2r = w1.detach().chunk(world, 0)[r], b1.detach().chunk(world)[r], w2.detach().chunk(world, 1)[r]
        xr = x.detach().clone().requires_grad_(True)
        o = dense.activation(xr @ w1r.T + b1r) @ w2r.T
        o.backward(g)
        partial_out.append(o.detach())
        partial_grad.append(xr.grad)
        with torch.no_grad():  # f and g swapped: x summed over the ranks, the partial outputs not
            swapped.append(dense.activation(world * x @ w1r.T + b1r) @ w2r.T)
    shards = []  # (value, gradient) of every piece a rank should hold: [rank][piece]
    for r in range(world):
        shards.append([(w1.detach().chunk(world, 0)[r], w1.grad.chunk(world, 0)[r], "linear1's weight rows"),
                       (b1.detach().chunk(world)[r], b1.grad.chunk(world)[r], "linear1's bias"),
                       (w2.detach().chunk(world, 1)[r], w2.grad.chunk(world, 1)[r], "linear2's weight columns"),
                       (b2.detach(), b2.grad, "linear2's bias")])
    with torch.no_grad():  # the output a hard-coded activation would give
        others = {name: dense.linear2(fn(dense.linear1(x))) for name, fn in
                  (("GELU", torch.nn.functional.gelu), ("ReLU", torch.relu),
                   ("GELU (tanh)", lambda t: torch.nn.functional.gelu(t, approximate="tanh")))}
    return {"out": out.detach(), "x_grad": x.grad, "b2": b2.detach(), "b1": b1.detach(), "partial_out": partial_out,
            "other_activations": others, "w1": w1.detach(), "w2": w2.detach(), "activation": activation,
            "partial_grad": partial_grad, "shards": shards, "swapped": swapped,
            "dense_numel": sum(p.numel() for p in dense.parameters())}


def _near(a: Any, b: torch.Tensor, tol: float = 1e-10) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and (a.double() - b).abs().max().item() <= tol


@checker
def check_parallel_mlp(cls: Callable[..., Any]) -> None:
    """Check ``cls(dense, rank, world_size)`` (an nn.Module; ``forward(x (B, T, d)) -> (B, T, d)``)
    on 2 gloo processes: every rank's output and input gradient equal the dense ``FeedForward``'s,
    each rank holds 1/2 of each matrix and its parameters' gradients equal the matching slices of
    the dense gradients, with one all-reduce in forward and one in backward (1e-10, float64)."""
    if is_course_lib(cls):
        raise CheckFailure("That is course_lib's ParallelMLP: build your own from f and g.")
    cases = [("2 ranks, d_model 8, d_ff 12, GELU", 2, 8, 12, "gelu", 0),
             ("2 ranks, d_model 6, d_ff 16, ReLU", 2, 6, 16, "relu", 1)]
    for case, world, d_model, d_ff, activation, seed in cases:
        try:
            results = _on_ranks(_mlp_case, world, (cls, d_model, d_ff, activation, seed), case)
        except CheckFailure as err:  # a crash: the shards built here may say why
            why = _layout_after_crash(cls, d_model, d_ff, activation, seed, world, case)
            raise CheckFailure(f"{err} {why}".strip()) from None
        ref = _dense_reference(d_model, d_ff, activation, seed, world)
        for rank, r in enumerate(results):
            if r["course_lib"]:
                raise CheckFailure("Your class uses course_lib's ParallelMLP, ColumnParallelLinear, "
                                   "RowParallelLinear, CopyToParallel or ReduceFromParallel: write your "
                                   "own (your f and g, torch.autograd.Functions with dist.all_reduce, "
                                   "are welcome).")
            if not r["is_module"]:
                raise CheckFailure("Make it an nn.Module (class ...(nn.Module), super().__init__()), "
                                   "holding this rank's shares as nn.Parameters.")
        dense = {k: ref[k] for k in ("w1", "b1", "w2", "b2")}
        layouts = [mlp_layout([(n, v) for n, v, _ in r["params"]], dense, world) for r in results]
        message = name_mlp_layout(layouts, dense, world, [r["counts"] for r in results], case)
        if message:
            raise CheckFailure(message, mistake=message.split("Likely mistake: ")[-1][:80])
        for rank, r in enumerate(results):
            _check_mlp_rank(r, ref, rank, world, case)
    print(f"check_parallel_mlp: all {len(cases)} cases equal the dense FeedForward on every rank, forward "
          "and backward, with half of each matrix per rank and one all-reduce each way. Well done!")


def _layout_after_crash(cls: Callable[..., Any], d_model: int, d_ff: int, activation: str, seed: int,
                        world: int, case: str) -> str:
    """After a crash on the ranks: the learner's shards built here, one per rank, named if wrong."""
    dense = _random_dense(d_model, d_ff, activation, seed)
    pieces = {"w1": dense.linear1.weight.detach(), "b1": dense.linear1.bias.detach(),
              "w2": dense.linear2.weight.detach(), "b2": dense.linear2.bias.detach()}
    try:
        with time_limit(10, "building your module took more than 10 s"):
            modules = [cls(dense, rank, world) for rank in range(world)]
            layouts = [mlp_layout([(n, p.detach()) for n, p in m.named_parameters()], pieces, world)
                       for m in modules]
    except Exception:  # noqa: BLE001 (it may need the process group: then nothing more to say)
        return ""
    return name_mlp_layout(layouts, pieces, world, [{} for _ in range(world)], case) or ""


def _grad_of(r: dict[str, Any], value: torch.Tensor) -> torch.Tensor | None:
    """The gradient of the learner's parameter that holds ``value`` (or its transpose), as ``value``."""
    for _, v, g in r["params"]:
        if g is not None and v.shape == value.shape and torch.equal(v, value):
            return g
        if g is not None and v.dim() == 2 and v.T.shape == value.shape and torch.equal(v.T, value):
            return g.T
    return None


def _check_mlp_rank(r: dict[str, Any], ref: dict[str, Any], rank: int, world: int, case: str) -> None:
    out, b2 = r["out"], ref["b2"]
    where = f"({case}, rank {rank})"
    counts = r["counts"]
    others = sorted(k for k in counts if k.split(":")[1] != "all_reduce" and not k.startswith("build"))
    dropout = [k for k in others if "dropout" in k]
    if dropout:
        raise CheckFailure(f"Observed {where}: your module calls dropout in training mode ({dropout[0]}). "
                           "Likely mistake: dropout in the parallel MLP: the dense layer's dropout is 0 "
                           "here, and the output must be dense(x) exactly; use dense.dropout, or none.",
                           mistake="dropout")
    if others:
        raise CheckFailure(f"Observed {where}: your module calls {', '.join(others)} (phase:collective). "
                           "Only all_reduce is allowed, once in forward and once in backward: no rank "
                           "gathers or broadcasts the activations; g sums the ranks' partial outputs.",
                           mistake="a collective other than all_reduce")
    if not isinstance(out, torch.Tensor) or out.shape != ref["out"].shape:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise CheckFailure(f"forward returns {shape}, expected the dense output's shape "
                           f"{tuple(ref['out'].shape)} on every rank {where}.")
    if not _near(out, ref["out"]):
        partial = ref["partial_out"][rank]
        c = name_scale(out.double() - ref["out"], b2.expand_as(out))
        if c is not None and abs(c + 1 - world) < 1e-9:
            raise CheckFailure(f"Likely mistake {where}: linear2's bias is added on every rank before "
                               f"the all-reduce, so the sum holds it {world} times: add it once, after.")
        if c is not None:
            why = {0.0: "it is missing from the output", 1 / world: f"it is divided by {world}"}
            told = next((w for k, w in why.items() if abs(1 + c - k) < 1e-9), f"it counts {1 + c:g} times")
            raise CheckFailure(f"Observed {where}: the output is the dense one except for linear2's bias: "
                               f"{told}. Likely mistake: linear2's bias must count once: every rank "
                               "adds the whole bias once, after the all-reduce.", mistake="linear2's bias")
        swapped = ref["swapped"][rank]
        if _near(out, swapped + b2) or _near(out, swapped):
            raise CheckFailure(f"Observed {where}: the output is this rank's partial output computed from "
                               f"{world}·x (x summed over the ranks). Likely mistake: f and g are swapped: "
                               "f (identity forward) goes on x before linear1, g (the all-reduce in "
                               "forward) on linear2's partial output.", mistake="f and g swapped")
        if _near(out, partial + b2) or _near(out, partial):
            raise CheckFailure(f"Likely mistake {where}: the output is this rank's partial sum only; "
                               "the ranks' partial products of linear2 must be added up (all-reduce) "
                               "in forward.")
        for name, other in ref["other_activations"].items():
            if name.split()[0].lower() != ref["activation"] and _near(out, other):
                message = (f"the activation is hard-coded ({name}): use the dense layer's own "
                           "(dense.activation), whatever it is")
                raise CheckFailure(f"Observed {where}: the output equals the dense layer's with {name} in "
                                   f"place of its {ref['activation']}. Likely mistake: {message}.",
                                   mistake="hard-coded activation")
        raise CheckFailure(f"The output differs from the dense FeedForward's by up to "
                           f"{(out.double() - ref['out']).abs().max().item():.3g} {where}. Each rank: "
                           "its rows of linear1 (with their bias), the activation, its columns of linear2.")
    if r["x_grad"] is None:
        raise CheckFailure(f"x.grad is None after backward {where}: the output must depend on x "
                           "through autograd (an autograd Function's forward returns a new tensor).")
    if not _near(r["x_grad"], ref["x_grad"]):
        partial, w2r = ref["partial_grad"][rank], ref["shards"][rank][2][0]
        c = name_scale(r["x_grad"], ref["x_grad"])
        if _near(r["x_grad"], partial):
            raise CheckFailure(
                f"Likely mistake {where}: the forward is right but x's gradient is this rank's part "
                "only: each rank's linear1 used the same x, so the ranks' gradients for x must be "
                "summed in backward (the all-reduce of Megatron's f). dist.all_reduce in a forward is "
                "invisible to autograd.")
        w2_scale = name_scale(_grad_of(r, w2r), ref["shards"][rank][2][1])
        if c is not None and abs(c - 1 / world) < 1e-9 and w2_scale is not None and abs(w2_scale - c) < 1e-9:
            raise CheckFailure(
                f"Observed {where}: the forward is right, but x's gradient and linear2's weight gradient "
                f"are 1/{world} of the dense ones. Likely mistake: g's backward divides by {world}; g's "
                "backward is the identity (every rank already holds the whole output gradient).",
                mistake="g's backward averages")
        if c is not None and abs(c - world) < 1e-9:
            raise CheckFailure(
                f"Likely mistake {where}: x's gradient is {world} times too large: it is summed over "
                "the ranks twice. The all-reduce of the forward (g) passes the gradient through "
                "unchanged in backward (every rank's part counts once in the sum).")
        if c is not None and abs(c - 1 / world) < 1e-9:
            raise CheckFailure(
                f"Observed {where}: the forward is right, but x's gradient is 1/{world} of the dense "
                f"one. Likely mistake: f's backward averages (divides the sum by {world}), as data "
                "parallel does; here the ranks' linear1 compute different hidden features from the same "
                "x, so x's gradient is the plain SUM of the ranks' parts.", mistake="f's backward averages")
        scale = f" ({c:.4g} times the dense one)" if c is not None else ""
        raise CheckFailure(f"x's gradient differs from the dense one by up to "
                           f"{(r['x_grad'] - ref['x_grad']).abs().max().item():.3g}{scale} {where}.")
    shards = ref["shards"][rank]
    held = sum(v.numel() for v, _, _ in shards)
    numel = sum(v.numel() for _, v, _ in r["params"])
    if numel != held:
        raise CheckFailure(
            f"This rank holds {numel} parameters; its share is {held} of the dense {ref['dense_numel']} "
            f"{where}: 1/{world} of each matrix and of linear1's bias, and linear2's whole bias. "
            "Keep only the slices as nn.Parameters (clone them), not the dense layer.")
    if r["shared"]:
        name, dense_name, same = r["shared"][0]
        how = ("is the dense layer's own Parameter" if same else
               "shares its memory with the dense layer's " + dense_name)
        raise CheckFailure(
            f"Observed {where}: your parameter {name} {how} ({len(r['shared'])} of your parameters "
            "share memory with the dense layer). The exercise asks for copies: each rank's shards "
            "are its own tensors (.clone() the slices, then nn.Parameter), so that training the "
            "shards never writes into the dense layer.", mistake="shards share the dense layer's memory")
    for value, grad, what in shards:
        match = [(n, g) for n, v, g in r["params"] if v.shape == value.shape and torch.equal(v, value)]
        match += [(n, None if g is None else g.T) for n, v, g in r["params"]
                  if v.dim() == 2 and v.T.shape == value.shape and torch.equal(v.T, value)]
        if not match:
            raise CheckFailure(f"No parameter of rank {rank} holds its slice of {what} {where}: rank r "
                               "keeps chunk r of linear1's rows (and bias) and chunk r of linear2's "
                               "columns, cloned from the dense layer.")
        name, g = match[0]
        if g is None:
            raise CheckFailure(f"Observed {where}: your {name} ({what}) has no gradient after backward: "
                               "it is not used in this rank's forward (every rank uses all its shards).")
        if not _near(g, grad):
            c = name_scale(g, grad)
            if c is not None and what == "linear2's bias" and abs(c - 1 / world) < 1e-9:
                raise CheckFailure(
                    f"Observed {where}: the output is right, but the gradient of {name} (linear2's bias) "
                    f"is 1/{world} of the dense one. Likely mistake: the bias is divided by {world} and "
                    f"added on every rank before the all-reduce; then each rank's copy gets only "
                    f"1/{world} of its gradient. Add the whole bias once, after the all-reduce.",
                    mistake="linear2's bias divided before the all-reduce")
            scale = f" ({c:.4g} times it)" if c is not None else ""
            raise CheckFailure(f"The gradient of {name} ({what}) differs from the matching slice of the "
                               f"dense gradient{scale} {where}.")
    fwd, bwd = counts.get("forward:all_reduce", 0), counts.get("backward:all_reduce", 0)
    if (fwd, bwd) != (1, 1) and counts:
        raise CheckFailure(f"Your module calls all_reduce {fwd} time(s) in forward and {bwd} in backward "
                           f"{where}; the constraint is one each way (linear1's all-reduce waits until "
                           "backward; linear2's partial sums are reduced once).")
