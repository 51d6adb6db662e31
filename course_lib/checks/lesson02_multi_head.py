"""Checkers for lesson 02's exercises on the layer (multi-head attention, exercises 1 and 5).

* ``check_parameter_count_prediction(fn)``: ``fn() -> (n_8, n_1)``, the predicted number of
  parameters of multi-head attention with ``d_model=512`` and 8 heads, then 1 head (a "predict, then
  run" question).
* ``check_multi_head_attention(cls)``: ``cls(d_model, num_heads)`` with ``q_proj``, ``k_proj``,
  ``v_proj``, ``out_proj`` and ``forward(query, key, value, mask=None) -> (B, L_q, d_model)``
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..attention import MultiHeadAttention, scaled_dot_product_attention
from ..masks import causal_mask, padding_mask
from .common import (
    CheckFailure, Mistake, calls_to, checker, close, load_reference_weights, passed, run_learner,
)
from .lesson02_heads import (REFERENCE_FUNCTIONS, compare_any_shape, first_tensor, reject_call,
                             reject_reference)

__all__ = ["check_parameter_count_prediction", "check_multi_head_attention"]


# ----------------------------------------------------------------------------------------------
# Predict: the number of parameters
# ----------------------------------------------------------------------------------------------

def _count(d_model: int, num_heads: int) -> int:
    return sum(p.numel() for p in MultiHeadAttention(d_model, num_heads).parameters())


def _as_int(value: Any, what: str) -> int:
    is_number = isinstance(value, (int, float)) or hasattr(value, "__index__")
    if isinstance(value, bool) or not is_number:
        raise CheckFailure(f"{what} should be a whole number, got {value!r} "
                           f"({type(value).__name__}).")
    if isinstance(value, float):
        if not value.is_integer():
            raise CheckFailure(f"{what} should be a whole number (a count of parameters), got "
                               f"{value}.")
        return int(value)
    return int(value.__index__()) if hasattr(value, "__index__") else int(value)


@checker
def check_parameter_count_prediction(fn: Callable[[], Any]) -> None:
    """Check ``fn() -> (n_8, n_1)``: parameters of multi-head attention, d_model=512, 8/1 heads."""
    answer = fn()
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        raise CheckFailure(
            f"Return two numbers, (parameters with 8 heads, parameters with 1 head), e.g. (1000, "
            f"2000); "
            f"got {answer!r}."
        )
    n_8, n_1 = (_as_int(v, f"the {w} count") for v, w in zip(answer, ("8-head", "1-head")))
    d, h, hd = 512, 8, 512 // 8
    truth_8, truth_1 = _count(d, h), _count(d, 1)
    per_layer = d * d + d
    why = (
        f"Each of the four projections W^Q, W^K, W^V (all heads stacked) and W^O is a {d} x {d} "
        f"matrix plus "
        f"a bias of {d}: 4 x ({d}*{d} + {d}) = {4 * per_layer:,}. With 8 heads, head i's W_i^Q is "
        f"{d} x {hd}, "
        f"and 8 of them stacked are one {d} x {d} matrix, so the number of heads does not change "
        f"the count."
    )
    if (n_8, n_1) == (truth_8, truth_1):
        print(f"check_parameter_count_prediction: right, {truth_8:,} parameters with 8 heads and "
              f"with 1 head. "
              f"{why}")
        return
    wrong = {
        4 * d * d: f"you left out the biases: each nn.Linear({d}, {d}) also has {d} of them",
        3 * per_layer: "you left out the output projection W^O (out_proj), which mixes the "
                       "concatenated heads",
        3 * d * d: "you left out the biases and the output projection W^O",
        h * 3 * per_layer + per_layer: (
            f"you gave every head full-width {d} x {d} projections; each head projects to head_dim "
            f"= "
            f"{d} // {h} = {hd} dimensions only"),
        h * 4 * per_layer: (
            f"you counted a whole {d} x {d} attention layer per head; each head projects to "
            f"head_dim = {hd} "
            "dimensions, and there is one W^O for all heads"),
        3 * (d * hd + hd) + per_layer: (
            f"you counted the projections of one head only ({d} x {hd} each); there are {h} heads"),
    }
    for got, what in ((n_8, "8 heads"), (n_1, "1 head")):
        truth = truth_8 if what == "8 heads" else truth_1
        if got != truth:
            reason = wrong.get(got, "")
            if not reason and n_8 != n_1:
                reason = "your two counts differ, but the number of heads does not change the count"
            reason = f"Likely mistake: {reason}. " if reason else ""
            raise CheckFailure(f"Not quite: with {what} you predicted {got:,}, the layer has "
                               f"{truth:,}. "
                               f"{reason}{why}")


# ----------------------------------------------------------------------------------------------
# MultiHeadAttention
# ----------------------------------------------------------------------------------------------

def _variant(
    ref: MultiHeadAttention,
    split: str = "ok",
    merge: str = "ok",
    scale: str = "head_dim",
    out_proj: bool | str = True,
    mask_mode: str = "ok",
    softmax_dim: int = -1,
    projections: tuple[str, str, str] = ("q", "k", "v"),
    inputs: str = "ok",
    one_head: bool = False,
) -> Callable[..., torch.Tensor]:
    """A (possibly deliberately wrong) multi-head attention that uses ``ref``'s weights.

    split: "ok", "straight" (reshape to (B, h, L, hd)), "no_transpose", "interleaved" (head i
    takes every h-th feature); merge: "ok", "straight", "interleaved"; scale: "head_dim", "none",
    "d_model", "twice" (by head_dim); mask_mode: "ok", "ignored", "inverted", "after_softmax",
    "fill_zero" (hidden scores set to 0); out_proj: True, False, "untransposed" (x @ W + b);
    softmax_dim: -1, or -2 (over the queries); projections: which of q_proj/k_proj/v_proj
    projects the query, key and value ("x": none); inputs: "ok", "query_only" (keys and values
    from the query), "kv_swapped"; one_head: attention over the whole d_model, no split.
    """
    h, hd, d = ref.num_heads, ref.head_dim, ref.d_model
    if one_head:
        h, hd = 1, d

    def split_fn(t: torch.Tensor) -> torch.Tensor:
        B, L, _ = t.shape
        if split == "ok":
            return t.view(B, L, h, hd).transpose(1, 2)  # (B, h, L, hd)
        if split == "straight":
            return t.reshape(B, h, L, hd)  # scrambled
        if split == "interleaved":
            return t.view(B, L, hd, h).permute(0, 3, 1, 2)
        return t.view(B, L, h, hd)  # "no_transpose": attention then runs across heads

    def merge_fn(t: torch.Tensor, B: int, L_q: int) -> torch.Tensor:
        if merge == "ok":
            return t.transpose(1, 2).reshape(B, L_q, d)
        if merge == "interleaved":
            return t.permute(0, 2, 3, 1).reshape(B, L_q, d)
        return t.reshape(B, L_q, d)

    @torch.no_grad()
    def run(query, key, value, mask=None):
        B, L_q, _ = query.shape
        if inputs == "query_only":
            key = value = query
        elif inputs == "kv_swapped":
            key, value = value, key
        if mask_mode == "ignored":
            mask = None
        elif mask_mode == "inverted" and mask is not None:
            mask = ~mask
        if mask is not None and mask.dim() in (2, 3):
            mask = mask.unsqueeze(-3)
        proj = {"q": ref.q_proj, "k": ref.k_proj, "v": ref.v_proj, "x": lambda t: t}
        q = split_fn(proj[projections[0]](query))
        k = split_fn(proj[projections[1]](key))
        v = split_fn(proj[projections[2]](value))
        divisor = {"head_dim": math.sqrt(hd), "none": 1.0, "d_model": math.sqrt(d),
                   "twice": float(hd)}[scale]
        if softmax_dim == -1 and mask_mode not in ("after_softmax", "fill_zero"):
            # course_lib's attention divides by sqrt(head_dim); rescale q to get another divisor.
            heads, _ = scaled_dot_product_attention(q * math.sqrt(hd) / divisor, k, v, mask)
        else:
            scores = q @ k.transpose(-2, -1) / divisor
            if mask is not None and mask_mode == "fill_zero":
                scores = scores.masked_fill(~mask, 0.0)
            elif mask is not None and mask_mode != "after_softmax":
                scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            weights = scores.softmax(dim=softmax_dim)
            if mask is not None and mask_mode == "after_softmax":
                weights = weights.masked_fill(~mask, 0.0)
            heads = weights @ v
        merged = merge_fn(heads, B, L_q)
        if out_proj == "untransposed":
            return merged @ ref.out_proj.weight + ref.out_proj.bias
        return ref.out_proj(merged) if out_proj else merged

    return run


def _mha_mistakes(ref: MultiHeadAttention) -> list[Mistake]:
    split_hint = (
        "Split with `.view(B, L, num_heads, head_dim).transpose(1, 2)` -> (B, num_heads, L, "
        "head_dim): the transpose puts the head axis before the positions, so that attention runs "
        "over positions within each head."
    )
    merge_hint = (
        "Merge with `.transpose(1, 2).reshape(B, L_q, d_model)`: transpose back to (B, L_q, "
        "num_heads, head_dim) before concatenating the heads."
    )
    slice_hint = (
        "Head i takes the consecutive columns i*head_dim ... (i+1)*head_dim - 1 of q, k and v, "
        "`q[..., i * head_dim:(i + 1) * head_dim]`, not every num_heads-th column "
        "(`q[..., i::num_heads]`)."
    )
    out = [Mistake("missing output projection",
                   "Apply `self.out_proj` (W^O) to the concatenated heads; "
                   "MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O.",
                   _variant(ref, out_proj=False))]
    for split in ("straight", "no_transpose"):
        for merge in ("straight", "ok"):
            out.append(Mistake("heads split without the transpose", split_hint,
                               _variant(ref, split=split, merge=merge)))
    out += [
        Mistake("heads merged in the wrong order (no transpose before the reshape)", merge_hint,
                _variant(ref, merge="straight")),
        Mistake("heads take every num_heads-th column instead of a block of head_dim consecutive "
                "ones", slice_hint, _variant(ref, split="interleaved")),
        Mistake("heads interleaved when merged (head_dim before num_heads)",
                "Concatenate whole heads: head 0's head_dim features, then head 1's, ... "
                "(`torch.cat(heads, dim=-1)`, or `.transpose(1, 2).reshape(B, L_q, d_model)`).",
                _variant(ref, merge="interleaved")),
        Mistake("one head of width d_model instead of num_heads heads",
                "Split q, k and v into num_heads heads of head_dim = d_model // num_heads columns "
                "each and run attention per head; one softmax over the whole width is a single "
                "head.", _variant(ref, one_head=True)),
        Mistake("mask ignored", "Pass `mask` on to the attention (for the vectorised version add "
                "the head axis first: a (B, 1, L_k) or (L_q, L_k) mask becomes (..., 1, L_q, L_k) "
                "with `mask.unsqueeze(-3)`).", _variant(ref, mask_mode="ignored")),
        Mistake("mask inverted", "Masks are boolean with True = may attend (course_lib.masks); "
                "hide where the mask is False: `scores.masked_fill(~mask, ...)`, not "
                "`masked_fill(mask, ...)`.", _variant(ref, mask_mode="inverted")),
        Mistake("hidden scores set to 0 instead of -inf",
                "A score of 0 still gets weight exp(0) in the softmax. Fill the hidden scores with "
                "-inf (or a very negative number such as torch.finfo(scores.dtype).min), so that "
                "their weight is 0.", _variant(ref, mask_mode="fill_zero")),
        Mistake("mask applied after the softmax (weights zeroed, rows no longer sum to 1)",
                "Hide the keys before the softmax: fill the hidden scores with -inf (or a very "
                "negative number), then softmax, so the visible keys share all the weight.",
                _variant(ref, mask_mode="after_softmax")),
        Mistake("softmax over the queries (dim=-2) instead of the keys",
                "Each query's weights over the keys must sum to 1: `softmax(dim=-1)` on scores "
                "(..., L_q, L_k).", _variant(ref, softmax_dim=-2)),
        Mistake("no scaling of the scores", "Divide the scores by sqrt(head_dim) (or reuse "
                "course_lib.scaled_dot_product_attention, which does it).",
                _variant(ref, scale="none")),
        Mistake("scaled by sqrt(d_model) instead of sqrt(head_dim)", "Each head's dot products "
                "have head_dim terms, so divide by sqrt(head_dim) = sqrt(d_model // num_heads), "
                "not by sqrt(d_model).", _variant(ref, scale="d_model")),
        Mistake("scores scaled twice (divided by head_dim, not sqrt(head_dim))",
                "course_lib's scaled_dot_product_attention (and F.scaled_dot_product_attention) "
                "already divide by sqrt(head_dim); do not scale q or the scores yourself as well.",
                _variant(ref, scale="twice")),
        Mistake("key and value inputs swapped (k_proj(value), v_proj(key))",
                "forward(query, key, value): the keys come from `key`, the values from `value`; "
                "in cross-attention they may differ.", _variant(ref, inputs="kv_swapped")),
        Mistake("keys and values taken from the query input, not from key and value",
                "Project `key` with k_proj and `value` with v_proj; in cross-attention they are "
                "another sequence than `query`.", _variant(ref, inputs="query_only")),
    ]
    out += [
        Mistake("value not projected (v_proj unused)", "The values go through v_proj before "
                "the heads average them: v = self.v_proj(value).",
                _variant(ref, projections=("q", "k", "x"))),
        Mistake("key not projected (k_proj unused)", "The keys go through k_proj: "
                "k = self.k_proj(key).", _variant(ref, projections=("q", "x", "v"))),
        Mistake("W^O applied untransposed (x @ out_proj.weight + bias)",
                "nn.Linear stores its weight as (out_features, in_features) and computes "
                "x @ weight.T + bias: call `self.out_proj(x)`.",
                _variant(ref, out_proj="untransposed")),
    ]
    for names in (("q", "q", "q"), ("q", "q", "v"), ("q", "k", "k"), ("q", "v", "k"),
                  ("k", "q", "v"), ("v", "k", "q"), ("k", "v", "q"), ("v", "q", "k")):
        used = ", ".join(f"{role} through {n}_proj"
                         for role, n in zip(("query", "key", "value"), names))
        out.append(Mistake(f"projections mixed up ({used})",
                           "The query goes through q_proj, the key through k_proj, the value "
                           "through v_proj.", _variant(ref, projections=names)))
    return out


def _build(
    cls: type[nn.Module], d_model: int, num_heads: int
) -> tuple[nn.Module, MultiHeadAttention]:
    torch.manual_seed(0)
    ref = MultiHeadAttention(d_model, num_heads).eval()
    model = run_learner(cls, d_model, num_heads, case=f"{cls.__name__}({d_model}, {num_heads})",
                        hint="The class is built as cls(d_model, num_heads).")
    if isinstance(model, nn.Module) and any(isinstance(m, MultiHeadAttention)
                                            for m in model.modules()):
        raise CheckFailure(
            f"Your {cls.__name__} holds course_lib's MultiHeadAttention, the reference the checker "
            "compares with, so the checker would only test course_lib. Build the four projections "
            "yourself and attend per head, or read a solution with "
            "show_solution(\"02.sliced_attention\")."
        )
    without_out_proj = set(ref.state_dict()) - {"out_proj.weight", "out_proj.bias"}
    if isinstance(model, nn.Module) and set(model.state_dict()) == without_out_proj:
        raise CheckFailure(
            "Likely mistake: missing output projection. Add `self.out_proj = nn.Linear(d_model, "
            "d_model)` and apply it to the concatenated heads."
        )
    load_reference_weights(
        model, ref.state_dict(), f"{cls.__name__}({d_model}, {num_heads})",
        f"Name the four projections q_proj, k_proj, v_proj, out_proj, each nn.Linear(d_model, "
        f"d_model) = nn.Linear({d_model}, {d_model}), with bias.",
    )
    return model.eval(), ref


# A mask in every layout course_lib.MultiHeadAttention accepts. A learner's module may expect any
# one of them (course_lib's (B, 1, L_k) and (L, L), the Annotated Transformer's 3-D masks that it
# unsqueezes itself, or 4-D masks handed straight to F.scaled_dot_product_attention): a case passes
# if the module gives the right output for at least one layout of the same mask.
MaskForms = list[tuple[str, torch.Tensor]]


def _padding_forms(ids: torch.Tensor) -> MaskForms:
    m = padding_mask(ids, 0)  # (B, 1, L_k)
    return [("(B, 1, L_k)", m), ("(B, 1, 1, L_k)", m.unsqueeze(1))]


def _causal_forms(B: int, L: int) -> MaskForms:
    m = causal_mask(L)  # (L, L)
    return [("(L, L)", m), ("(1, L, L)", m.unsqueeze(0)), ("(B, L, L)", m.expand(B, L, L)),
            ("(1, 1, L, L)", m[None, None]), ("(B, 1, L, L)", m.expand(B, 1, L, L))]


def _takes_mask(model: nn.Module, case: str, *inputs: Any) -> None:
    try:
        inspect.signature(model.forward).bind(*inputs)
    except TypeError as err:
        raise CheckFailure(
            f"forward does not take a mask ({case}): the signature must be "
            f"forward(query, key, value, mask=None). Python says: {err}"
        ) from None
    except ValueError:  # no signature available: just try
        pass


def _run_case(
    model: nn.Module, ref: MultiHeadAttention, case: str, query: torch.Tensor, key: torch.Tensor,
    value: torch.Tensor, forms: MaskForms | None, mistakes: Sequence[Mistake],
) -> None:
    """Pass if ``model`` matches ``ref`` for one layout of the mask, else raise a failure."""
    failures: list[tuple[bool, CheckFailure]] = []  # (crashed, failure)
    for label, mask in forms or [("", None)]:
        where = f"{case}, mask {label}" if label else case
        args = (query.clone(), key.clone(), value.clone())
        args += () if mask is None else (mask.clone(),)
        if mask is not None:
            _takes_mask(model, where, *args)
        with torch.no_grad():
            expected = ref(query, key, value, mask)
            try:
                with calls_to(REFERENCE_FUNCTIONS) as called:
                    got = first_tensor(run_learner(
                        model, *args, case=where,
                        hint=_MHA_CRASH_HINT if mask is not None else _MHA_CRASH_HINT_NO_MASK))
            except CheckFailure as failure:
                named = _named_crash(failure.__cause__, query.size(-1), where)
                failures.append((named is None, named or failure))
                continue
        if called:
            reject_call(type(model).__name__, called, "02.sliced_attention")
        try:
            compare_any_shape(
                got, expected, (query, key, value, mask), mistakes, where, f"the output for "
                                                                           f"{where}",
                "The output must have the query's shape (B, L_q, d_model): merge the heads back "
                "and apply "
                "out_proj.",
            )
            return
        except CheckFailure as failure:
            failures.append((False, failure))
    crashed, failure = next((f for f in failures if not f[0]), failures[0])
    if len(failures) > 1:
        tried = ", ".join(label for label, _ in forms or [])
        raise CheckFailure(f"{failure} (The same mask was also tried as {tried}; no layout "
                           f"worked.)") from (
            failure.__cause__)
    raise failure


_MHA_CRASH_HINT = (
    "Check the shapes step by step. A mask from course_lib.masks is (B, 1, L_k) or (L_q, L_k). "
    "One head's scores, in the sliced version, are (B, L_q, L_k): the mask broadcasts as it is, "
    "do not add an axis. All heads' scores at once are (B, num_heads, L_q, L_k): there, give the "
    "mask a head axis with `mask.unsqueeze(-3)`."
)
_MHA_CRASH_HINT_NO_MASK = (
    "Check the shapes step by step: each head's q, k and v are (B, L, head_dim) (or (B, "
    "num_heads, L, head_dim) all at once); the scores are q @ k.transpose(-2, -1), the last two "
    "axes of k swapped; the heads' outputs are concatenated on the last axis into "
    "(B, L_q, d_model) before out_proj."
)


def _named_crash(err: BaseException | None, d_model: int, where: str) -> CheckFailure | None:
    """A failure naming the mistake behind a crash, when the error message shows it."""
    text = str(err)
    found = re.search(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)",
                      text)
    if isinstance(err, RuntimeError) and found:
        width = int(found.group(2))
        if int(found.group(3)) == d_model and width != d_model:
            return CheckFailure(
                f"Likely mistake ({where}): a d_model x d_model projection got {width} features "
                f"per position instead of d_model = {d_model}. If it is out_proj: concatenate the "
                "heads on the last axis, `torch.cat(heads, dim=-1)`, or merge them back to "
                "(B, L_q, d_model), before applying it."
            )
    return None


def _extra_note(
    model: nn.Module, ref: MultiHeadAttention, what: str, query: torch.Tensor, forms: MaskForms,
) -> str:
    """Run an input the exercise did not ask for; "" if it matches, else a note naming the input."""
    got: Any = None
    for _, mask in forms:
        with torch.no_grad():
            expected = ref(query, query, query, mask)
            try:
                got = first_tensor(model(query.clone(), query.clone(), query.clone(),
                                          mask.clone()))
            except Exception:  # noqa: BLE001 - any failure on an unasked input only makes a note
                continue
        if isinstance(got, torch.Tensor) and close(got, expected, 1e-5):
            return ""
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and torch.isnan(got).any():
        detail = ("your output holds NaN where course_lib's is finite: softmax over a row that is "
                  "all -inf is "
                  "0/0 (lesson 01 shows the fix)")
    else:
        detail = ("your output differs from course_lib's there: course_lib gives a query that may "
                  "attend to no "
                  "key zero weights (its output is out_proj's bias), while filling the hidden "
                  "scores with a finite "
                  "number and not zeroing the weights afterwards gives it uniform weights")
    return f" Not asked by the exercise, so not required: with {what}, {detail}."


@checker
def check_multi_head_attention(cls: type[nn.Module]) -> None:
    """Check a multi-head attention class ``cls(d_model, num_heads)`` against course_lib's.

    Asked (must pass): self- and cross-attention (L_q != L_k, and key != value), a padding and a
    causal mask in any layout course_lib's MultiHeadAttention accepts, and a second size. The sizes
    make sqrt(head_dim), head_dim and sqrt(d_model) all differ, so every scaling mistake gives its
    own numbers. Not asked (a failure there only adds a note to the success line): a sequence that
    is all padding, so some queries may attend to no key.
    """
    if cls is MultiHeadAttention or (
            isinstance(cls, type) and issubclass(cls, MultiHeadAttention)
            and cls.forward is MultiHeadAttention.forward):
        reject_reference("multi-head attention with slices", "`MultiHeadAttention`",
                         "02.sliced_attention")
    g = torch.Generator().manual_seed(4)
    d_model, h = 24, 3  # head_dim = 8: sqrt(head_dim) = 2.8, head_dim = 8, sqrt(d_model) = 4.9
    model, ref = _build(cls, d_model, h)
    ids = torch.tensor([[5, 6, 7, 8, 9, 0], [5, 6, 7, 0, 0, 0]])  # pad id 0
    x = torch.randn(2, 6, d_model, generator=g)
    q3 = torch.randn(2, 3, d_model, generator=g)
    v6 = torch.randn(2, 6, d_model, generator=g)
    cases: list[tuple[str, tuple]] = [
        ("self-attention, no mask", (x, x, x, None)),
        ("cross-attention, L_q=3 != L_k=6", (q3, x, x, None)),
        ("cross-attention, key != value", (q3, x, v6, None)),
        ("self-attention with a padding mask", (x, x, x, _padding_forms(ids))),
        ("cross-attention with a padding mask", (q3, x, x, _padding_forms(ids))),
        ("self-attention with a causal mask", (x, x, x, _causal_forms(2, 6))),
    ]
    mistakes = _mha_mistakes(ref)
    for case, (query, key, value, forms) in cases:
        _run_case(model, ref, case, query, key, value, forms, mistakes)
    # A second size (other num_heads and head_dim), so that a hard-coded number shows up.
    model2, ref2 = _build(cls, 12, 4)
    x2 = torch.randn(1, 4, 12, generator=g)
    try:
        _run_case(model2, ref2, "d_model=12, num_heads=4", x2, x2, x2, None, _mha_mistakes(ref2))
    except CheckFailure as failure:
        if "Likely mistake" in str(failure):
            raise
        raise CheckFailure(
            f"Likely mistake: a size fixed in the code. Every case with d_model=24 and num_heads=3 "
            f"passed, but d_model=12 with num_heads=4 does not: compute num_heads and head_dim = "
            f"d_model // num_heads from the constructor's arguments, not 3 or 8. ({failure})"
        ) from failure.__cause__
    # Not asked: batch row 1 is all padding, so its queries may attend to no key at all.
    note = _extra_note(model, ref, "a sequence that is all padding (every key hidden)", x[:, :4],
                       _padding_forms(torch.tensor([[5, 6, 0, 0], [0, 0, 0, 0]])))
    if note:
        print(f"check_multi_head_attention: all {len(cases) + 1} cases match course_lib's "
              f"reference. Well done!{note}")
    else:
        passed("check_multi_head_attention", len(cases) + 1)
