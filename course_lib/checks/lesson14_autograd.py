"""Checker for lesson 14's custom autograd operators: Megatron's f and g.

* ``check_f_and_g(f, g)``: ``f`` and ``g`` are ``torch.autograd.Function`` classes (Megatron-LM's
  two operators of tensor parallelism). **f**: the identity forward; backward, the all-reduce (sum
  over the ranks) of the incoming gradient. **g**: forward, the all-reduce (sum) of the input over
  the ranks; backward, the identity. Neither changes the tensor it is given.

The checker runs both on 2 gloo processes (``course_lib.launch.run_on_ranks``; forked from the
notebook's kernel on Linux, so classes defined in a cell run there as they are), every rank with
its own input, f with another upstream gradient on every rank and g with the same one on every rank
(after g, Megatron's MLP holds the same output on every rank). A residual branch recorded before
each operator shares its upstream gradient tensor, so a backward that changes that tensor in place
shows in the branch's gradient. It counts the collectives of each pass and compares outputs and
gradients with the sums, in float64, to 1e-12; a wrong answer is named by what the ranks' numbers
are (their mean, max, min or product, world_size times one's own, one rank's copy, the sum on rank
0 alone), and a class without its own forward or backward is named before any rank starts (PyTorch's
NotImplementedError would read as the unfinished stub's). One run on the ranks,
under a deadline of ``TIME_LIMIT`` seconds: a rank that never reaches a collective, or a loop that
never ends, is stopped and named.
"""

from __future__ import annotations

import difflib
import re
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..launch import RankFailed, RanksTimedOut, run_on_ranks
from ..parallel import CopyToParallel, ReduceFromParallel, copy_to_parallel, reduce_from_parallel
from .common import CheckFailure, calls_to, checker, is_course_lib, plain, time_limit

__all__ = ["check_f_and_g"]

TIME_LIMIT = 9.0  # seconds for the run on the ranks (one to three when right, on a busy machine)
SHAPE = (2, 3, 4)  # (B, T, d) of every test tensor
TOL = 1e-12
COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all", "reduce",
               "all_gather_into_tensor", "reduce_scatter_tensor")
PHASES = ("f forward", "f backward", "g forward", "g backward")
REFERENCES = (CopyToParallel.forward, CopyToParallel.backward, ReduceFromParallel.forward,
              ReduceFromParallel.backward, copy_to_parallel, reduce_from_parallel)


def test_tensors(rank: int) -> dict[str, torch.Tensor]:
    """This rank's inputs (float64, ``SHAPE``): ``x`` for f and its upstream gradient ``grad_f``
    (other on every rank), ``partial`` for g and its upstream gradient ``grad_g`` (the same on every
    rank)."""
    def draw(seed: int) -> torch.Tensor:
        return torch.randn(SHAPE, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))

    return {"x": draw(100 + rank), "grad_f": draw(200 + rank), "partial": draw(300 + rank),
            "grad_g": draw(400)}


def is_function_class(op: Any) -> bool:
    """A subclass of ``torch.autograd.Function`` (or an instance of one)."""
    kind = op if isinstance(op, type) else type(op)
    return issubclass(kind, torch.autograd.Function) and kind is not torch.autograd.Function


def _apply(op: Any, x: torch.Tensor) -> Any:
    if is_function_class(op):
        return (op if isinstance(op, type) else type(op)).apply(x)
    return op(x)  # a plain function: the checker observes what autograd makes of it


def _f_and_g_case(rank: int, world_size: int, f: Any, g: Any) -> dict[str, Any]:
    """One rank: f forward and backward, then g forward and backward, each pass's collectives
    counted. A learner's error is raised again as ``RuntimeError("<pass>: <error>")``, so that the
    launcher names it (and the pass) before a peer's broken connection."""
    import torch.distributed.distributed_c10d as c10d

    torch.manual_seed(rank)
    t = test_tensors(rank)
    counts: dict[str, int] = {}
    phase = [PHASES[0]]
    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def counted(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            key = f"{phase[0]}:{name}"
            counts[key] = counts.get(key, 0) + 1
            work = original(*args, **kwargs)
            if work is None:  # a blocking call: done on return
                return work
            handle = WorkWatched(work, key)  # async_op=True: the sum arrives after .wait()
            handles.append(handle)
            return handle
        return wrapper

    for name, original in originals.items():
        setattr(dist, name, counted(name, original))
        setattr(c10d, name, getattr(dist, name))
    result: dict[str, Any] = {"counts": counts}
    handles: list[WorkWatched] = []
    try:
        with calls_to(list(REFERENCES)) as seen, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for op, name, given, upstream in ((f, "f", "x", "grad_f"), (g, "g", "partial", "grad_g")):
                inp = t[given].clone().requires_grad_(True)
                # a residual branch, recorded before the operator: autograd hands one and the same
                # gradient tensor to the operator's backward and to this branch, and runs the
                # operator's backward first, so a change in place shows in side.grad
                side = torch.zeros_like(inp, requires_grad=True)
                branch = side * 1.0
                phase[0] = f"{name} forward"
                try:
                    out = _apply(op, inp)
                except NotImplementedError as err:
                    _torch_missing_method(err, phase[0])
                    raise
                except Exception as err:  # noqa: BLE001 (named by the parent)
                    raise RuntimeError(f"{phase[0]}: {type(err).__name__}: {err}") from None
                tracked = isinstance(out, torch.Tensor) and out.requires_grad
                result[f"{name}_out"] = plain(out.detach(), "the output") if isinstance(
                    out, torch.Tensor) else type(out).__name__
                result[f"{name}_tracked"] = tracked
                result[f"{name}_input_after_forward"] = inp.detach().clone()
                if tracked and out.shape == inp.shape:
                    phase[0] = f"{name} backward"
                    handed: list[tuple[torch.Tensor, torch.Tensor]] = []
                    out.register_hook(lambda grad: handed.append((grad, grad.detach().clone())))
                    try:
                        # ((out + branch) * upstream).sum(): out's gradient is exactly `upstream`,
                        # and unlike out.backward(upstream) it does not import sympy (seconds in
                        # each rank)
                        ((out + branch) * t[upstream]).sum().backward()
                    except NotImplementedError as err:
                        _torch_missing_method(err, phase[0])
                        raise
                    except Exception as err:  # noqa: BLE001 (named by the parent)
                        raise RuntimeError(f"{phase[0]}: {type(err).__name__}: {err}") from None
                    if handed:
                        now, before = handed[0]
                        result[f"{name}_handed_now"] = now.detach().clone()
                        result[f"{name}_handed_changed"] = not torch.equal(now, before)
                    result[f"{name}_side_grad"] = None if side.grad is None else side.grad.clone()
                result[f"{name}_grad"] = None if inp.grad is None else inp.grad.clone()
        result["course_lib"] = bool(seen)
        result["warnings"] = [str(w.message) for w in caught]
        result["unwaited"] = sorted({h.key for h in handles if not h.waited})
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
            setattr(c10d, name, original)
    return result


class WorkWatched:
    """The handle of an asynchronous collective (``async_op=True``), passed through to the learner:
    records whether anything waited for it (``wait``, ``synchronize``, ``get_future``, ``result``,
    or an ``is_completed`` that said True)."""

    def __init__(self, work: Any, key: str) -> None:
        self._work, self.key, self.waited = work, key, False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._work, name)
        if name in ("wait", "synchronize", "get_future", "result"):
            self.waited = True
        elif name == "is_completed":
            def is_completed() -> bool:
                done = bool(attr())
                self.waited = self.waited or done
                return done
            return is_completed
        return attr


def _torch_missing_method(err: NotImplementedError, where: str) -> None:
    """PyTorch's own NotImplementedError (a Function without backward or forward) raised again as a
    RuntimeError, so that the parent names it instead of taking it for the stub's."""
    if str(err).startswith("You must implement"):
        raise RuntimeError(f"{where}: NotImplementedError: {err}") from None


def _near(a: Any, b: torch.Tensor) -> bool:
    return (isinstance(a, torch.Tensor) and a.shape == b.shape
            and (a.double() - b).abs().max().item() <= TOL)


# What autograd's own errors mean in f and g, and what to look at: (pattern, what it means).
_ERRORS = (
    (r"You must implement either the backward or vjp",
     "a torch.autograd.Function without backward: autograd never derives a Function's backward "
     "from its forward (forward runs with autograd switched off), so it needs a backward(ctx, "
     "grad) of your own"),
    (r"You must implement the forward",
     "a torch.autograd.Function without forward: .apply(x) calls its forward(ctx, x), which you "
     "write"),
    (r"incorrect number of gradients \(expected (\d+), got (\d+)\)",
     "backward returns one gradient for each input of forward: forward(ctx, x) has one input, so "
     "backward returns one tensor (not a tuple with extra entries)"),
    (r"save_for_backward can only save",
     "ctx.save_for_backward(...) keeps tensors only; keep anything else (a number, the world size) as "
     "an attribute, ctx.name = value (f and g need nothing saved at all)"),
    (r"\w+\(\) takes \d+ positional argument|\w+\(\) missing \d+ required positional",
     "PASS takes ctx first: forward(ctx, x) and backward(ctx, grad), both under @staticmethod "
     "(the checker calls .apply(x))"),
    (r"not enough values to unpack|saved_tensors",
     "ctx.saved_tensors holds only what forward passed to ctx.save_for_backward (f and g need "
     "nothing saved)"),
)


def _run(f: Any, g: Any) -> list[dict[str, Any]]:
    """The case on 2 ranks; a learner's error, a rank left waiting or a hang becomes a CheckFailure."""
    try:
        with time_limit(TIME_LIMIT + 5, f"The ranks ran for more than {TIME_LIMIT + 5:g} s and were "
                        "stopped."):
            return run_on_ranks(_f_and_g_case, 2, (f, g), timeout=TIME_LIMIT)
    except RanksTimedOut:
        raise CheckFailure(
            f"Observed: your f and g did not finish on 2 ranks within {TIME_LIMIT:g} s; the ranks were "
            "stopped. Does every rank call the same collectives in the same order (no all_reduce under "
            "`if rank == 0:`), and does every loop end?", mistake="ranks did not finish") from None
    except RankFailed as err:
        first = str(err).splitlines()[0]
        if re.match(r"rank \d+ raised NotImplementedError", first):  # the stub's, not PyTorch's
            raise NotImplementedError from None
        if "never reached" in first:
            raise CheckFailure(
                f"Observed: {first} Likely mistake: a collective "
                "that only some ranks call (all_reduce under `if rank == ...`, or after a return "
                "that only one rank takes).", mistake="a collective only some ranks call") from None
        match = re.search(r"raised RuntimeError: ((?:f|g) (?:forward|backward)): (\w+): (.*)", first)
        if match:
            where, kind, message = match.groups()
            for pattern, meaning in _ERRORS:
                if re.search(pattern, message):
                    meaning = meaning.replace("PASS", where.split()[1])
                    raise CheckFailure(f"Observed: your {where} raised {kind}: "
                                       f"{message.rstrip('.')}. Likely "
                                       f"mistake: {meaning}.", mistake=meaning.split(":")[0]) from None
            raise CheckFailure(f"Your {where} raised {kind} on 2 ranks: "
                               f"{message.rstrip('.')}.") from None
        raise CheckFailure(f"Your f and g failed on 2 ranks: {first}") from None


def _refuse_course_lib(op: Any, which: str) -> None:
    kind = op if isinstance(op, type) else type(op)
    refs = {"f": (CopyToParallel, copy_to_parallel), "g": (ReduceFromParallel, reduce_from_parallel)}
    if (is_course_lib(op) or (isinstance(kind, type) and issubclass(kind, (CopyToParallel,
                                                                          ReduceFromParallel)))):
        name = getattr(op, "__name__", kind.__name__)
        raise CheckFailure(f"That is course_lib's {name} (or built on it): write your own {which}, a "
                           "torch.autograd.Function with dist.all_reduce. course_lib's "
                           f"{refs[which][0].__name__} is the very operator this exercise builds.")


def _check_inputs(f: Any, g: Any) -> None:
    for op, which, name in ((f, "f", "MyCopyToParallel"), (g, "g", "MyReduceFromParallel")):
        if op is None or not callable(op):
            raise CheckFailure(f"Pass the two classes themselves: check_f_and_g(MyCopyToParallel, "
                               f"MyReduceFromParallel). Your {which} ({name}) is {type(op).__name__}, "
                               "not a torch.autograd.Function class.")
        _refuse_course_lib(op, which)
        if isinstance(op, type) and not is_function_class(op):
            raise CheckFailure(
                f"Observed: your {which}, `{op.__name__}`, is a class but not a subclass of "
                "torch.autograd.Function, so it has no .apply and autograd never calls its "
                f"backward. Write class {op.__name__}(torch.autograd.Function).",
                mistake="not a Function")
        _missing_methods(op, which)
    if f is g:
        raise CheckFailure("You passed the same object as f and as g: they are two operators, f "
                           "(MyCopyToParallel) and g (MyReduceFromParallel).")


def _missing_methods(op: Any, which: str) -> None:
    """A Function class without its own forward or backward (PyTorch's base methods only raise
    NotImplementedError, which would read as the unfinished stub): named before any rank starts."""
    if not is_function_class(op):
        return
    kind = op if isinstance(op, type) else type(op)
    base = torch.autograd.Function
    missing = [m for m, aliases in (("forward", ("forward",)), ("backward", ("backward", "vjp")))
               if all(getattr(kind, a, None) is getattr(base, a, None) for a in aliases)]
    if not missing:
        return
    own = {n for k in kind.__mro__ if k not in base.__mro__ for n, v in vars(k).items()
           if isinstance(v, (staticmethod, classmethod, types.FunctionType))}  # methods written
    typos = []
    for method in missing:
        lower = {n.lower(): n for n in own
                 if n not in ("forward", "backward", "vjp", "setup_context")}
        close = difflib.get_close_matches(method, list(lower), n=1, cutoff=0.75)
        if close:
            typos.append(f"`{lower[close[0]]}` is not `{method}`: autograd calls only the "
                         f"method named exactly {method}")
    typo = f" ({'; '.join(typos)})" if typos else ""
    name = kind.__name__
    if missing == ["backward"]:
        raise CheckFailure(
            f"Observed: `{name}` (your {which}) defines forward but no backward{typo}. Autograd "
            "cannot derive a backward for a torch.autograd.Function from its forward (forward runs "
            "with autograd switched off; nothing in it is recorded), so the backward pass through "
            f"{name} stops at PyTorch's NotImplementedError (\"You must implement either the "
            f"backward or vjp method ...\"). {which}'s backward is the heart of this exercise: "
            "write backward(ctx, grad) too, under @staticmethod.", mistake="no backward")
    what = "backward but no forward" if missing == ["forward"] else "neither forward nor backward"
    raise CheckFailure(
        f"Observed: `{name}` (your {which}) defines {what}{typo}, so {name}.apply(x) stops at "
        "PyTorch's NotImplementedError (\"You must implement the forward function ...\"). Write "
        "forward(ctx, x) and backward(ctx, grad), both under @staticmethod.", mistake="no forward")


@checker
def check_f_and_g(f: Any, g: Any = None) -> None:
    """Check Megatron's f (identity forward, gradient all-reduced in backward) and g (all-reduce
    forward, identity backward), both ``torch.autograd.Function`` classes, on 2 gloo processes:
    outputs and gradients equal the sums over the ranks (1e-12, float64), one all-reduce in f's
    backward and one in g's forward, and neither changes the tensor it is given."""
    _check_inputs(f, g)
    results = _run(f, g)
    expected = [test_tensors(r) for r in range(2)]
    for rank, r in enumerate(results):
        if r["course_lib"]:
            raise CheckFailure("Your f or g calls course_lib's CopyToParallel, ReduceFromParallel, "
                               "copy_to_parallel or reduce_from_parallel: write your own with "
                               "torch.autograd.Function and dist.all_reduce.")
    for rank, r in enumerate(results):
        if r["unwaited"]:
            where, name = r["unwaited"][0].split(":")
            raise CheckFailure(
                f"Observed (rank {rank}): in {where}, dist.{name}(..., async_op=True) returns a "
                "handle that nothing waits on, so the tensor is returned, and read, before the "
                "collective is known to be done (the sum may or may not have arrived). Likely "
                "mistake: an asynchronous collective without work.wait() before its result is "
                "used.",
                mistake="async collective not waited")
    _swapped(results, expected)
    for rank in range(len(results)):
        _check_f(results, expected, rank, f)
        _check_g(results, expected, rank, g)
    for rank, r in enumerate(results):
        _check_counts(r, rank)
    print("check_f_and_g: on 2 ranks, f is the identity forward and sums the gradient in backward, g "
          "sums forward and passes the gradient through, one all-reduce each, inputs untouched "
          "(to 1e-12 in float64). Well done!")


def _swapped(results: list[dict[str, Any]], expected: list[dict[str, torch.Tensor]]) -> None:
    """f doing g's job and g doing f's: the all-reduces are in the wrong passes."""
    x_sum = expected[0]["x"] + expected[1]["x"]
    f_sums_forward = all(_near(r["f_out"], x_sum) for r in results)
    g_passes_forward = all(_near(r["g_out"], expected[k]["partial"]) for k, r in enumerate(results))
    f_own_grad = all(_near(r.get("f_grad"), expected[k]["grad_f"]) for k, r in enumerate(results))
    g_sums_grad = all(_near(r.get("g_grad"), 2 * expected[k]["grad_g"]) for k, r in enumerate(results))
    if f_sums_forward and g_passes_forward and (f_own_grad or g_sums_grad):
        message = ("f and g are swapped: each all-reduce sits in the other pass. f is the identity "
                   "forward and all-reduces in backward; g all-reduces in forward and is the identity "
                   "in backward")
        raise CheckFailure(
            "Observed: f's output is the sum of the ranks' inputs, g's output is each rank's own input, "
            "and the gradients are reduced in g's backward, not in f's. Likely mistake: "
            f"{message}.", mistake="f and g swapped")


# Mistakes told apart by how the ranks' values follow from the ranks' inputs (random float64,
# other on every rank: the sum, the mean, world_size times one's own, the max, min and product all
# differ).
_ORDER = ("own", "sum", "mean", "world_times_own", "max", "min", "product", "rank 0's", "rank 1's",
          "zeros", "world_times_sum", "own_over_world")


def _pattern(values: list[Any], inputs: list[torch.Tensor]) -> str | None:
    """What ``values`` (one per rank) are, as a function of ``inputs`` (one per rank, the same
    shape): a key of ``_ORDER`` true on every rank, "rank0_only" (the sum on rank 0 alone), or
    None."""
    n = len(inputs)
    stack = torch.stack(inputs)  # (n, *SHAPE)
    total = stack.sum(0)

    def candidates(r: int) -> dict[str, torch.Tensor]:
        return {"own": inputs[r], "sum": total, "mean": total / n, "world_times_own": n * inputs[r],
                "max": stack.amax(0), "min": stack.amin(0), "product": stack.prod(0),
                "rank 0's": inputs[0], "rank 1's": inputs[1], "zeros": torch.zeros_like(total),
                "world_times_sum": n * total, "own_over_world": inputs[r] / n}

    matches = [{k for k, v in candidates(r).items() if _near(values[r], v)} for r in range(n)]
    for key in _ORDER:
        if all(key in m for m in matches):
            return key
    if "sum" in matches[0] and not any("sum" in m for m in matches[1:]):
        return "rank0_only"
    return None


def _named(key: str | None, subject: str, things: str, one: str, where: str,
           identity: str = "") -> None:
    """CheckFailure naming the mistake behind pattern ``key`` of ``subject`` (for instance "x's
    gradient after f"), if it is one of those below. ``identity``: where the right answer is each
    rank's own input (f's forward), the sentence saying so; else the right answer is the sum."""
    ops = {"max": "MAX", "min": "MIN", "product": "PRODUCT"}
    if key in ops:
        observed = f"{subject} is the elementwise {key} over {things}"
        cause = (f"dist.all_reduce with op=ReduceOp.{ops[key]} (the sum is ReduceOp.SUM, the "
                 "default)")
    elif key in ("rank 0's", "rank 1's"):
        src = key[5]
        observed = f"{subject} is rank {src}'s {one} on every rank"
        cause = (f"dist.broadcast(..., src={src}), which copies rank {src}'s tensor to every "
                 "rank, in place of dist.all_reduce, which sums")
    elif key == "rank0_only":
        observed = f"{subject} is the sum of {things} on rank 0 only; rank 1's is not"
        cause = "dist.reduce(..., dst=0), which leaves the sum on rank 0 alone"
    elif key == "world_times_own":
        observed = f"{subject} is world_size (2) times this rank's own {one}" + (
            "" if identity else f", not the sum of {things} (which differ from rank to rank)")
        cause = ("a multiplication by the world size" if identity else
                 "a multiplication by the world size in place of an all-reduce: that gives the sum "
                 f"only when every rank holds the same {one}")
    elif key == "world_times_sum":
        observed = f"{subject} is world_size (2) times the sum of {things}"
        cause = "the sum multiplied by the world size as well (an all-reduce, then `* world_size`)"
    elif key == "own_over_world":
        observed = f"{subject} is this rank's own {one} divided by world_size (2)"
        cause = "a division by the world size" + ("" if identity else ", and no all-reduce")
    elif key == "zeros":
        raise CheckFailure(f"Observed {where}: {subject} is all zeros on every rank.",
                           mistake="zeros")
    else:
        return
    if identity:
        cause += f"; {identity}"
    tags = {"world_times_own": "multiplied by the world size", "world_times_sum":
            "sum times the world size", "own_over_world": "divided by the world size",
            "rank0_only": "reduce to rank 0 only", "rank 0's": "broadcast", "rank 1's": "broadcast"}
    raise CheckFailure(f"Observed {where}: {observed}. Likely mistake: {cause}.",
                       mistake=tags.get(key, f"ReduceOp.{ops.get(key, key)}"))


def _check_f(results: list[dict[str, Any]], expected: list[dict[str, torch.Tensor]], rank: int,
             f: Any) -> None:
    r = results[rank]
    mine = expected[rank]
    where = f"(rank {rank})"
    x_sum = expected[0]["x"] + expected[1]["x"]
    out = r["f_out"]
    if not isinstance(out, torch.Tensor) or out.shape != mine["x"].shape:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else out
        raise CheckFailure(f"f's forward returns {shape} {where}; expected a tensor shaped like its input, "
                           f"{tuple(mine['x'].shape)}.")
    if not torch.equal(r["f_input_after_forward"], mine["x"]):
        raise CheckFailure(f"Observed {where}: after f's forward, the tensor x you were given holds other "
                           "numbers: f changed its caller's tensor. f's forward must leave x as it is.",
                           mistake="f changes its input")
    if not _near(out, mine["x"]):
        if _near(out, x_sum):
            raise CheckFailure(f"Observed {where}: f's output is the sum of the ranks' x. Likely mistake: "
                               "an all-reduce in f's forward; f is the identity forward (its all-reduce "
                               "is in backward).", mistake="f reduces in forward")
        if _near(out, x_sum / 2):
            raise CheckFailure(f"Observed {where}: f's output is the mean of the ranks' x. Likely mistake: "
                               "an all-reduce (averaged) in f's forward; f is the identity forward.",
                               mistake="f reduces in forward")
        key = _pattern([q["f_out"] for q in results], [e["x"] for e in expected])
        _named(key, "f's output", "the ranks' x", "x", where,
               identity="f's forward is the identity")
        raise CheckFailure(f"f's output differs from its input x by up to "
                           f"{(out - mine['x']).abs().max().item():.3g} {where}: f's forward is the "
                           "identity.")
    if not r["f_tracked"]:
        raise CheckFailure(f"Observed {where}: f's output does not require grad, so nothing can flow back "
                           "to x. Likely mistake: the output is detached (or marked non-differentiable); "
                           "return it from forward as it is.", mistake="f's output detached")
    _check_f_grad(results, expected, rank, f)


def _check_f_grad(results: list[dict[str, Any]], expected: list[dict[str, torch.Tensor]], rank: int,
                  f: Any) -> None:
    r = results[rank]
    where = f"(rank {rank})"
    mine = expected[rank]
    total = expected[0]["grad_f"] + expected[1]["grad_f"]
    grad = r["f_grad"]
    backward_reduces = r["counts"].get("f backward:all_reduce", 0)
    if grad is None:
        raise CheckFailure(f"Observed {where}: x.grad is None after backward through f. Likely mistake: "
                           "f's backward returned None; it must return x's gradient (the incoming one, "
                           "summed over the ranks).", mistake="backward returns None")
    key = _pattern([q.get("f_grad") for q in results], [e["grad_f"] for e in expected])
    if key == "sum" or (key is None and _near(grad, total)):  # (None: another rank's is named)
        _check_handed(r, "f", mine["grad_f"], total, where)
        return
    if key == "own" or (key is None and _near(grad, mine["grad_f"])):
        if not is_function_class(f):
            message = ("f is a plain function, not a torch.autograd.Function: autograd derives its "
                       "backward from what forward did (the identity), so nothing can sum the "
                       "gradient. Write f as a class with its own backward")
            raise CheckFailure(f"Observed {where}: x's gradient is this rank's own upstream gradient, not "
                               f"the sum over the ranks. Likely mistake: {message}.",
                               mistake="plain function")
        how = ("f's backward calls all_reduce, but on a tensor it does not return (dist.all_reduce "
               "changes the tensor it is given, in place, and returns None)" if backward_reduces else
               "no all-reduce in f's backward: the ranks' gradients for x must be summed")
        raise CheckFailure(f"Observed {where}: x's gradient is this rank's own upstream gradient, not the "
                           f"sum over the ranks. Likely mistake: {how}.", mistake="f's gradient not reduced")
    if key == "mean":
        raise CheckFailure(f"Observed {where}: x's gradient is the MEAN of the ranks' upstream gradients. "
                           "Likely mistake: averaging (ReduceOp.AVG, or a division by the world size) "
                           "instead of summing: every rank's part of x's gradient counts whole.",
                           mistake="averaging instead of summing")
    _named(key, "x's gradient after f", "the ranks' upstream gradients", "upstream gradient", where)
    _forward_input_as_gradient(grad, [e["x"] for e in expected], rank, "x's gradient after f",
                               "x")
    raise CheckFailure(f"x's gradient after f differs from the sum of the ranks' upstream gradients by up "
                       f"to {(grad - total).abs().max().item():.3g} {where}.")


def _forward_input_as_gradient(grad: torch.Tensor, inputs: list[torch.Tensor], rank: int,
                               subject: str, one: str) -> None:
    """A backward that returns (or reduces) forward's input instead of its incoming gradient."""
    total = torch.stack(inputs).sum(0)  # (*SHAPE)
    for value, what in ((total, f"the sum of the ranks' {one} (forward's input)"),
                        (inputs[rank], f"this rank's own {one} (forward's input)")):
        if _near(grad, value):
            raise CheckFailure(
                f"Observed (rank {rank}): {subject} is {what}, not made from the upstream "
                "gradient. Likely mistake: backward works on the tensor saved from forward (or "
                "forward's input) instead of its incoming gradient, the only input backward needs.",
                mistake="backward uses forward's input")


def _check_handed(r: dict[str, Any], which: str, own: torch.Tensor, total: torch.Tensor,
                  where: str) -> None:
    """The gradient autograd handed to ``which``'s backward, also read by a residual branch (its
    gradient should be this rank's own upstream gradient ``own``), is left as it was."""
    side, changed, now = r.get(f"{which}_side_grad"), r.get(f"{which}_handed_changed"), r.get(
        f"{which}_handed_now")
    side_wrong = isinstance(side, torch.Tensor) and not _near(side, own)
    if not (changed or side_wrong):
        return
    if side_wrong and _near(side, total):
        seen = "the residual branch's gradient now holds the sum over the ranks"
    elif side_wrong:
        seen = ("the residual branch's gradient differs from this rank's upstream gradient by up "
                f"to {(side - own).abs().max().item():.3g}")
    else:
        seen = ("that tensor holds " + ("the sum over the ranks" if _near(now, total) else
                                        "other numbers") + " after your backward ran")
    raise CheckFailure(
        f"Observed {where}: the gradient autograd handed to {which}'s backward was changed in "
        f"place: {seen}, not this rank's own upstream gradient. (The checker backpropagates "
        f"through {which}(x) + r, with r = side * 1 recorded before {which}: autograd hands one "
        f"and the same gradient tensor to {which}'s backward and to r's branch, and runs {which}'s "
        "backward first.) "
        "Likely mistake: an in-place operation (dist.all_reduce included) on backward's incoming "
        "gradient itself, or on a tensor that shares its storage (.detach() and .view() are not "
        "copies).", mistake="incoming gradient changed in place")


def _check_g(results: list[dict[str, Any]], expected: list[dict[str, torch.Tensor]], rank: int,
             g: Any) -> None:
    r = results[rank]
    where = f"(rank {rank})"
    mine = expected[rank]
    p_sum = expected[0]["partial"] + expected[1]["partial"]
    out = r["g_out"]
    if not isinstance(out, torch.Tensor) or out.shape != mine["partial"].shape:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else out
        raise CheckFailure(f"g's forward returns {shape} {where}; expected a tensor shaped like its input, "
                           f"{tuple(mine['partial'].shape)}.")
    if not torch.equal(r["g_input_after_forward"], mine["partial"]):
        changed_to_sum = _near(r["g_input_after_forward"], p_sum)
        what = "the sum over the ranks" if changed_to_sum else "other numbers"
        raise CheckFailure(
            f"Observed {where}: after g's forward, the tensor you were given holds {what}: g changed its "
            "caller's tensor. Likely mistake: dist.all_reduce works in place, on the very tensor you "
            "give it (and .detach() or .view() share its storage: they are not copies); reduce a "
            "copy (.clone()) and return that.", mistake="no clone in g's forward")
    if not _near(out, p_sum):
        key = _pattern([q["g_out"] for q in results], [e["partial"] for e in expected])
        if key == "own" or (key is None and _near(out, mine["partial"])):
            raise CheckFailure(f"Observed {where}: g's output is this rank's own input, not the sum over "
                               "the ranks. Likely mistake: no all-reduce in g's forward (or one on a "
                               "tensor that is not returned).", mistake="g does not reduce in forward")
        if key == "mean":
            raise CheckFailure(f"Observed {where}: g's output is the MEAN of the ranks' inputs. Likely "
                               "mistake: averaging (ReduceOp.AVG, or a division by the world size) "
                               "instead of summing: Megatron's partial outputs add up.",
                               mistake="averaging instead of summing")
        _named(key, "g's output", "the ranks' inputs", "input", where)
        raise CheckFailure(f"g's output differs from the sum of the ranks' inputs by up to "
                           f"{(out - p_sum).abs().max().item():.3g} {where}.")
    if not r["g_tracked"]:
        raise CheckFailure(f"Observed {where}: g's output does not require grad, so nothing can flow back. "
                           "Likely mistake: the output is detached (or marked non-differentiable).",
                           mistake="g's output detached")
    grad, upstream = r["g_grad"], mine["grad_g"]
    if grad is None:
        raise CheckFailure(f"Observed {where}: the input's .grad is None after backward through g. Likely "
                           "mistake: g's backward returned None; it returns the incoming gradient.",
                           mistake="backward returns None")
    if not _near(grad, upstream):
        if _near(grad, 2 * upstream):
            raise CheckFailure(f"Observed {where}: every rank got the same upstream gradient, and g's "
                               "input gradient is twice it, the sum over the 2 ranks. Likely mistake: "
                               "an all-reduce in g's backward; g is the identity in backward.",
                               mistake="g reduces in backward")
        if _near(grad, upstream / 2):
            raise CheckFailure(f"Observed {where}: g's input gradient is half the upstream "
                               "gradient (the same on every rank). Likely mistake: a division by "
                               "the world size; g is the identity in backward.",
                               mistake="divided by the world size")
        if _near(grad, torch.zeros_like(upstream)):
            raise CheckFailure(f"Observed {where}: g's input gradient is all zeros.",
                               mistake="zeros")
        _forward_input_as_gradient(grad, [e["partial"] for e in expected], rank,
                                   "g's input gradient", "input")
        raise CheckFailure(f"The input gradient after g differs from the upstream gradient by up to "
                           f"{(grad - upstream).abs().max().item():.3g} {where}: g is the identity in "
                           "backward.")
    _check_handed(r, "g", upstream, 2 * upstream, where)
    if not is_function_class(g):
        raise CheckFailure(
            f"Observed {where}: your g is a plain function, not a torch.autograd.Function. Its numbers "
            "are right only because autograd passes the gradient through dist.all_reduce unchecked, "
            "which PyTorch warns is deprecated and will be removed (\"an autograd kernel was not "
            "registered\"). Write g as a class whose backward you write.", mistake="plain function")


def _check_counts(r: dict[str, Any], rank: int) -> None:
    counts = r["counts"]
    if not counts:  # collectives reached by another route than dist.<name>: the numbers decide
        return
    others = sorted(k for k in counts if not k.endswith(":all_reduce"))
    if others:
        raise CheckFailure(f"Observed (rank {rank}): your f and g call {others}; each needs one "
                           "all_reduce, nothing else.")
    got = {p: counts.get(f"{p}:all_reduce", 0) for p in PHASES}
    want = {"f forward": 0, "f backward": 1, "g forward": 1, "g backward": 0}
    if got != want:
        said = ", ".join(f"{n} in {p}" for p, n in got.items())
        raise CheckFailure(f"Observed (rank {rank}): all_reduce runs {said}; the numbers are right, but "
                           "each operator needs exactly one (f in backward, g in forward).")
