"""Checker for lesson 15's ★★★, the LoRA linear layer built by hand, and what the lesson's checkers share.

* ``check_lora_linear(cls)``: ``cls(base, r, alpha)`` wraps a given ``nn.Linear`` (d_in -> d_out) whose
  weight and bias stay frozen, keeps ``in_features`` and ``out_features`` as ``nn.Linear`` does,
  with ``lora_A (r, d_in)`` initialised as PEFT does (kaiming-uniform,
  ``a = √5``: every number within ``±1/√d_in``) and ``lora_B (d_out, r)`` zero;
  ``forward(x (..., d_in)) = W x + b + (alpha / r) B A x``; ``merge()`` adds ``(alpha / r) B A`` to
  ``W`` in place and keeps the output, ``unmerge()`` takes it out again; merging a merged layer (or
  unmerging an unmerged one) changes nothing, or raises; through all of it ``base.weight`` stays the
  same frozen Parameter (a new Parameter, or a copy of ``base`` wrapped, is named). ``lora_A`` and
  ``lora_B`` may be parameters or PEFT-style ``nn.Linear`` modules (their ``weight`` then has the
  shape above).

The test: several shapes (d_in != d_out, and square, where a transposed ``B A`` fits), ranks 1 to 8,
``alpha / r`` of 0.5, 1.5, 2 and 5, inputs of 1 to 3 leading dims, with and without a bias, float32 and
float64; the output at start, after ``A`` and ``B`` are set to random values, the gradients of ``A``,
``B`` and the input ``x`` (none on ``W`` or ``b``; ``W x`` still passes its part back to ``x``), after two SGD steps on ``A`` and ``B``, merged and unmerged.
course_lib's ``LoRALinear`` and PEFT's LoRA layers are refused (the lesson uses them once yours has
passed); every other building block (``F.linear``, einsum, ``@torch.no_grad()``, float64 inside) is welcome.

Shared with ``lesson15_adapters``: ``lora_matrix`` (a learner's ``lora_A``/``lora_B``, parameter or
``nn.Linear``), ``close_scaled`` (float64 comparison with a tolerance that scales with the values).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .common import CheckFailure, calls_to, checker, is_course_lib, run_learner, time_limit
from .lesson11_modern import f64, no_raw_errors

__all__ = ["check_lora_linear", "lora_matrix", "close_scaled", "is_peft", "LIMIT_SECONDS"]

LIMIT_SECONDS = 30  # the learner's code on one case: a loop that never ends stops here


def is_peft(obj: Any) -> bool:
    """True for an object, class or module from PEFT (its LoRA layers and models)."""
    kind = obj if isinstance(obj, type) else type(obj)
    return any((getattr(k, "__module__", "") or "").split(".")[0] == "peft" for k in kind.__mro__)


def lora_matrix(layer: nn.Module, name: str) -> torch.Tensor:
    """The learner's ``lora_A`` or ``lora_B`` as a tensor: a parameter (or tensor) itself, or the
    ``weight`` of a PEFT-style ``nn.Linear``. CheckFailure naming what is missing otherwise."""
    value = getattr(layer, name, None)
    if isinstance(value, nn.Linear):
        if value.bias is not None:
            raise CheckFailure(f"Your {name} is an nn.Linear with a bias: LoRA's A and B have none "
                               "(nn.Linear(..., bias=False)), or B A x would gain a constant.")
        value = value.weight
    if not isinstance(value, torch.Tensor):
        shape = "(r, d_in)" if name == "lora_A" else "(d_out, r)"
        raise CheckFailure(
            f"Your layer has no {name}: keep the matrix as self.{name}, an nn.Parameter of shape "
            f"{shape} (or an nn.Linear without bias whose weight has that shape, as PEFT does); "
            f"got {type(value).__name__}.")
    return value


def close_scaled(got: Any, expected: torch.Tensor, atol: float = 1e-5) -> bool:
    """``got`` a float tensor of ``expected``'s shape, equal in float64 within ``atol`` times the
    values' scale (the largest |expected|, at least 1) and a relative 1e-4."""
    if not (isinstance(got, torch.Tensor) and got.shape == expected.shape and got.is_floating_point()):
        return False
    scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
    return bool(torch.allclose(f64(got), f64(expected), atol=atol * scale, rtol=1e-4))


def _largest(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((f64(got) - f64(expected)).abs().max())


def _name_mistake(got: torch.Tensor, expected: torch.Tensor,
                  variants: list[tuple[str, str, Callable[[], torch.Tensor]]], case: str, what: str,
                  atol: float, reference: str = "W x + b + (alpha / r) B A x") -> None:
    """Pass if ``got`` equals ``expected``; else the first variant it equals, or the difference."""
    if close_scaled(got, expected, atol):
        return
    for name, hint, compute in variants:
        try:
            wrong = compute()
        except Exception:  # noqa: BLE001 (a variant that cannot exist for this case)
            continue
        if wrong is None:
            continue
        if close_scaled(got, wrong, atol) and not close_scaled(wrong, expected, atol):
            raise CheckFailure(f"Likely mistake ({case}): {name}. {hint}", mistake=name)
    detail = (f"largest difference {_largest(got, expected):.3g}" if isinstance(got, torch.Tensor)
              and got.shape == expected.shape else
              f"shape {tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}, "
              f"expected {tuple(expected.shape)}")
    raise CheckFailure(f"{what} differs from {reference} ({case}): {detail}. None of the usual "
                       "mistakes explains it; print both for a small input and compare.")


# (case, d_in, d_out, r, alpha, leading dims of x, bias, dtype): alpha / r = 2, 1.5, 0.5, 5, so that
# r / alpha, (alpha / r)², alpha / √r and no scaling all give other numbers; the square case lets a
# transposed B A fit; d_in != d_out elsewhere
_CASES = [
    ("square 24 -> 24, r=8, alpha=4, no bias, float64, x (3, 24)", 24, 24, 8, 4, (3,), False,
     torch.float64),
    ("d_in 32 -> d_out 48, r=4, alpha=8, x (5, 32)", 32, 48, 4, 8, (5,), True, torch.float32),
    ("d_in 48 -> d_out 24, r=2, alpha=3, x (2, 7, 48)", 48, 24, 2, 3, (2, 7), True, torch.float32),
    ("d_in 40 -> d_out 16, r=1, alpha=5, x (2, 3, 4, 40)", 40, 16, 1, 5, (2, 3, 4), True, torch.float32),
]

_KIND = ("That is a ready-made LoRA layer, the very thing this exercise builds: right, and the lesson "
         "uses it once yours has passed. Here, write the layer yourself; torch's building blocks "
         "(nn.Parameter, nn.init, F.linear, matmul, einsum) are welcome.")


def _refuse_ready_made(cls: Any) -> None:
    from ..lora import LoRALinear

    if is_course_lib(cls) or is_peft(cls) or (isinstance(cls, type) and issubclass(cls, LoRALinear)):
        raise CheckFailure(f"You handed in a library's LoRA layer (course_lib's LoRALinear or "
                           f"PEFT's). {_KIND}")


def _watched() -> list[Callable[..., Any]]:
    from .. import lora

    return [lora.LoRALinear.forward, lora.LoRALinear.merge, lora.LoRALinear.unmerge,
            lora.LoRALinear.get_delta_weight, lora.add_lora, lora.merge_lora, lora.unmerge_lora]


def _call(fn: Callable[..., Any], *args: Any, case: str, hint: str) -> Any:
    """The learner's call, watched for course_lib's LoRA, stopped after LIMIT_SECONDS."""
    with calls_to(_watched()) as seen, time_limit(
            LIMIT_SECONDS, f"Your code ran for more than {LIMIT_SECONDS} s ({case}): a loop that never "
                           "ends? One call on these small tensors takes milliseconds."):
        out = run_learner(fn, *args, case=case, hint=hint)
    if seen:
        raise CheckFailure(f"Your code calls course_lib's LoRA ({seen[0].__qualname__}). {_KIND}")
    return out


def _init_message(A: torch.Tensor, d_in: int, case: str) -> str | None:
    """None if A looks like kaiming_uniform_(a=√5): uniform in ±1/√d_in, spread over it."""
    bound = 1 / math.sqrt(d_in)
    a = f64(A)
    if not torch.isfinite(a).all():
        return f"lora_A holds NaN or inf at start ({case}); torch.empty is not initialised: fill it."
    biggest, spread = float(a.abs().max()), float(a.std()) if a.numel() > 1 else 0.0
    if biggest == 0:
        return (f"lora_A starts at zero ({case}). With B zero too, no gradient reaches either: "
                "dL/dB needs A x and dL/dA needs B, both 0, so LoRA never trains. B starts at zero; "
                "A starts as PEFT draws it, nn.init.kaiming_uniform_(A, a=math.sqrt(5)).")
    if biggest <= bound * (1 + 1e-6) and spread >= 0.45 * bound / math.sqrt(3):
        return None
    if abs(biggest - math.sqrt(6) * bound) < 0.6 * bound or (
            biggest <= math.sqrt(6) * bound * (1 + 1e-6) and biggest > 1.2 * bound):
        why = ("its numbers reach ±√(6 / d_in): that is kaiming_uniform_ with its default a = 0; "
               "PEFT passes a = math.sqrt(5), which gives ±1/√d_in (nn.Linear's own init)")
    elif biggest > 1.5:
        why = "its numbers are as large as N(0, 1)'s: PEFT draws A uniform in ±1/√d_in"
    else:
        why = (f"its largest |number| is {biggest:.3g}, its spread {spread:.3g}; PEFT's A is uniform "
               f"in ±1/√d_in = ±{bound:.3g} (spread {bound / math.sqrt(3):.3g})")
    return (f"lora_A does not start as PEFT initialises it ({case}): {why}. Use "
            "nn.init.kaiming_uniform_(A, a=math.sqrt(5)).")


def _expect_base_itself(layer: nn.Module, base: nn.Linear, W0: torch.Tensor, case: str) -> None:
    """CheckFailure if ``layer`` holds a copy of ``base``'s weight and not ``base.weight`` itself."""
    held = list(layer.named_parameters()) + list(layer.named_buffers())
    if any(t is base.weight for _, t in held):
        return
    copies = [name for name, t in held if isinstance(t, torch.Tensor) and tuple(t.shape) == tuple(W0.shape)
              and t.is_floating_point() and torch.equal(t.detach().to(torch.float64), W0)]
    if copies:
        state = "still requires grad" if base.weight.requires_grad else "is frozen"
        raise CheckFailure(
            f"The nn.Linear your layer wraps is not the one passed in ({case}): your layer holds "
            f"{copies[0]}, a tensor with the numbers of base.weight but another tensor (a copy), while "
            f"the weight of the base passed in {state}. Keep base itself (self.base_layer = base): "
            "freezing must freeze it, and merge() must change its weight.", mistake="base copied")


def _expect_same_weight(base: nn.Linear, weight: nn.Parameter, case: str, when: str) -> None:
    """CheckFailure if ``base.weight`` is no longer the frozen Parameter ``weight`` after ``when``."""
    now = getattr(base, "weight", None)
    if now is not weight:
        kind = ("a new Parameter" if isinstance(now, nn.Parameter) else
                f"a new {type(now).__name__}")
        grad = f" (requires_grad={now.requires_grad})" if isinstance(now, torch.Tensor) else ""
        raise CheckFailure(
            f"After {when}, the given layer's weight is {kind}{grad}, not the Parameter it had "
            f"({case}): merge() and unmerge() change W in place (with torch.no_grad(): W += ...), so "
            "that W stays "
            "the one frozen Parameter that the model, its optimizer and any tied layer hold.",
            mistake="merge replaces W")
    if now.requires_grad:
        raise CheckFailure(f"After {when}, the given layer's weight W requires grad ({case}): it "
                           "stays frozen through merge() and unmerge(); only A and B train.",
                           mistake="base weight trainable")


def _forward_variants(x, W, b, A, B, s, r, alpha) -> list[tuple[str, str, Callable[[], torch.Tensor]]]:
    def out(scale: float, bias_times: int = 1, delta: torch.Tensor | None = None) -> torch.Tensor:
        d = B @ A if delta is None else delta
        y = x @ W.T + x @ d.T * scale
        return y + bias_times * b if b is not None else y

    fix = "The LoRA path is (alpha / r) · B A x, added to the frozen layer's W x + b."
    return [
        ("the scaling is r / alpha, upside down", f"scaling = alpha / r. {fix}",
         lambda: out(r / alpha)),
        ("the scaling is applied twice", f"multiply B A x by alpha / r once. {fix}",
         lambda: out(s * s)),
        ("the scaling is missing", f"multiply B A x by alpha / r. {fix}", lambda: out(1.0)),
        ("the scaling is alpha / √r (rsLoRA's)", f"this exercise uses LoRA's alpha / r. {fix}",
         lambda: out(alpha / math.sqrt(r))),
        (f"the LoRA path's scaling is {alpha // r:g} where alpha / r = {s:g} (alpha={alpha:g}, r={r}): "
         "alpha // r, an integer division", f"scaling = alpha / r, a true division. {fix}",
         lambda: out(float(alpha // r)) if alpha // r != alpha / r else None),
        ("the LoRA path is missing: the output is the frozen layer's W x + b",
         "add (alpha / r) · B A x to base(x).", lambda: out(0.0)),
        ("the bias is dropped", "keep the frozen layer's bias: base(x) is W x + b.",
         lambda: out(s, 0) if b is not None else None),
        ("the bias is added twice", "base(x) already adds b; add only the LoRA path to it.",
         lambda: out(s, 2) if b is not None else None),
        ("B A transposed (ΔW^T in place of ΔW)",
         "B A is (d_out, r) @ (r, d_in) = (d_out, d_in), W's layout: x goes through A first, then B.",
         lambda: out(s, delta=(B @ A).T)),
    ]


def _set_random(t: torch.Tensor, gen: torch.Generator, std: float) -> torch.Tensor:
    value = torch.randn(t.shape, generator=gen, dtype=torch.float64) * std
    with torch.no_grad():
        t.copy_(value.to(t.dtype))
    return value.to(t.dtype).to(torch.float64)


def _check_case(cls: Any, n: int, case: str, d_in: int, d_out: int, r: int, alpha: float,
                lead: tuple[int, ...], bias: bool, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(100 + n)
    base = nn.Linear(d_in, d_out, bias=bias).to(dtype)
    with torch.no_grad():
        base.weight.copy_(torch.randn(d_out, d_in, generator=gen, dtype=torch.float64) * 0.3)
        if bias:
            base.bias.copy_(torch.randn(d_out, generator=gen, dtype=torch.float64) * 0.5)
    W0 = base.weight.detach().to(torch.float64).clone()
    b0 = base.bias.detach().to(torch.float64).clone() if bias else None
    torch.manual_seed(n)
    layer = _call(cls, base, r, alpha, case=f"building {getattr(cls, '__name__', 'it')}(base, r={r}, "
                  f"alpha={alpha})", hint="The constructor takes (base, r, alpha): base an nn.Linear.")
    if not isinstance(layer, nn.Module):
        raise CheckFailure(f"{getattr(cls, '__name__', 'Your class')}(base, r, alpha) should be an "
                           f"nn.Module, got {type(layer).__name__} (subclass nn.Module, call "
                           "super().__init__()).")
    if any(is_course_lib(m) or is_peft(m) for m in layer.modules()):
        raise CheckFailure(f"Your layer is, or holds, a library's LoRA layer. {_KIND}")
    if base.weight.shape != (d_out, d_in) or not torch.equal(base.weight.detach().double(), W0):
        raise CheckFailure(f"Building your layer changed the given nn.Linear's weight ({case}): the "
                           "frozen W must stay as it is until merge().")
    sizes = (getattr(layer, "in_features", None), getattr(layer, "out_features", None))
    if sizes != (d_in, d_out):
        raise CheckFailure(f"Your layer's (in_features, out_features) are {sizes}, expected "
                           f"{(d_in, d_out)} ({case}): keep the base's sizes as self.in_features and "
                           "self.out_features, as nn.Linear and PEFT's layers do (the model's "
                           "feed-forward reads them).")
    _expect_base_itself(layer, base, W0, case)
    A, B = lora_matrix(layer, "lora_A"), lora_matrix(layer, "lora_B")
    for name, t, shape in (("lora_A", A, (r, d_in)), ("lora_B", B, (d_out, r))):
        if tuple(t.shape) != shape:
            flipped = tuple(t.shape) == shape[::-1]
            raise CheckFailure(
                f"{name} has shape {tuple(t.shape)}, expected {shape} ({case}: r={r}, d_in={d_in}, "
                f"d_out={d_out}). " + ("That is the transpose: keep PEFT's layout, A (r, d_in) and B "
                                      "(d_out, r), so that ΔW = B @ A has W's shape (d_out, d_in)."
                                      if flipped else "A is (r, d_in), B is (d_out, r)."))
        if t.dtype != dtype:
            raise CheckFailure(f"{name} is {t.dtype} but the base layer's weight is {dtype} ({case}): "
                               "create A and B with the weight's dtype (and device).")
    if B.detach().abs().max() > 0 and A.detach().abs().max() == 0:
        raise CheckFailure(
            f"lora_A starts at zero and lora_B does not ({case}: B's largest |number| is "
            f"{float(B.detach().abs().max()):.3g}): the two starts are swapped. B starts at zero "
            "(torch.zeros), so that a new adapter leaves the model as it was, and A starts as PEFT "
            "draws it, nn.init.kaiming_uniform_(A, a=math.sqrt(5)), so that B's gradient is not zero.",
            mistake="A zero and B random at start")
    if B.detach().abs().max() > 0:
        raise CheckFailure(
            f"lora_B does not start at zero ({case}): its largest |number| is "
            f"{float(B.detach().abs().max()):.3g}, so before any training the wrapped layer already "
            "computes something else than the frozen one. B starts at zero (torch.zeros), so that a "
            "new adapter leaves the model exactly as it was.", mistake="B random at start")
    message = _init_message(A.detach(), d_in, case)
    if message:
        raise CheckFailure(message, mistake="A not initialised as PEFT does")
    trainable = {id(p) for p in layer.parameters() if p.requires_grad}
    if base.weight.requires_grad or (bias and base.bias.requires_grad):
        which = "weight W" if base.weight.requires_grad else "bias b"
        raise CheckFailure(f"The frozen layer's {which} still requires grad ({case}): the base layer "
                           "stays frozen (requires_grad_(False) on its weight and bias); only A and B "
                           "train.", mistake="base weight trainable")
    if not (A.requires_grad and B.requires_grad):
        raise CheckFailure(f"{'lora_A' if not A.requires_grad else 'lora_B'} does not require grad "
                           f"({case}): A and B are what LoRA trains (nn.Parameter does it).")
    extra = trainable - {id(A), id(B)}
    if extra:
        names = [k for k, p in layer.named_parameters() if id(p) in extra]
        raise CheckFailure(f"Your layer trains {names} besides A and B ({case}): only lora_A and "
                           "lora_B train.")
    x = torch.randn(*lead, d_in, generator=gen, dtype=torch.float64).to(dtype)
    x64 = x.double()

    def reference(A64: torch.Tensor, B64: torch.Tensor, merged_W: torch.Tensor | None = None) -> torch.Tensor:
        y = x64 @ (W0 if merged_W is None else merged_W).T
        if merged_W is None:
            y = y + x64 @ (B64 @ A64).T * (alpha / r)
        return y + b0 if b0 is not None else y

    hint = f"x is (..., d_in={d_in}); return (..., d_out={d_out})."
    atol = 1e-5 if dtype == torch.float32 else 1e-10
    got = _call(layer, x, case=case, hint=hint)
    A_start, B_start = A.detach().double(), B.detach().double()
    _name_mistake(got, reference(A_start, B_start),
                  _forward_variants(x64, W0, b0, A_start, B_start, alpha / r, r, alpha), case + ", at start",
                  "Your output at start (B = 0)", atol)
    s = alpha / r
    A64, B64 = _set_random(A, gen, 0.4), _set_random(B, gen, 0.4)
    got = _call(layer, x, case=case, hint=hint)
    _name_mistake(got, reference(A64, B64), _forward_variants(x64, W0, b0, A64, B64, s, r, alpha),
                  case + ", A and B random", "Your output", atol)
    # gradients of A and B, then two SGD steps on them, as training does
    for step in range(2):
        weights = torch.randn(got.shape, generator=gen, dtype=torch.float64)
        A_ref, B_ref = A64.clone().requires_grad_(True), B64.clone().requires_grad_(True)
        (reference(A_ref, B_ref) * weights).sum().backward()
        for t in (A, B):
            t.grad = None
        x_leaf = x.detach().clone().requires_grad_(True)  # (*lead, d_in): the gradient must reach x too
        got = _call(layer, x_leaf, case=case, hint=hint)
        _call(lambda: (got.to(torch.float64) * weights).sum().backward(), case=case + ", backward",
              hint="The output must stay in the autograd graph of A and B: no .detach(), no .data, "
                   "no torch.no_grad() in forward.")
        for name, t, ref in (("lora_A", A, A_ref), ("lora_B", B, B_ref)):
            if t.grad is None or not close_scaled(t.grad, ref.grad, atol * 10):
                raise CheckFailure(
                    f"The gradient of {name} differs from that of W x + b + (alpha / r) B A x "
                    f"({case}, step {step}): "
                    + ("it has none; the output must depend on it through autograd."
                       if t.grad is None else f"largest difference {_largest(t.grad, ref.grad):.3g}."))
        if base.weight.grad is not None or (bias and base.bias.grad is not None):
            raise CheckFailure(f"The frozen layer's weight or bias received a gradient ({case}): "
                               "freeze them; only A and B train.", mistake="base weight trainable")
        _expect_x_grad(x_leaf.grad, weights, W0, A64, B64, s, case, step, atol)
        # one SGD step on each (its size normalised: numbers move by at most 0.1), the reference alongside
        step_A = 0.1 * A_ref.grad / A_ref.grad.abs().max().clamp_min(1e-12)
        step_B = 0.1 * B_ref.grad / B_ref.grad.abs().max().clamp_min(1e-12)
        with torch.no_grad():
            A -= step_A.to(A.dtype)
            B -= step_B.to(B.dtype)
        A64, B64 = A64 - step_A.to(A.dtype).double(), B64 - step_B.to(B.dtype).double()
        A.grad = B.grad = None
        got = _call(layer, x, case=case, hint=hint)
        _name_mistake(got, reference(A64, B64), _forward_variants(x64, W0, b0, A64, B64, s, r, alpha),
                      f"{case}, after {step + 1} SGD step(s) on A and B", "Your output", atol)
    _check_merge(layer, base, x, x64, W0, b0, A64, B64, r, alpha, case, atol, reference, hint)


def _expect_x_grad(grad: torch.Tensor | None, weights: torch.Tensor, W0: torch.Tensor, A64: torch.Tensor,
                   B64: torch.Tensor, s: float, case: str, step: int, atol: float) -> None:
    """The gradient of sum(output * weights) with respect to x (*lead, d_in) is weights (*lead, d_out)
    @ (W + s B A); name it when only the LoRA path's part or only W's part reaches x."""
    full, lora_part, w_part = weights @ (W0 + s * B64 @ A64), weights @ (s * B64 @ A64), weights @ W0
    if grad is not None and close_scaled(grad, full, atol * 10):
        return
    if grad is None:
        seen = "x receives no gradient"
    elif close_scaled(grad, lora_part, atol * 10):
        seen = ("x's gradient holds only the LoRA path's part, (alpha / r) B A: the frozen layer's "
                "W x + b passes no gradient back to x (frozen means W and b get none, but x, and the "
                "layers before, still do)")
        raise CheckFailure(f"The gradient with respect to x differs from that of W x + b + (alpha / r) "
                           f"B A x ({case}, step {step}): {seen}.", mistake="base(x) outside autograd")
    elif close_scaled(grad, w_part, atol * 10):
        seen = "x's gradient holds only the frozen layer's part, W: the LoRA path passes none back to x"
    else:
        seen = f"largest difference {_largest(grad, full):.3g}"
    raise CheckFailure(f"The gradient with respect to x differs from that of W x + b + (alpha / r) B A x "
                       f"({case}, step {step}): {seen}.")


def _check_merge(layer, base, x, x64, W0, b0, A64, B64, r, alpha, case, atol, reference, hint) -> None:
    s = alpha / r
    weight = base.weight  # the frozen Parameter: merge() and unmerge() change it in place
    delta = (B64 @ A64) * s  # (d_out, d_in)
    unmerged = reference(A64, B64)
    for name in ("merge", "unmerge"):
        if not callable(getattr(layer, name, None)):
            raise CheckFailure(f"Your layer has no method {name}(): merge() adds (alpha / r) B A to "
                               "the frozen W in place, unmerge() takes it out again.")
    _call(layer.merge, case=case + ", merge()", hint="merge() takes no argument.")
    _expect_same_weight(base, weight, case, "merge()")
    merged_W = W0 + delta
    W_variants = [
        ("merge() did not change the weight of the nn.Linear the layer was given", "merge() writes "
         "W + (alpha / r) B A into the given layer's weight, in place (with torch.no_grad(), +=).",
         lambda: W0),
        ("merge() adds B A without the scaling", "W <- W + (alpha / r) · B A.", lambda: W0 + B64 @ A64),
        ("merge() applies the scaling twice", "W <- W + (alpha / r) · B A, scaled once.",
         lambda: W0 + delta * s),
        ("merge() adds the transpose of B A", "B A is (d_out, r) @ (r, d_in): W's own layout, "
         "nothing to transpose.", lambda: W0 + delta.T),
        ("merge() subtracts", "merging adds: W <- W + (alpha / r) · B A.", lambda: W0 - delta),
    ]
    _name_mistake(base.weight.detach(), merged_W, W_variants, case + ", W after merge()",
                  "The given layer's weight after merge()", atol,
                  "W + (alpha / r) B A")
    got = _call(layer, x, case=case + ", merged", hint=hint)
    _name_mistake(got, unmerged, [
        ("after merge() the forward still adds the LoRA path, so B A counts twice",
         "once merged, B A is inside W: the forward is base(x) alone until unmerge().",
         lambda: reference(A64, B64, merged_W) + x64 @ delta.T)],
        case + ", merged", "Your merged layer's output (it must not change)", atol)
    try:
        _call(layer.merge, case=case + ", merge() a second time", hint="")
    except CheckFailure:  # raising on a second merge is a fine answer
        pass
    _expect_same_weight(base, weight, case, "a second merge()")
    _name_mistake(base.weight.detach(), merged_W, [
        ("merge() on a merged layer adds B A again",
         "keep whether the layer is merged (self.merged) and do nothing, or raise, when it is.",
         lambda: W0 + 2 * delta)],
        case + ", W after merge() twice", "The weight after a second merge()", atol,
                  "W + (alpha / r) B A")
    _call(layer.unmerge, case=case + ", unmerge()", hint="unmerge() takes no argument.")
    _expect_same_weight(base, weight, case, "unmerge()")
    _name_mistake(base.weight.detach(), W0, [
        ("unmerge() did not change W", "unmerge() subtracts (alpha / r) B A from W, in place.",
         lambda: merged_W),
        ("unmerge() subtracts B A without the scaling", "W <- W - (alpha / r) · B A.",
         lambda: merged_W - B64 @ A64),
        ("unmerge() adds instead of subtracting", "W <- W - (alpha / r) · B A.",
         lambda: merged_W + delta)],
        case + ", W after unmerge()", "The weight after unmerge()", atol,
                  "W, the weight before merge()")
    got = _call(layer, x, case=case + ", unmerged", hint=hint)
    _name_mistake(got, unmerged, [
        ("after unmerge() the LoRA path stays off",
         "once unmerged, the forward adds (alpha / r) B A x again.", lambda: reference(A64, B64, W0))],
        case + ", unmerged again", "Your unmerged layer's output", atol)
    try:
        _call(layer.unmerge, case=case + ", unmerge() a second time", hint="")
    except CheckFailure:
        pass
    _expect_same_weight(base, weight, case, "a second unmerge()")
    _name_mistake(base.weight.detach(), W0, [
        ("unmerge() on an unmerged layer subtracts B A again",
         "keep whether the layer is merged and do nothing, or raise, when it is not.",
         lambda: W0 - delta)],
        case + ", W after unmerge() twice", "The weight after a second unmerge()", atol,
                  "W, the weight before merge()")


@checker
@no_raw_errors
def check_lora_linear(cls: Any) -> None:
    """Check ``cls(base, r, alpha)``: LoRA on a frozen ``nn.Linear`` (see the module's docstring)."""
    _refuse_ready_made(cls)
    with torch.random.fork_rng(devices=[]):
        for n, (case, d_in, d_out, r, alpha, lead, bias, dtype) in enumerate(_CASES):
            _check_case(cls, n, case, d_in, d_out, r, alpha, lead, bias, dtype)
    print(f"check_lora_linear: right on all {len(_CASES)} layers (shapes, ranks, alphas, batch shapes, "
          "bias or none, float32 and float64): the start, the output, the gradients of A, B and x, two "
          "training steps, merge and unmerge. Well done!")
