"""What every checker shares: friendly "not implemented yet", shape checks, and naming the mistake.

How a checker names a mistake: it runs the learner's code and course_lib's reference on the same
seeded inputs. If they differ, it also runs *deliberately wrong* variants of the reference (no
scaling, softmax over the wrong axis, ...) and reports the first variant the learner's output
matches. Only if none matches does it fall back to a generic message with the largest difference.

Handing in course_lib's own code is refused by one guard, ``is_course_lib`` (and ``course_lib_used``,
which also looks at what a function's code reads); ``calls_to`` sees a reference called at run time.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import random
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

__all__ = [
    "expect_bool_mask",
    "broadcasts_to",
    "Mistake", "CheckFailure", "checker", "expect_shape", "expect_finite", "compare", "passed",
    "load_reference_weights", "run_learner", "has_passed", "yours_or_reference", "RESULTS",
    "is_course_lib", "course_lib_used", "calls_to", "one_thread", "time_limit", "close", "ATOL", "plain",
]

ATOL = 1e-5


# --------------------------------------------------------------------------------------------------
# The one guard: "the learner handed in course_lib's own code"
# --------------------------------------------------------------------------------------------------

def is_course_lib(obj: Any) -> bool:
    """True for course_lib's own code, the references a checker compares with: any course_lib
    module, and any object (function, class, method, instance of a course_lib class) defined in a
    course_lib module other than ``course_lib.solutions`` (the solutions ``show_solution`` displays,
    which a learner may paste and hand in).

    The one test of "course_lib's own code" for every checker: checkers refuse a hand-in with it (each
    with its own message), ``course_lib_used`` extends it to the code a function reads, and
    ``calls_to`` catches a call to a reference at run time."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__.split(".")[0] == "course_lib"
    module = getattr(obj, "__module__", None)
    module = module if isinstance(module, str) else ""
    return module.split(".")[0] == "course_lib" and not module.startswith("course_lib.solutions")


def _is_code(obj: Any) -> bool:
    """A module, class or function: what a learner's code may call. An instance is data (a learner
    may read ``task.pad_id`` of a course_lib task), so ``course_lib_used`` never counts one it reads."""
    return (isinstance(obj, types.ModuleType) or inspect.isclass(obj) or inspect.isfunction(obj)
            or inspect.ismethod(obj))


def _functions(candidate: Any) -> list[Any]:
    """A function itself, or every method a class defines outside course_lib and torch."""
    functions = []
    if inspect.isclass(candidate):
        for klass in candidate.__mro__:
            if klass is object or is_course_lib(klass) or klass.__module__.startswith("torch"):
                continue
            functions += [f for f in vars(klass).values() if inspect.isfunction(f)]
    else:
        functions.append(getattr(candidate, "__func__", candidate))
    return functions


def _code_objects(candidate: Any) -> list[tuple[types.CodeType, dict]]:
    """The code of a function, or of every method of a class, with the globals it reads names from
    (nested functions and lambdas included)."""
    found = []
    for f in _functions(candidate):
        code, glob = getattr(f, "__code__", None), getattr(f, "__globals__", {})
        stack = [code] if code is not None else []
        while stack:
            c = stack.pop()
            found.append((c, glob))
            stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    return found


def _reads_course_lib(value: Any) -> bool:
    return _is_code(value) and is_course_lib(value)


def course_lib_used(candidate: Any, references: tuple[Any, ...] = ()) -> str | None:
    """The name of the course_lib object the learner handed in or whose code reads one, or None.

    ``is_course_lib`` at the hand-in, and further: one of ``references`` itself, a subclass of a
    referenced class, and a function (or a class's own methods) whose code reads a course_lib
    module, class or function from its globals or its closure (for example ``causal_mask``
    imported from course_lib, or ``course_lib.masks.padding_mask``). Checkers whose exercise may
    build on course_lib's other parts use ``is_course_lib`` alone, or ``calls_to`` at run time.
    """
    for ref in references:
        if candidate is ref or (inspect.isclass(candidate) and inspect.isclass(ref)
                                and issubclass(candidate, ref)):
            return getattr(ref, "__name__", repr(ref))
    if is_course_lib(candidate):
        return getattr(candidate, "__name__", type(candidate).__name__)
    for code, glob in _code_objects(candidate):
        for name in code.co_freevars:  # a course_lib object from the enclosing function
            for f in _functions(candidate):
                if f.__code__ is code and f.__closure__:
                    value = dict(zip(code.co_freevars, f.__closure__))[name]
                    try:
                        if _reads_course_lib(value.cell_contents):
                            return name
                    except ValueError:  # an empty cell
                        pass
        for name in code.co_names:
            if name in glob and _reads_course_lib(glob[name]):
                if isinstance(glob[name], types.ModuleType):  # course_lib.masks.causal_mask(...)
                    modules = [glob[name]] + [getattr(glob[name], n) for n in code.co_names if
                                              isinstance(getattr(glob[name], n, None), types.ModuleType)]
                    for other in code.co_names:
                        for module in modules:
                            target = getattr(module, other, None)
                            if callable(target) and _reads_course_lib(target):
                                return other
                return name
    return None


@contextlib.contextmanager
def calls_to(functions: Sequence[Callable[..., Any]]) -> Iterator[list[Callable[..., Any]]]:
    """Record which of ``functions`` run inside the block, in call order (Python-level calls).

    A profile hook sees every route a learner may take to course_lib's reference: the function
    itself, an alias, a wrapper, ``course_lib.module.function`` or a method that calls it.
    Threads started inside the block are watched too (``threading.setprofile``); a thread started
    before it is the grader's to see (it refuses an answer while such a thread works).
    A decorated reference is watched by its own body (``inspect.unwrap``): every function under
    ``@torch.no_grad()`` or ``@functools.wraps`` shares the decorator's wrapper code, so watching that
    would also flag the learner's own decorated function.
    """
    codes = {inspect.unwrap(f).__code__: f for f in functions}
    called: list[Callable[..., Any]] = []
    previous, previous_threads = sys.getprofile(), threading.getprofile()

    def profile(frame: Any, event: str, arg: Any) -> None:  # noqa: ARG001 (profiler signature)
        if event == "call" and frame.f_code in codes:
            called.append(codes[frame.f_code])

    sys.setprofile(profile)
    threading.setprofile(profile)  # and every thread started inside the block (#49: a worker thread)
    try:
        yield called
    finally:
        sys.setprofile(previous)
        threading.setprofile(previous_threads)


class SdpaWatch(TorchFunctionMode):
    """Records whether ``F.scaled_dot_product_attention``, PyTorch's ready-made attention, is called
    (any backend, any dtype): lesson 13's checkers refuse it where the learner builds the kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.called = False

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if func is F.scaled_dot_product_attention:
            self.called = True
        return func(*args, **(kwargs or {}))


class CheckFailure(AssertionError):
    """Raised by a checker; the message says what is wrong and how to fix it.

    ``mistake`` is the name of the mistake the checker named, if it named one (``compare`` sets it);
    ``site`` is where in the checker it was raised. The grader's report groups a class's failures
    by them (``mistake`` first), never by parsing the message.
    """

    def __init__(self, message: str = "", mistake: str | None = None) -> None:
        super().__init__(message)
        self.mistake = mistake
        caller = sys._getframe(1)
        self.site = f"{caller.f_code.co_filename.rsplit('/', 1)[-1]}:{caller.f_code.co_name}:{caller.f_lineno}"

    def _render_traceback_(self) -> list[str]:
        """What Jupyter shows for it: the message alone. IPython's traceback would list the checker's
        frames and source lines, which hold the names of the mistakes it tells apart (answers, for a
        learner who has not found them yet)."""
        return [f"{type(self).__name__}: {self}"]


@dataclass
class Mistake:
    """A known wrong variant: ``compute(*inputs)`` gives what the mistaken code would output."""

    name: str
    hint: str
    compute: Callable[..., Any]


@dataclass
class CheckResult:
    """One checker call: which checker, whose code (its name), and the outcome."""

    checker: str
    candidate: str
    outcome: str  # "passed", "not implemented" or "failed"


# Every checker call of this Python session, in order (the solution test run reads it).
RESULTS: list[CheckResult] = []
# The objects (functions, classes, predictions) that passed their checker, by id.
_PASSED: dict[int, Any] = {}


def _name_of(candidate: Any) -> str:
    return getattr(candidate, "__name__", type(candidate).__name__)


def checker(func: Callable[..., None]) -> Callable[..., None]:
    """Decorator for every checker: one line on success, a reminder for a stub, an error otherwise.

    The wrapped checker returns None in every case, so a notebook shows nothing but its one printed
    line. A wrong answer raises ``CheckFailure`` (an ``AssertionError``) naming the likely mistake; an
    unfinished exercise (it raises ``NotImplementedError``) prints a reminder and does not stop Run All.
    Whether an object passed is recorded: ``has_passed(obj)`` and ``yours_or_reference`` read it.
    """

    @functools.wraps(func)
    def wrapper(candidate: Any, *args: Any, **kwargs: Any) -> None:
        name = _name_of(candidate)
        try:
            with _random_state_kept():
                func(candidate, *args, **kwargs)
        except NotImplementedError:
            RESULTS.append(CheckResult(func.__name__, name, "not implemented"))
            print(f"{func.__name__}: `{name}` is not implemented yet. "
                  "Fill in the TODO and run this cell again.")
            return None
        except BaseException:
            RESULTS.append(CheckResult(func.__name__, name, "failed"))
            _PASSED.pop(id(candidate), None)
            raise
        RESULTS.append(CheckResult(func.__name__, name, "passed"))
        _PASSED[id(candidate)] = candidate
        return None

    return wrapper


@contextlib.contextmanager
def _random_state_kept() -> Iterator[None]:
    """Restore the random generators (torch's CPU one, Python's) after a checker has drawn from them.

    A checker draws its test cases; the lesson's next cells must then draw what they would have drawn
    without it. Otherwise every number after a checker would depend on whether the exercise was done
    yet, and a learner's outputs would differ from the stored ones once the exercise passes."""
    torch_state, python_state = torch.get_rng_state(), random.getstate()
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        random.setstate(python_state)


def has_passed(candidate: Any) -> bool:
    """True if this very object (not an older or newer definition of the name) passed its checker."""
    return _PASSED.get(id(candidate)) is candidate


def yours_or_reference(yours: Any, reference: Any, name: str | None = None, owner: str = "course_lib") -> Any:
    """Return the learner's ``yours`` if it passed its checker, else course_lib's ``reference``; say which.

    ``name`` is what to call the reference in the message (default: its ``__name__``); ``owner`` whose
    it is ("PyTorch" when the reference is PyTorch's own call).
    """
    if has_passed(yours):
        print(f"using your `{_name_of(yours)}`")
        return yours
    ref_name = name or _name_of(reference)
    print(f"using {owner}'s `{ref_name}`: yours (`{_name_of(yours)}`) has not passed its checker yet")
    return reference


def run_learner(fn: Callable[..., Any], *args: Any, case: str = "", hint: str = "", **kwargs: Any) -> Any:
    """Return ``fn(*args, **kwargs)``; a crash becomes a ``CheckFailure`` naming the case, the error and ``hint``.

    A tensor returned (alone, or in a tuple or list) of a subclass of ``torch.Tensor`` comes back as
    a plain ``torch.Tensor`` on the same data, still in the autograd graph: the checker's comparisons
    run torch's own methods, never the subclass's ``__torch_function__`` (#49: a tensor that lies).

    ``NotImplementedError`` (an unfinished exercise, see ``checker``) and ``CheckFailure`` pass through.
    """
    try:
        return _unsubclassed(fn(*args, **kwargs))
    except (NotImplementedError, CheckFailure):
        raise
    except Exception as err:
        where = f" ({case})" if case else ""
        raise CheckFailure(f"Your code raised {type(err).__name__}{where}: {err}. {hint}".strip()) from err


def _unsubclassed(value: Any) -> Any:
    """``value`` with every tensor of a ``torch.Tensor`` subclass, at its top level or in a tuple or
    list, seen as a plain ``torch.Tensor`` (same data, same autograd graph)."""
    if type(value) in (tuple, list):
        return type(value)(_unsubclassed(v) for v in value)
    if isinstance(value, torch.Tensor) and type(value) is not torch.Tensor \
            and not isinstance(value, nn.Parameter):
        try:
            with torch._C.DisableTorchFunctionSubclass():
                return torch.Tensor.as_subclass(value, torch.Tensor)
        except Exception:  # noqa: BLE001 (no data of its own: the checker's own use of it fails, named)
            return value
    return value


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run a checker's tiny models on one thread (faster than two on a busy machine); restore."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def alarm_within(seconds: float, on_alarm: Callable[[], None]) -> Iterator[None]:
    """A SIGALRM timer of ``seconds`` that calls ``on_alarm()`` (which raises), nested inside any
    timer already running, such as the grader's limit for the whole checker: the earlier deadline
    wins (the outer one runs its own handler), and on leaving, the outer timer is set again with the
    time it has left, never cancelled. POSIX and the main thread only (the caller checks)."""
    outer_left = signal.getitimer(signal.ITIMER_REAL)[0]
    start = time.monotonic()
    outer_first = 0 < outer_left <= seconds
    previous: Any = None
    outer_fired = False

    def handler(signum: int, frame: Any) -> None:
        nonlocal outer_fired
        if outer_first:
            outer_fired = True  # the outer deadline is spent: it must not be armed again on leaving
            if callable(previous):
                previous(signum, frame)  # the outer deadline came first: its handler decides
        on_alarm()

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, min(seconds, outer_left) if outer_left > 0 else seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_left > 0 and not outer_fired:  # the outer timer goes on with what it has left
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.monotonic() - start), 1e-4))


@contextlib.contextmanager
def time_limit(seconds: float, message: str) -> Iterator[None]:
    """Stop the learner's code after ``seconds`` with ``CheckFailure(message)``, so that a loop that
    never ends cannot hang a checker. A SIGALRM timer (``alarm_within``, so that a grader's timer
    around the checker keeps running): POSIX, main thread; a no-op elsewhere."""
    usable = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def stop() -> None:
        raise CheckFailure(message)

    with alarm_within(seconds, stop):
        yield


def load_reference_weights(
    learner: Any, reference_state_dict: dict[str, torch.Tensor], what: str, names_hint: str = ""
) -> None:
    """Load course_lib's weights into the learner's module, or fail naming the expected and found names.

    ``what`` names the learner's module in the message; ``names_hint`` says how to name the submodules
    (and is repeated when a shape differs).
    """
    if not isinstance(learner, nn.Module):
        raise CheckFailure(f"{what} should be an nn.Module, got {type(learner).__name__} "
                           "(did you forget `nn.Module` or `super().__init__()`?).")
    found = learner.state_dict()
    if set(found) != set(reference_state_dict):
        missing = sorted(set(reference_state_dict) - set(found))
        unexpected = sorted(set(found) - set(reference_state_dict))
        raise CheckFailure(
            f"{what}: state_dict names differ from course_lib's, so its weights cannot be copied: expected "
            f"parameters named {sorted(reference_state_dict)}, found {sorted(found)}. Missing: {missing}; "
            f"unexpected: {unexpected}. {names_hint or 'Name the submodules as the exercise says.'}"
        )
    for name, tensor in reference_state_dict.items():
        if found[name].shape != tensor.shape:
            raise CheckFailure(f"{what}: {name} has shape {tuple(found[name].shape)}, "
                               f"expected {tuple(tensor.shape)}. {names_hint}".strip())
    learner.load_state_dict(reference_state_dict)


def _as_tensors(out: Any) -> tuple[torch.Tensor, ...]:
    if isinstance(out, torch.Tensor):
        return (out,)
    return tuple(out)


def expect_shape(got: torch.Tensor, expected: Sequence[int], what: str, fix: str = "") -> None:
    """Fail with the expected and the actual shape."""
    if not isinstance(got, torch.Tensor):
        raise CheckFailure(f"Wrong type: {what} should be a torch.Tensor, got {type(got).__name__}.")
    if tuple(got.shape) != tuple(expected):
        raise CheckFailure(
            f"Wrong output shape: {what} has shape {tuple(got.shape)}, expected {tuple(expected)}. {fix}".strip()
        )


def expect_bool_mask(got: Any, case: str, hint: str) -> None:
    """Fail unless the learner's mask is a ``torch.bool`` tensor (True = may attend)."""
    if not isinstance(got, torch.Tensor):
        raise CheckFailure(
            f"Wrong type ({case}): the mask should be a torch.Tensor of dtype torch.bool, got {type(got).__name__}."
        )
    if got.dtype != torch.bool:
        raise CheckFailure(
            f"Wrong dtype ({case}): the mask has dtype {got.dtype}, expected torch.bool. Masks are boolean, "
            "True = may attend and False = hidden; attention hides where it is False (masked_fill(~mask, ...)), "
            f"and ~ on a float or int tensor does not mean \"not\". {hint}"
        )


def broadcasts_to(mask: torch.Tensor, shape: tuple[int, ...], same_rank: bool = True) -> bool:
    """True if ``mask`` broadcasts to ``shape`` without enlarging it (and, if ``same_rank``, has as many axes)."""
    if same_rank and mask.dim() != len(shape):
        return False
    try:
        return torch.broadcast_shapes(mask.shape, shape) == torch.Size(shape)
    except RuntimeError:
        return False


def expect_finite(got: torch.Tensor, what: str, fix: str) -> None:
    """Fail if ``got`` holds NaN or infinity."""
    if not torch.isfinite(got).all():
        raise CheckFailure(f"{what} contains NaN or inf. {fix}")


def close(a: Any, b: Any, atol: float = ATOL) -> bool:
    """True if ``a`` and ``b`` (a tensor or a sequence of tensors) have the same shapes and values,
    compared as plain tensors (``plain``): a subclass's ``allclose`` or ``__torch_function__`` never runs."""
    a_t, b_t = _as_tensors(plain(a, "your output")), _as_tensors(plain(b, "the reference"))
    if len(a_t) != len(b_t):
        return False
    for x, y in zip(a_t, b_t):
        if not isinstance(x, torch.Tensor) or x.shape != y.shape:
            return False
        if not torch.allclose(x.float(), y.float(), atol=atol, rtol=1e-4, equal_nan=True):
            return False
    return True


def compare(
    got: Any,
    expected: Any,
    inputs: Sequence[Any],
    mistakes: Sequence[Mistake],
    case: str,
    atol: float = ATOL,
) -> None:
    """Pass if ``got`` equals ``expected``; otherwise name the first mistake whose output ``got`` matches.
    ``got`` is compared as plain values (``plain``), whatever type the learner's code returned."""
    got = plain(got, "your output")
    if close(got, expected, atol):
        return
    for mistake in mistakes:
        try:
            wrong = mistake.compute(*inputs)
        except Exception:  # a variant that cannot run on this case simply does not match
            continue
        if close(got, wrong, atol):
            raise CheckFailure(f"Likely mistake ({case}): {mistake.name}. {mistake.hint}", mistake=mistake.name)
    got_t, exp_t = _as_tensors(got), _as_tensors(expected)
    diffs = [
        (g.float() - e.float()).abs().max().item()
        for g, e in zip(got_t, exp_t)
        if isinstance(g, torch.Tensor) and g.shape == e.shape
    ]
    detail = f"largest difference {max(diffs):.3g}" if diffs else "different shapes or number of outputs"
    raise CheckFailure(
        f"Output differs from course_lib's reference ({case}): {detail}. None of the usual mistakes "
        "explains it; print both for a small input and compare step by step."
    )


def passed(name: str, n_cases: int) -> None:
    """Print the one-line success message."""
    print(f"{name}: all {n_cases} cases match course_lib's reference. Well done!")


# --------------------------------------------------------------------------------------------------
# A learner's answer as plain values: no subclass of theirs decides a comparison
# --------------------------------------------------------------------------------------------------

_PLAIN_DEPTH = 8


def plain(value: Any, what: str = "your answer", _depth: int = 0) -> Any:
    """``value`` made of exact built-ins before a checker compares it: a ``str``, ``int``, ``float``,
    ``bool`` or ``None`` of its exact type (a subclass's value copied by the base type's own method:
    its ``__eq__``, ``strip`` or ``__int__`` never run), a ``tuple``/``list`` (``torch.Size``
    included) as a tuple/list of plain items, a tensor as a plain ``torch.Tensor`` copy (a
    subclass's ``__torch_function__``, ``__eq__`` or ``allclose`` never run) and a NumPy number or
    array as a Python number or a plain tensor. Any other object is returned as it is (the checker
    refuses it with its own message). CheckFailure for a subclass that cannot be made plain."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if _depth > _PLAIN_DEPTH:
        raise CheckFailure(f"{what} is nested too deeply; return plain numbers, strings, tuples or lists.")
    try:
        if isinstance(value, torch.Tensor):
            with torch._C.DisableTorchFunctionSubclass():
                out = torch.Tensor.as_subclass(value, torch.Tensor).detach().clone()
            if type(out) is not torch.Tensor or torch._C._dispatch_keys(out).has(torch._C.DispatchKey.Python):
                raise TypeError("not a plain tensor")
            return out
        if isinstance(value, bool):  # (bool has no subclasses; for completeness)
            return bool(int.__index__(value))
        if isinstance(value, int):
            return int.__index__(value)
        if isinstance(value, float):
            return float.__float__(value)
        if isinstance(value, str):
            return str.__str__(value)
        if isinstance(value, tuple):
            return tuple(plain(v, what, _depth + 1) for v in tuple.__iter__(value))
        if isinstance(value, list):
            return [plain(v, what, _depth + 1) for v in list.__iter__(value)]
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(value, numpy.generic):
            return plain(numpy.generic.item(value), what, _depth + 1)
        if numpy is not None and isinstance(value, numpy.ndarray):
            return plain(torch.from_numpy(numpy.array(numpy.ndarray.view(value, numpy.ndarray), copy=True)),
                         what, _depth + 1)
    except CheckFailure:
        raise
    except Exception:  # noqa: BLE001 (a subclass that breaks its base type's own conversion)
        raise CheckFailure(f"{what} is a {kind.__name__}, a subclass that does not convert to a plain "
                           f"{kind.__mro__[1].__name__}; return a plain value.") from None
    return value
