"""Checkers for the exercises of lesson 04 (the encoder): feed-forward, LayerNorm, encoder layer,
two predictions (a LayerNorm output, an encoder layer's parameter count) and the repaired block."""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import EncoderLayer, FeedForward
from ..masks import causal_mask
from .common import (
    CheckFailure, Mistake, checker, compare, expect_shape, load_reference_weights, passed,
    is_course_lib, run_learner,
)

__all__ = [
    "check_feed_forward", "check_layer_norm", "check_encoder_layer", "check_layer_norm_prediction",
    "check_encoder_layer_params", "check_repaired_encoder_block",
]


def _refuse_reference(candidate: Any, what: str, also: tuple[Any, ...] = ()) -> None:
    """Fail if the learner handed in course_lib's (or PyTorch's) own object instead of writing one."""
    if is_course_lib(candidate) or any(candidate is ref for ref in also):
        owner = "course_lib" if is_course_lib(candidate) else "PyTorch"
        raise CheckFailure(
            f"This is {owner}'s own `{getattr(candidate, '__name__', candidate)}`, not code of "
            f"yours: it passes trivially and teaches nothing. Write {what} yourself."
        )


def _build(cls: type, *args: Any, **kwargs: Any) -> nn.Module:
    """Instantiate the learner's class; ``dropout=0.0`` if its signature accepts it."""
    try:
        return cls(*args, **kwargs)
    except TypeError:
        return cls(*args)


def _randomize_norms(module: nn.Module, gen: torch.Generator) -> None:
    """Give every LayerNorm a non-trivial gain and bias, so a missing or misplaced norm shows."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.copy_(1.0 + 0.3 * torch.randn(m.weight.shape, generator=gen))
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=gen))


_RUN_HINT = ("If it is a shape error, print the shapes of the intermediate tensors (a mean or "
             "variance "
             "taken without keepdim=True is a common cause).")


# --------------------------------------------------------------------------- feed-forward


@checker
def check_feed_forward(cls: type) -> None:
    """Check ``cls(d_model, d_ff, dropout=0.0)``: ``linear2(relu(linear1(x)))`` with submodules
    ``linear1`` (d_model -> d_ff) and ``linear2`` (d_ff -> d_model)."""
    _refuse_reference(cls, "the feed-forward network (`MyFeedForward`)", (nn.Linear,))
    cases = [((2, 5, 16), 32), ((1, 1, 8), 8), ((3, 7, 12), 48)]
    for i, (shape, d_ff) in enumerate(cases):
        torch.manual_seed(100 + i)
        d_model = shape[-1]
        reference = FeedForward(d_model, d_ff, dropout=0.0).eval()
        learner = _build(cls, d_model, d_ff, dropout=0.0)
        load_reference_weights(learner, reference.state_dict(), "Your feed-forward network")
        learner.eval()
        x = torch.randn(shape)
        case = f"input {shape}, d_ff={d_ff}"
        with torch.no_grad():
            got = run_learner(learner, x, case=case, hint=_RUN_HINT)
            expected = reference(x)
        expect_shape(got, expected.shape, "the feed-forward output",
                     "linear2 must map d_ff back to d_model, so the output has the input's shape.")
        l1, l2 = reference.linear1, reference.linear2
        mistakes = [
            Mistake("the activation is missing",
                    "Without a non-linearity the two linear layers collapse into one linear map; "
                    "apply ReLU between linear1 and linear2.",
                    lambda x: l2(l1(x))),
            Mistake("the activation is applied after linear2 instead of between the layers",
                    "The paper's FFN is max(0, x W1 + b1) W2 + b2: ReLU on the d_ff-wide hidden "
                    "layer, "
                    "nothing after linear2.",
                    lambda x: F.relu(l2(l1(x)))),
            Mistake("GELU is used where the paper's ReLU was asked",
                    "This exercise follows the paper: use ReLU (BERT uses GELU).",
                    lambda x: l2(F.gelu(l1(x)))),
            *[Mistake(f"{name} is used where the paper's ReLU was asked",
                      "This exercise follows the paper's equation 2: max(0, x W1 + b1) W2 + b2, "
                      "i.e. F.relu (or torch.relu, nn.ReLU()) between the two layers.",
                      lambda x, act=act: l2(act(l1(x))))
              for name, act in (("tanh", torch.tanh), ("a sigmoid", torch.sigmoid),
                                ("SiLU", F.silu), ("leaky ReLU", F.leaky_relu))],
            Mistake("ReLU applied twice (between the layers and again after linear2)",
                    "Equation 2 has one ReLU, on the d_ff-wide hidden layer; the output of linear2 "
                    "is returned as it is (it may be negative).",
                    lambda x: F.relu(l2(F.relu(l1(x))))),
            Mistake("a residual connection inside the feed-forward network (x + FFN(x))",
                    "Return FFN(x) only: the encoder layer adds x around the sublayer itself "
                    "(x + feed_forward(x)), so a residual inside would add x twice.",
                    lambda x: x + l2(F.relu(l1(x)))),
            Mistake("the activation is applied to the input before linear1",
                    "ReLU goes on linear1's output: linear2(relu(linear1(x))).",
                    lambda x: l2(l1(F.relu(x)))),
        ]
        with torch.no_grad():
            compare(got, expected, (x,), mistakes, case=case)
    passed("check_feed_forward", len(cases))


# --------------------------------------------------------------------------- LayerNorm


def _ln(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
        dims: tuple[int, ...] = (-1,), unbiased: bool = False,
        eps_outside: bool = False, no_sqrt: bool = False) -> torch.Tensor:
    """LayerNorm and its usual wrong variants (statistics over ``dims``)."""
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, keepdim=True, unbiased=unbiased)
    if no_sqrt:
        y = (x - mean) / (var + eps)
    else:
        y = (x - mean) / (var.sqrt() + eps) if eps_outside else (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight + bias
    return y


def _layer_norm_mistakes(weight: torch.Tensor, bias: torch.Tensor, eps: float) -> list[Mistake]:
    return [
        Mistake("unbiased variance (Bessel's correction, dividing by d - 1)",
                "LayerNorm uses the biased variance, the mean of squared deviations (divide by d): "
                "x.var(dim=-1, unbiased=False, keepdim=True); torch.var's default is unbiased.",
                lambda x: _ln(x, weight, bias, eps, unbiased=True)),
        Mistake("eps is added outside the square root",
                "Divide by torch.sqrt(var + eps), not by (std + eps); the two differ most when the "
                "variance is small.",
                lambda x: _ln(x, weight, bias, eps, eps_outside=True)),
        Mistake("eps outside the square root AND unbiased variance",
                "Use torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + eps) (x.std's "
                "default is "
                "unbiased, too).",
                lambda x: _ln(x, weight, bias, eps, unbiased=True, eps_outside=True)),
        Mistake("normalizing over the wrong axis (the sequence axis instead of the features)",
                "LayerNorm normalizes each token's feature vector: take mean and variance over "
                "dim=-1, "
                "not over the positions (dim=1).",
                lambda x: _ln(x, weight, bias, eps, dims=(-2,))),
        Mistake("normalizing over the wrong axis (the batch axis instead of the features)",
                "That is BatchNorm's axis. LayerNorm takes mean and variance over the last dim "
                "(the features) of each token, dim=-1.",
                lambda x: _ln(x, weight, bias, eps, dims=(0,))),
        Mistake("no square root: divided by the variance instead of the standard deviation",
                "Divide by sqrt(var + eps), the standard deviation, not by var + eps.",
                lambda x: _ln(x, weight, bias, eps, no_sqrt=True)),
        Mistake("the statistics are taken over the whole tensor (one mean and variance for "
                "everything)",
                "Each token gets its own mean and variance over its features: "
                "x.mean(dim=-1, keepdim=True), not x.mean().",
                lambda x: _ln(x, weight, bias, eps, dims=tuple(range(x.dim())))),
        Mistake("the statistics are taken over the last two axes (positions and features together)",
                "Only the features: mean and variance over dim=-1 with keepdim=True.",
                lambda x: _ln(x, weight, bias, eps, dims=(-2, -1))),
        Mistake("the bias is added before the gain multiplies ((y + bias) * weight)",
                "Scale first, then shift: y * weight + bias.",
                lambda x: (_ln(x, None, None, eps) + bias) * weight),
        Mistake("the gain and bias are missing",
                "After normalizing, scale by the learned gain and shift by the learned bias: "
                "y * weight + bias.",
                lambda x: _ln(x, None, None, eps)),
        Mistake("the gain and bias are missing and the variance is unbiased",
                "Multiply by weight and add bias at the end, and use x.var(dim=-1, "
                "unbiased=False).",
                lambda x: _ln(x, None, None, eps, unbiased=True)),
    ]


@checker
def check_layer_norm(candidate: Any) -> None:
    """Check a LayerNorm over the last axis.

    ``candidate`` is either a function ``layer_norm(x, weight, bias, eps) -> y`` or a class
    ``cls(d_model, eps=...)`` with parameters ``weight`` (gain) and ``bias`` like ``nn.LayerNorm``.
    """
    # (shape, eps, scale of x): the small-scale case makes "eps outside the sqrt" visible
    cases = [((2, 5, 16), 1e-5, 1.0), ((3, 4, 8), 1e-3, 0.02), ((1, 6, 6), 1e-5, 4.0),
             ((4, 10), 1e-5, 1.0)]
    _refuse_reference(candidate, "the LayerNorm formula (`MyLayerNorm`)",
                      (nn.LayerNorm, F.layer_norm, torch.layer_norm))
    is_class = inspect.isclass(candidate)
    gen = torch.Generator().manual_seed(4)
    for shape, eps, scale in cases:
        d = shape[-1]
        offset = 3.0 * torch.randn(shape[:-1] + (1,), generator=gen)
        x = scale * torch.randn(shape, generator=gen) + offset
        weight = 1.0 + 0.5 * torch.randn(d, generator=gen)
        bias = 0.5 * torch.randn(d, generator=gen)
        expected = F.layer_norm(x, (d,), weight, bias, eps)
        case = f"input {shape}, eps={eps:g}"
        if is_class:
            module = candidate(d, eps=eps)
            params = dict(module.named_parameters())
            if "weight" not in params or "bias" not in params:
                raise CheckFailure(
                    "Likely mistake: the gain and bias are missing. Your class should own two "
                    "learned "
                    f"parameters named `weight` (gain, ones) and `bias` (zeros) of shape ({d},), "
                    "like "
                    f"nn.LayerNorm; it has {sorted(params)}."
                )
            if params["weight"].shape != (d,) or params["bias"].shape != (d,):
                raise CheckFailure(
                    f"Wrong parameter shape: weight and bias must have shape ({d},), got "
                    f"{tuple(params['weight'].shape)} and {tuple(params['bias'].shape)}."
                )
            with torch.no_grad():
                params["weight"].copy_(weight)
                params["bias"].copy_(bias)
                got = run_learner(module, x, case=case, hint=_RUN_HINT)
        else:
            with torch.no_grad():
                got = run_learner(candidate, x, weight, bias, eps, case=case, hint=_RUN_HINT)
        expect_shape(got, expected.shape, "the LayerNorm output",
                     "LayerNorm keeps the input's shape; keep the feature axis with keepdim=True.")
        # float32 rounding differs between correct formulas by ~1e-5 on the small-variance case;
        # every named mistake is off by far more than 1e-4
        compare(got, expected, (x,), _layer_norm_mistakes(weight, bias, eps), case=case, atol=1e-4)
    passed("check_layer_norm", len(cases))


# --------------------------------------------------------------------------- encoder layer


def _encoder_layer_mistakes(ref: EncoderLayer, mask: torch.Tensor | None) -> list[Mistake]:
    def attn(h: torch.Tensor, m: torch.Tensor | None = mask) -> torch.Tensor:
        return ref.self_attn(h, h, h, m)

    ff, n1, n2 = ref.feed_forward, ref.norm1, ref.norm2

    def ff_linear(h: torch.Tensor) -> torch.Tensor:
        return ff.linear2(ff.linear1(h))

    def overwritten(x: torch.Tensor) -> torch.Tensor:  # x = norm(x); x = x + sublayer(x)
        x = n1(x)
        x = x + attn(x)
        x = n2(x)
        return x + ff(x)

    drop_hint = ("The attention output never reaches the result, so the layer ignores attention "
                 "entirely. Add the sublayer's OUTPUT to its input: x = norm1(x + self_attn(x, x, "
                 "x, mask)).")
    missing_hint = ("Each sublayer's input must be added back before the norm: "
                    "x = norm1(x + self_attn(x, x, x, mask)); x = norm2(x + feed_forward(x)).")
    return [
        Mistake("the residual drops the attention output (x + x instead of x + attention)",
                drop_hint,
                lambda x: (lambda h: n2(h + ff(h)))(n1(x + x))),
        Mistake("the residual drops the attention output (x + x instead of x + attention), and "
                "the norm "
                "overwrites the residual stream",
                drop_hint + " Then normalize the sum of the feed-forward sublayer: "
                "x = norm2(x + feed_forward(x)).",
                lambda x: (lambda h: h + ff(h))(n2(x + x))),
        Mistake("the residual drops the attention output (the attention result is never used)",
                drop_hint,
                lambda x: (lambda h: n2(h + ff(h)))(n1(x))),
        Mistake("a residual connection is missing (around the attention)", missing_hint,
                lambda x: (lambda h: n2(h + ff(h)))(n1(attn(x)))),
        Mistake("a residual connection is missing (around the feed-forward)", missing_hint,
                lambda x: (lambda h: n2(ff(h)))(n1(x + attn(x)))),
        Mistake("a residual connection is missing (around both sublayers)", missing_hint,
                lambda x: (lambda h: n2(ff(h)))(n1(attn(x)))),
        Mistake("the norm comes before the sublayer (pre-LN) where post-LN was asked",
                "This exercise builds the paper's post-LN layer: x = norm1(x + self_attn(x, x, x, "
                "mask)), "
                "then x = norm2(x + feed_forward(x)). Pre-LN would be x = x + self_attn(norm1(x), "
                "...).",
                lambda x: (lambda h: h + ff(n2(h)))(x + attn(n1(x)))),
        Mistake("the norm overwrites the residual stream (x = norm(x), then x = x + sublayer(x))",
                "Normalize the SUM: x = norm1(x + self_attn(x, x, x, mask)); do not replace x by "
                "its "
                "norm before adding the sublayer.",
                overwritten),
        Mistake("the mask is ignored",
                "Pass the mask to the attention: self_attn(x, x, x, mask); padded keys must stay "
                "hidden.",
                lambda x: (lambda h: n2(h + ff(h)))(n1(x + attn(x, None)))),
        Mistake("the mask is inverted (True must mean \"may attend\")",
                "course_lib's masks are True where attention is allowed: pass the mask as it "
                "comes, self_attn(x, x, x, mask), without ~ or == 0.",
                lambda x: (lambda h: n2(h + ff(h)))(n1(x + attn(x, None if mask is None
                                                              else ~mask)))),
        Mistake("the feed-forward is missing its activation",
                "Apply the non-linearity between linear1 and linear2 (ReLU here).",
                lambda x: (lambda h: n2(h + ff_linear(h)))(n1(x + attn(x)))),
        Mistake("the feed-forward reads the layer's input instead of the attention sublayer's "
                "output",
                "Feed the output of the first add & norm into the feed-forward: h = norm1(...); "
                "x = norm2(h + feed_forward(h)).",
                lambda x: (lambda h: n2(h + ff(x)))(n1(x + attn(x)))),
        Mistake("norm1 and norm2 swapped (norm2 after the attention, norm1 after the "
                "feed-forward)",
                "norm1 belongs to the attention sublayer and norm2 to the feed-forward: "
                "x = norm1(x + attention), then x = norm2(x + feed_forward(x)). The two have "
                "different learned weights, so the order matters.",
                lambda x: (lambda h: n1(h + ff(h)))(n2(x + attn(x)))),
        Mistake("the same norm (norm1) used for both sublayers",
                "Each sublayer has its own LayerNorm with its own weights: norm2 after the "
                "feed-forward.",
                lambda x: (lambda h: n1(h + ff(h)))(n1(x + attn(x)))),
        Mistake("the same norm (norm2) used for both sublayers",
                "Each sublayer has its own LayerNorm with its own weights: norm1 after the "
                "attention.",
                lambda x: (lambda h: n2(h + ff(h)))(n2(x + attn(x)))),
    ]


def _run_with_mask(learner: nn.Module, x: torch.Tensor, mask: torch.Tensor | None,
                   case: str) -> torch.Tensor:
    """Run the learner's layer; if a 3-D mask makes it crash, try it as 4-D (B, 1, L_q, L_k).

    Any mask rank ``MultiHeadAttention`` accepts is a correct answer, so a layer written for 4-D
    masks
    (for example around ``F.scaled_dot_product_attention``) passes too.
    """
    try:
        return run_learner(learner, x, mask, case=case, hint=_RUN_HINT)
    except CheckFailure as first:
        if mask is None or mask.dim() != 3:
            raise
        try:
            return run_learner(learner, x, mask.unsqueeze(1), case=case + ", mask given as 4-D",
                               hint=_RUN_HINT)
        except CheckFailure:
            shape4 = tuple(mask.unsqueeze(1).shape)
            raise CheckFailure(f"{first} (The same mask as 4-D {shape4} failed too.)")


def _encoder_layer_cases(gen: torch.Generator) -> list[tuple[tuple[int, int, int], int, int, Any]]:
    cases = []
    # padding mask (B, 1, L): the second sequence has 2 padded positions
    pad = torch.ones(2, 1, 6, dtype=torch.bool)
    pad[1, :, 4:] = False
    cases.append(((2, 6, 16), 4, 32, pad))
    cases.append(((1, 5, 8), 2, 16, None))
    # (B, L, L) mask: causal and padding together
    pad3 = torch.ones(3, 1, 4, dtype=torch.bool)
    pad3[2, :, 3:] = False
    cases.append(((3, 4, 12), 3, 24, causal_mask(4) & pad3))
    return cases


def _check_dropout_places(cls: type, gen: torch.Generator) -> None:
    """Training mode with ``dropout=1.0``: every dropout zeroes what it gets, whatever its random
    draws, so the right layer returns exactly ``norm2(norm1(x))`` (attention and feed-forward
    outputs dropped entirely). Where the dropout sits decides what comes out; no RNG is compared,
    so any correct attention (fused or not) passes."""
    d_model, num_heads, d_ff = 16, 4, 32
    reference = EncoderLayer(d_model, num_heads, d_ff, dropout=1.0)
    _randomize_norms(reference, gen)
    with torch.no_grad():  # non-zero biases: an output bias that slips through must show
        for m in reference.modules():
            if isinstance(m, nn.Linear):
                m.bias.copy_(0.5 * torch.randn(m.bias.shape, generator=gen))
    learner = _build(cls, d_model, num_heads, d_ff, dropout=1.0)
    load_reference_weights(learner, reference.state_dict(), "Your encoder layer")
    x = torch.randn(2, 5, d_model, generator=gen)
    case = "training mode, dropout=1.0"
    learner.train()
    reference.train()
    n1, n2 = reference.norm1, reference.norm2
    with torch.no_grad():
        got = _run_with_mask(learner, x, None, case)
        expect_shape(got, x.shape, "the encoder layer output",
                     "An encoder layer maps (B, L, d_model) to the same shape.")
        expected = n2(n1(x))
        # What a sublayer outputs when no residual dropout follows it: with p = 1 inside the
        # attention (weights dropped) only out_proj's bias is left, and inside the feed-forward
        # only linear2's bias; a learner's sublayer may have no inner dropout, so both are tried.
        attn_b = reference.self_attn(x, x, x)
        ff_b = reference.feed_forward.linear2.bias
        def no_inner_dropout(module: nn.Module, *args: torch.Tensor) -> torch.Tensor:
            module.eval()
            try:
                return module(*args)
            finally:
                module.train()

        def attn_full(h: torch.Tensor) -> torch.Tensor:
            return no_inner_dropout(reference.self_attn, h, h, h)

        def ff_full(h: torch.Tensor) -> torch.Tensor:
            return no_inner_dropout(reference.feed_forward, h)

        # the last of each: dropout on the sublayer's INPUT (zeroed), the sublayer itself intact
        attns = [lambda h: attn_b, attn_full, lambda h: attn_full(torch.zeros_like(h))]
        ffs = [lambda h: ff_b, ff_full, lambda h: ff_full(torch.zeros_like(h))]
        mistakes = [
            Mistake("dropout on the residual sum (after the addition) instead of on the sublayer "
                    "output",
                    "Dropout belongs on each sublayer's output BEFORE it is added: "
                    "x = norm1(x + dropout(self_attn(x, x, x, mask))), not "
                    "norm1(dropout(x + self_attn(...))), which also drops the residual stream.",
                    lambda x: n2.bias.expand_as(x)),
            Mistake("dropout on the residual sum around the attention (after the addition)",
                    "Dropout belongs on the attention's output before the addition: "
                    "x = norm1(x + dropout(self_attn(x, x, x, mask))), not "
                    "norm1(dropout(x + ...)), which also drops the residual stream.",
                    lambda x: n2(n1.bias.expand_as(x))),
            Mistake("dropout applied after the norm (on the layer's output)",
                    "Dropout goes on each sublayer's output before the addition; a post-LN layer "
                    "returns norm2's output as it is.",
                    lambda x: torch.zeros_like(x)),
            Mistake("norm1 and norm2 swapped", "norm1 follows the attention, norm2 the "
                    "feed-forward; they have different learned weights.",
                    lambda x: n1(n2(x))),
        ]
        for attn in attns:
            for ff in ffs:
                mistakes += [
                    Mistake("dropout is not applied to the sublayer outputs (missing, or applied "
                            "to the sublayer's input instead)",
                            "The paper's residual dropout: x = norm1(x + dropout(self_attn(x, x, "
                            "x, mask))) and x = norm2(x + dropout(feed_forward(x))), with "
                            "nn.Dropout(dropout).",
                            lambda x, a=attn, f=ff: (lambda h: n2(h + f(h)))(n1(x + a(x)))),
                    Mistake("dropout is missing around the attention sublayer",
                            "Drop the attention output before adding it: "
                            "x = norm1(x + dropout(self_attn(x, x, x, mask))).",
                            lambda x, a=attn: n2(n1(x + a(x)))),
                    Mistake("dropout is missing around the feed-forward sublayer",
                            "Drop the feed-forward output before adding it: "
                            "x = norm2(x + dropout(feed_forward(x))).",
                            lambda x, f=ff: (lambda h: n2(h + f(h)))(n1(x))),
                ]
        if not torch.allclose(got, expected, atol=1e-5, rtol=1e-4):
            for mistake in mistakes:
                if torch.allclose(got, mistake.compute(x), atol=1e-5, rtol=1e-4):
                    raise CheckFailure(f"Likely mistake ({case}): {mistake.name}. {mistake.hint}", mistake=mistake.name)
            raise CheckFailure(
                f"Dropout in the wrong place ({case}): with p = 1 every dropout zeroes its input, "
                "so the paper's layer returns exactly norm2(norm1(x)) (both sublayer outputs "
                "dropped); yours does not (largest difference "
                f"{(got - expected).abs().max().item():.3g}). Put nn.Dropout(dropout) on each "
                "sublayer's output, before the addition, and nowhere on the residual stream."
            )


def _check_encoder_layer(cls: type) -> int:
    """Compare ``cls`` with ``course_lib.EncoderLayer`` (post-LN); return the number of cases."""
    gen = torch.Generator().manual_seed(44)
    cases = _encoder_layer_cases(gen)
    for shape, num_heads, d_ff, mask in cases:
        d_model = shape[-1]
        torch.manual_seed(int(torch.randint(0, 10_000, (1,), generator=gen)))
        reference = EncoderLayer(d_model, num_heads, d_ff, dropout=0.0)
        _randomize_norms(reference, gen)
        learner = _build(cls, d_model, num_heads, d_ff, dropout=0.0)
        load_reference_weights(learner, reference.state_dict(), "Your encoder layer")
        x = torch.randn(shape, generator=gen)
        learner.eval()
        reference.eval()
        mask_shape = 'none' if mask is None else tuple(mask.shape)
        case = f"input {shape}, num_heads={num_heads}, mask {mask_shape}"
        with torch.no_grad():
            got = _run_with_mask(learner, x, mask, case)
            expected = reference(x, mask)
            expect_shape(got, expected.shape, "the encoder layer output",
                         "An encoder layer maps (B, L, d_model) to the same shape.")
            compare(got, expected, (x,), _encoder_layer_mistakes(reference, mask), case=case)
            learner.train()  # dropout=0.0 was asked: train mode must give the same output
            got = _run_with_mask(learner, x, mask, case)
            if not torch.allclose(got, expected, atol=1e-5, rtol=1e-4):
                raise CheckFailure(
                    f"Likely mistake ({case}): dropout is active although dropout=0.0 was asked "
                    "(in eval "
                    "mode your output is right, in train mode it changes). Pass the dropout "
                    "argument on: "
                    "nn.Dropout(dropout); a bare nn.Dropout() drops with p=0.5."
                )
    _check_dropout_places(cls, gen)
    return len(cases) + 1


@checker
def check_encoder_layer(cls: type) -> None:
    """Check ``cls(d_model, num_heads, d_ff, dropout=0.0)``, a post-LN encoder layer
    ``forward(x (B, L, d_model), mask bool | None) -> (B, L, d_model)`` with submodules named like
    ``course_lib.EncoderLayer``: ``self_attn`` (q_proj, k_proj, v_proj, out_proj), ``feed_forward``
    (linear1, linear2), ``norm1``, ``norm2``. Masks come as (B, 1, L) and (B, L, L); a layer that
    only takes 4-D masks gets them as (B, 1, 1, L) and (B, 1, L, L). Then once in training mode
    with ``dropout=1.0``, where the place of the dropout decides the output."""
    _refuse_reference(cls, "the encoder layer (`MyEncoderLayer`)",
                      (nn.TransformerEncoderLayer,))
    passed("check_encoder_layer", _check_encoder_layer(cls))


# ----------------------------------------------------------------------- the repaired block (Debug)


def _attention_mask_cases(gen: torch.Generator) -> list[tuple[tuple[int, int, int], int, int,
                                                                 torch.Tensor]]:
    """(shape, num_heads, d_ff, attention_mask (B, L) int64 with 1 = real token, 0 = pad)."""
    cases = []
    am = torch.ones(2, 6, dtype=torch.long)
    am[1, 4:] = 0                                       # 2 pads in the second sequence
    cases.append(((2, 6, 16), 4, 32, am))
    am = torch.ones(3, 5, dtype=torch.long)
    am[0, 2:] = 0                                       # 3 pads
    am[2, 4:] = 0                                       # 1 pad
    cases.append(((3, 5, 12), 3, 24, am))
    cases.append(((1, 4, 8), 2, 16, torch.ones(1, 4, dtype=torch.long)))   # no padding
    return cases


@checker
def check_repaired_encoder_block(cls: type) -> None:
    """The debug exercise: a post-LN encoder layer that takes the tokenizer's ``attention_mask``.

    ``cls(d_model, num_heads, d_ff, dropout)``; ``forward(x (B, L, d_model), attention_mask (B, L)
    int, 1 = real token, 0 = pad) -> (B, L, d_model)``, submodules named like
    ``course_lib.EncoderLayer``. It must equal ``course_lib.EncoderLayer`` given the padding mask
    ``(B, 1, L)`` at every real position (nobody reads the padded ones), on three batches, and place
    its dropout right (training mode with ``dropout=1.0``).
    """
    _refuse_reference(cls, "the repaired layer (`RepairedEncoderLayer`)",
                      (nn.TransformerEncoderLayer,))
    gen = torch.Generator().manual_seed(46)
    cases = _attention_mask_cases(gen)
    for shape, num_heads, d_ff, attention_mask in cases:
        d_model = shape[-1]
        torch.manual_seed(int(torch.randint(0, 10_000, (1,), generator=gen)))
        reference = EncoderLayer(d_model, num_heads, d_ff, dropout=0.0).eval()
        _randomize_norms(reference, gen)
        learner = _build(cls, d_model, num_heads, d_ff, dropout=0.0)
        load_reference_weights(learner, reference.state_dict(), "Your encoder layer",
                               "Keep the submodule names of the block: self_attn, feed_forward, "
                               "norm1, norm2.")
        learner.eval()
        x = torch.randn(shape, generator=gen)
        real = attention_mask.bool()                                  # (B, L)
        pad_mask = real.unsqueeze(1)                                  # (B, 1, L): keys
        case = (f"input {shape}, attention_mask with {int((~real).sum())} padded positions")
        with torch.no_grad():
            got = run_learner(learner, x, attention_mask, case=case, hint=_RUN_HINT)
            expect_shape(got, shape, "the encoder layer output",
                         "An encoder layer maps (B, L, d_model) to the same shape.")
            expected = reference(x, pad_mask)

            def at_real(f: Any) -> Any:
                return lambda x: f(x)[real]

            mask_mistakes = [
                Mistake("the padded keys are not hidden: the mask hides the padded QUERIES (rows) "
                        "instead of the padded KEYS (columns), or no mask reaches the attention",
                        "A mask broadcasts against the scores (B, L_q, L_k). attention_mask is "
                        "(B, L); unsqueeze(-1) makes it (B, L, 1), which is spread along the "
                        "keys: only the pad rows are hidden, and every real token still attends "
                        "to the pads, exactly as with no mask at all. The keys are the last axis: "
                        "attention_mask.bool().unsqueeze(1), shape (B, 1, L), as padding_mask "
                        "builds it.",
                        at_real(lambda x: reference(x, real.unsqueeze(-1)))),
                Mistake("a causal mask was added: an encoder lets every token see the whole "
                        "sentence",
                        "Only the pads are hidden in an encoder: the (B, 1, L) padding mask "
                        "alone, no torch.tril (that belongs to the decoder, lesson 05).",
                        at_real(lambda x: reference(x, pad_mask & torch.ones(
                            x.size(1), x.size(1), dtype=torch.bool).tril()))),
                Mistake("the mask is inverted: the real tokens attend only to the pads",
                        "attention_mask is 1 on real tokens, and course_lib's masks mean True = "
                        "may attend: use attention_mask.bool(), not == 0 or ~.",
                        at_real(lambda x: reference(x, ~pad_mask))),
            ]
            layer_mistakes = [Mistake(m.name, m.hint, at_real(m.compute))
                              for m in _encoder_layer_mistakes(reference, pad_mask)]
            compare(got[real], expected[real], (x,), mask_mistakes + layer_mistakes,
                    case=case + " (real positions)")
            learner.train()  # dropout=0.0 was asked: train mode must give the same output
            got = run_learner(learner, x, attention_mask, case=case, hint=_RUN_HINT)
            if not torch.allclose(got[real], expected[real], atol=1e-5, rtol=1e-4):
                raise CheckFailure(
                    f"Likely mistake ({case}): dropout is active although dropout=0.0 was asked "
                    "(in eval mode your output is right, in train mode it changes). Pass the "
                    "dropout argument on: nn.Dropout(dropout); a bare nn.Dropout() drops with "
                    "p=0.5."
                )

    class _NoMask(nn.Module):  # the dropout test runs without padding: an all-ones mask
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__()
            self.inner = _build(cls, *args, **kwargs)

        def state_dict(self, *args: Any, **kwargs: Any) -> Any:
            return self.inner.state_dict(*args, **kwargs)

        def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
            return self.inner.load_state_dict(*args, **kwargs)

        def forward(self, x: torch.Tensor, mask: Any = None) -> torch.Tensor:
            ones = torch.ones(x.shape[:2], dtype=torch.long)
            return self.inner(x, ones)

    _check_dropout_places(_NoMask, gen)
    print(f"check_repaired_encoder_block: all {len(cases) + 1} cases pass. The real tokens "
          "attend to the real tokens only, whatever the padding, and the dropout sits on the "
          "sublayer outputs. Well done!")


# ----------------------------------------------------------------------- Predict: LayerNorm output


LAYER_NORM_PREDICT_INPUT = ((1.0, 2.0, 3.0, 4.0), (10.0, 20.0, 30.0, 40.0))


def _as_float_tensor(value: Any, what: str) -> torch.Tensor:
    try:
        return torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as err:
        raise CheckFailure(f"{what}: could not read your answer {value!r} as numbers ({err}).") \
            from err


@checker
def check_layer_norm_prediction(fn: Any) -> None:
    """Predict: ``fn()`` returns ``nn.LayerNorm(4)`` (gain 1, bias 0) applied to
    ``[[1, 2, 3, 4], [10, 20, 30, 40]]``, as a 2 x 4 nested list (two decimals are enough)."""
    got = _as_float_tensor(fn(), "Your prediction")
    x = torch.tensor(LAYER_NORM_PREDICT_INPUT, dtype=torch.float64)
    expected = F.layer_norm(x, (4,))
    if got.shape != expected.shape:
        raise CheckFailure(
            f"Your prediction has shape {tuple(got.shape)}; give one row of 4 numbers per token: "
            "[[a, b, c, d], [e, f, g, h]] (shape (2, 4))."
        )
    ones, zeros = torch.ones(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)
    mistakes = [
        Mistake("the statistics are taken over the wrong axis (across the two tokens, per feature)",
                "LayerNorm normalizes each token's own vector: mean and variance over its 4 "
                "features (the "
                "last axis), never across tokens. Each feature column [a, 10a] would become [-1, "
                "1].",
                lambda: _ln(x, None, None, 1e-5, dims=(0,))),
        Mistake("unbiased variance (dividing by d - 1 = 3)",
                "LayerNorm divides by d = 4: var of [1, 2, 3, 4] is 1.25, std 1.118, so the outer "
                "values "
                "are 1.5 / 1.118 = 1.342.",
                lambda: _ln(x, None, None, 1e-5, unbiased=True)),
        Mistake("the second token keeps its scale (it comes out ten times larger)",
                "LayerNorm divides each token by its own standard deviation, so scaling a token by "
                "10 "
                "changes nothing: both rows come out the same.",
                lambda: torch.cat([expected[:1], 10 * expected[:1]])),
        Mistake("only the mean is removed (no division by the standard deviation)",
                "After subtracting the mean (2.5 and 25), divide by the standard deviation (1.118 "
                "and 11.18).",
                lambda: x - x.mean(-1, keepdim=True)),
        Mistake("divided by the standard deviation without subtracting the mean",
                "First subtract each token's mean, then divide: (x - mean) / std.",
                lambda: x / x.std(-1, unbiased=False, keepdim=True)),
    ]
    if torch.allclose(got, expected, atol=0.01):
        print("check_layer_norm_prediction: right. Both tokens become [-1.34, -0.45, 0.45, 1.34]: "
              "each is "
              "centred on its own mean and divided by its own std (1.118 and 11.18), so scale "
              "disappears.")
        return
    for mistake in mistakes:
        if torch.allclose(got, mistake.compute(), atol=0.01):
            raise CheckFailure(f"Not quite: {mistake.name}. {mistake.hint}", mistake=mistake.name)
    raise CheckFailure(
        "Not quite. For each token: subtract its mean, divide by sqrt(biased variance + eps); the "
        "gain is 1 "
        "and the bias 0. For [1, 2, 3, 4]: mean 2.5, variance 1.25. Compute the first row, then "
        "ask what "
        "multiplying a token by 10 changes."
    )


# ----------------------------------------------------------------------- Predict: parameter count


@checker
def check_encoder_layer_params(fn: Any) -> None:
    """Predict: ``fn()`` returns the number of parameters of one encoder layer of the paper's base
    model, ``EncoderLayer(d_model=512, num_heads=8, d_ff=2048)`` (biases everywhere, two
    LayerNorms)."""
    got = fn()
    if not isinstance(got, (int, float)) or isinstance(got, bool) or got != int(got):
        raise CheckFailure(f"Give a whole number of parameters (an int), got {got!r}.")
    got = int(got)
    d, f, h = 512, 2048, 8
    with torch.device("meta"):  # shapes only, no memory
        truth = sum(p.numel() for p in EncoderLayer(d, h, f).parameters())
    attn, ffn, norms = 4 * (d * d + d), d * f + f + f * d + d, 2 * 2 * d
    assert truth == attn + ffn + norms
    if got == truth:
        print(f"check_encoder_layer_params: right, {truth:,} = attention {attn:,} + "
              f"feed-forward {ffn:,} "
              f"+ two LayerNorms {norms:,}.")
        return
    mistakes = {
        4 * d * d + 2 * d * f + norms: "the biases are missing (each nn.Linear(d_in, d_out) also "
                                       "has d_out biases)",
        4 * d * d + 2 * d * f: "the biases and the LayerNorms are missing",
        attn + ffn: "the two LayerNorms are missing (each has a gain and a bias of size d_model: "
                    "2 x 2 x 512)",
        attn + ffn + 2 * d: "the LayerNorms are counted with only one vector each (each has a "
                            "gain AND a bias)",
        3 * (d * d + d) + ffn + norms: "the output projection W^O is missing (attention has four "
                                        "d x d "
                                        "matrices: W^Q, W^K, W^V and W^O)",
        h * attn + ffn + norms: "the attention is counted once per head: the 8 heads share the "
                                "four "
                               "d_model x d_model matrices, each head uses a 64-column slice",
        4 * (d * d // h + d // h) + ffn + norms: "the attention is counted for one head only: "
                                                  "the heads' slices "
                                                  "together fill four full d_model x d_model "
                                                  "matrices",
        attn + 2 * (d * d + d) + norms: "the feed-forward is counted as d_model -> d_model (it "
                                        "widens to "
                                        "d_ff = 2048 and back)",
        attn + d * f + f + norms: "the feed-forward is counted with one linear layer (it has two: "
                                  "512 -> 2048 and 2048 -> 512)",
    }
    if got in mistakes:
        raise CheckFailure(f"Not quite ({got:,}): likely {mistakes[got]}.")
    raise CheckFailure(
        f"Not quite ({got:,}). Count each part: four attention projections d_model x d_model with "
        "biases, "
        "two feed-forward layers (512 -> 2048 and 2048 -> 512) with biases, and two LayerNorms "
        "(gain and bias "
        "each)."
    )
