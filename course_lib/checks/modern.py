"""Checkers for the exercises of lesson 11 (from GPT-2 to a Llama-style block).

* ``check_kv_bytes(fn)``: ``fn() -> number``, the predicted bytes of the KV cache of
  ``GPT(KV_CONFIG)`` after ``KV_TOKENS`` tokens for a batch of ``KV_BATCH`` sequences in float32
  (a "predict, then run" question). The checker compares with the formula and names the usual
  miscounts; the lesson's reveal cell measures a real cache.
* ``check_rope_layout(fn)``: ``fn(x (B, h, L, hd), cos, sin) -> (B, h, L, hd)``, the fixed
  ``apply_rotary_ported`` (the lesson's debug exercise): Hugging Face's layout ("halves",
  ``rotate_half``). Reference: ``transformers``' ``apply_rotary_pos_emb`` on random inputs and
  random positions, for several head sizes.
* ``check_gqa(fn)``: ``fn(q (B, h, L_q, hd), k, v (B, kv, L_k, hd), mask=None) -> (B, h, L_q, hd)``,
  grouped-query attention (query head i uses KV head ``i // (h // kv)``). Reference: PyTorch's
  ``F.scaled_dot_product_attention(..., enable_gqa=True)``.
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
from ..rope import RotaryEmbedding, apply_rotary, rotary_frequencies
from ._common import (CheckFailure, Mistake, calls_to, checker, compare, expect_shape, is_course_lib,
                      run_learner)

__all__ = ["check_kv_bytes", "check_rope_layout", "check_gqa", "check_rmsnorm", "check_swiglu",
           "check_apply_rope", "check_rope_decode"]


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
# check_rope_layout (debug)
# ----------------------------------------------------------------------------------------------


def _compare(got: Any, expected: Any, inputs: tuple, mistakes: list[Mistake], case: str,
             reference: str) -> None:
    """``compare``, with the generic message naming the reference actually used."""
    try:
        compare(got, expected, inputs, mistakes, case)
    except CheckFailure as failure:
        raise CheckFailure(str(failure).replace("course_lib's reference", reference)) from None


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    half = x.size(-1) // 2
    return x[..., :half], x[..., half:]


def _pairs_layout(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The lesson's broken function: pairs (2i, 2i+1) turned with the halves tables."""
    a, b = x[..., 0::2], x[..., 1::2]
    return x * cos + torch.stack([-b, a], dim=-1).flatten(-2) * sin


def _pairs_consistent(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Pairs turned with the tables reordered for pairs: a correct RoPE, but not Hugging Face's."""
    half = x.size(-1) // 2
    cos_p = cos[..., :half].repeat_interleave(2, dim=-1)
    sin_p = sin[..., :half].repeat_interleave(2, dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return x * cos_p + torch.stack([-b, a], dim=-1).flatten(-2) * sin_p


def _rotate(x: torch.Tensor, first: str, second: str, split: str = "halves") -> torch.Tensor:
    """``cat([first, second])`` of the two parts, each part one of "x1", "-x1", "x2", "-x2"."""
    x1, x2 = _halves(x) if split == "halves" else (x[..., 0::2], x[..., 1::2])
    parts = {"x1": x1, "-x1": -x1, "x2": x2, "-x2": -x2}
    return torch.cat([parts[first], parts[second]], dim=-1)


# The Debug exercise's messages say what is observed (which numbers, which property), never the
# fix: that lives behind show_solution("11.rope_layout").
_ROPE_MISTAKES = [
    Mistake("pairs layout with the tables reordered",
            "your function is a rotation (it keeps lengths, and the score of a query and a key depends "
            "only on their offset), but not Hugging Face's: with the same inputs its numbers differ "
            "from apply_rotary_pos_emb's. Weights trained with Hugging Face's code expect its pairing "
            "of numbers into planes, with the tables as they are given",
            _pairs_consistent),
    Mistake("each plane turns backwards",
            "your output at position m is Hugging Face's output at position -m: every plane turns "
            "by minus its angle",
            lambda x, c, s: x * c + _rotate(x, "x2", "-x1") * s),
    Mistake("not a rotation: lengths change",
            "your output does not keep each vector's length (a rotation does), and at angle 90 "
            "degrees a plane (u, v) comes out as (v, u), a mirror image, not turned",
            lambda x, c, s: x * c + _rotate(x, "x2", "x1") * s),
    Mistake("each number stays in its half",
            "your output's first half depends only on x's first half, and its second half only on "
            "the second: in a turned plane each number takes part of its partner's value",
            lambda x, c, s: x * c + _rotate(x, "-x1", "x2") * s),
    Mistake("position 0 is not left alone",
            "at position 0 (angle 0) a rotation leaves x unchanged, and your output there is not x",
            lambda x, c, s: x * s + _rotate(x, "-x2", "x1") * c),
    Mistake("numbers paired with the wrong partners",
            "your output turns number i together with another number than Hugging Face's does "
            "(compare, for head_dim 8 at position 1, which two outputs change when you change "
            "one input number)",
            lambda x, c, s: x * c + _rotate(x, "-x2", "x1", split="interleaved") * s),
    Mistake("numbers mixed across positions",
            "your output at one position depends on x at other positions (dim 2, L): a rotation "
            "mixes numbers within one head vector only",
            lambda x, c, s: x * c + torch.cat([-x.chunk(2, dim=-2)[1], x.chunk(2, dim=-2)[0]],
                                              dim=-2) * s),
    Mistake("numbers mixed across heads",
            "your output for one head depends on x in other heads (dim 1): a rotation mixes "
            "numbers within one head vector only",
            lambda x, c, s: x * c + torch.cat([-x.chunk(2, dim=1)[1], x.chunk(2, dim=1)[0]],
                                              dim=1) * s),
    Mistake("the turned numbers land in the wrong places",
            "your output's number i is built from x_i and a number that is not its partner: the "
            "rotated part is laid out in another order than x (compare, for head_dim 8 at position "
            "1, which input numbers each output number depends on)",
            lambda x, c, s: x * c + torch.stack([-_halves(x)[1], _halves(x)[0]], -1).flatten(-2) * s),
    Mistake("every number only scaled",
            "each output number is its input number times cos: nothing of the partner number enters, "
            "and lengths shrink",
            lambda x, c, s: x * c),
    Mistake("x itself is missing",
            "at position 0 (angle 0) your output is all zeros, where a rotation leaves x unchanged",
            lambda x, c, s: _rotate(x, "-x2", "x1") * s),
]

# How many times in a row this Python session handed in the port's numbers: a second failed
# attempt gets a question that narrows the search, never the fix.
_LAYOUT_REPEATS: dict[str, int] = {"port": 0}


def _port_observed(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, got: torch.Tensor,
                   expected: torch.Tensor, case: str) -> str:
    """What the untouched port's output shows: where it differs, and the lengths it changes."""
    diff = (got.double() - expected.double()).abs()  # (B, h, L, hd)
    per_position = diff.amax(dim=(0, 1, 3)) if diff.dim() == 4 else diff.amax(-1)
    ratio = (got.double().norm(dim=-1) / x.double().norm(dim=-1)).flatten()
    _LAYOUT_REPEATS["port"] += 1
    message = (
        f"Your output is the port's, unchanged ({case}): it differs from Hugging Face's "
        f"apply_rotary_pos_emb by up to {diff.max().item():.3g} (at {int((per_position > 1e-5).sum())} "
        f"of {per_position.numel()} positions), and it does not keep lengths: each head vector comes "
        f"out {ratio.min().item():.2f} to {ratio.max().item():.2f} times as long as it went in, "
        "where a rotation keeps every length. Which two numbers of a head does each of Hugging "
        "Face's angles belong to, and which two does the port turn together?")
    if _LAYOUT_REPEATS["port"] > 1:
        message += (" A look that helps: print RotaryEmbedding(8, 4, layout='halves').cos_sin(4)[0][1], "
                    "the cos of position 1, and find the columns that hold the same angle.")
    return message + ' The fix itself: show_solution("11.rope_layout").'


def _hf_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face's ``apply_rotary_pos_emb`` on ``x (B, h, L, hd)``; ``cos, sin``: ``(L, hd)`` or
    ``(B, 1, L, hd)``."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]  # (1, L, hd): HF's (batch, seq, head_dim)
    else:
        cos, sin = cos[:, 0], sin[:, 0]  # (B, L, hd)
    out, _ = apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=1)  # (B, h, L, hd)
    return out


def _tables(positions: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Halves-layout cos/sin for any positions ``(..., L)``: ``(..., L, head_dim)`` each."""
    angles = positions[..., None].float() * rotary_frequencies(head_dim, base)  # (..., L, hd/2)
    angles = torch.cat([angles, angles], dim=-1)  # (..., L, hd)
    return angles.cos(), angles.sin()


def _rope_refusals(fn: Callable[..., Any]) -> list[Callable[..., Any]]:
    """Refuse a library's rotary function handed in; return those the learner's code may not call."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    if fn is apply_rotary_pos_emb or is_course_lib(fn):
        raise CheckFailure(
            "You handed in a library's rotary function (course_lib's or Hugging Face's, the "
            "reference): fix the body of apply_rotary_ported yourself; the fix is a few lines."
        )
    return [apply_rotary, RotaryEmbedding.forward, apply_rotary_pos_emb]


@checker
def check_rope_layout(fn: Callable[..., Any]) -> None:
    """Check ``fn(x (B, h, L, hd), cos, sin (L, hd)) -> (B, h, L, hd)`` against Hugging Face's
    ``apply_rotary_pos_emb``. The global random state is left as it was."""
    _no_raw_errors(_check_rope_layout)(fn)


_ROPE_CASES = [  # (case, B, h, L, head_dim, base, tables with a batch dim)
    ("B=2, 3 heads, L=6, head_dim=8, random positions", 2, 3, 6, 8, 10000.0, False),
    ("B=1, 2 heads, L=4, head_dim=16, random positions", 1, 2, 4, 16, 10000.0, False),
    ("B=2, 4 heads, L=10, head_dim=12, base 500, random positions", 2, 4, 10, 12, 500.0, False),
    ("tables with a batch dim, (B, 1, L, head_dim) as Hugging Face's rotary embedding gives "
     "after cos.unsqueeze(1), each sequence at other positions", 3, 2, 5, 8, 10000.0, True),
]


def _rope_inputs(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Case ``n``: x ``(B, h, L, hd)`` and halves tables at random positions (not 0..L-1)."""
    _, B, h, L, hd, base, batched = _ROPE_CASES[n]
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(B, h, L, hd, generator=gen)
    positions = torch.randint(0, 200, (B, L) if batched else (L,), generator=gen)
    cos, sin = _tables(positions, hd, base)  # (L, hd) or (B, L, hd)
    if batched:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, L, hd)
    return x, cos, sin


def _rope_case_ok(fn: Callable[..., Any], n: int) -> bool:
    """True if ``fn`` is right on case ``n`` (used to tell a hard-coded head_dim)."""
    x, cos, sin = _rope_inputs(n)
    try:
        got = fn(x.clone(), cos, sin)
    except Exception:
        return False
    expected = _hf_rotary(x, cos, sin)
    return (isinstance(got, torch.Tensor) and got.shape == expected.shape and got.is_floating_point()
            and torch.allclose(got.detach().double(), expected.double(), atol=1e-5, rtol=1e-4))


def _one_head_dim(fn: Callable[..., Any], n: int) -> str:
    """A sentence if ``fn`` is right for another head_dim than case ``n``'s, else ''."""
    hd = _ROPE_CASES[n][4]
    right = sorted({_ROPE_CASES[m][4] for m in range(len(_ROPE_CASES))
                    if _ROPE_CASES[m][4] != hd and _rope_case_ok(fn, m)})
    if not right:
        return ""
    return (f"Only works for one head_dim: right with head_dim {right}, wrong with head_dim {hd} "
            f"({_ROPE_CASES[n][0]}). Take the half from the input, x.size(-1) // 2, instead of "
            "writing a number.")


def _check_rope_layout(fn: Callable[..., Any]) -> None:
    refused = _rope_refusals(fn)
    for n, (case, B, h, L, hd, _, batched) in enumerate(_ROPE_CASES):
        x, cos, sin = _rope_inputs(n)
        x_before, cos_before, sin_before = x.clone(), cos.clone(), sin.clone()
        got, error = None, None
        with calls_to(refused) as seen:
            try:
                got = fn(x, cos, sin)
            except (NotImplementedError, CheckFailure):
                raise
            except Exception as err:
                error = err
        if seen:
            raise CheckFailure(
                "Your function calls a library's rotary function (course_lib's apply_rotary or "
                "RotaryEmbedding, or Hugging Face's apply_rotary_pos_emb, the reference): write the "
                "rotation yourself."
            )
        if not (torch.equal(x, x_before) and torch.equal(cos, cos_before) and torch.equal(sin, sin_before)):
            raise CheckFailure(
                f"Your function changes its input in place ({case}): x (or cos/sin) is different after "
                "the call. In-place operations (mul_, x[...] = ..., +=) overwrite the queries and keys "
                "that attention still needs; build a new tensor (x * cos + ...)."
            )
        expected = _hf_rotary(x, cos, sin)  # (B, h, L, hd)
        wrong_shape = not isinstance(got, torch.Tensor) or got.shape != expected.shape
        if batched and (error is not None or wrong_shape):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            what = f"raised {type(error).__name__}: {error}" if error is not None else f"returned {shape}"
            raise CheckFailure(
                f"Your function works with (L, head_dim) tables but {what}, with {case}; expected "
                f"{tuple(expected.shape)}. Do not reshape cos and sin: x * cos + ... broadcasts any "
                "table shape that lines up with x's last two dims."
            ) from error
        if error is not None or (not wrong_shape and not (got.is_floating_point() and torch.allclose(
                got.detach().double(), expected.double(), atol=1e-5, rtol=1e-4))):
            hard_coded = _one_head_dim(fn, n)
            if hard_coded:
                raise CheckFailure(hard_coded) from error
        if error is not None:
            if f"({hd // 2})" in str(error) and f"({hd})" in str(error):
                raise CheckFailure(
                    f"Likely mistake ({case}): a tensor of head_dim/2 = {hd // 2} numbers per vector "
                    f"meets one of head_dim = {hd}: {type(error).__name__}: {error}. Two parts of "
                    "head_dim/2 numbers joined along another dim than the last still have "
                    "head_dim/2 numbers in the last dim.") from error
            raise CheckFailure(
                f"Your code raised {type(error).__name__} ({case}): {error}. x is (B, h, L, head_dim) "
                "and cos, sin are (L, head_dim): print the shape of each tensor your function builds."
            ) from error
        expect_shape(got, (B, h, L, hd), f"the turned x ({case})",
                     "RoPE turns x without changing its shape: (B, h, L, head_dim) in and out.")
        if not _close64(got, expected) and _close64(got, _pairs_layout(x.double(), cos.double(),
                                                                      sin.double())):
            raise CheckFailure(_port_observed(x, cos, sin, got.detach(), expected, case))
        _LAYOUT_REPEATS["port"] = 0
        _compare(got.detach().double(), expected.double(), (x, cos, sin), _ROPE_MISTAKES, case,
                 "Hugging Face's apply_rotary_pos_emb")
    print(f"check_rope_layout: right, equal to Hugging Face's apply_rotary_pos_emb on all "
          f"{len(_ROPE_CASES)} cases (halves layout: rotate_half(x) = (-x2, x1)).")


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


class _CallWatch(TorchFunctionMode):
    """Records which of ``functions`` (torch functions, seen through ``__torch_function__``) run."""

    def __init__(self, functions: tuple[Any, ...]) -> None:
        super().__init__()
        self.functions, self.seen = functions, []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if any(func is f for f in self.functions):
            self.seen.append(func)
        return func(*args, **(kwargs or {}))


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
    return _close64(got, expected)


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
    _no_raw_errors(_check_gqa)(fn)


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
            _compare(got, expected, (q, k, v, mask), _gqa_mistakes(h, kv), case,
                     "F.scaled_dot_product_attention(..., enable_gqa=True)")
        except CheckFailure as failure:  # no named mistake: perhaps a size taken from elsewhere
            diagnosis = "" if str(failure).startswith("Likely") else _gqa_diagnosis(fn, case, h, kv, hd)
            if diagnosis:
                raise CheckFailure(diagnosis + ".") from None
            raise
    print(f"check_gqa: all {len(cases)} cases match PyTorch's F.scaled_dot_product_attention with "
          "enable_gqa=True (query head i reads KV head i // (h // kv)). Well done!")


# ----------------------------------------------------------------------------------------------
# Shared by the checkers below: every comparison in float64 (a float64 or float16 answer is
# compared, never refused by torch.allclose's dtype rule), and no raw error ever leaves a checker.
# ----------------------------------------------------------------------------------------------


def _f64(t: Any) -> Any:
    return t.detach().to(torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point() else t


def _close64(got: Any, expected: torch.Tensor, atol: float = 1e-5) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == expected.shape and got.is_floating_point()
            and torch.allclose(_f64(got), _f64(expected), atol=atol, rtol=1e-4))


def _compare64(got: torch.Tensor, expected: torch.Tensor, inputs: tuple, mistakes: list[Mistake],
               case: str, reference: str) -> None:
    """``compare`` on float64 copies (the mistakes are computed on float64 inputs too)."""
    wrapped = [Mistake(m.name, m.hint, (lambda f: lambda *a: _f64(f(*a)))(m.compute)) for m in mistakes]
    _compare(_f64(got), _f64(expected), tuple(_f64(a) for a in inputs), wrapped, case, reference)


def _no_raw_errors(body: Callable[..., None]) -> Callable[..., None]:
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


def _call(fn: Callable[..., Any], *args: Any, case: str, hint: str) -> Any:
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
    if _close64(got, missing.compute(x.double(), w.double())):
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
@_no_raw_errors
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
        module = _call(cls, d, eps, case=f"building {cls.__name__}({d}, eps={eps})",
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
        watch = _CallWatch(ready_made)
        with calls_to(refused) as seen, watch:
            try:
                got = _call(module, x, case=case, hint="x is (..., d_model); normalise over the last dim.")
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
        _compare64(got, _rms_ref(x64, w64, eps), (x64, w64), _rms_mistakes(eps), case,
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


@checker
@_no_raw_errors
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
            module = _call(cls, d, case=f"building {cls.__name__}({d})",
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
        got = _call(module, x, case=case, hint="x is (B, L, d_model).")
        if isinstance(got, tuple):
            raise CheckFailure("Return only the output tensor, not a tuple.")
        expect_shape(got, (2, 5, d), f"the output ({case})",
                     "down maps back to d_model: (B, L, d_model) in and out.")
        weights = tuple(layers[k].weight.detach() for k in ("gate", "up", "down"))
        x64 = x.double()
        _compare64(got, _swiglu_ref(x64, *(w.double() for w in weights)), (x64, *weights),
                   _SWIGLU_MISTAKES, case, "down(silu(gate(x)) * up(x))")
    print(f"check_swiglu: right for d_model {', '.join(map(str, _SWIGLU_DIMS))} (d_ff "
          f"{', '.join(str(_best_d_ff(d)) for d in _SWIGLU_DIMS)}: GELU's weight count, and "
          "down(silu(gate(x)) * up(x))). Well done!")


# ----------------------------------------------------------------------------------------------
# check_apply_rope (build: from the 2-D rotation to a whole head)
# ----------------------------------------------------------------------------------------------


def _rope_angles(positions: torch.Tensor, hd: int, base: float, *, two: float = 2.0,
                 sign: float = -1.0, shift: int = 0) -> torch.Tensor:
    """``(L, hd/2)`` angles ``(positions + shift) * base ** (sign * two * i / hd)``, in float64."""
    i = torch.arange(hd // 2, dtype=torch.float64)
    return (positions.double() + shift)[:, None] * base ** (sign * two * i / hd)


def _turn_halves(x: torch.Tensor, angles: torch.Tensor, flip: float = 1.0) -> torch.Tensor:
    """Plane i = (x_i, x_{i + hd/2}) turned by ``flip * angles[:, i]``: the 2-D rotation."""
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = angles.cos().to(x.dtype), (flip * angles).sin().to(x.dtype)
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)


def _turn_pairs(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)


def _turn_interleaved_table(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """The halves rotation with a pairs-layout table: number j gets plane j // 2's angle."""
    table = angles.repeat_interleave(2, dim=-1)  # (L, hd)
    x1, x2 = x[..., : x.size(-1) // 2], x[..., x.size(-1) // 2:]
    return x * table.cos().to(x.dtype) + torch.cat([-x2, x1], -1) * table.sin().to(x.dtype)


def _cat_table(angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    table = torch.cat([angles, angles], dim=-1)  # (L, hd): Hugging Face's layout
    return table.cos(), table.sin()


def _no_outer_probe(fn: Callable[..., Any], base: float) -> str:
    """After a raised error: a sentence if ``fn``, fed L = head_dim/2 rows (where positions * theta
    still broadcasts), gives what a missing outer product gives; else ''."""
    gen = torch.Generator().manual_seed(5)
    x, positions = torch.randn(2, 6, 12, generator=gen), torch.randperm(30, generator=gen)[:6]
    try:
        got = fn(x.clone(), positions.clone(), base)
    except Exception:
        return ""
    for mistake in _apply_rope_mistakes(base):
        if "outer product" not in mistake.name and "transposed" not in mistake.name:
            continue
        if _close64(got, mistake.compute(x.double(), positions)):
            return (f"Likely mistake: {mistake.name}. Your function raises a size error when L "
                    f"differs from head_dim/2, and with L = head_dim/2 = 6 it gives what that "
                    f"mistake gives: {mistake.hint}.")
    return ""


def _apply_rope_mistakes(base: float) -> list[Mistake]:
    def angles(**kw: Any) -> Callable[..., torch.Tensor]:
        return lambda p, hd: _rope_angles(p, hd, base, **kw)

    right = angles()
    return [
        Mistake("1-based positions",
                "the first position is 0 (no turn at all); you turned every vector by one position "
                "too many. Use the positions as given",
                lambda x, p: _turn_halves(x, angles(shift=1)(p, x.size(-1)))),
        Mistake("the positions 0..L-1 instead of the positions given",
                "turn row j by the angle of positions[j], not of j: the positions need not start at "
                "0 or be consecutive (a KV cache's new token sits at position t)",
                lambda x, p: _turn_halves(x, right(torch.arange(len(p)), x.size(-1)))),
        Mistake("the pairs layout (neighbours 2i, 2i+1)",
                "this exercise uses Hugging Face's layout: plane i is made of numbers i and "
                "i + head_dim/2 (the two halves), not of neighbours",
                lambda x, p: _turn_pairs(x, right(p, x.size(-1)))),
        Mistake("the sine's sign is flipped (turning backwards)",
                "the 2-D rotation by angle a maps (u, v) to (u cos a - v sin a, u sin a + v cos a): "
                "the first number LOSES v sin a",
                lambda x, p: _turn_halves(x, right(p, x.size(-1)), flip=-1.0)),
        Mistake("frequencies base ** (-i / head_dim): the 2 is missing",
                "theta_i = base ** (-2 i / head_dim) for i = 0 .. head_dim/2 - 1 (or "
                "base ** (-torch.arange(0, head_dim, 2) / head_dim))",
                lambda x, p: _turn_halves(x, angles(two=1.0)(p, x.size(-1)))),
        Mistake("frequencies base ** (+2i / head_dim): the minus is missing",
                "theta_i = base ** (-2 i / head_dim) = 1 / base ** (2 i / head_dim): the first plane "
                "turns fastest (1 radian per position), the last slowest",
                lambda x, p: _turn_halves(x, angles(sign=1.0)(p, x.size(-1)))),
        Mistake("frequencies base ** (-4i / head_dim): 2i with i stepping by 2",
                "use i = 0, 1, ..., head_dim/2 - 1 with 2i in the exponent, or torch.arange(0, "
                "head_dim, 2) without another factor 2",
                lambda x, p: _turn_halves(x, angles(two=4.0)(p, x.size(-1)))),
        Mistake("cos and sin swapped",
                "at position 0 (angle 0) x must come out unchanged: cos goes with the number "
                "itself, sin with its partner",
                lambda x, p: (lambda a: _turn_halves(x, torch.pi / 2 - a))(right(p, x.size(-1)))),
        Mistake("an interleaved table with the halves rotation",
                "your angles are laid out in pairs, each plane's angle twice in a row "
                "(repeat_interleave), while the rotation pairs number i with number "
                "i + head_dim/2: number i then gets the angle of plane i // 2. With the halves "
                "layout, the table repeats the whole list of angles, cat([angles, angles])",
                lambda x, p: _turn_interleaved_table(x, right(p, x.size(-1)))),
        Mistake("the halves table with the pairs rotation",
                "your rotation turns neighbours (2i, 2i+1) while your table holds plane i's angle at "
                "numbers i and i + head_dim/2 (the Debug exercise's bug): this exercise pairs the "
                "halves, number i with number i + head_dim/2",
                lambda x, p: _pairs_layout(x, *_cat_table(right(p, x.size(-1))))),
        Mistake("floor division in the frequencies: every plane turns at 1 radian per position",
                "2 * i // head_dim (or torch.arange(0, head_dim, 2) // head_dim) rounds the "
                "exponent down to 0, so every theta_i is 1. The exponent is a fraction, "
                "-2 i / head_dim: true division, /",
                lambda x, p: _turn_halves(x, p.double()[:, None] * torch.ones(x.size(-1) // 2,
                                                                             dtype=torch.float64))),
        Mistake("floor division in the frequencies: the exponents rounded down to -1",
                "-2 * i // head_dim rounds -2i/head_dim down to -1 for every plane but the first, "
                "so all planes after the first turn at 1/base per position. The exponent is a "
                "fraction: true division, /",
                lambda x, p: _turn_halves(x, p.double()[:, None] * base ** torch.floor(
                    -2 * torch.arange(x.size(-1) // 2, dtype=torch.float64) / x.size(-1)))),
        Mistake("positions times frequencies without an outer product",
                "positions * theta multiplies row j's position by plane j's frequency only (it runs "
                "when L = head_dim/2, and raises a size error otherwise): every row needs every "
                "plane's angle, an (L, head_dim/2) table, positions[:, None] * theta[None, :]",
                lambda x, p: _turn_halves(x, (p.double() * right(torch.ones(1), x.size(-1))[0]))),
        Mistake("frequencies counted from i = 1",
                "theta_i = base ** (-2 i / head_dim) for i = 0 .. head_dim/2 - 1: the first plane "
                "turns by 1 radian per position (theta_0 = 1); from i = 1 every plane turns as the "
                "next one should",
                lambda x, p: _turn_halves(x, right(p, x.size(-1)) * base ** (-2 / x.size(-1)))),
        Mistake("the second half gets the first half's formula",
                "a plane (u, v) turned by a is (u cos a - v sin a, u sin a + v cos a): the second "
                "number has its own formula",
                lambda x, p: (lambda y: torch.cat([y[..., : x.size(-1) // 2]] * 2, -1))(
                    _turn_halves(x, right(p, x.size(-1))))),
        Mistake("base 10000 written in, not the base given",
                "your angles are those of base 10000, but this call passed another base: use the "
                "base argument",
                lambda x, p: _turn_halves(x, _rope_angles(p, x.size(-1), 10000.0))),
        Mistake("the two halves of the output swapped",
                "your first half holds what belongs in the second (x1 sin + x2 cos) and the other "
                "way round: plane i's first number goes back to place i, its second to i + "
                "head_dim/2",
                lambda x, p: (lambda y: torch.cat([y[..., x.size(-1) // 2:], y[..., : x.size(-1) // 2]],
                                                  -1))(_turn_halves(x, right(p, x.size(-1))))),
        Mistake("the halves taken along the positions, not the head dimension",
                "your output at one position depends on x at other positions: x.chunk(2, dim=-2) "
                "splits the L rows; a plane's two numbers are both in one row's head_dim numbers",
                lambda x, p: (lambda c, s_: x * c + torch.cat([-x.chunk(2, -2)[1], x.chunk(2, -2)[0]],
                                                              -2) * s_)(*_cat_table(right(p, x.size(-1))))),
        Mistake("the angle table transposed, (head_dim/2, L)",
                "positions[None, :] * theta[:, None] gives row i = plane i and column j = position "
                "j, the transpose of what x needs (it runs when L = head_dim/2, and raises a size "
                "error otherwise): the table is (L, head_dim/2), positions[:, None] * theta[None, :]",
                lambda x, p: _turn_halves(x, right(p, x.size(-1)).T)),
        Mistake("only the first half is turned",
                "a plane's rotation changes BOTH its numbers: (x1 cos - x2 sin, x1 sin + x2 cos)",
                lambda x, p: torch.cat([_turn_halves(x, right(p, x.size(-1)))[..., : x.size(-1) // 2],
                                        x[..., x.size(-1) // 2:]], dim=-1)),
    ]


_APPLY_ROPE_CASES = [  # (case, shape of x, base, positions kind, dtype)
    ("x (2, 3, 6, 8), random positions", (2, 3, 6, 8), 10000.0, "random", torch.float32),
    ("x (1, 2, 5, 12), base 500, positions 7..11 (a cache's offset)", (1, 2, 5, 12), 500.0, "offset",
     torch.float32),
    ("x (3, 4, 16) (no heads dim), random positions", (3, 4, 16), 10000.0, "random", torch.float32),
    ("x (1, 1, 6, 10) in float64, random positions", (1, 1, 6, 10), 10000.0, "random", torch.float64),
]


def _apply_rope_inputs(n: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    _, shape, base, kind, dtype = _APPLY_ROPE_CASES[n]
    gen = torch.Generator().manual_seed(100 + n)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
    L = shape[-2]
    positions = (torch.arange(7, 7 + L) if kind == "offset"
                 else torch.randperm(40, generator=gen)[:L])
    return x, positions, base


def _apply_rope_right_on(fn: Callable[..., Any], cases: list[int]) -> list[int]:
    """The cases among ``cases`` that ``fn`` gets right (used to spot a hard-coded head_dim)."""
    ok = []
    for m in cases:
        x, p, base = _apply_rope_inputs(m)
        try:
            got = fn(x.clone(), p.clone(), base)
        except Exception:
            continue
        if _close64(got, _turn_halves(x.double(), _rope_angles(p, x.size(-1), base))):
            ok.append(m)
    return ok


def _one_head_dim_rope(fn: Callable[..., Any], n: int) -> str:
    """A sentence if ``fn`` is right only for x with another number of dims, or another head_dim,
    than case ``n``'s; else ''."""
    shape, base = _APPLY_ROPE_CASES[n][1], _APPLY_ROPE_CASES[n][2]
    hd = shape[-1]
    right = _apply_rope_right_on(fn, list(range(len(_APPLY_ROPE_CASES))))
    if len({_APPLY_ROPE_CASES[m][1][-1] for m in right}) > 1 and all(
            _APPLY_ROPE_CASES[m][2] != base for m in right):
        return ""  # right for several head_dims: not a size written in (another base, named below)
    if right and all(len(_APPLY_ROPE_CASES[m][1]) != len(shape) for m in right):
        dims = sorted({len(_APPLY_ROPE_CASES[m][1]) for m in right})
        return (f"Only right for x with {' or '.join(map(str, dims))} dims: {_APPLY_ROPE_CASES[n][0]} "
                f"has {len(shape)}. x is (..., L, head_dim), any number of leading dims: take the "
                "sizes from the end, x.size(-1) and x.size(-2), not by unpacking x.shape.")
    others = [m for m in right if _APPLY_ROPE_CASES[m][1][-1] != hd]
    if not others:
        return ""
    return (f"Only right for another head_dim ({_APPLY_ROPE_CASES[n][0]} has head_dim {hd}): take "
            "the sizes from x (x.size(-1) // 2), not from a number you wrote.")


@checker
@_no_raw_errors
def check_apply_rope(fn: Callable[..., Any]) -> None:
    """Check ``fn(x (..., L, hd), positions (L,), base) -> (..., L, hd)``: RoPE in the halves layout,
    plane i = numbers (i, i + hd/2) turned by ``positions * base ** (-2i / hd)``."""
    from transformers.models.llama import modeling_llama as hf

    from ..rope import rotate_half, rotate_pairs

    if is_course_lib(fn) or fn in (hf.apply_rotary_pos_emb, hf.rotate_half):
        raise CheckFailure("You handed in a library's rotary function: write the rotation yourself.")
    refused = [apply_rotary, RotaryEmbedding.forward, RotaryEmbedding.__init__, rotary_frequencies,
               rotate_half, rotate_pairs, hf.apply_rotary_pos_emb, hf.rotate_half,
               hf.LlamaRotaryEmbedding.forward]
    for n, (case, shape, base, _, dtype) in enumerate(_APPLY_ROPE_CASES):
        x, positions, base = _apply_rope_inputs(n)
        before = (x.clone(), positions.clone())
        with calls_to(refused) as seen:
            try:
                got = _call(fn, x, positions, base, case=case,
                            hint="x is (..., L, head_dim), positions an int tensor (L,), base a float.")
            except CheckFailure as failure:
                failed = failure
            else:
                failed = None
        if failed is not None:
            if not seen and _one_head_dim_rope(fn, n):
                raise CheckFailure(_one_head_dim_rope(fn, n)) from failed
            if not seen and _no_outer_probe(fn, base):
                raise CheckFailure(_no_outer_probe(fn, base)) from failed
            hd = shape[-1]
            if f"({hd})" in str(failed) and f"({hd // 2})" in str(failed):
                raise CheckFailure(
                    f"Likely mistake ({case}): a tensor of head_dim = {hd} numbers per row meets one "
                    f"of head_dim/2 = {hd // 2}. {str(failed).split('. x is')[0]}. Parts of head_dim/2 "
                    "numbers joined along another dim than the last (torch.cat's default is dim 0) "
                    "still have head_dim/2 numbers per row.") from failed
            raise failed
        if seen:
            raise CheckFailure("Your function calls a library's rotary code (course_lib's or Hugging "
                               "Face's): build the angles and the rotation yourself.")
        if not (torch.equal(x, before[0]) and torch.equal(positions, before[1])):
            raise CheckFailure(f"Your function changes x or positions in place ({case}).")
        if isinstance(got, tuple):
            raise CheckFailure("Return only the turned x, not a tuple.")
        expect_shape(got, shape, f"the turned x ({case})", "RoPE keeps the shape of x.")
        if not got.is_floating_point() or not torch.isfinite(got).all():
            raise CheckFailure(f"The output ({case}) is not a finite floating-point tensor.")
        x64 = x.double()
        expected = _turn_halves(x64, _rope_angles(positions, shape[-1], base))
        if not _close64(got, expected) and _one_head_dim_rope(fn, n):
            raise CheckFailure(_one_head_dim_rope(fn, n))
        _compare64(got, expected, (x64, positions), _apply_rope_mistakes(base), case,
                   "the 2-D rotation of every plane (x_i, x_{i + head_dim/2})")
    print(f"check_apply_rope: right on all {len(_APPLY_ROPE_CASES)} cases (every plane (x_i, "
          "x_{i + head_dim/2}) turned by position * base ** (-2i / head_dim)). Well done!")


# ----------------------------------------------------------------------------------------------
# check_rope_decode (build ★★★: one decoding step with a KV cache, rotary positions at offset t)
# ----------------------------------------------------------------------------------------------
#
# The rule for positions, one for the whole lesson: positions count from 0. The token after t
# others sits at position t, and the cache a step receives holds the keys of positions 0..t-1,
# each already turned by its own position (Hugging Face's position_ids = arange, and course_lib's
# project_kv(..., start=t)). The checker hands over a prefilled cache (a prompt's keys and values
# computed by the reference), so a step that counts positions from 1, or turns the keys it finds in
# the cache again, gives other numbers at once.


def _lin64(module: torch.nn.Linear, t: torch.Tensor) -> torch.Tensor:
    out = t @ module.weight.double().T
    return out + module.bias.double() if module.bias is not None else out


def _heads64(layer: MultiHeadAttention, name: str, x: torch.Tensor, heads: int) -> torch.Tensor:
    """``x (B, L, d)`` through ``layer.<name>`` in float64: ``(B, heads, L, head_dim)``."""
    B, L, _ = x.shape
    return _lin64(getattr(layer, name), x.double()).view(B, L, heads, layer.head_dim).transpose(1, 2)


def _turn_at(t: torch.Tensor, positions: Any, base: float) -> torch.Tensor:
    p = torch.as_tensor(positions).reshape(-1)
    return _turn_halves(t, _rope_angles(p, t.size(-1), base))


def _prefill(layer: MultiHeadAttention, prompt: torch.Tensor, base: float) -> tuple[torch.Tensor, ...]:
    """The cache of a prompt ``(B, P, d)``: keys turned by positions 0..P-1, and values, float64."""
    k = _heads64(layer, "k_proj", prompt, layer.num_kv_heads)
    v = _heads64(layer, "v_proj", prompt, layer.num_kv_heads)
    return _turn_at(k, torch.arange(prompt.size(1)), base), v


def _decode_step64(layer: MultiHeadAttention, x_t: torch.Tensor, t: int, cache: Any, base: float,
                   knob: str = "") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step in float64 from a right cache (keys of 0..t-1, turned), with one mistake ``knob``
    (or none): ``(out (B, 1, d), k, v)``, the cache returned."""
    h, kv = layer.num_heads, layer.num_kv_heads
    q = _heads64(layer, "q_proj", x_t, h)  # (B, h, 1, hd)
    k = _heads64(layer, "k_proj", x_t, kv)  # (B, kv, 1, hd)
    v = _heads64(layer, "v_proj", x_t, kv)
    pos = {"pos0": 0, "one_based": t + 1, "minus_one": t - 1}.get(knob, t)
    if knob != "q_unturned":
        q = _turn_at(q, {"q_next": t + 1, "k_next": t, "q_prev": t - 1}.get(knob, pos), base)
    if knob == "k_next":
        pos = t + 1
    k_raw = k
    if knob not in ("k_unturned", "whole_at_t", "turned_twice", "turned_twice_all"):
        k = _turn_at(k, pos, base)
    if knob == "turn_v":
        v = _turn_at(v, pos, base)
    K, V = (k, v) if cache is None else (torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2))
    keys, values = K, V
    if knob == "whole_at_t":  # every key, the cached ones too, turned by the new position t
        keys = _turn_at(torch.cat([cache[0], k_raw], 2) if cache is not None else k_raw, t, base)
        K = keys
    if knob in ("turned_twice", "turned_twice_all"):  # the cached keys turned again by 0..t
        new_key = k_raw if knob == "turned_twice" else _turn_at(k_raw, t, base)
        keys = _turn_at(torch.cat([cache[0], new_key], 2) if cache is not None else new_key,
                        torch.arange(t + 1), base)
        K = keys if knob == "turned_twice_all" else K
    if knob == "past_only":
        keys, values = K[:, :, :-1], V[:, :, :-1]
    if knob == "new_only":
        keys, values = K[:, :, -1:], V[:, :, -1:]
    if knob == "first_only":  # a (1, t + 1) tril mask: only column 0 is True
        keys, values = K[:, :, :1], V[:, :, :1]
    if keys.size(2) == 0:
        heads = torch.zeros_like(q)
    else:
        index = torch.arange(h) % kv if knob == "modulo" else torch.arange(h) // (h // kv)
        keys, values = keys[:, index], values[:, index]
        scale = {"no_scale": 1.0, "scale_d_model": 1 / math.sqrt(h * layer.head_dim)}.get(
            knob, 1 / math.sqrt(layer.head_dim))
        scores = q @ keys.transpose(-2, -1) * scale  # (B, h, 1, t + 1)
        heads = scores.softmax(-2 if knob == "softmax_rows" else -1) @ values  # (B, h, 1, hd)
    merged = heads.transpose(1, 2).reshape(x_t.size(0), 1, h * layer.head_dim)  # (B, 1, d)
    out = merged if knob == "no_out_proj" else _lin64(layer.out_proj, merged)
    return out, K, V


# (knob, name, what is observed and what it means). The observations say what the step's numbers
# show; the ★★★'s stub gives no steps, so these messages are where a forgotten step is named.
_DECODE_MISTAKES = [
    ("one_based", "positions counted from 1",
     "the new query and key are turned by position t + 1, but the cache you received holds the "
     "keys of positions 0..t-1: the new token is the (t+1)-th, at position t. Positions count from "
     "0 everywhere in this lesson (the first token is not turned at all)"),
    ("whole_at_t", "the cached keys are turned again, all by the new position t",
     "the keys already in the cache come out turned a second time, each by t: the key of position j "
     "then carries the angle of j + t. The keys you receive are already turned, each by its own "
     "position j, and a score must see the query's position minus the key's own position"),
    ("turned_twice", "the cached keys are turned twice",
     "the keys in the cache you received are already turned, each by its own position; turning "
     "them again by 0..t doubles every cached key's angle"),
    ("turned_twice_all", "the cached keys are turned twice",
     "the keys in the cache you received are already turned, each by its own position; turning "
     "them again by 0..t doubles every key's angle"),
    ("minus_one", "the new query and key turned at position t - 1",
     "t - 1 is the position of the last cached token; the new token comes after the t cached ones "
     "(positions 0..t-1), at position t"),
    ("q_next", "the new query and its key turned at different positions",
     "the query is turned by t + 1 and the new key by t: both belong to the newest token, at "
     "position t"),
    ("q_prev", "the new query and its key turned at different positions",
     "the query is turned by t - 1 and the new key by t: both belong to the newest token, at "
     "position t (t - 1 is the last cached token's)"),
    ("k_next", "the new query and its key turned at different positions",
     "the query is turned by t and the new key by t + 1: both belong to the newest token, at "
     "position t"),
    ("pos0", "the new query and key turned at position 0",
     "your scores are those of a new query and key at position 0 (unturned) against cached keys at "
     "0..t-1 (the same scores come from turning every key once more by t). The new token sits at "
     "position t, and each key carries the angle of its own position"),
    ("q_unturned", "the query is not turned",
     "the score sees the difference of the query's and the key's angles: the new query must be "
     "turned by its position t too"),
    ("k_unturned", "the new key is not turned",
     "the key you append carries no angle, while the cached keys carry their positions' angles: "
     "turn it by its own position before it joins the cache"),
    ("turn_v", "the values are turned too",
     "RoPE turns queries and keys only; the values are mixed as they are"),
    ("first_only", "the new token attends to position 0 only",
     "your output is what attending to the first cached position alone gives. A (1, t + 1) mask "
     "built with tril keeps only its first column; the newest token is the LAST row of the causal "
     "mask and may see every position 0..t (no mask is needed for one new token)"),
    ("past_only", "the new token does not see itself",
     "the query at t attends to positions 0..t, itself included: the new key and value must be in "
     "what it attends to"),
    ("new_only", "the cache is not used",
     "the output is what attending to the new token alone gives: the query must attend to every "
     "cached position and the new one, (B, num_kv_heads, t + 1, head_dim)"),
    ("modulo", "KV heads paired as i % num_kv_heads",
     "query head i uses KV head i // (num_heads // num_kv_heads): repeat_interleave, not repeat"),
    ("no_scale", "no 1/sqrt(head_dim) scaling",
     "the scores are not divided by sqrt(head_dim)"),
    ("softmax_rows", "the softmax taken over the query's one row",
     "your output is the SUM of the values: a softmax over dim -2 normalises the one query row "
     "(every weight 1); the weights must sum to 1 over the positions 0..t, the last dim"),
    ("scale_d_model", "the scores divided by sqrt(d_model), not sqrt(head_dim)",
     "each head's scores are dot products of head_dim numbers: they are divided by sqrt(head_dim)"),
    ("no_out_proj", "layer.out_proj is not applied",
     "your output is the merged heads themselves: the layer's output goes through its output "
     "projection, layer.out_proj, after merging the heads"),
]

# (case, d_model, heads, KV heads, B, prompt length in the cache, steps, bias). The prompts put the
# positions past 9 (two digits); 6 heads : 2 KV heads tells i // 3 from i % 2; one case starts from
# no cache at all (t = 0, cache None).
_DECODE_CASES = [
    ("d_model 48, 6 heads, 2 KV heads, B=2, a cache of 11 prompt positions, 4 steps",
     48, 6, 2, 2, 11, 4, True),
    ("d_model 32, 4 heads, 1 KV head, B=1, a cache of 3 prompt positions, 5 steps, no biases",
     32, 4, 1, 1, 3, 5, False),
    ("d_model 40, 2 heads, 2 KV heads (head_dim 20), B=3, no cache at first (t=0), 6 steps",
     40, 2, 2, 3, 0, 6, True),
]
DECODE_BASE = 10000.0


def _decode_layer(n: int) -> tuple[MultiHeadAttention, MultiHeadAttention, torch.Tensor]:
    """Case ``n``'s layer without rotary, the same layer with it (the reference) and its input."""
    _, d, h, kv, B, P, T, bias = _DECODE_CASES[n]
    gen = torch.Generator().manual_seed(200 + n)
    torch.manual_seed(200 + n)
    layer = MultiHeadAttention(d, h, num_kv_heads=kv, bias=bias).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.4)
    reference = MultiHeadAttention(d, h, num_kv_heads=kv, bias=bias,
                                   rotary=RotaryEmbedding(d // h, P + T, DECODE_BASE)).eval()
    reference.load_state_dict(layer.state_dict())
    return layer, reference, torch.randn(B, P + T, d, generator=gen)


def _decode_cache_message(case: str, t: int, got: tuple, want_k: torch.Tensor, want_v: torch.Tensor,
                          layer: MultiHeadAttention, x_t: torch.Tensor) -> str:
    """What is wrong with the cache a step returns (its output was right)."""
    k_new = got[0][:, :, -1:]
    if _close64(got[0], want_v) and _close64(got[1], want_k):
        return (f"The cache you return after step t={t} ({case}) is (v, k): its first tensor holds "
                "the values and its second the keys. The cache is (k, v), keys first, as received.")
    if not _close64(got[0][:, :, :-1], want_k[:, :, :-1]) or not _close64(got[1][:, :, :-1],
                                                                          want_v[:, :, :-1]):
        return (f"The cache you return after step t={t} ({case}) changes the positions it received: "
                "its first t positions should be the received keys and values, as they were.")
    k_raw = _heads64(layer, "k_proj", x_t, layer.num_kv_heads)
    if _close64(k_new, k_raw) and t > 0:
        return (f"Your step's output is right, but the key it appends to the cache at t={t} ({case}) "
                "is not turned, while the keys it received carry the angles of their positions: the "
                "next step would read it as a key at position 0.")
    if _close64(k_new, _turn_at(k_raw, t + 1, DECODE_BASE)):
        return (f"Your step's output is right, but the key it appends to the cache at t={t} ({case}) "
                "is turned by position t + 1; the new token sits at position t (positions count "
                "from 0, and the received keys sit at 0..t-1).")
    which, mine, right = (("values", got[1], want_v) if _close64(got[0], want_k)
                          else ("keys", got[0], want_k))
    return (f"Your step's output is right at t={t} ({case}), but the {which} of the cache it returns "
            "differ from the received cache plus the new token's, by up to "
            f"{(_f64(mine) - right).abs().max().item():.3g}.")


@checker
@_no_raw_errors
def check_rope_decode(fn: Callable[..., Any]) -> None:
    """Check ``fn(layer, x_t (B, 1, d_model), t, cache) -> (out (B, 1, d_model), (k, v))``, one
    decoding step of rotary grouped-query self-attention. ``cache`` holds the keys (turned by their
    own positions 0..t-1) and values of the earlier tokens, or is None at t = 0. Each case starts
    from a prompt's cache (or none) and decodes several steps, the learner's cache carried from
    step to step: every output must equal the same layer run once on the whole sequence with RoPE
    and a causal mask (cached = recomputed), and every returned cache must hold the turned keys.
    At the first wrong step, that step is compared with the usual mistakes made from the same
    (right) cache."""
    from transformers.models.llama import modeling_llama as hf

    from ..masks import causal_mask

    if is_course_lib(fn):
        raise CheckFailure("You handed in one of course_lib's functions: write the decoding step.")
    refused = [RotaryEmbedding.forward, hf.apply_rotary_pos_emb, MultiHeadAttention.forward]
    for n, (case, d, h, kv, B, P, T, _) in enumerate(_DECODE_CASES):
        layer, reference, x = _decode_layer(n)
        with torch.no_grad():
            expected = _f64(reference(x, x, x, causal_mask(P + T)))  # (B, P+T, d): all at once
        cache = None
        want = _prefill(layer, x[:, :P], DECODE_BASE) if P else None  # float64
        if P:
            cache = tuple(c.float() for c in want)  # the prompt's cache, float32 like the layer
        for t in range(P, P + T):
            x_t = x[:, t : t + 1].clone()
            given = None if cache is None else tuple(c.clone() for c in cache)
            with calls_to(refused) as seen, torch.no_grad():
                try:
                    result = _call(fn, layer, x_t, t, cache, case=f"{case}, step t={t}",
                                   hint="Arguments: layer, x_t (B, 1, d_model), t (int), cache ((k, v) "
                                        "or None at t = 0); return (out (B, 1, d_model), (k, v)).")
                except CheckFailure as failure:
                    hd = d // h
                    if h != kv and f"[{B}, 1, {h}, {hd}]" in str(failure) and f"{B * kv * hd}" in str(
                            failure):
                        raise CheckFailure(
                            f"Likely mistake ({case}, step t={t}): the new key or value split into "
                            f"num_heads = {h} heads. {str(failure).split('. Arguments')[0]}: k_proj "
                            f"and v_proj give num_kv_heads * head_dim = {kv * hd} numbers per "
                            f"token, {kv} heads of {hd} (split_heads(..., num_heads) takes the "
                            "number of heads).") from failure
                    if h != kv and f"({h})" in str(failure) and f"({kv})" in str(failure):
                        raise CheckFailure(
                            f"Likely mistake ({case}, step t={t}): the query heads meet the KV heads "
                            f"unshared. {str(failure).split('. Arguments')[0]}: the query has {h} "
                            f"heads and the cache {kv} KV heads; each KV head serves its group of "
                            f"{h // kv} query heads (attend, your grouped-query attention, does "
                            "that).") from failure
                    raise
            if seen:
                raise CheckFailure("Your step calls a library's rotary attention (course_lib's "
                                   "RotaryEmbedding or MultiHeadAttention.forward, or Hugging Face's "
                                   "apply_rotary_pos_emb): turn the queries and keys with rope_at, at "
                                   "the position you work out.")
            if not torch.equal(x_t, x[:, t : t + 1]):
                raise CheckFailure(f"Your step changes x_t in place ({case}, t={t}).")
            if given is not None and not all(torch.equal(a, b) for a, b in zip(given, cache)):
                raise CheckFailure(f"Your step changes the cache it received in place ({case}, t={t}): "
                                   "build the longer cache as a new tensor (torch.cat).")
            if not (isinstance(result, tuple) and len(result) == 2):
                raise CheckFailure(
                    f"Return a pair (out, cache) ({case}, t={t}), got {type(result).__name__}: out "
                    "(B, 1, d_model) and the new cache (k, v).")
            out, new_cache = result
            if not (isinstance(new_cache, (tuple, list)) and len(new_cache) == 2
                    and all(isinstance(c, torch.Tensor) for c in new_cache)):
                raise CheckFailure(f"The cache you return ({case}, t={t}) should be a pair of "
                                   "tensors (k, v), each (B, num_kv_heads, t + 1, head_dim).")
            shape = (B, kv, t + 1, d // h)
            for name, c in zip("kv", new_cache):
                if tuple(c.shape) != shape:
                    raise CheckFailure(
                        f"The cached {name} has shape {tuple(c.shape)} after step t={t} ({case}); "
                        f"expected {shape}: (B, num_kv_heads, positions so far, head_dim), the "
                        "received positions and one new one. Keep num_kv_heads heads in the cache: "
                        "the query heads share them.")
            if isinstance(out, torch.Tensor) and tuple(out.shape) == (B, t + 1, d) and t > 0:
                raise CheckFailure(
                    f"out has shape {tuple(out.shape)} at step t={t} ({case}): one row for each "
                    "position 0..t, where a step outputs the newest token's row only, (B, 1, "
                    "d_model). With one query row, a (t + 1, t + 1) mask broadcasts the scores to "
                    "t + 1 rows.")
            expect_shape(out, (B, 1, d), f"out ({case}, t={t})",
                         "out is the layer's output for the new position: (B, 1, d_model).")
            _, want_k, want_v = _decode_step64(layer, x_t, t, want, DECODE_BASE)  # the right cache
            if not _close64(out, expected[:, t : t + 1], atol=1e-4):
                # Two mistakes can give the same scores (turning the new query and key at 0, or
                # every key once more at t): the cache each returns tells them apart.
                matches = []
                for knob, name, hint in _DECODE_MISTAKES:
                    if knob in ("past_only",) and want is None:
                        continue
                    wrong, wrong_k, _ = _decode_step64(layer, x_t, t, want, DECODE_BASE, knob)
                    if _close64(out, wrong, atol=1e-4):
                        matches.append((_close64(new_cache[0], wrong_k, atol=1e-4), name, hint))
                if matches:
                    _, name, hint = max(matches, key=lambda m: m[0])  # the first with its cache too
                    raise CheckFailure(f"Likely mistake ({case}, step t={t}): {name}. {hint}.", mistake=name)
                raise CheckFailure(
                    f"Decoded step by step, the output at step t={t} ({case}) differs from the whole "
                    "sequence computed at once, by up to "
                    f"{(_f64(out) - expected[:, t : t + 1]).abs().max().item():.3g}, though the "
                    "cache it received was right. None of the usual mistakes explains it; compare "
                    "your step's scores with those of the whole sequence's last row.")
            if not (_close64(new_cache[0], want_k, atol=1e-4) and _close64(new_cache[1], want_v,
                                                                            atol=1e-4)):
                raise CheckFailure(_decode_cache_message(case, t, new_cache, want_k, want_v, layer,
                                                         x_t))
            cache, want = tuple(new_cache), (want_k, want_v)
    print(f"check_rope_decode: on all {len(_DECODE_CASES)} cases (prompts in the cache, and none), "
          "decoding step by step with your cache gives what the whole sequence gives at once. "
          "Well done!")
