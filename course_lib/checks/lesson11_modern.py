"""Checkers for lesson 11's new norm and MLP (from GPT-2 to a Llama-style block), and what the
lesson's checkers share.

* ``check_rmsnorm(cls)``: ``cls(d_model, eps)``, an ``nn.Module`` with one gain ``weight (d_model,)``
  starting at ones, ``forward(x (..., d_model))`` = ``x / sqrt(mean(x^2) + eps) * weight``, on inputs
  where each mistake (centring, eps's place, the mean of squares) shows.
* ``check_swiglu(cls)``: ``cls(d_model)``, SwiGLU with ``gate``, ``up`` and ``down``, no biases,
  ``d_ff`` chosen so that its weights come closest to a GELU network's at ``4 d_model``;
  ``forward(x) = down(silu(gate(x)) * up(x))``.

Shared with ``lesson11_rope``, ``lesson11_gqa`` and ``lesson11_rope_decode``: every comparison in
float64 (``close64``, ``compare64``), no raw error leaves a checker (``no_raw_errors``), and
``CallWatch``, which records the torch functions the learner's code calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .common import (
    ATOL, CheckFailure, Mistake, calls_to, checker, compare, expect_shape, is_course_lib, run_learner,
)

__all__ = ["check_rmsnorm", "check_swiglu"]


# ----------------------------------------------------------------------------------------------
# Shared by the lesson's checkers: every comparison in float64 (a float64 or float16 answer is
# compared, never refused by torch.allclose's dtype rule), and no raw error ever leaves a checker.
# ----------------------------------------------------------------------------------------------


def compare_against(got: Any, expected: Any, inputs: tuple, mistakes: list[Mistake], case: str,
                    reference: str, atol: float = ATOL) -> None:
    """``compare``, with the generic message naming the reference actually used."""
    try:
        compare(got, expected, inputs, mistakes, case, atol)
    except CheckFailure as failure:
        raise CheckFailure(str(failure).replace("course_lib's reference", reference)) from None


class CallWatch(TorchFunctionMode):
    """Records which of ``functions`` (torch functions, seen through ``__torch_function__``) run."""

    def __init__(self, functions: tuple[Any, ...]) -> None:
        super().__init__()
        self.functions, self.seen = functions, []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if any(func is f for f in self.functions):
            self.seen.append(func)
        return func(*args, **(kwargs or {}))


def f64(t: Any) -> Any:
    """A float tensor as a detached float64 copy; anything else as it is."""
    return t.detach().to(torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point() else t


def close64(got: Any, expected: torch.Tensor, atol: float = 1e-5) -> bool:
    """True if ``got`` is a float tensor of ``expected``'s shape and values, compared in float64."""
    return (isinstance(got, torch.Tensor) and got.shape == expected.shape and got.is_floating_point()
            and torch.allclose(f64(got), f64(expected), atol=atol, rtol=1e-4))


def compare64(got: torch.Tensor, expected: torch.Tensor, inputs: tuple, mistakes: list[Mistake],
              case: str, reference: str, atol: float = ATOL) -> None:
    """``compare`` on float64 copies (the mistakes are computed on float64 inputs too)."""
    wrapped = [Mistake(m.name, m.hint, (lambda f: lambda *a: f64(f(*a)))(m.compute)) for m in mistakes]
    compare_against(f64(got), f64(expected), tuple(f64(a) for a in inputs), wrapped, case, reference, atol)


def no_raw_errors(body: Callable[..., None]) -> Callable[..., None]:
    """Run a checker's body; anything but a verdict becomes a ``CheckFailure`` that says so."""

    def run(fn: Any) -> None:
        try:
            with torch.random.fork_rng(devices=[]):  # the learner's global random state stays as it was
                body(fn)
        except (NotImplementedError, CheckFailure):
            raise
        except Exception as err:  # a learner's object the checker could not use
            raise CheckFailure(
                f"The checker could not use your answer: {type(err).__name__}: {err}. Check that it "
                "has the signature the exercise gives and returns a tensor."
            ) from err

    run.__name__ = body.__name__
    return run


def call_learner(fn: Callable[..., Any], *args: Any, case: str, hint: str) -> Any:
    """``run_learner``: the learner's call, a crash named with the case and ``hint``."""
    return run_learner(fn, *args, case=case, hint=hint)


# ----------------------------------------------------------------------------------------------
# check_rmsnorm (build)
# ----------------------------------------------------------------------------------------------


def _rms_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rms_mistakes(eps: float) -> list[Mistake]:
    def var(x: torch.Tensor, unbiased: bool) -> torch.Tensor:
        return x.var(-1, keepdim=True, unbiased=unbiased)

    def centred(x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(-1, keepdim=True)

    return [
        Mistake("torch.var instead of the mean of squares",
                "x.var() subtracts the mean first and divides by d - 1 (the unbiased estimate): "
                "RMSNorm divides by sqrt(mean(x**2) + eps), x.pow(2).mean(-1, keepdim=True)",
                lambda x, w: x / torch.sqrt(var(x, True) + eps) * w),
        Mistake("torch.var(unbiased=False): the variance, not the mean square",
                "the variance subtracts the mean; RMSNorm uses the mean of the squares themselves, "
                "x.pow(2).mean(-1, keepdim=True)",
                lambda x, w: x / torch.sqrt(var(x, False) + eps) * w),
        Mistake("the mean is subtracted: that is LayerNorm",
                "(x - mean) / std is LayerNorm's centring; RMSNorm keeps x as it is and divides by "
                "its root mean square",
                lambda x, w: centred(x) / torch.sqrt(var(x, False) + eps) * w),
        Mistake("the mean is subtracted, with torch.var's unbiased variance",
                "that is LayerNorm's centring, and torch.var divides by d - 1: RMSNorm divides x by "
                "sqrt(mean(x**2) + eps)",
                lambda x, w: centred(x) / torch.sqrt(var(x, True) + eps) * w),
        Mistake("the sum of squares divided by d - 1",
                "the mean square divides by d (x.pow(2).mean(-1)), not d - 1",
                lambda x, w: x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) / (x.size(-1) - 1) + eps) * w),
        Mistake("eps outside the square root",
                "eps goes inside: x / sqrt(mean(x**2) + eps), not x / (sqrt(mean(x**2)) + eps)",
                lambda x, w: x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w),
        *[Mistake(f"another eps than the module's: eps written in as a number ({number:g}), or changed",
                  f"your output matches eps = {number:g}, but this module was built with eps={eps:g}: "
                  "the constructor's eps, as it is, is the one to use (Llama's configs use 1e-5 or "
                  "1e-6, and the checker builds modules with other values)",
                  (lambda e: lambda x, w: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + e) * w)(number))
          for number in (1e-6, 1e-5, 1e-8) if not math.isclose(number, eps)],
        Mistake("eps is missing",
                "add eps inside the square root: x / sqrt(mean(x**2) + eps) (it keeps a zero vector "
                "from dividing by 0)",
                lambda x, w: x / x.pow(2).mean(-1, keepdim=True).sqrt() * w),
        Mistake("the square root is missing",
                "divide by the ROOT of the mean square, torch.sqrt(mean(x**2) + eps) (or multiply by "
                "torch.rsqrt(...))",
                lambda x, w: x / (x.pow(2).mean(-1, keepdim=True) + eps) * w),
        Mistake("the gain is not applied",
                "multiply the normalised x by self.weight (the learned gain, d_model numbers)",
                lambda x, w: _rms_ref(x, torch.ones_like(w), eps)),
        Mistake("the gain divides instead of multiplying",
                "multiply by self.weight, do not divide",
                lambda x, w: _rms_ref(x, 1 / w, eps)),
        Mistake("the mean square over the wrong axis (dim 0, the batch)",
                "normalise each vector over its d_model numbers: mean over the LAST dim, "
                "mean(-1, keepdim=True)",
                lambda x, w: x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + eps) * w),
        Mistake("the mean square over the wrong axis (dim -2, the positions)",
                "normalise each vector over its d_model numbers: mean over the LAST dim, "
                "mean(-1, keepdim=True)",
                lambda x, w: x * torch.rsqrt(x.pow(2).mean(-2, keepdim=True) + eps) * w),
        Mistake("one mean square for the whole tensor",
                "x.pow(2).mean() without a dim averages every number of the batch: take the mean "
                "over the last dim, mean(-1, keepdim=True), one per vector",
                lambda x, w: x * torch.rsqrt(x.pow(2).mean() + eps) * w),
        Mistake("eps added to the output, not under the root",
                "x / sqrt(mean(x**2)) * weight + eps adds eps to every output number; eps belongs "
                "under the square root, x / sqrt(mean(x**2) + eps), where it keeps a zero vector "
                "from dividing by 0",
                lambda x, w: x / x.pow(2).mean(-1, keepdim=True).sqrt() * w + eps),
        Mistake("the mean absolute value instead of the root mean square",
                "mean(|x|) is not the root mean square: square, take the mean, then the root, "
                "sqrt(mean(x**2) + eps)",
                lambda x, w: x / (x.abs().mean(-1, keepdim=True) + eps) * w),
        Mistake("the gain applied before normalising",
                "you normalise x * weight, which divides the gain back out: normalise x first, then "
                "multiply by weight, x / sqrt(mean(x**2) + eps) * weight",
                lambda x, w: (x * w) / torch.sqrt((x * w).pow(2).mean(-1, keepdim=True) + eps)),
        Mistake("the mean of x, not of its squares",
                "sqrt(mean(x) + eps) takes the mean of the numbers themselves; the root mean square "
                "squares them first, sqrt(mean(x**2) + eps)",
                lambda x, w: x / torch.sqrt(x.mean(-1, keepdim=True) + eps) * w),
        Mistake("the root mean square itself returned, not x divided by it",
                "your output is sqrt(mean(x**2) + eps) * weight, the same for every number of a "
                "vector: RMSNorm returns x divided by it, x / sqrt(mean(x**2) + eps) * weight",
                lambda x, w: torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w),
        Mistake("the mean square without keepdim",
                "x.pow(2).mean(-1) drops the last dim: its (...,) numbers then line up with x's "
                "LAST dim, not with its vectors (with other sizes it raises a size error). Keep the "
                "dim, mean(-1, keepdim=True): (..., 1), one per vector",
                lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1) + eps) * w),
        Mistake("the norm instead of the root mean square",
                "x.norm(dim=-1) is sqrt(SUM of squares), sqrt(d) times the RMS: use the mean",
                lambda x, w: x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps) * w),
    ]


def _rms_square_probe(module: torch.nn.Module, d: int, eps: float) -> str:
    """After a raised error: a sentence if the module, fed x (d, d) (where a mean square without
    keepdim still broadcasts), gives what a mean without keepdim gives; else ''."""
    x = torch.randn(d, d, generator=torch.Generator().manual_seed(7)) + 0.5
    with torch.no_grad():
        w = module.weight.detach().clone()
        try:
            got = module(x)
        except Exception:
            return ""
    missing = next(m for m in _rms_mistakes(eps) if "keepdim" in m.name)
    if close64(got, missing.compute(x.double(), w.double())):
        return (f"Likely mistake: {missing.name}. Your forward raises a size error on x (..., "
                f"d_model), and on a square x ({d}, {d}) it gives what dividing by "
                f"x.pow(2).mean(-1) without keepdim gives. {missing.hint}.")
    return ""


# (case, shape of x, eps, scale, shift): d = 6 and 7 make d - 1 differ from d; a mean far from 0
# makes centring show; tiny x with a large eps makes eps's place show, and tinier x tells the
# module's eps from a number written in (1e-6, 1e-5, 1e-8, none); B, L, d all differ
_RMS_CASES = [
    ("x (3, 5, 6), mean about 2, eps=1e-6", (3, 5, 6), 1e-6, 1.0, 2.0),
    ("x (2, 3, 10), tiny numbers (about 0.001), eps=1e-4", (2, 3, 10), 1e-4, 1e-3, 0.0),
    ("x (2, 4, 7), small numbers (about 0.05), eps=1e-2", (2, 4, 7), 1e-2, 0.05, 0.02),
    ("x (4, 3, 16), eps=1e-5", (4, 3, 16), 1e-5, 3.0, -1.0),
    ("x (5, 8) float64, eps=1e-6", (5, 8), 1e-6, 1.0, 0.5),
]


@checker
@no_raw_errors
def check_rmsnorm(cls: Any) -> None:
    """Check ``cls(d_model, eps)``: an ``nn.Module`` with one gain ``weight (d_model,)`` starting at
    ones, ``forward(x (..., d_model)) -> (..., d_model)`` = ``x / sqrt(mean(x^2) + eps) * weight``."""
    from ..modern import RMSNorm

    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    ready_made = tuple(f for f in (getattr(F, "rms_norm", None), getattr(torch, "rms_norm", None))
                       if f is not None)  # PyTorch's own RMSNorm (from torch 2.4)
    kind = ("That is a ready-made RMSNorm, the very thing this exercise builds: right, and welcome "
            "once yours has passed. Here, write the formula yourself; torch's building blocks "
            "(pow, mean, sqrt, rsqrt) are welcome.")
    if is_course_lib(cls) or cls is LlamaRMSNorm or cls is getattr(torch.nn, "RMSNorm", None):
        raise CheckFailure("You handed in a library's RMSNorm (course_lib's, Hugging Face's or "
                           f"PyTorch's nn.RMSNorm). {kind}")
    refused = [RMSNorm.forward, LlamaRMSNorm.forward]
    for n, (case, shape, eps, scale, shift) in enumerate(_RMS_CASES):
        d = shape[-1]
        module = call_learner(cls, d, eps, case=f"building {cls.__name__}({d}, eps={eps})",
                       hint="The constructor takes (d_model, eps=1e-6).")
        if not isinstance(module, torch.nn.Module):
            raise CheckFailure(f"{cls.__name__}({d}, eps={eps}) should be an nn.Module, got "
                               f"{type(module).__name__} (subclass nn.Module, call super().__init__()).")
        if getattr(torch.nn, "RMSNorm", None) is not None and any(
                isinstance(m, torch.nn.RMSNorm) for m in module.modules()):
            raise CheckFailure(f"Your module is, or holds, PyTorch's torch.nn.RMSNorm. {kind}")
        params = dict(module.named_parameters())
        if not params:
            raise CheckFailure(
                "Your module has no parameters: RMSNorm keeps a learned gain, self.weight = "
                f"nn.Parameter(torch.ones(d_model)), and multiplies the normalised x by it.")
        if len(params) > 1:
            raise CheckFailure(
                f"Your module has {len(params)} parameters {sorted(params)}: RMSNorm has ONE, the gain "
                "weight (d_model,). No bias: that is one of the two things it drops from LayerNorm.")
        (name, weight), = params.items()
        if name != "weight":
            raise CheckFailure(f"Name the gain self.weight, not self.{name}: Hugging Face's "
                               "LlamaRMSNorm and course_lib call it weight, and the lesson copies "
                               "weights by that name.")
        if tuple(weight.shape) != (d,):
            raise CheckFailure(f"The gain {name} has shape {tuple(weight.shape)}, expected ({d},): one "
                               "number per feature, nn.Parameter(torch.ones(d_model)).")
        if not torch.equal(weight.detach(), torch.ones(d)):
            raise CheckFailure(f"The gain {name} should start at ones (torch.ones(d_model)), so that a "
                               "new RMSNorm only rescales; it starts at other values.")
        gen = torch.Generator().manual_seed(n)
        dtype = torch.float64 if "float64" in case else torch.float32
        x = (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale + shift).to(dtype)
        w = torch.randn(d, generator=gen) * 0.5 + 1.0  # a random gain: a forgotten one shows
        with torch.no_grad():
            weight.copy_(w)
        x_before = x.clone()
        watch = CallWatch(ready_made)
        with calls_to(refused) as seen, watch:
            try:
                got = call_learner(module, x, case=case, hint="x is (..., d_model); normalise over the last dim.")
            except CheckFailure as failure:
                raised = failure
            else:
                raised = None
        if seen:
            raise CheckFailure("Your module calls a library's RMSNorm (course_lib's or Hugging Face's "
                               f"LlamaRMSNorm). {kind}")
        if watch.seen:
            name = "F.rms_norm" if watch.seen[0] is getattr(F, "rms_norm", None) else "torch.rms_norm"
            raise CheckFailure(f"Your module calls {name}, PyTorch's own RMSNorm. {kind}")
        if raised is not None:
            raise CheckFailure(_rms_square_probe(module, d, eps) or str(raised)) from raised
        if not torch.equal(x, x_before):
            raise CheckFailure(f"Your forward changes x in place ({case}); compute a new tensor.")
        if isinstance(got, tuple):
            raise CheckFailure("Return only the normalised tensor, not a tuple.")
        expect_shape(got, shape, f"the output ({case})", "RMSNorm keeps the shape: (..., d_model).")
        if not got.is_floating_point():
            raise CheckFailure(f"The output has dtype {got.dtype}; it should be floating point.")
        if torch.finfo(got.dtype).bits < torch.finfo(x.dtype).bits:
            raise CheckFailure(
                f"Your output is {got.dtype} for a {x.dtype} input ({case}): it is computed in, or "
                f"cast to, {got.dtype} and not cast back, so the caller loses precision. Hugging "
                "Face's LlamaRMSNorm computes in float32 too, then returns the input's dtype.",
                mistake="the output's dtype is lower than the input's")
        x64, w64 = x.double(), w.double()
        compare64(got, _rms_ref(x64, w64, eps), (x64, w64), _rms_mistakes(eps), case,
                  "x / sqrt(mean(x**2, last dim) + eps) * weight")
    print(f"check_rmsnorm: right on all {len(_RMS_CASES)} cases (x / sqrt(mean(x**2) + eps) * weight, "
          "over the last dim). Well done!")


# ----------------------------------------------------------------------------------------------
# check_swiglu (build: the width and the wiring)
# ----------------------------------------------------------------------------------------------


def _gelu_count(d: int) -> int:
    return 2 * d * 4 * d  # GPT-2's feed-forward weights at d_ff = 4 d, no biases


def _best_d_ff(d: int) -> int:
    return min(range(1, 8 * d), key=lambda f: (abs(3 * d * f - _gelu_count(d)), f))


def _swiglu_ref(x: torch.Tensor, g: torch.Tensor, u: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    return (F.silu(x @ g.T) * (x @ u.T)) @ o.T


_SWIGLU_MISTAKES = [
    Mistake("gate and up swapped",
            "SiLU goes on the gate's projection, silu(gate(x)) * up(x), and up's projection passes "
            "through ungated (Hugging Face's act_fn(gate_proj(x)) * up_proj(x))",
            lambda x, g, u, o: _swiglu_ref(x, u, g, o)),
    Mistake("SiLU on the product",
            "gate first, then multiply: silu(gate(x)) * up(x), not silu(gate(x) * up(x))",
            lambda x, g, u, o: F.silu((x @ g.T) * (x @ u.T)) @ o.T),
    Mistake("SiLU on both projections",
            "only the gate goes through SiLU: silu(gate(x)) * up(x)",
            lambda x, g, u, o: (F.silu(x @ g.T) * F.silu(x @ u.T)) @ o.T),
    Mistake("sigmoid instead of SiLU (that is GLU)",
            "SiLU is z * sigmoid(z) (F.silu); sigmoid alone is the original GLU",
            lambda x, g, u, o: (torch.sigmoid(x @ g.T) * (x @ u.T)) @ o.T),
    Mistake("GELU instead of SiLU (that is GEGLU)",
            "SwiGLU's gate is SiLU (F.silu), z * sigmoid(z)",
            lambda x, g, u, o: (F.gelu(x @ g.T) * (x @ u.T)) @ o.T),
    Mistake("ReLU instead of SiLU (that is ReGLU)",
            "SwiGLU's gate is SiLU (F.silu), z * sigmoid(z)",
            lambda x, g, u, o: (F.relu(x @ g.T) * (x @ u.T)) @ o.T),
    Mistake("the gate is added, not multiplied",
            "the gate multiplies the values elementwise: silu(gate(x)) * up(x)",
            lambda x, g, u, o: (F.silu(x @ g.T) + (x @ u.T)) @ o.T),
    Mistake("no gate: up is not used",
            "the values up(x) are what the gate lets through: down(silu(gate(x)) * up(x))",
            lambda x, g, u, o: F.silu(x @ g.T) @ o.T),
]


_SWIGLU_DIMS = (12, 100, 32)  # 8d/3 = 32 exactly; 266.7 (round up, not down); 85.3


def _swiglu_atol(expected: torch.Tensor) -> float:
    """The tolerance for a float32 SwiGLU: ATOL times the output's scale (its largest |value|, at
    least 1). A float32 answer's error grows with the sums it adds up, not with each output: at
    d_model 100 (d_ff 267, weights * 0.3) the outputs reach ~190 and a right answer is off by up to
    9e-5 where an output is near 0, which a fixed 1e-5 refused on about a quarter of the re-check's
    seeds (82 of 300). Measured over 2,000 draws per size, the course's solution is off by at most
    1e-6 of the largest |output| (so 1e-5 of it leaves a tenfold margin), and the closest named
    mistake (GELU for SiLU) by at least 3e-2 of it."""
    return ATOL * max(1.0, float(expected.abs().max()))


@checker
@no_raw_errors
def check_swiglu(cls: Any) -> None:
    """Check ``cls(d_model)``: SwiGLU with ``gate``, ``up`` (d_model -> d_ff) and ``down`` (d_ff ->
    d_model), no biases, ``d_ff`` chosen so that its weights come closest to a GELU network's at
    ``4 d_model``; ``forward(x) = down(silu(gate(x)) * up(x))``."""
    from ..modern import SwiGLU, swiglu_d_ff

    from transformers.models.llama.modeling_llama import LlamaMLP

    if is_course_lib(cls) or cls is LlamaMLP:
        raise CheckFailure("You handed in a library's SwiGLU (course_lib's or Hugging Face's): build it.")
    for n, d in enumerate(_SWIGLU_DIMS):
        case = f"d_model={d}"
        with calls_to([swiglu_d_ff]) as seen:
            module = call_learner(cls, d, case=f"building {cls.__name__}({d})",
                           hint="The constructor takes d_model only and chooses d_ff itself. A size "
                                "must be an int: 8 * d_model / 3 is a float, round(...) is an int.")
        if seen:
            raise CheckFailure("Your module calls course_lib's swiglu_d_ff, the sizing this exercise "
                               "asks for: work the width out from the parameter counts.")
        if not isinstance(module, torch.nn.Module):
            raise CheckFailure(f"{cls.__name__}({d}) should be an nn.Module, got {type(module).__name__}.")
        if isinstance(module, SwiGLU) or any(isinstance(m, (SwiGLU, LlamaMLP)) for m in module.modules()):
            raise CheckFailure("Your module uses a library's SwiGLU: build it from three nn.Linear.")
        layers = {}
        for name in ("gate", "up", "down"):
            layer = getattr(module, name, None)
            if not isinstance(layer, torch.nn.Linear):
                raise CheckFailure(
                    f"Your module has no nn.Linear named {name!r}: name the three projections gate "
                    "(d_model -> d_ff, through SiLU), up (d_model -> d_ff) and down (d_ff -> d_model).")
            layers[name] = layer
        if any(layer.bias is not None for layer in layers.values()):
            raise CheckFailure("Llama's projections have no biases: nn.Linear(..., bias=False) for "
                               "gate, up and down.")
        d_ff = layers["gate"].out_features
        shapes = {name: (layer.out_features, layer.in_features) for name, layer in layers.items()}
        if shapes != {"gate": (d_ff, d), "up": (d_ff, d), "down": (d, d_ff)}:
            raise CheckFailure(
                f"Shapes ({case}): gate {shapes['gate']}, up {shapes['up']}, down {shapes['down']} "
                "as (out, in). gate and up map d_model -> d_ff, down maps d_ff -> d_model, with the "
                "same d_ff.")
        best = _best_d_ff(d)
        count, target = 3 * d * d_ff, _gelu_count(d)
        if d_ff != best:
            if d_ff == 4 * d:
                why = ("that is GELU's width, 4 * d_model: with THREE matrices it has 1.5x GELU's "
                       "weights. Solve 3 * d * d_ff = 2 * d * (4 * d) for d_ff")
            elif d_ff == (8 * d) // 3 and best == d_ff + 1:
                why = ("8 * d_model / 3 rounded DOWN (int() or //): round to the nearest int, which "
                       "comes closer to GELU's count here")
            elif d_ff in (round(2 * d / 3), (2 * d) // 3):
                why = "that is 2/3 of d_model; the 2/3 applies to GELU's width 4 * d_model"
            elif d_ff in (round(4 * d / 3), (4 * d) // 3):
                why = ("that keeps the weights of one GELU matrix, not of two: GELU has 2 * d * 4d "
                       "weights, SwiGLU 3 * d * d_ff")
            else:
                why = ("solve 3 * d_model * d_ff = 2 * d_model * (4 * d_model) for d_ff and round "
                       "to the nearest int")
            raise CheckFailure(
                f"d_ff = {d_ff} ({case}) gives {count:,} weights, GELU's network {target:,}: {why}.")
        gen = torch.Generator().manual_seed(n)
        with torch.no_grad():
            for layer in layers.values():
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) * 0.3)
        x = torch.randn(2, 5, d, generator=gen)
        got = call_learner(module, x, case=case, hint="x is (B, L, d_model).")
        if isinstance(got, tuple):
            raise CheckFailure("Return only the output tensor, not a tuple.")
        expect_shape(got, (2, 5, d), f"the output ({case})",
                     "down maps back to d_model: (B, L, d_model) in and out.")
        weights = tuple(layers[k].weight.detach() for k in ("gate", "up", "down"))
        x64 = x.double()
        expected = _swiglu_ref(x64, *(w.double() for w in weights))
        compare64(got, expected, (x64, *weights), _SWIGLU_MISTAKES, case, "down(silu(gate(x)) * up(x))",
                  atol=_swiglu_atol(expected))
    print(f"check_swiglu: right for d_model {', '.join(map(str, _SWIGLU_DIMS))} (d_ff "
          f"{', '.join(str(_best_d_ff(d)) for d in _SWIGLU_DIMS)}: GELU's weight count, and "
          "down(silu(gate(x)) * up(x))). Well done!")
