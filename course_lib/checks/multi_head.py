"""Checkers for the exercises of lesson 02 (multi-head attention).

* ``check_split_heads(fn)``: ``fn(x (B, L, d_model), num_heads) -> (B, num_heads, L, head_dim)``
* ``check_merge_heads(fn)``: ``fn(x (B, num_heads, L, head_dim)) -> (B, L, d_model)``
* ``check_multi_head_attention(cls)``: ``cls(d_model, num_heads)`` with ``q_proj``, ``k_proj``,
  ``v_proj``, ``out_proj`` and ``forward(query, key, value, mask=None) -> (B, L_q, d_model)``
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..attention import MultiHeadAttention, scaled_dot_product_attention
from ..masks import causal_mask, padding_mask
from ._common import CheckFailure, Mistake, _close, checker, compare, expect_shape, load_reference_weights, passed

__all__ = ["check_split_heads", "check_merge_heads", "check_multi_head_attention"]


def _first_tensor(out: Any) -> Any:
    """Accept ``out`` or ``(out, weights)`` from a forward that also returns the weights."""
    return out[0] if isinstance(out, (tuple, list)) and len(out) > 0 else out


def _compare_any_shape(
    got: Any,
    expected: torch.Tensor,
    inputs: Sequence[Any],
    mistakes: Sequence[Mistake],
    case: str,
    what: str,
    shape_fix: str,
) -> None:
    """Like ``compare``, but a wrong shape that no named mistake explains gets a shape message."""
    if isinstance(got, torch.Tensor) and got.shape != expected.shape:
        for mistake in mistakes:
            try:
                wrong = mistake.compute(*inputs)
            except Exception:  # a variant that cannot run on this case does not match
                continue
            if _close(got, wrong, 1e-5):
                raise CheckFailure(f"Likely mistake ({case}): {mistake.name}. {mistake.hint}")
    expect_shape(got, expected.shape, what, shape_fix)
    compare(got, expected, inputs, mistakes, case)


# ----------------------------------------------------------------------------------------------
# split_heads / merge_heads
# ----------------------------------------------------------------------------------------------

def _split_ref(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    B, L, d_model = x.shape
    return x.view(B, L, num_heads, d_model // num_heads).transpose(1, 2)  # (B, h, L, hd)


_SPLIT_MISTAKES = [
    Mistake(
        "heads split without the transpose",
        "`x.view(B, L, num_heads, head_dim)` is only half of the job: it groups the features of each "
        "position into heads, shape (B, L, num_heads, head_dim). Add `.transpose(1, 2)` so the head axis "
        "comes before the positions: (B, num_heads, L, head_dim).",
        lambda x, h: x.view(x.size(0), x.size(1), h, x.size(2) // h),
    ),
    Mistake(
        "reshaped straight to (B, num_heads, L, head_dim) without the transpose",
        "The shape is right but the numbers are scrambled: reshape reads the features of position 0, then "
        "position 1, ... and cuts them into rows of head_dim, so one 'head' holds pieces of several "
        "positions. First `view(B, L, num_heads, head_dim)` (features -> heads, per position), then "
        "`.transpose(1, 2)`. See the reshape picture in the lesson.",
        lambda x, h: x.reshape(x.size(0), h, x.size(1), x.size(2) // h),
    ),
    Mistake(
        "heads take every num_heads-th feature (view(B, L, head_dim, num_heads))",
        "Head i must get the consecutive features i*head_dim ... (i+1)*head_dim - 1, so the head axis "
        "comes first in the view: `view(B, L, num_heads, head_dim)`, then `.transpose(1, 2)`.",
        lambda x, h: x.view(x.size(0), x.size(1), x.size(2) // h, h).permute(0, 3, 1, 2),
    ),
]


@checker
def check_split_heads(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
    """Check ``fn(x, num_heads)``: ``(B, L, d_model) -> (B, num_heads, L, head_dim)``."""
    cases = [((2, 5, 12), 3), ((1, 4, 8), 2), ((3, 7, 16), 4), ((2, 3, 6), 6), ((2, 4, 10), 1)]
    g = torch.Generator().manual_seed(2)
    for shape, h in cases:
        x = torch.randn(*shape, generator=g)
        case = f"x {shape}, num_heads={h}"
        got = fn(x.clone(), h)
        B, L, d = shape
        _compare_any_shape(
            got, _split_ref(x, h), (x, h), _SPLIT_MISTAKES, case,
            "split_heads(x, num_heads)",
            f"Expected (B, num_heads, L, head_dim) with head_dim = d_model // num_heads = {d // h}.",
        )
    passed("check_split_heads", len(cases))


def _merge_ref(x: torch.Tensor) -> torch.Tensor:
    B, h, L, hd = x.shape
    return x.transpose(1, 2).reshape(B, L, h * hd)  # (B, h, L, hd) -> (B, L, h, hd) -> (B, L, d)


_MERGE_MISTAKES = [
    Mistake(
        "heads merged in the wrong order (reshape without the transpose)",
        "Reshaping (B, num_heads, L, head_dim) straight to (B, L, d_model) glues head 0's rows together "
        "first, so output position 0 gets head 0's values for positions 0, 1, ... First "
        "`.transpose(1, 2)` -> (B, L, num_heads, head_dim), then `.reshape(B, L, d_model)`.",
        lambda x: x.reshape(x.size(0), x.size(2), x.size(1) * x.size(3)),
    ),
    Mistake(
        "transposed but not reshaped",
        "After `.transpose(1, 2)` the tensor is (B, L, num_heads, head_dim); finish with "
        "`.reshape(B, L, num_heads * head_dim)` to concatenate the heads.",
        lambda x: x.transpose(1, 2),
    ),
]


@checker
def check_merge_heads(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Check ``fn(x)``: ``(B, num_heads, L, head_dim) -> (B, L, num_heads * head_dim)``."""
    cases = [(2, 3, 5, 4), (1, 2, 4, 4), (3, 4, 7, 2), (2, 1, 3, 6)]
    g = torch.Generator().manual_seed(3)
    for shape in cases:
        # A fresh, contiguous tensor, like the output of the attention matmul inside the module.
        x = torch.randn(*shape, generator=g)
        case = f"x {shape}"
        try:
            got = fn(x.clone())
        except RuntimeError as err:
            if "view" in str(err) and ("contiguous" in str(err) or "compatible" in str(err)):
                raise CheckFailure(
                    f"Likely mistake ({case}): `.view` after `.transpose` on a tensor that is not contiguous "
                    f"(PyTorch: '{str(err).splitlines()[0].split(' (')[0]}'). transpose only swaps strides, so the "
                    "numbers are no longer laid out row by row; use `.reshape(...)`, or `.contiguous().view(...)`."
                ) from None
            raise
        B, h, L, hd = shape
        _compare_any_shape(
            got, _merge_ref(x), (x,), _MERGE_MISTAKES, case,
            "merge_heads(x)", f"Expected (B, L, d_model) = {(B, L, h * hd)}.",
        )
    passed("check_merge_heads", len(cases))


# ----------------------------------------------------------------------------------------------
# MultiHeadAttention
# ----------------------------------------------------------------------------------------------

def _variant(
    ref: MultiHeadAttention,
    split: str = "ok",
    merge: str = "ok",
    scale: str = "head_dim",
    out_proj: bool = True,
    mask_mode: str = "ok",
) -> Callable[..., torch.Tensor]:
    """A (possibly deliberately wrong) multi-head attention that uses ``ref``'s weights."""
    h, hd, d = ref.num_heads, ref.head_dim, ref.d_model

    def split_fn(t: torch.Tensor) -> torch.Tensor:
        B, L, _ = t.shape
        if split == "ok":
            return t.view(B, L, h, hd).transpose(1, 2)  # (B, h, L, hd)
        if split == "straight":
            return t.reshape(B, h, L, hd)  # scrambled
        return t.view(B, L, h, hd)  # "no_transpose": attention then runs across heads

    def merge_fn(t: torch.Tensor, B: int, L_q: int) -> torch.Tensor:
        if merge == "ok":
            return t.transpose(1, 2).reshape(B, L_q, d)
        return t.reshape(B, L_q, d)

    @torch.no_grad()
    def run(query, key, value, mask=None):
        B, L_q, _ = query.shape
        if mask_mode == "ignored":
            mask = None
        elif mask_mode == "inverted" and mask is not None:
            mask = ~mask
        if mask is not None and mask.dim() in (2, 3):
            mask = mask.unsqueeze(-3)
        q, k, v = split_fn(ref.q_proj(query)), split_fn(ref.k_proj(key)), split_fn(ref.v_proj(value))
        # scaled_dot_product_attention divides by sqrt(head_dim); rescale q to get another divisor.
        if scale == "none":
            q = q * math.sqrt(hd)
        elif scale == "d_model":
            q = q * math.sqrt(hd) / math.sqrt(d)
        heads, _ = scaled_dot_product_attention(q, k, v, mask)
        merged = merge_fn(heads, B, L_q)
        return ref.out_proj(merged) if out_proj else merged

    return run


def _mha_mistakes(ref: MultiHeadAttention) -> list[Mistake]:
    split_hint = (
        "Split with `.view(B, L, num_heads, head_dim).transpose(1, 2)` -> (B, num_heads, L, head_dim): the "
        "transpose puts the head axis before the positions, so that attention runs over positions within each head."
    )
    merge_hint = (
        "Merge with `.transpose(1, 2).reshape(B, L_q, d_model)`: transpose back to (B, L_q, num_heads, head_dim) "
        "before concatenating the heads."
    )
    out = [Mistake("missing output projection", "Apply `self.out_proj` (W^O) to the concatenated heads; "
                   "MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O.", _variant(ref, out_proj=False))]
    for split in ("straight", "no_transpose"):
        for merge in ("straight", "ok"):
            out.append(Mistake("heads split without the transpose", split_hint, _variant(ref, split=split, merge=merge)))
    out += [
        Mistake("heads merged in the wrong order (no transpose before the reshape)", merge_hint,
                _variant(ref, merge="straight")),
        Mistake("mask ignored", "Pass `mask` on to scaled_dot_product_attention (add the head axis first: "
                "a (B, L_q, L_k) or (L_q, L_k) mask becomes (..., 1, L_q, L_k) with `mask.unsqueeze(-3)`).",
                _variant(ref, mask_mode="ignored")),
        Mistake("mask inverted", "Masks are boolean with True = may attend (course_lib.masks); do not pass `~mask`.",
                _variant(ref, mask_mode="inverted")),
        Mistake("no scaling of the scores", "Divide the scores by sqrt(head_dim) (or reuse "
                "course_lib.scaled_dot_product_attention, which does it).", _variant(ref, scale="none")),
        Mistake("scaled by sqrt(d_model) instead of sqrt(head_dim)", "Each head's dot products have head_dim "
                "terms, so divide by sqrt(head_dim) = sqrt(d_model // num_heads), not by sqrt(d_model).",
                _variant(ref, scale="d_model")),
    ]
    return out


def _build(cls: type[nn.Module], d_model: int, num_heads: int) -> tuple[nn.Module, MultiHeadAttention]:
    torch.manual_seed(0)
    ref = MultiHeadAttention(d_model, num_heads).eval()
    model = cls(d_model, num_heads)
    without_out_proj = set(ref.state_dict()) - {"out_proj.weight", "out_proj.bias"}
    if isinstance(model, nn.Module) and set(model.state_dict()) == without_out_proj:
        raise CheckFailure(
            "Likely mistake: missing output projection. Add `self.out_proj = nn.Linear(d_model, d_model)` and "
            "apply it to the concatenated heads."
        )
    load_reference_weights(
        model, ref.state_dict(), f"{cls.__name__}({d_model}, {num_heads})",
        f"Name the four projections q_proj, k_proj, v_proj, out_proj, each nn.Linear(d_model, d_model) = "
        f"nn.Linear({d_model}, {d_model}), with bias.",
    )
    return model.eval(), ref


@checker
def check_multi_head_attention(cls: type[nn.Module]) -> None:
    """Check a multi-head attention class ``cls(d_model, num_heads)`` against course_lib's."""
    g = torch.Generator().manual_seed(4)
    d_model, h = 16, 4
    model, ref = _build(cls, d_model, h)
    ids = torch.tensor([[5, 6, 7, 8, 9, 0], [5, 6, 7, 0, 0, 0]])  # pad id 0
    x = torch.randn(2, 6, d_model, generator=g)
    q3 = torch.randn(2, 3, d_model, generator=g)
    cases: list[tuple[str, tuple]] = [
        ("self-attention, no mask", (x, x, x, None)),
        ("cross-attention, L_q=3 != L_k=6", (q3, x, x, None)),
        ("self-attention with a padding mask (B, 1, L_k)", (x, x, x, padding_mask(ids, 0))),
        ("cross-attention with a padding mask", (q3, x, x, padding_mask(ids, 0))),
        ("self-attention with a causal mask (L, L)", (x, x, x, causal_mask(6))),
    ]
    mistakes = _mha_mistakes(ref)
    for case, inputs in cases:
        query, key, value, mask = inputs
        with torch.no_grad():
            expected = ref(query, key, value, mask)
            if mask is None:
                got = _first_tensor(model(query.clone(), key.clone(), value.clone()))
            else:
                try:
                    got = _first_tensor(model(query.clone(), key.clone(), value.clone(), mask))
                except TypeError as err:
                    raise CheckFailure(
                        f"forward does not take a mask ({case}): the signature must be "
                        f"forward(query, key, value, mask=None). PyTorch says: {err}"
                    ) from None
        _compare_any_shape(
            got, expected, inputs, mistakes, case, f"the output for {case}",
            "The output must have the query's shape (B, L_q, d_model): merge the heads back and apply out_proj.",
        )
    # A second size, so that a hard-coded number of heads or head_dim shows up.
    model2, ref2 = _build(cls, 12, 3)
    x2 = torch.randn(1, 4, 12, generator=g)
    with torch.no_grad():
        got2 = _first_tensor(model2(x2, x2, x2))
        _compare_any_shape(got2, ref2(x2, x2, x2), (x2, x2, x2, None), _mha_mistakes(ref2),
                           "d_model=12, num_heads=3", "the output for d_model=12, num_heads=3",
                           "The output must be (B, L_q, d_model).")
    passed("check_multi_head_attention", len(cases) + 1)
