"""Checkers for lesson 11's grouped-query attention and what it saves.

* ``check_gqa(fn)``: ``fn(q (B, h, L_q, hd), k, v (B, kv, L_k, hd), mask=None) -> (B, h, L_q, hd)``,
  grouped-query attention (query head i uses KV head ``i // (h // kv)``). Reference: PyTorch's
  ``F.scaled_dot_product_attention(..., enable_gqa=True)``.
* ``check_kv_bytes(fn)``: ``fn() -> number``, the predicted bytes of the KV cache of
  ``GPT(KV_CONFIG)`` after ``KV_TOKENS`` tokens for a batch of ``KV_BATCH`` sequences in float32
  (a "predict, then run" question). The checker compares with the formula and names the usual
  miscounts; the lesson's reveal cell measures a real cache.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..attention import MultiHeadAttention
from ..gpt import GPTConfig
from ..modern import kv_cache_bytes
from .common import CheckFailure, Mistake, calls_to, checker, expect_shape, is_course_lib
from .lesson11_modern import close64, compare_against, no_raw_errors

__all__ = ["check_gqa", "check_kv_bytes"]


# ----------------------------------------------------------------------------------------------
# check_kv_bytes (predict)
# ----------------------------------------------------------------------------------------------


# The lesson's Llama-style sizes, with 3 layers and a batch of 5: every usual miscount then gives
# a number of its own (2 layers would look like forgetting the values, 4 sequences like counting
# numbers instead of bytes).
KV_CONFIG = GPTConfig.llama_style(vocab_size=83, max_len=64, d_model=128, num_heads=8,
                                  num_kv_heads=2, num_layers=3)


KV_BATCH, KV_TOKENS, KV_BYTES_PER_NUMBER = 5, 50, 4  # float32


def _kv_counts() -> dict[str, int]:
    c = KV_CONFIG
    return dict(layers=c.num_layers, kv=c.num_kv_heads, heads=c.num_heads, hd=c.head_dim,
                d=c.d_model, tokens=KV_TOKENS, batch=KV_BATCH, bytes=KV_BYTES_PER_NUMBER,
                max_len=c.max_len)


def kv_bytes_answer() -> int:
    """The exact answer: ``kv_cache_bytes`` with the exercise's sizes."""
    n = _kv_counts()
    return kv_cache_bytes(n["layers"], n["kv"], n["hd"], n["tokens"], n["batch"], n["bytes"])


def kv_bytes_factors() -> list[tuple[Fraction, str, str]]:
    """``(factor, short name, reason)`` of each usual miscount: the wrong answer is the right one
    times ``factor``. With the exercise's sizes the factors all differ, except that counting only
    the keys and counting 2 bytes per number both halve it (one reason names both)."""
    n = _kv_counts()
    group = n["heads"] // n["kv"]
    return [
        (Fraction(n["heads"], n["kv"]), f"all {n['heads']} heads",
         f"you counted all num_heads = {n['heads']} heads (or d_model = num_heads * head_dim = "
         f"{n['d']} numbers per position): with grouped-query attention keys and values have only "
         f"num_kv_heads = {n['kv']} heads, each shared by {group} query heads, so the cache is "
         f"{group}x smaller than multi-head attention's"),
        (Fraction(n["d"], n["hd"]), "d_model per KV head",
         f"you counted d_model = {n['d']} numbers per KV head: each KV head holds head_dim = "
         f"d_model / num_heads = {n['hd']} numbers per position, not d_model"),
        (Fraction(1, 2), "only the keys (or 2 bytes per number)",
         "half the answer: either you counted only the keys (the cache holds keys AND values: a "
         "factor 2), or 2 bytes per number (bfloat16/float16; float32 takes 4)"),
        (Fraction(1, n["layers"]), "one layer",
         f"you counted one layer: every one of the {n['layers']} layers keeps its own keys and "
         "values"),
        (Fraction(2, n["layers"]), "2 layers",
         f"you counted 2 layers: this question's model has num_layers = {n['layers']}"),
        (Fraction(1, n["bytes"]), "numbers, not bytes",
         f"that is the number of stored numbers, not bytes: a float32 number takes {n['bytes']} "
         "bytes"),
        (Fraction(1, n["batch"]), "one sequence",
         f"you counted one sequence: the batch holds {n['batch']} sequences, each with its own keys "
         "and values"),
        (Fraction(1, n["tokens"]), "one token",
         f"that is the cache per token: after {n['tokens']} tokens it holds {n['tokens']} positions"),
        (Fraction(n["max_len"], n["tokens"]), f"max_len = {n['max_len']} positions",
         f"you counted max_len = {n['max_len']} positions: course_lib's cache grows one position per "
         f"step (torch.cat), so after {n['tokens']} tokens it holds {n['tokens']}, not a table "
         "allocated for max_len"),
        (Fraction(n["tokens"] + 1, n["tokens"]), f"{n['tokens'] + 1} positions",
         f"{n['tokens'] + 1} positions: each of the {n['tokens']} steps appends exactly one "
         f"position, so the cache holds {n['tokens']}"),
        (Fraction(n["tokens"] - 1, n["tokens"]), f"{n['tokens'] - 1} positions",
         f"{n['tokens'] - 1} positions: the token of the last step is cached too (step appends "
         f"before it attends), so the cache holds {n['tokens']}"),
        (Fraction(2), "8 bytes per number",
         "twice the answer: 8 bytes per number is float64, the model is float32 (4 bytes); or you "
         f"counted keys and values twice; or all {n['heads']} heads and only the keys"),
    ]


def kv_bytes_mistakes() -> list[tuple[float, str]]:
    """``(number, reason)`` for each usual miscount alone (all different), then for each pair of
    them whose number no single miscount gives."""
    right = kv_bytes_answer()
    factors = kv_bytes_factors()
    singles = [(float(right * f), reason) for f, _, reason in factors]
    taken = {value for value, _ in singles} | {float(right)}
    pairs = []
    for i, (f1, short1, _) in enumerate(factors):
        for f2, short2, _ in factors[i + 1:]:
            value = float(right * f1 * f2)
            if value not in taken:
                taken.add(value)
                pairs.append((value, f"two miscounts at once: {short1}, and {short2}"))
    return singles + pairs


def _as_count(got: Any) -> float:
    """The learner's prediction as a float, or a ``CheckFailure`` saying what came instead."""
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        raise CheckFailure(f"Return one number (the bytes, e.g. 12345), got {type(got).__name__} {got!r}.")
    value = float(got)
    if not math.isfinite(value):
        raise CheckFailure(f"Your prediction is {value}; return a finite number of bytes.")
    return value


@checker
def check_kv_bytes(fn: Callable[[], Any]) -> None:
    """Check ``fn() -> number``: the bytes of the KV cache of ``GPT(KV_CONFIG)``, batch 5, 50 tokens."""
    if is_course_lib(fn):
        raise CheckFailure("You handed in one of course_lib's own functions: return the number you "
                           "predict (you may write the product out).")
    with calls_to([kv_cache_bytes]) as seen:
        try:
            raw = fn()
        except (NotImplementedError, CheckFailure):
            raise
        except Exception as err:
            raise CheckFailure(f"Your code raised {type(err).__name__}: {err}. Return one number.") from err
    if seen:
        raise CheckFailure("Your function calls course_lib's kv_cache_bytes, the formula this exercise "
                           "asks you to find: multiply the sizes yourself.")
    got = _as_count(raw)
    right = kv_bytes_answer()
    n = _kv_counts()
    why = (f"keys and values (2) x {n['layers']} layers x {n['kv']} KV heads x head_dim "
           f"{n['hd']} x {n['tokens']} tokens x {n['batch']} sequences x {n['bytes']} bytes")
    if got == right:
        print(f"check_kv_bytes: right, {right:,} bytes = {why}.")
        return
    if got < 0:
        raise CheckFailure("Not quite: a number of bytes is never negative.")
    for value, reason in kv_bytes_mistakes():
        if abs(got - value) <= 1e-9 * value:
            raise CheckFailure(f"Not quite: {reason}.", mistake=reason)
    if abs(got - right) <= 0.05 * right:
        reason = ("close, but a cache holds an exact number of bytes: multiply the sizes exactly, "
                  "and return plain bytes (not KB, KiB or MB)")
    elif any(abs(got - right / unit) <= 0.01 * right / unit for unit in (1000, 1024, 1e6, 2 ** 20)):
        reason = "that looks like kilobytes or megabytes: return plain bytes"
    elif got < right:
        reason = "too small: a factor is missing"
    else:
        reason = "too large: one of the factors is too big"
    raise CheckFailure(
        f"Not quite: {reason}. The cache keeps, for every layer, the keys and the values of every KV "
        "head at every position of every sequence, each a float32 number. Check each factor "
        "against the config: num_layers, num_kv_heads, head_dim = d_model // num_heads, the tokens, "
        "the batch and the bytes per number."
    )


# ----------------------------------------------------------------------------------------------
# check_gqa (build)
# ----------------------------------------------------------------------------------------------


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               index: torch.Tensor, scale: float | None = None, softmax_dim: int = -1,
               mask_mode: str = "normal") -> torch.Tensor:
    """Attention with query head i reading KV head ``index[i]``, one knob per mistake."""
    k, v = k[:, index], v[:, index]  # (B, h, L_k, hd)
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale  # (B, h, L_q, L_k)
    if mask is not None and mask_mode != "ignored":
        if mask_mode == "causal":  # F.scaled_dot_product_attention's is_causal: top-left tril
            mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
        hide = mask if mask_mode == "inverted" else ~mask
        fill = 0.0 if mask_mode == "zero" else float("-inf")
        if mask_mode != "after":
            scores = scores.masked_fill(hide, fill)
    weights = scores.softmax(dim=softmax_dim)  # (B, h, L_q, L_k)
    if mask is not None and mask_mode == "after":
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v  # (B, h, L_q, hd)


def _gqa_mistakes(h: int, kv: int) -> list[Mistake]:
    group = h // kv
    right = torch.arange(h) // group
    modulo = torch.arange(h) % kv
    return [
        Mistake("heads paired as i % num_kv_heads",
                f"query head i must use KV head i // {group} (h // kv = {group} query heads share each "
                "KV head, neighbours together); k.repeat(1, group, 1, 1) (or a view as (group, kv)) "
                "gives KV head i % kv. Use k.repeat_interleave(group, dim=1)",
                lambda q, k, v, m: _attention(q, k, v, m, modulo)),
        Mistake("no 1/sqrt(head_dim) scaling",
                "divide the scores q @ k^T by sqrt(head_dim) before the softmax",
                lambda q, k, v, m: _attention(q, k, v, m, right, scale=1.0)),
        Mistake("scores divided by head_dim",
                "divide by the SQUARE ROOT of head_dim, math.sqrt(q.size(-1))",
                lambda q, k, v, m: _attention(q, k, v, m, right, scale=1 / q.size(-1))),
        Mistake("scaled with the number of heads",
                "the scale is 1/sqrt(head_dim) of one head, not of d_model = h * head_dim",
                lambda q, k, v, m: _attention(q, k, v, m, right,
                                              scale=1 / math.sqrt(q.size(-1) * q.size(1)))),
        Mistake("the mask is ignored",
                "hide the scores where the mask is False: scores.masked_fill(~mask, float('-inf')) "
                "before the softmax",
                lambda q, k, v, m: _attention(q, k, v, m, right, mask_mode="ignored")),
        Mistake("the mask is inverted",
                "True means MAY attend: fill where the mask is False, masked_fill(~mask, ...), not "
                "masked_fill(mask, ...)",
                lambda q, k, v, m: _attention(q, k, v, m, right, mask_mode="inverted")),
        Mistake("a causal mask instead of the mask given",
                "use the mask passed in (it is not always causal): is_causal=True or a tril of your "
                "own ignores it",
                lambda q, k, v, m: _attention(q, k, v, m, right, mask_mode="causal")),
        Mistake("softmax over the wrong dim",
                "each query's weights over the keys must sum to 1: softmax(dim=-1), over L_k",
                lambda q, k, v, m: _attention(q, k, v, m, right, softmax_dim=-2)),
        Mistake("softmax over the heads",
                "softmax(dim=1) mixes the heads; each query's weights over the keys must sum to 1: "
                "softmax(dim=-1)",
                lambda q, k, v, m: _attention(q, k, v, m, right, softmax_dim=1)),
        Mistake("hidden scores set to 0 instead of -inf",
                "a score of 0 still gets weight exp(0) after the softmax; fill hidden scores with "
                "float('-inf') (or a very large negative number) so that their weight is 0",
                lambda q, k, v, m: _attention(q, k, v, m, right, mask_mode="zero")),
        Mistake("the mask is applied after the softmax",
                "zeroing weights after the softmax leaves rows that no longer sum to 1: hide the "
                "scores BEFORE the softmax, scores.masked_fill(~mask, float('-inf'))",
                lambda q, k, v, m: _attention(q, k, v, m, right, mask_mode="after")),
    ]


class _SdpaWatch(TorchFunctionMode):
    """Records whether ``F.scaled_dot_product_attention`` is called with ``enable_gqa=True``."""

    def __init__(self) -> None:
        super().__init__()
        self.gqa = False

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and kwargs.get("enable_gqa"):  # keyword-only
            self.gqa = True
        return func(*args, **kwargs)


def _random_mask(L_q: int, L_k: int, gen: torch.Generator) -> torch.Tensor:
    """Bool ``(L_q, L_k)`` with at least one True and one False in every row (so that an inverted
    mask still leaves every query a key: no row of NaN)."""
    mask = torch.rand(L_q, L_k, generator=gen) < 0.6
    rows = torch.arange(L_q)
    mask[rows, rows % L_k] = True
    mask[rows, (rows + 1) % L_k] = False
    return mask


def _gqa_right_at(fn: Callable[..., Any], B: int, h: int, kv: int, L: int, hd: int) -> bool:
    """True if ``fn`` gives PyTorch's grouped-query attention at these sizes (causal mask)."""
    gen = torch.Generator().manual_seed(h * 100 + kv * 10 + hd)
    q = torch.randn(B, h, L, hd, generator=gen)
    k, v = (torch.randn(B, kv, L, hd, generator=gen) for _ in range(2))
    mask = torch.ones(L, L, dtype=torch.bool).tril()
    try:
        got = fn(q, k, v, mask)
    except Exception:
        return False
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=kv != h)
    return close64(got, expected)


def _gqa_diagnosis(fn: Callable[..., Any], case: str, h: int, kv: int, hd: int) -> str:
    """A sentence naming a size mistake (hard-coded sizes, heads repeated the wrong number of
    times) from how ``fn`` does at other sizes, or ''."""
    if (h, kv, hd) != (8, 2, 16) and _gqa_right_at(fn, 2, 8, 2, 5, 16):
        return (f"Hard-coded sizes: your function is right at the lesson's own sizes (8 heads, 2 KV "
                f"heads, head_dim 16) but not with {case}. Take every size from the tensors: "
                "group = q.size(1) // k.size(1), head_dim = q.size(-1)")
    group = h // kv
    if _gqa_right_at(fn, 1, 4, 1, 4, 8) and _gqa_right_at(fn, 1, 3, 3, 4, 8):
        return ""  # right whenever no repeat is needed: the KV heads are not repeated (named below)
    if group != kv and kv != 1 and _gqa_right_at(fn, 1, 4, 2, 4, 8):
        return (f"KV heads repeated the wrong number of times ({case}): your function is right when "
                f"num_kv_heads = num_heads // num_kv_heads (4 heads, 2 KV heads) but not here. Repeat "
                f"each KV head group = num_heads // num_kv_heads = {group} times, not num_kv_heads = "
                f"{kv} times")
    if kv != 1 and group != h and _gqa_right_at(fn, 1, 4, 1, 4, 8):
        return (f"KV heads repeated the wrong number of times ({case}): your function is right with "
                f"one KV head but not here. Repeat each KV head group = num_heads // num_kv_heads = "
                f"{group} times (not num_heads = {h} times)")
    return ""


@checker
def check_gqa(fn: Callable[..., Any]) -> None:
    """Check ``fn(q, k, v, mask=None) -> (B, h, L_q, hd)``: grouped-query attention, against PyTorch's
    ``F.scaled_dot_product_attention(..., enable_gqa=True)``. The global random state is left as it was."""
    no_raw_errors(_check_gqa)(fn)


def _check_gqa(fn: Callable[..., Any]) -> None:
    if is_course_lib(fn):
        raise CheckFailure("You handed in one of course_lib's own functions: write grouped-query "
                           "attention yourself (repeat each KV head for its group, then attention).")
    refused = [MultiHeadAttention.forward, MultiHeadAttention.attend, MultiHeadAttention._fused_attention]
    # (case, B, h, kv, L_q, L_k, hd, mask kind): h=6 with 2 and 3 KV heads, so that pairing heads as
    # i % kv differs from i // group; L_q != L_k so that a softmax over queries is not square
    cases = [
        ("B=2, 6 heads, 2 KV heads, L_q=4, L_k=5, head_dim=8, random mask", 2, 6, 2, 4, 5, 8, "random"),
        ("B=1, 6 heads, 3 KV heads, L_q=3, L_k=6, head_dim=4, random mask", 1, 6, 3, 3, 6, 4, "random"),
        ("B=2, 8 heads, 2 KV heads, L=5, head_dim=6, mask=None", 2, 8, 2, 5, 5, 6, "none"),
        ("B=1, 4 heads, 1 KV head (multi-query), L=6, causal mask", 1, 4, 1, 6, 6, 8, "causal"),
        ("B=2, 3 heads, 3 KV heads (multi-head), L_q=2, L_k=4, random mask", 2, 3, 3, 2, 4, 8, "random"),
    ]
    for n, (case, B, h, kv, L_q, L_k, hd, kind) in enumerate(cases):
        gen = torch.Generator().manual_seed(n)
        q = torch.randn(B, h, L_q, hd, generator=gen)
        k = torch.randn(B, kv, L_k, hd, generator=gen) * 1.5  # larger scores: scaling mistakes show
        v = torch.randn(B, kv, L_k, hd, generator=gen)
        mask = {"random": lambda: _random_mask(L_q, L_k, gen), "none": lambda: None,
                "causal": lambda: torch.ones(L_q, L_k, dtype=torch.bool).tril()}[kind]()
        inputs = [t.clone() for t in (q, k, v)]
        watch = _SdpaWatch()
        got, error = None, None
        with calls_to(refused) as seen, watch:
            try:
                got = fn(q, k, v, mask) if mask is not None else fn(q, k, v)
            except (NotImplementedError, CheckFailure):
                raise
            except Exception as err:
                error = err
        if seen:
            raise CheckFailure("Your function uses course_lib's MultiHeadAttention, which already "
                               "does grouped-query attention: build it yourself.")
        if watch.gqa:
            raise CheckFailure(
                "Your function calls F.scaled_dot_product_attention with enable_gqa=True: PyTorch "
                "then does the grouping for you, and that is what this exercise asks you to build. "
                "Repeat each KV head for its group yourself (F.scaled_dot_product_attention without "
                "enable_gqa is fine afterwards)."
            )
        if any(not torch.equal(a, b) for a, b in zip((q, k, v), inputs)):
            raise CheckFailure(f"Your function changes q, k or v in place ({case}); build new tensors.")
        if error is not None:
            diagnosis = _gqa_diagnosis(fn, case, h, kv, hd)
            if diagnosis:
                raise CheckFailure(diagnosis + ".") from error
            text = str(error)
            if kv not in (1, h) and (f"{kv}" in text and f"{h}" in text):
                raise CheckFailure(
                    f"Your code raised {type(error).__name__} ({case}): {error}. It looks like the KV "
                    f"heads (of k, v or both) were not repeated along dim 1: q has {h} heads, k and "
                    f"v {kv}; repeat each KV head {h // kv} times along dim 1 (repeat_interleave), "
                    "both k and v, before attention."
                ) from error
            raise CheckFailure(
                f"Your code raised {type(error).__name__} ({case}): {error}. q is (B, h, L_q, hd), k "
                "and v (B, kv, L_k, hd), mask (L_q, L_k) bool or None."
            ) from error
        if isinstance(got, tuple):
            raise CheckFailure("Return only the output (B, h, L_q, head_dim), not a tuple (the "
                               "attention weights are not asked for).")
        if isinstance(got, torch.Tensor) and kv != h and tuple(got.shape) == (B, kv, L_q, hd):
            raise CheckFailure(
                f"Wrong output shape ({case}): {tuple(got.shape)} has one row per KV head; the output "
                f"has one per QUERY head, (B, h={h}, L_q, head_dim): every query head attends, with "
                "its group's keys and values."
            )
        expect_shape(got, (B, h, L_q, hd), f"the output ({case})",
                     "Grouped-query attention returns one output per query head: (B, h, L_q, head_dim).")
        got = got.detach()
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=kv != h)
        try:
            compare_against(got, expected, (q, k, v, mask), _gqa_mistakes(h, kv), case,
                            "F.scaled_dot_product_attention(..., enable_gqa=True)")
        except CheckFailure as failure:  # no named mistake: perhaps a size taken from elsewhere
            diagnosis = "" if str(failure).startswith("Likely") else _gqa_diagnosis(fn, case, h, kv, hd)
            if diagnosis:
                raise CheckFailure(diagnosis + ".") from None
            raise
    print(f"check_gqa: all {len(cases)} cases match PyTorch's F.scaled_dot_product_attention with "
          "enable_gqa=True (query head i reads KV head i // (h // kv)). Well done!")
