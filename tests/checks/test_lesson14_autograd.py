"""Lesson 14's check_f_and_g (Megatron's f and g as torch.autograd.Functions): right solutions in
other styles pass, each named mistake is caught with its own message, course_lib's operators are
refused, bad inputs get a message, a hang is stopped, and no process is left running."""

from __future__ import annotations

import time

import psutil
import pytest
import torch
import torch.distributed as dist
from _helpers import solution_namespace

import course_lib.checks.lesson14_autograd as checks_autograd
from course_lib.checks import CheckFailure, has_passed
from course_lib.checks.lesson14_autograd import check_f_and_g
from course_lib.parallel import CopyToParallel, ReduceFromParallel, copy_to_parallel
from torch.autograd.function import once_differentiable


@pytest.fixture(autouse=True)
def no_process_left():
    yield
    assert psutil.Process().children(recursive=True) == [], "a checker left a process running"


def _solution():
    ns = solution_namespace("14.f_and_g")
    return ns["MyCopyToParallel"], ns["MyReduceFromParallel"]


def _passes(f, g) -> bool:
    assert check_f_and_g(f, g) is None
    return has_passed(f)


def test_solution_passes_quickly_and_keeps_random_state():
    f, g = _solution()
    torch.manual_seed(123)
    start = time.monotonic()
    assert _passes(f, g)
    assert time.monotonic() - start < 10  # the brief: the checker's total under ~10 s
    after = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(after, torch.rand(3))


class _MegatronF(torch.autograd.Function):  # Megatron-LM's own style, in place on grad_output:
    @staticmethod                             # wrong when another branch shares that gradient
    def forward(ctx, input_):
        return input_

    @staticmethod
    def backward(ctx, grad_output):
        dist.all_reduce(grad_output, op=dist.ReduceOp.SUM)
        return grad_output


class _ReturnsInputF(torch.autograd.Function):  # Megatron's `return input_`, reducing a copy
    @staticmethod
    def forward(ctx, input_):
        return input_

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        grad = grad_output.detach().clone()
        dist.all_reduce(grad, async_op=True).wait()
        return grad, None  # a trailing None: autograd drops it


class _SetupContextG(torch.autograd.Function):  # forward without ctx, setup_context beside it
    @staticmethod
    def forward(partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.world_size = dist.get_world_size()

    @staticmethod
    def backward(ctx, grad):
        return grad


class _AvgTimesN(torch.autograd.Function):  # g by ReduceOp.AVG, scaled back; ctx and no_grad used
    @staticmethod
    @torch.no_grad()
    def forward(ctx, partial):
        ctx.world = dist.get_world_size()
        ctx.save_for_backward(partial)  # saved and unused: allowed
        total = torch.empty_like(partial).copy_(partial)
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        return total * ctx.world

    @staticmethod
    def backward(ctx, grad):
        (partial,) = ctx.saved_tensors
        return grad.clone() if partial.shape == grad.shape else None


def test_other_styles_pass():
    f, g = _solution()
    assert _passes(_ReturnsInputF, _AvgTimesN)
    assert _passes(f, _AvgTimesN)
    assert _passes(_ReturnsInputF, _SetupContextG)
    assert _passes(_function(_identity, _async_polled), _function(_async_future, _pass_grad))


def _function(forward, backward):
    return type("Op", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def _identity(ctx, x):
    return x.view_as(x)


def _pass_grad(ctx, grad):
    return grad


def _sum_forward(ctx, x, op=dist.ReduceOp.SUM):
    total = x.clone()
    dist.all_reduce(total, op=op)
    return total


def _sum_grad(ctx, grad, op=dist.ReduceOp.SUM):
    grad = grad.clone()
    dist.all_reduce(grad, op=op)
    return grad


def _f_and_g(f=None, g=None):
    sf, sg = _solution()
    return (f or sf, g or sg)


def _plain_identity(x):
    return x


def _plain_sum(x):
    total = x.clone()
    dist.all_reduce(total)
    return total


def _g_in_place(ctx, x):
    dist.all_reduce(x)
    return x


def _save_a_number(ctx, x):
    ctx.save_for_backward(dist.get_world_size())
    return x.view_as(x)


def _no_ctx(x):
    return x.view_as(x)


def _reduce_not_returned(ctx, grad):
    dist.all_reduce(grad.clone())
    return grad


def _two_gradients(ctx, grad):  # (a trailing None would be allowed: autograd drops it)
    grad = _sum_grad(ctx, grad)
    return grad, grad


def _grad_and_broadcast(ctx, grad):
    grad = _sum_grad(ctx, grad)
    dist.broadcast(grad, src=0)
    return grad


def _two_reduces(ctx, grad):
    grad = _sum_grad(ctx, grad)
    zero = torch.zeros_like(grad)
    dist.all_reduce(zero)
    return grad + zero


def _rank0_reduces(ctx, grad):
    if dist.get_rank() == 0:
        dist.all_reduce(grad)
    return grad


def _reads_unsaved(ctx, grad):
    (x,) = ctx.saved_tensors
    return _sum_grad(ctx, grad)


def _stub(ctx, *args):
    raise NotImplementedError


def _op(op):
    return lambda ctx, t: _sum_forward(ctx, t, op)


def _grad_op(op):
    return lambda ctx, grad: _sum_grad(ctx, grad, op)


def _times_world(ctx, t):
    return t * dist.get_world_size()


def _over_world(ctx, t):
    return t / dist.get_world_size()


def _sum_times_world(ctx, t):
    return _sum_forward(ctx, t) * dist.get_world_size()


def _broadcast(src):
    def copy(ctx, t):
        t = t.clone()
        dist.broadcast(t, src=src)
        return t
    return copy


def _reduce_to_0(ctx, t):
    t = t.clone()
    dist.reduce(t, dst=0)
    return t


def _zeros(ctx, grad):
    return torch.zeros_like(grad)


def _reduce_detached(ctx, grad):  # detach() shares the incoming gradient's storage
    grad = grad.detach()
    dist.all_reduce(grad)
    return grad


def _g_backward_reduces_in_place(ctx, grad):  # right numbers, but the incoming gradient is changed
    dist.all_reduce(grad)
    return grad / dist.get_world_size()


class MyCopyToParallel(torch.autograd.Function):  # forward only: "autograd will derive backward"
    @staticmethod
    def forward(ctx, x):
        return x.clone()


class _Typo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backwards(ctx, grad):
        return _sum_grad(ctx, grad)


class _NoForward(torch.autograd.Function):
    @staticmethod
    def backward(ctx, grad):
        return grad


def _plain_wraps_forward_only(x):  # a plain function around a Function without backward
    return MyCopyToParallel.apply(x)


class _NotAFunction:  # forward and backward, but no torch.autograd.Function base
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _sum_grad(ctx, grad)


def _save_input(ctx, x):
    ctx.save_for_backward(x)
    return x.view_as(x)


def _reduce_saved(ctx, grad):  # reduces forward's input, not the gradient
    (x,) = ctx.saved_tensors
    return _sum_grad(ctx, x)


def _sum_saved(ctx, x):
    ctx.save_for_backward(x)
    return _sum_forward(ctx, x)


def _return_saved(ctx, grad):
    (x,) = ctx.saved_tensors
    return x.clone()


def _async_no_wait(ctx, t):
    t = t.clone()
    dist.all_reduce(t, async_op=True)
    return t


def _async_polled(ctx, t):  # waits by polling: right
    t = t.clone()
    work = dist.all_reduce(t, async_op=True)
    while not work.is_completed():
        pass
    return t


def _async_future(ctx, t):  # waits on the future: right
    t = t.clone()
    dist.all_reduce(t, async_op=True).get_future().wait()
    return t


MISTAKES = [
    (_f_and_g(*reversed(_solution())), "f and g are swapped"),
    (_f_and_g(f=_function(_identity, lambda ctx, g: _sum_grad(ctx, g, dist.ReduceOp.AVG))),
     "x's gradient is the MEAN"),
    (_f_and_g(g=_function(lambda ctx, x: _sum_forward(ctx, x, dist.ReduceOp.AVG), _pass_grad)),
     "g's output is the MEAN"),
    (_f_and_g(f=_function(_identity, lambda ctx, g: None)), "f's backward returned None"),
    (_f_and_g(g=_function(_sum_forward, lambda ctx, g: None)), "g's backward returned None"),
    (_f_and_g(f=_function(_identity, _two_gradients)), "one gradient for each input of forward"),
    (_f_and_g(g=_function(_g_in_place, _pass_grad)), "holds the sum over the ranks: g changed"),
    (_f_and_g(f=_plain_identity), "f is a plain function"),
    (_f_and_g(g=_plain_sum), "your g is a plain function"),
    (_f_and_g(f=_function(_save_a_number, _sum_grad)), "keeps tensors only"),
    (_f_and_g(f=_function(_identity, _reads_unsaved)), "ctx.saved_tensors holds only"),
    (_f_and_g(f=_function(_no_ctx, _sum_grad)), "forward takes ctx first"),
    (_f_and_g(f=_function(_sum_forward, _sum_grad)), "f's output is the sum of the ranks' x"),
    (_f_and_g(f=_function(_identity, _pass_grad)), "no all-reduce in f's backward"),
    (_f_and_g(f=_function(_identity, _reduce_not_returned)), "on a tensor it does not return"),
    (_f_and_g(g=_function(_identity, _pass_grad)), "g's output is this rank's own input"),
    (_f_and_g(g=_function(_sum_forward, _sum_grad)), "an all-reduce in g's backward"),
    (_f_and_g(f=_function(_identity, _grad_and_broadcast)), r"call \['f backward:broadcast'\]"),
    (_f_and_g(f=_function(_identity, _two_reduces)), "2 in f backward"),
    (_f_and_g(f=_function(_identity, _rank0_reduces)), "never reached"),
    # the incoming gradient changed in place: another branch reads it
    (_f_and_g(f=_MegatronF), "handed to f's backward was changed in place: the residual branch's "
     "gradient now holds the sum over the ranks"),
    (_f_and_g(f=_function(_identity, _reduce_detached)),
     "handed to f's backward was changed in place"),
    (_f_and_g(g=_function(_sum_forward, _g_backward_reduces_in_place)),
     "handed to g's backward was changed in place: the residual"),
    # a Function without backward or forward: PyTorch's NotImplementedError, not the stub's
    (_f_and_g(f=MyCopyToParallel),
     "`MyCopyToParallel` \\(your f\\) defines forward but no backward\\. "),
    (_f_and_g(f=_Typo), "`backwards` is not `backward`"),
    (_f_and_g(g=_NoForward), "defines backward but no forward"),
    (_f_and_g(f=_plain_wraps_forward_only), "a torch.autograd.Function without backward"),
    # told apart by what the ranks' numbers are
    (_f_and_g(f=_function(_identity, _times_world)),
     "x's gradient after f is world_size \\(2\\) times this rank's own upstream gradient"),
    (_f_and_g(f=_function(_identity, _grad_op(dist.ReduceOp.MAX))),
     "x's gradient after f is the elementwise max over the ranks' upstream gradients"
     ".*ReduceOp.MAX"),
    (_f_and_g(f=_function(_identity, _grad_op(dist.ReduceOp.MIN))),
     "elementwise min.*ReduceOp.MIN"),
    (_f_and_g(f=_function(_identity, _grad_op(dist.ReduceOp.PRODUCT))),
     "elementwise product.*ReduceOp.PRODUCT"),
    (_f_and_g(f=_function(_identity, _broadcast(0))),
     "x's gradient after f is rank 0's upstream gradient on every rank.*dist.broadcast"),
    (_f_and_g(f=_function(_identity, _broadcast(1))), "rank 1's upstream gradient on every rank"),
    (_f_and_g(f=_function(_identity, _reduce_to_0)),
     "the sum of the ranks' upstream gradients on rank 0 only.*dist.reduce"),
    (_f_and_g(f=_function(_identity, _sum_times_world)), "world_size \\(2\\) times the sum of"),
    (_f_and_g(f=_function(_identity, _over_world)), "own upstream gradient divided by world_size"),
    (_f_and_g(f=_function(_identity, _zeros)), "x's gradient after f is all zeros"),
    (_f_and_g(f=_function(_op(dist.ReduceOp.MAX), _sum_grad)),
     "f's output is the elementwise max over the ranks' x.*f's forward is the identity"),
    (_f_and_g(f=_function(_broadcast(0), _sum_grad)), "f's output is rank 0's x on every rank"),
    (_f_and_g(f=_function(_times_world, _sum_grad)), "f's output is world_size \\(2\\) times"),
    (_f_and_g(g=_function(_op(dist.ReduceOp.MAX), _pass_grad)),
     "g's output is the elementwise max over the ranks' inputs"),
    (_f_and_g(g=_function(_op(dist.ReduceOp.PRODUCT), _pass_grad)), "g's output is the elementwise "
     "product"),
    (_f_and_g(g=_function(_times_world, _pass_grad)),
     "g's output is world_size \\(2\\) times this rank's own input"),
    (_f_and_g(g=_function(_broadcast(0), _pass_grad)),
     "g's output is rank 0's input on every rank"),
    (_f_and_g(g=_function(_reduce_to_0, _pass_grad)),
     "g's output is the sum of the ranks' inputs on rank 0 only"),
    (_f_and_g(g=_function(_sum_forward, _over_world)), "g's input gradient is half the upstream"),
    (_f_and_g(f=_NotAFunction), "is a class but not a subclass of torch.autograd.Function"),
    (_f_and_g(f=_function(_save_input, _reduce_saved)),
     "x's gradient after f is the sum of the ranks' x \\(forward's input\\)"),
    (_f_and_g(g=_function(_sum_saved, _return_saved)),
     "g's input gradient is this rank's own input \\(forward's input\\)"),
    (_f_and_g(f=_function(_identity, _async_no_wait)),
     "in f backward, dist.all_reduce\\(..., async_op=True\\) returns a handle that nothing waits"),
    (_f_and_g(g=_function(_async_no_wait, _pass_grad)), "in g forward, dist.all_reduce"),
]


@pytest.mark.parametrize("ops, words", MISTAKES, ids=[w[:30] for _, w in MISTAKES])
def test_mistakes_are_named(ops, words):
    with pytest.raises(CheckFailure, match=words):
        check_f_and_g(*ops)


def test_course_lib_is_refused():
    f, g = _solution()
    with pytest.raises(CheckFailure, match="course_lib's CopyToParallel"):
        check_f_and_g(CopyToParallel, g)
    with pytest.raises(CheckFailure, match="course_lib's ReduceFromParallel"):
        check_f_and_g(f, ReduceFromParallel)

    class Sub(CopyToParallel):
        pass

    with pytest.raises(CheckFailure, match="course_lib's Sub"):
        check_f_and_g(Sub, g)
    wraps = _function(_identity, lambda ctx, grad: CopyToParallel.backward(ctx, grad))
    with pytest.raises(CheckFailure, match="calls course_lib's CopyToParallel"):
        check_f_and_g(wraps, g)
    with pytest.raises(CheckFailure, match="course_lib's copy_to_parallel"):
        check_f_and_g(copy_to_parallel, g)


def test_bad_inputs_get_messages(capsys):
    f, g = _solution()
    with pytest.raises(CheckFailure, match="Pass the two classes"):
        check_f_and_g(f)
    with pytest.raises(CheckFailure, match="Pass the two classes"):
        check_f_and_g(3, g)
    with pytest.raises(CheckFailure, match="same object as f and as g"):
        check_f_and_g(f, f)
    check_f_and_g(_function(_stub, _stub), _function(_stub, _stub))
    assert "not implemented yet" in capsys.readouterr().out
    check_f_and_g(f, _function(_stub, _stub))
    assert "not implemented yet" in capsys.readouterr().out


def _spins(ctx, x):
    while True:
        pass


def test_a_rank_that_never_ends_is_stopped(monkeypatch):
    monkeypatch.setattr(checks_autograd, "TIME_LIMIT", 2.0)
    with pytest.raises(CheckFailure, match="did not finish on 2 ranks within 2 s"):
        check_f_and_g(*_f_and_g(f=_function(_spins, _pass_grad)))
