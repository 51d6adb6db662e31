"""Lesson-14 checkers: the solutions pass, each named mistake is caught, course_lib's own version is
refused, a hang is stopped, and no process the checkers start is left running."""

from __future__ import annotations


import psutil
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from _helpers import assert_checkers_keep_random_state, passes, solution_namespace
from torch import nn

import course_lib.checks.lesson14_distributed as checks_distributed
from course_lib.checks import (
    check_accumulation, check_average_gradients, check_parallel_mlp, check_seeded_replicas,
    check_zero1_bytes,
)
from course_lib.checks import CheckFailure
from course_lib.gpt import lm_loss
from course_lib.parallel import ParallelMLP, accumulate_gradients, average_gradients


@pytest.fixture(autouse=True)
def no_process_left():
    yield
    assert psutil.Process().children(recursive=True) == [], "a checker left a process running"


# --- gradient accumulation ----------------------------------------------------------------------

def test_accumulation_solution_passes():
    assert passes(check_accumulation, solution_namespace("14.accumulate")["my_accumulate"])


def _no_division(model, x, y, k):
    model.zero_grad()
    for xs, ys in zip(x.chunk(k), y.chunk(k)):
        lm_loss(model(xs), ys).backward()


def _no_zeroing(model, x, y, k):
    for xs, ys in zip(x.chunk(k), y.chunk(k)):
        (lm_loss(model(xs), ys) / k).backward()


def _zero_in_loop(model, x, y, k):
    for xs, ys in zip(x.chunk(k), y.chunk(k)):
        model.zero_grad()
        (lm_loss(model(xs), ys) / k).backward()


def _whole_batch(model, x, y, k):
    model.zero_grad()
    lm_loss(model(x), y).backward()


@pytest.mark.parametrize("wrong, words", [
    (_no_division, "divide each micro-batch's loss by k"),
    (_no_zeroing, "previous step's gradients are still in .grad"),
    (_zero_in_loop, "zeroed inside the loop"),
    (_whole_batch, "micro-batches of B/k"),
])
def test_accumulation_mistakes_are_named(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check_accumulation(wrong)


def test_accumulation_refuses_course_lib():
    with pytest.raises(CheckFailure, match="course_lib's accumulate_gradients"):
        check_accumulation(accumulate_gradients)


# --- data parallel by hand ----------------------------------------------------------------------

def test_average_gradients_solution_passes():
    assert passes(check_average_gradients, solution_namespace("14.average_gradients")["my_average_gradients"])
    assert passes(check_average_gradients, _avg_op)


def _summed(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)


def _on_a_copy(model):
    for p in model.parameters():
        g = p.grad.clone()
        dist.all_reduce(g)
        g /= dist.get_world_size()


def _divided_by_two(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= 2


def _avg_op(model):  # right: gloo averages too (since PyTorch 2.x)
    for p in model.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)


def _matrices_only(model):
    for p in model.parameters():
        if p.dim() == 2:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


def _rank0_only(model):  # a hang: rank 1 never joins the all-reduce
    if dist.get_rank() == 0:
        for p in model.parameters():
            dist.all_reduce(p.grad)


def _crashes_on_rank1(model):
    if dist.get_rank() == 1:
        raise ValueError("rank 1 fails")
    for p in model.parameters():
        dist.all_reduce(p.grad)


def _stub(model):
    raise NotImplementedError


@pytest.mark.parametrize("wrong, words", [
    (_summed, "the SUM over the ranks"),
    (_on_a_copy, "nothing was all-reduced into p.grad"),
    (_divided_by_two, "divided by 2 on 3 ranks"),
    (_matrices_only, "gradients are right, but not"),
    (_rank0_only, "never reached"),
    (_crashes_on_rank1, "rank 1 raised ValueError: rank 1 fails"),
])
def test_average_gradients_mistakes_are_named(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check_average_gradients(wrong)


def test_average_gradients_refuses_course_lib_and_says_not_implemented(capsys):
    with pytest.raises(CheckFailure, match="course_lib's average_gradients"):
        check_average_gradients(average_gradients)

    def wrapped(model):
        average_gradients(model)

    with pytest.raises(CheckFailure, match="calls course_lib's average_gradients"):
        check_average_gradients(wrapped)
    check_average_gradients(_stub)
    assert "not implemented yet" in capsys.readouterr().out


def _spins(model):
    while True:
        pass


def test_a_rank_that_never_ends_is_stopped(monkeypatch):
    monkeypatch.setattr(checks_distributed, "TIME_LIMIT", 3.0)
    with pytest.raises(CheckFailure, match="did not finish"):
        check_average_gradients(_spins)


# --- ZeRO-1's bytes (Predict) -------------------------------------------------------------------

def test_zero1_prediction_passes_and_mistakes_are_named():
    assert passes(check_zero1_bytes, solution_namespace("14.zero1_bytes")["predicted_zero1_bytes"])
    n = checks_distributed.LESSON_GPT_PARAMETERS
    for wrong, words in ((8 * n, "whole state"), (2 * n, "TWO numbers"), (n, "number of parameters"),
                         (n, "number of parameters"), (12 * n // 2, "weights themselves"),
                         (12345, "Count AdamW's numbers")):
        with pytest.raises(CheckFailure, match=words):
            check_zero1_bytes(lambda wrong=wrong: wrong)
    # the reveal cell's measurement is course_lib.parallel's; older notebooks import it from its
    # former place, kept as a deprecated re-export
    from course_lib.checks.distributed import measure_zero1_bytes as former
    from course_lib.parallel import measure_zero1_bytes

    assert former is measure_zero1_bytes


# --- Debug: one seed per rank -------------------------------------------------------------------

def test_seeded_replicas_fix_passes():
    assert passes(check_seeded_replicas, solution_namespace("14.seeded_replicas")["train_by_hand"])


def _buggy_train_by_hand(rank, world_size, batches):
    from course_lib.gpt import GPT, GPTConfig

    torch.manual_seed(1337 + rank)
    model = GPT(GPTConfig(vocab_size=67, max_len=16, d_model=32, num_heads=4, num_layers=2)).double()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in batches:
        x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        optimizer.zero_grad()
        lm_loss(model(x), y).backward()
        average_gradients(model)
        optimizer.step()
    return {name: p.detach() for name, p in model.named_parameters()}


def _broadcast_from_rank1(rank, world_size, batches):  # same replicas, but not seed 1337's model
    from course_lib.gpt import GPT, GPTConfig

    torch.manual_seed(1337 + rank)
    model = GPT(GPTConfig(vocab_size=67, max_len=16, d_model=32, num_heads=4, num_layers=2)).double()
    for p in model.parameters():
        dist.broadcast(p.data, src=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in batches:
        x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        optimizer.zero_grad()
        lm_loss(model(x), y).backward()
        average_gradients(model)
        optimizer.step()
    return {name: p.detach() for name, p in model.named_parameters()}


def test_seeded_replicas_bug_is_observed_not_fixed():
    with pytest.raises(CheckFailure, match="Observed: after 3 steps, rank 0's and rank 1's weights differ") as err:
        check_seeded_replicas(_buggy_train_by_hand)
    assert "seed" not in str(err.value)  # the first message says what is observed, not the fix
    with pytest.raises(CheckFailure, match="both ranks agree"):
        check_seeded_replicas(_broadcast_from_rank1)


# --- ★★★ Megatron's MLP ---------------------------------------------------------------------

def test_parallel_mlp_solution_passes():
    assert passes(check_parallel_mlp, solution_namespace("14.parallel_mlp")["MyParallelMLP"])


class _TransposedShards(nn.Module):  # Megatron's own layout: (in, out/N) matrices; another style
    def __init__(self, dense, rank, world_size):
        super().__init__()
        ns = solution_namespace("14.parallel_mlp")
        self.f, self.g = ns["CopyToRanks"], ns["SumOverRanks"]
        self.a = nn.Parameter(dense.linear1.weight.detach().T.chunk(world_size, 1)[rank].clone())
        self.a_bias = nn.Parameter(dense.linear1.bias.detach().chunk(world_size)[rank].clone())
        self.b = nn.Parameter(dense.linear2.weight.detach().T.chunk(world_size, 0)[rank].clone())
        self.b_bias = nn.Parameter(dense.linear2.bias.detach().clone())
        self.act = dense.activation

    def forward(self, x):
        return self.g.apply(self.act(self.f.apply(x) @ self.a + self.a_bias) @ self.b) + self.b_bias


def _variant(bias_before=False, reduce_forward=True, f_backward=True, g_backward_reduces=False):
    class Variant(nn.Module):
        def __init__(self, dense, rank, world_size):
            super().__init__()
            self.w1 = nn.Parameter(dense.linear1.weight.detach().chunk(world_size, 0)[rank].clone())
            self.b1 = nn.Parameter(dense.linear1.bias.detach().chunk(world_size)[rank].clone())
            self.w2 = nn.Parameter(dense.linear2.weight.detach().chunk(world_size, 1)[rank].clone())
            self.b2 = nn.Parameter(dense.linear2.bias.detach().clone())
            self.act = dense.activation

        def forward(self, x):
            ns = solution_namespace("14.parallel_mlp")
            f, g = ns["CopyToRanks"], ns["SumOverRanks"]
            x_in = f.apply(x) if f_backward else x
            partial = F.linear(self.act(F.linear(x_in, self.w1, self.b1)), self.w2)
            if bias_before:
                partial = partial + self.b2
            if g_backward_reduces:
                import torch.distributed.nn.functional as dist_fn

                out = dist_fn.all_reduce(partial)
            else:
                out = g.apply(partial) if reduce_forward else partial
            return out if bias_before else out + self.b2
    return Variant


class _KeepsDense(nn.Module):
    def __init__(self, dense, rank, world_size):
        super().__init__()
        self.dense = dense
        self.r, self.n = rank, world_size

    def forward(self, x):
        return self.dense(x)


def test_parallel_mlp_other_style_passes():
    assert passes(check_parallel_mlp, _TransposedShards)


@pytest.mark.parametrize("wrong, words", [
    (_variant(bias_before=True), "bias is added on every rank"),
    (_variant(reduce_forward=False), "partial sum only"),
    (_variant(f_backward=False), "x's gradient is this rank's part"),
    (_variant(g_backward_reduces=True), "summed over the ranks twice"),
    (_KeepsDense, "holds 176 parameters|its share"),
])
def test_parallel_mlp_mistakes_are_named(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check_parallel_mlp(wrong)


def test_parallel_mlp_refuses_course_lib():
    with pytest.raises(CheckFailure, match="course_lib's ParallelMLP"):
        check_parallel_mlp(ParallelMLP)

    class Wrapper(nn.Module):
        def __init__(self, dense, rank, world_size):
            super().__init__()
            self.inner = ParallelMLP(dense, rank, world_size)

        def forward(self, x):
            return self.inner(x)

    with pytest.raises(CheckFailure, match="uses course_lib's"):
        check_parallel_mlp(Wrapper)


def test_checkers_keep_random_state():
    assert_checkers_keep_random_state([
        (check_accumulation, solution_namespace("14.accumulate")["my_accumulate"]),
        (check_average_gradients, solution_namespace("14.average_gradients")["my_average_gradients"]),
    ])


# --- issue #48: wrong attempts that were accepted -----------------------------------------------

class _ViewShards(nn.Module):  # right numbers, but the shards are views of the dense layer's weights
    def __init__(self, dense, rank, world_size):
        super().__init__()
        self.w1 = nn.Parameter(dense.linear1.weight.detach().chunk(world_size, 0)[rank])
        self.b1 = nn.Parameter(dense.linear1.bias.detach().chunk(world_size)[rank])
        self.w2 = nn.Parameter(dense.linear2.weight.detach().chunk(world_size, 1)[rank])
        self.b2 = dense.linear2.bias  # the dense layer's own Parameter
        self.act = dense.activation

    def forward(self, x):
        ns = solution_namespace("14.parallel_mlp")
        f, g = ns["CopyToRanks"], ns["SumOverRanks"]
        return g.apply(F.linear(self.act(F.linear(f.apply(x), self.w1, self.b1)), self.w2)) + self.b2


class _DenseBiasOnly(_ViewShards):  # copies, except linear2's bias: the dense layer's Parameter
    def __init__(self, dense, rank, world_size):
        super().__init__(dense, rank, world_size)
        self.w1 = nn.Parameter(self.w1.detach().clone())
        self.b1 = nn.Parameter(self.b1.detach().clone())
        self.w2 = nn.Parameter(self.w2.detach().clone())


@pytest.mark.parametrize("wrong, words", [
    (_ViewShards, "Observed.*share(s)? (its )?memory with the dense layer"),
    (_DenseBiasOnly, "Observed.*is the dense layer's own Parameter"),
])
def test_parallel_mlp_refuses_shards_that_are_not_copies(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check_parallel_mlp(wrong)


# --- issue #48: mistakes named (observed first) ---------------------------------------------------

def _loss_times_k(model, x, y, k):
    model.zero_grad()
    for xs, ys in zip(x.chunk(k), y.chunk(k)):
        (lm_loss(model(xs), ys) * k).backward()


def _divided_by_rows(model, x, y, k):
    model.zero_grad()
    for xs, ys in zip(x.chunk(k), y.chunk(k)):
        (lm_loss(model(xs), ys) / (x.size(0) / k)).backward()


def _grad_divided_every_time(model, x, y, k):
    model.zero_grad()
    for xs, ys in zip(x.chunk(k), y.chunk(k)):
        lm_loss(model(xs), ys).backward()
        for p in model.parameters():
            p.grad /= k


@pytest.mark.parametrize("wrong, words", [
    (_loss_times_k, "multiplied by k"),
    (_divided_by_rows, "divided by B/k"),
    (_grad_divided_every_time, "divided by k = 2 after every backward"),
])
def test_accumulation_more_mistakes_are_named(wrong, words):
    with pytest.raises(CheckFailure, match=f"^Observed.*{words}"):
        check_accumulation(wrong)


def _broadcast_grads(model):
    for p in model.parameters():
        dist.broadcast(p.grad, src=0)


def _divided_by_parameters(model):
    params = list(model.parameters())
    for p in params:
        dist.all_reduce(p.grad)
        p.grad /= len(params)


@pytest.mark.parametrize("wrong, words", [
    (_broadcast_grads, "^Observed.*broadcast from rank 0"),
    (_divided_by_parameters, "^Observed.*divided by the number of parameters"),
])
def test_average_gradients_more_mistakes_are_named(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check_average_gradients(wrong)


def test_zero1_in_kilobytes_is_named():
    n = checks_distributed.LESSON_GPT_PARAMETERS
    for value, words in ((8 * n // 2 / 1000, "in kB"), (8 * n // 2 / 1024, "in KiB")):
        with pytest.raises(CheckFailure, match=f"^Observed.*{words}"):
            check_zero1_bytes(lambda value=value: value)


def _seeds_variant(seed_offset=0, broadcast_from=None, average=True, zero=True, same_share=False,
                   average_weights=False):
    def train_by_hand(rank, world_size, batches):
        from course_lib.gpt import GPT, GPTConfig

        torch.manual_seed(1337 + seed_offset * rank)
        model = GPT(GPTConfig(vocab_size=67, max_len=16, d_model=32, num_heads=4, num_layers=2)).double()
        if broadcast_from is not None:
            for p in model.parameters():
                dist.broadcast(p.data, src=broadcast_from)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for x, y in batches:
            share = 0 if same_share else rank
            x, y = x.chunk(world_size)[share], y.chunk(world_size)[share]
            if zero:
                optimizer.zero_grad()
            lm_loss(model(x), y).backward()
            if average:
                average_gradients(model)
            optimizer.step()
            if average_weights:
                with torch.no_grad():
                    for p in model.parameters():
                        dist.all_reduce(p)
                        p /= world_size
        return {name: p.detach() for name, p in model.named_parameters()}
    return train_by_hand


@pytest.mark.parametrize("wrong, words", [
    (_seeds_variant(seed_offset=1, broadcast_from=1), "manual_seed\\(1338\\).*broadcast from rank 1"),
    (_seeds_variant(average=False), "differ; each rank's weights.*not averaged"),
    (_seeds_variant(zero=False), "never zeroed.*no zero_grad"),
    (_seeds_variant(same_share=True), "first half of each batch only.*same share"),
    (_seeds_variant(seed_offset=1, average_weights=True), "averaged after each step"),
])
def test_seeded_replicas_wrong_fixes_are_named(wrong, words):
    with pytest.raises(CheckFailure, match=f"^Observed.*{words}"):
        check_seeded_replicas(wrong)


class _HardGelu(nn.Module):
    def __init__(self, dense, rank, world_size):
        super().__init__()
        self.inner = _variant()(dense, rank, world_size)
        self.inner.act = F.gelu

    def forward(self, x):
        return self.inner(x)


class _OverlappingShards(nn.Module):  # rank r keeps rows r*4 .. r*4 + 5 of linear1 (d_ff 12): overlap
    def __init__(self, dense, rank, world_size):
        super().__init__()
        size = dense.linear1.weight.size(0) // world_size
        start = rank * (size - 2)
        self.w1 = nn.Parameter(dense.linear1.weight.detach()[start:start + size].clone())
        self.b1 = nn.Parameter(dense.linear1.bias.detach()[start:start + size].clone())
        self.w2 = nn.Parameter(dense.linear2.weight.detach()[:, start:start + size].clone())
        self.b2 = nn.Parameter(dense.linear2.bias.detach().clone())
        self.act = dense.activation

    def forward(self, x):
        ns = solution_namespace("14.parallel_mlp")
        f, g = ns["CopyToRanks"], ns["SumOverRanks"]
        return g.apply(F.linear(self.act(F.linear(f.apply(x), self.w1, self.b1)), self.w2)) + self.b2


@pytest.mark.parametrize("wrong, words", [
    (_HardGelu, "^Observed.*GELU in place of its relu.*hard-coded"),
    (_OverlappingShards, "^Observed.*holds linear1's weight rows 4..9.*overlap"),
])
def test_parallel_mlp_more_mistakes_are_named(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check_parallel_mlp(wrong)
