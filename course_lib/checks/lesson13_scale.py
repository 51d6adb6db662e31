"""Checkers for the exercises of lesson 13 (attention at scale).

* ``check_score_bytes(fn)``: ``fn() -> number``, the bytes of one layer's score matrix of GPT-2
  small (12 heads) at L = 32,768 in float32, one sequence (a "predict, then run" question).
* ``check_merge_states(fn)``: ``fn(m_a, ell_a, o_a, m_b, ell_b, o_b) -> (m, ell, o)``, the merge of
  two partial softmax states. Reference: course_lib's ``merge_softmax_states`` and the softmax;
  also an empty state, scores up to 1000 (absolute exponentials overflow there) and two maxima ~1000
  apart (a factor measured from the smaller maximum overflows there).
* ``check_flash_fix(fn)``: ``fn(q (L_q, d), k (L_k, d), v (L_k, d_v), block_k=16) -> (L_q, d_v)``,
  the repaired one-head tiled attention of the Debug exercise. Reference: PyTorch's SDPA; the last
  three cases are float32, with scores of 100 to 1000 (exp without the running maximum overflows),
  with a middle block about 100 above the others (a loop measured from the first block's maximum, or
  from each block's own, overflows), and with every score about -150 (a loop whose m starts at 0
  gets exp = 0, and 0 / 0).
* ``check_flash_forward(fn)``: ``fn(q, k, v, is_causal=False, block_q=32, block_k=32) -> (out, lse)``,
  the learner's FlashAttention forward (★★★). Reference: SDPA and ``torch.logsumexp`` of the
  scores; also checked: no tensor larger than a tile or the inputs, and causal tiles skipped (no
  tile computed that is masked whole). course_lib's ``merge_softmax_states`` is welcome inside.
* ``check_locate(fn)``: ``fn(block_table, position, block_size) -> (physical block, slot)``.

The usual mistakes, as code, live in ``lesson13_scale_mistakes``, ``lesson13_named`` and
``lesson13_named_f`` (each checker names the one that matches). Every checker compares in float64,
runs the learner's code under a time limit on one thread, and turns any raw error into a message
(the conventions of ``common``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention
from torch.utils._python_dispatch import TorchDispatchMode

from .. import flash, paged
from .common import (CheckFailure, SdpaWatch, calls_to, checker, is_course_lib, one_thread,
                     time_limit)
from .lesson13_locate import locate_failure, locate_observed
from .lesson13_named import (FIX_INVERTED_SAID, M_ZERO_SAID, NAMED_LOCATE, boundary_failure,
                              fix_inverted_zeroed, forward_named, inverted_said, m_zero_observed,
                              named_merges)
from .lesson13_named_f import (LOW_FIX_CASE, RAW_EXP_SLACK, fix_named_more, forward_named_more,
                               forward_shapes_swapped, largest_finite, low_fix_inputs, low_said,
                               merge_named_more, positive_finite, are_raw_scores, raw_exp_said)
from .lesson13_named_g import fix_sum_axis_failure, score_kib_or_1024
from .lesson13_scale_mistakes import (FIX_MISTAKES, FLOAT32_MISTAKE, FORWARD_MISTAKES, LOCATE_MISTAKES,
                                      SCORE_MISCOUNTS, PARTIAL_TILE, broadcast_hint, fix_reason,
                                      float32_gap, float32_said, kept_raise, merge_variants, one_head_loop,
                                      partial_tile_message, ref_forward, tiled_forward_variant,
                                      later_max_said, score_decompositions, unchanged_stub)

__all__ = ["check_score_bytes", "check_merge_states", "check_flash_fix", "check_flash_forward",
           "check_locate", "score_bytes_answer"]

TIME_LIMIT = 60.0


def _guarded(body: Callable[..., None]) -> Callable[..., None]:
    """Run a checker's body on one thread, with the random state kept; any raw error becomes a
    ``CheckFailure`` that says so."""

    def run(fn: Any) -> None:
        try:
            with torch.random.fork_rng(devices=[]), one_thread():
                body(fn)
        except (NotImplementedError, CheckFailure):
            raise
        except Exception as err:
            raise CheckFailure(f"The checker could not use your answer: {type(err).__name__}: {err}. "
                               "Check that it has the signature the exercise gives.") from err

    run.__name__ = body.__name__
    return run


def _call(fn: Callable[..., Any], *args: Any, case: str, hint: str = "",
          rows: tuple[int, int, str] | None = None, **kwargs: Any) -> Any:
    """``fn(*args)`` under the time limit; a crash becomes a ``CheckFailure`` naming the case (with
    ``rows = (rows, cols, what)``, a broadcasting error of a per-row factor is named as such)."""
    try:
        with time_limit(TIME_LIMIT, f"Your code ran for more than {TIME_LIMIT:g} s ({case}) and was "
                                    "stopped: does a loop never end (a step of 0, a while loop)?"):
            return fn(*args, **kwargs)
    except (NotImplementedError, CheckFailure):
        raise
    except Exception as err:
        said = broadcast_hint(err, *rows) if rows else ""
        if said:
            raise CheckFailure(f"{said} ({case})", mistake="a per-row factor not made a column") from err
        raise CheckFailure(f"Your code raised {type(err).__name__} ({case}): {err}. {hint}".strip()) from err


def _f64(t: Any) -> Any:
    return t.detach().to(torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point() else t


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    finite = torch.isfinite(b)
    if not torch.equal(torch.isfinite(a), finite):
        return math.inf
    if not finite.any():
        return 0.0
    return (a[finite] - b[finite]).abs().max().item()


def _near(got: torch.Tensor, expected: torch.Tensor, tol: float = 1e-9) -> bool:
    """Equal infinities, and finite numbers within ``tol`` relative to the largest of them."""
    finite = expected[torch.isfinite(expected)]
    scale = 1.0 + (finite.abs().max().item() if finite.numel() else 0.0)
    return _max_diff(got, expected) <= tol * scale


_REFUSED_TORCH = [F.scaled_dot_product_attention]


def _refuse(fn: Any, what: str) -> list[Callable[..., Any]]:
    if is_course_lib(fn) or fn in _REFUSED_TORCH:
        raise CheckFailure(f"You handed in a ready-made function (course_lib's or PyTorch's): {what}")
    return [flash.merge_softmax_states, flash.flash_attention_forward, flash.flash_attention,
            flash.naive_attention, flash.FlashAttention.forward, paged.PagedKVCache.write,
            paged.PagedKVCache.read, flex_attention]


class _Watch(TorchDispatchMode):
    """Records, while the learner's code runs: the largest tensor any operation returns, the
    elements that go through ``exp`` (or a softmax), and whether SDPA or flex attention ran."""

    def __init__(self) -> None:
        super().__init__()
        self.largest, self.largest_shape, self.exp_elements, self.fused = 0, (), 0, ""
        self.zero_exps: list[tuple[tuple[int, ...], int]] = []  # (shape, numel) of all-zero exp outputs
        self.one_exps: list[int] = []  # numel of the exp outputs that are all exactly 1
        self.exp_arg_max = -math.inf  # the largest finite argument any exp received
        self.exp_positive: list[torch.Tensor] = []  # positive arguments exp received (a sample)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)
        if name in ("exp", "exp_", "exp2") and args:
            self.exp_arg_max = max(self.exp_arg_max, largest_finite(args[0]))
            if len(self.exp_positive) < 64 and (positive := positive_finite(args[0])).numel():
                self.exp_positive.append(positive)
        if "scaled_dot_product" in name or "flex_attention" in name or "flash_attention" in name:
            self.fused = name
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                if t.numel() > self.largest:
                    self.largest, self.largest_shape = t.numel(), tuple(t.shape)
                if name in ("exp", "exp_", "_softmax", "softmax", "exp2", "_safe_softmax"):
                    self.exp_elements += t.numel()
                    if t.dim() >= 2 and t.numel() and not t.any():  # a tile that is all future
                        self.zero_exps.append((tuple(t.shape), t.numel()))
                    if t.numel() and t.is_floating_point() and bool((t == 1).all()):
                        self.one_exps.append(t.numel())
        return out


# ----------------------------------------------------------------------------------------------
# check_score_bytes (predict)
# ----------------------------------------------------------------------------------------------

HEADS, TOKENS, BYTES = 12, 32 * 1024, 4
PAIRABLE = {1 / HEADS, 1 / BYTES, 1 / 2, 2, 8, 1 / TOKENS, (32000 / TOKENS) ** 2, 768 / TOKENS, 64 / TOKENS}


def score_bytes_answer() -> int:
    return HEADS * TOKENS * TOKENS * BYTES


@checker
def check_score_bytes(fn: Callable[[], Any]) -> None:
    """Check ``fn() -> number``: one layer's score bytes, 12 heads, L = 32,768, float32, batch 1."""
    _guarded(_check_score_bytes)(fn)


def _check_score_bytes(fn: Callable[[], Any]) -> None:
    raw = _call(fn, case="your prediction", hint="Return one number.")
    if isinstance(raw, torch.Tensor) and raw.numel() == 1:
        raw = raw.item()
    if isinstance(raw, bool) or not isinstance(raw, numbers.Real) or not math.isfinite(float(raw)):
        raise CheckFailure(f"Return one number of bytes (e.g. 12345), got {type(raw).__name__} {raw!r}.")
    got, right = float(raw), score_bytes_answer()
    if got == right:
        print(f"check_score_bytes: right, {right:,} bytes = 12 heads x 32,768 queries x 32,768 keys "
              f"x 4 bytes, about {right / 2**30:.0f} GiB for one layer's scores.")
        return
    for factor, reason in SCORE_MISCOUNTS:
        if abs(got - right * factor) <= 1e-9 * right * factor:
            raise CheckFailure(f"Not quite: {reason}.", mistake=reason)
    units = ((2**30, "GiB"), (1e9, "GB"), (2**20, "MiB"), (1e6, "MB"), (2**10, "KiB"), (1e3, "kB"))
    for unit, name in units:
        if abs(got - right / unit) <= 0.01 * right / unit:
            if unit == 2**10:  # also 12 x 1,024 x 1,024 x 4: a sequence of 1,024 tokens
                raise CheckFailure(*score_kib_or_1024(got, right))
            raise CheckFailure(f"Observed: {got:,g}, which is the answer in {name} ({right:,} bytes / "
                               f"{unit:,g}): return plain bytes.", mistake=f"answer in {name}")
    for unit, name in units:
        for factor, reason in SCORE_MISCOUNTS:
            if abs(got - right * factor / unit) <= 0.01 * right * factor / unit:
                raise CheckFailure(f"Observed: {got:,g}, a number in {name} (return plain bytes), and "
                                   f"then {reason}.", mistake=f"answer in {name}, and {reason}")
    single = [(f, r) for f, r in SCORE_MISCOUNTS if f in PAIRABLE]  # two slips a learner makes at once
    pairs = [(a[1], b[1]) for n, a in enumerate(single) for b in single[n + 1:]
             if abs(got - right * a[0] * b[0]) <= 1e-9 * right * a[0] * b[0]]
    if len(pairs) == 1:  # two miscounts at once, and no other pair gives the same number
        raise CheckFailure(f"Not quite, observed {got:,g}: two things at once. First, {pairs[0][0]}. "
                           f"Second, {pairs[0][1]}.", mistake=" and ".join(pairs[0]))
    readings = score_decompositions(got)
    if 0 < len(readings) <= 3:
        shown = f"{got:,.0f}" if got == int(got) else f"{got:,g}"
        raise CheckFailure(f"Not quite, observed {shown} = heads x queries x keys x bytes with "
                           f"{'; or with '.join(readings)}. The scores are one number per (query, "
                           "key) pair in each of the 12 heads, 4 bytes each.", mistake=readings[0])
    ratio = got / right if got > 0 else 0.0
    size = ("" if ratio <= 0 else f" (observed {got:,g}: between {10 ** math.floor(math.log10(ratio)):g} "
            f"and {10 ** (math.floor(math.log10(ratio)) + 1):g} times the right number)")
    raise CheckFailure("Not quite: " + ("too small: a factor is missing" if got < right else
                                        "too large: a factor is too big") + size +
                       ". Count the numbers of Q K^T for one layer (heads x queries x keys), then "
                       "the bytes of each.")


# ----------------------------------------------------------------------------------------------
# check_merge_states (build)
# ----------------------------------------------------------------------------------------------


def _state(scores: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The partial state of ``scores (..., n)`` over ``values (..., n, d_v)``; n = 0 gives the empty one."""
    if scores.size(-1) == 0:
        shape = scores.shape[:-1]
        return (torch.full(shape, -math.inf, dtype=scores.dtype), torch.zeros(shape, dtype=scores.dtype),
                torch.zeros(*shape, values.size(-1), dtype=scores.dtype))
    m = scores.amax(dim=-1)
    p = torch.exp(scores - m[..., None])
    return m, p.sum(-1), (p[..., None, :] @ values).squeeze(-2)


def _merge_cases() -> list[tuple[str, tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor]]:
    """``(case, the six inputs, the scores of both parts, the values)``."""
    cases = []
    gen = torch.Generator().manual_seed(13)
    for case, shape, n_a, n_b, spread, d_v in [
        ("4 rows, 5 + 7 keys, d_v = 3", (4,), 5, 7, 3.0, 3),
        ("(B=2, h=3, L=5) rows, 4 + 9 keys, scores up to about 60, d_v = 6", (2, 3, 5), 4, 9, 20.0, 6),
        ("3 rows, 1 + 1 key", (3,), 1, 1, 3.0, 2),
    ]:
        scores = spread * torch.randn(*shape, n_a + n_b, generator=gen, dtype=torch.float64)
        scores[..., n_a:] += torch.linspace(-spread, spread, shape[-1], dtype=torch.float64)[..., None]
        values = torch.randn(*shape, n_a + n_b, d_v, generator=gen, dtype=torch.float64)
        a = _state(scores[..., :n_a], values[..., :n_a, :])
        b = _state(scores[..., n_a:], values[..., n_a:, :])
        cases.append((case, a + b, scores, values))
    scores = 3 * torch.randn(3, 6, generator=gen, dtype=torch.float64)
    values = torch.randn(3, 6, 4, generator=gen, dtype=torch.float64)
    empty = _state(scores[:, :0], values[:, :0])
    cases.append(("3 rows; state a has seen no key yet (m = -inf, ell = 0, o = 0)",
                  empty + _state(scores, values), scores, values))
    cases.append(("3 rows; both states have seen no key", empty + empty, scores[:, :0], values[:, :0]))
    scores = 100 + 900 * torch.rand(4, 10, generator=gen, dtype=torch.float64)  # exp(1000) overflows
    values = torch.randn(4, 10, 3, generator=gen, dtype=torch.float64)
    large = _state(scores[:, :4], values[:, :4]) + _state(scores[:, 4:], values[:, 4:])
    cases.append((LARGE_MERGE_CASE, large, scores, values))
    scores = torch.cat([900 + 100 * torch.rand(4, 4, generator=gen, dtype=torch.float64),
                        3 * torch.randn(4, 6, generator=gen, dtype=torch.float64)], dim=-1)
    scores[2:] = scores[2:].roll(6, dims=-1)  # rows 2, 3: state b holds the high scores
    values = torch.randn(4, 10, 3, generator=gen, dtype=torch.float64)
    far = _state(scores[:, :4], values[:, :4]) + _state(scores[:, 4:], values[:, 4:])
    cases.append((FAR_MERGE_CASE, far, scores, values))
    return cases


LARGE_MERGE_CASE = "4 rows, 4 + 6 keys, large scores (100 to 1000)"
FAR_MERGE_CASE = ("4 rows, 4 + 6 keys, one state's maximum about 1000 above the other's (rows 0, 1: "
                  "m_a high; rows 2, 3: m_b high)")


def _merge_rows(inputs: tuple[torch.Tensor, ...], got: tuple[torch.Tensor, ...],
                expected: tuple[torch.Tensor, ...]) -> str:
    """Where the rows go wrong, by which state holds the larger maximum ("" if it says nothing)."""
    flat = [t.reshape(-1) for t in (inputs[0], inputs[3], got[0], got[1], expected[0], expected[1])]
    o, e = got[2].reshape(len(flat[0]), -1), expected[2].reshape(len(flat[0]), -1)
    bad = [not (_near(flat[2][i:i + 1], flat[4][i:i + 1]) and _near(flat[3][i:i + 1], flat[5][i:i + 1])
                and _near(o[i], e[i])) for i in range(len(flat[0]))]
    groups = {"m_a > m_b": flat[0] > flat[1], "m_b > m_a": flat[1] > flat[0], "m_a = m_b": flat[0] == flat[1]}
    said = [f"{sum(b for b, g in zip(bad, sel) if g)} of {int(sel.sum())} rows where {name}"
            for name, sel in groups.items() if sel.any()]
    return "; wrong: " + ", ".join(said) if said and any(bad) else ""


@checker
def check_merge_states(fn: Callable[..., Any]) -> None:
    """Check ``fn(m_a, ell_a, o_a, m_b, ell_b, o_b) -> (m, ell, o)`` against the softmax of all keys."""
    _guarded(_check_merge_states)(fn)


def _check_merge_states(fn: Callable[..., Any]) -> None:
    refused = _refuse(fn, "write the merge of the two states yourself (a few lines).")
    for case, inputs, scores, values in _merge_cases():
        given = [t.clone() for t in inputs]
        with calls_to(refused) as seen:
            got = _call(fn, *given, case=case,
                        hint="The inputs are m (...), ell (...), o (..., d_v) of state a, then of state b.",
                        rows=(inputs[0].shape[-1], inputs[2].shape[-1], "o"))
        if seen:
            raise CheckFailure("Your function calls course_lib's merge_softmax_states, the function this "
                               "exercise builds: write the merge yourself.")
        if any(not torch.equal(a, b) for a, b in zip(given, inputs)):
            raise CheckFailure(f"Your function changes its inputs in place ({case}); build new tensors.")
        if not isinstance(got, (tuple, list)) or len(got) != 3 or not all(
                isinstance(t, torch.Tensor) for t in got):
            raise CheckFailure(f"Return three tensors (m, ell, o), got {type(got).__name__} ({case}).")
        m, ell, o = (_f64(t) for t in got)
        if named := merge_named_more(case, inputs, (m, ell, o), fn):
            raise CheckFailure(named[0] + ".", mistake=named[1])
        expected = flash.merge_softmax_states(*inputs)
        for name, t, e in (("m", m, expected[0]), ("ell", ell, expected[1]), ("o", o, expected[2])):
            if t.shape != e.shape:
                raise CheckFailure(f"Wrong shape ({case}): {name} is {tuple(t.shape)}, expected "
                                   f"{tuple(e.shape)}.")
        if case == LARGE_MERGE_CASE and not all(torch.isfinite(t).all() for t in (m, ell, o)):
            top = scores.max().item()
            raise CheckFailure(
                f"Observed ({case}): your m, ell or o contains NaN or inf when the scores reach "
                f"{top:.0f} (m_a = {inputs[0].max().item():.0f}): exp of a number above about 709 "
                "overflows float64 (above about 88 in float32). Likely mistake: an exponential of an "
                "absolute score or maximum, such as exp(m_a); only differences of maxima, "
                "exp(m_a - m) <= 1, stay finite.",
                mistake="absolute exponentials overflow on large scores")
        if case == FAR_MERGE_CASE and not all(torch.isfinite(t).all() for t in (m, ell, o)):
            gap = (inputs[0] - inputs[3]).abs()
            raise CheckFailure(
                f"Observed ({case}): your m, ell or o contains NaN or inf, while the earlier cases, "
                f"large scores included, are right. Here m_a and m_b are {gap.min().item():.0f} to "
                f"{gap.max().item():.0f} apart, and exp of a number above about 709 overflows float64 "
                "(inf; and inf * 0 = NaN). Print every exp argument of your merge on row 0: one of "
                "them grows with the gap between the two maxima.",
                mistake="a factor that grows with the gap between the maxima overflows")
        if any(torch.isnan(t).any() for t in (m, ell, o)):
            raise CheckFailure(
                f"Your result contains NaN ({case}). A state that has seen no key has m = -inf, and "
                "exp(-inf - (-inf)) = exp(nan): choose what to subtract so that such a row stays 0, "
                "never NaN.")
        if all(_near(t, e) for t, e in zip((m, ell, o), expected)):
            continue
        if (gap := float32_gap((m, ell, o), expected)) is not None:  # float32's round-off only
            raise CheckFailure(float32_said(case, gap, "your (m, ell, o)"), mistake=FLOAT32_MISTAKE)
        top = torch.maximum(inputs[0], inputs[3])
        if m.shape == top.shape and not _near(m, top):
            rows = int((~((m == top) | (m - top).abs().le(1e-9 * (1 + top.abs())))).sum())
            smaller = _near(m, torch.minimum(inputs[0], inputs[3]))
            low = " = min(m_a, m_b), the smaller maximum" if smaller else ""
            raise CheckFailure(f"Not yet ({case}): observed m{low}: on {rows} of {m.numel()} rows your m is "
                               "not the larger of m_a and m_b, the maximum over all the keys of both "
                               "states.", mistake="m is not max(m_a, m_b)")
        for reason, wrong in merge_variants() + named_merges():
            if all(t.shape == x.shape and _near(t, x) for t, x in zip((m, ell, o), wrong(*inputs))):
                raise CheckFailure(f"Likely mistake ({case}): {reason}.", mistake=reason)
        names = [n for n, t, e in zip(("m", "ell", "o"), (m, ell, o), expected) if not _near(t, e)]
        raise CheckFailure(f"Not yet ({case}): {', '.join(names)} differ from the state of all the keys "
                           f"together{_merge_rows(inputs, (m, ell, o), expected)}. Check on one row "
                           "with pen and paper: m is the larger maximum, and every term exp(score - m_a) "
                           "becomes exp(score - m).")
    print(f"check_merge_states: all {len(_merge_cases())} cases right: the merged state is the "
          "softmax over all the keys (o / ell), also when a state has seen no key. Well done!")


# ----------------------------------------------------------------------------------------------
# check_flash_fix (debug)
# ----------------------------------------------------------------------------------------------


_FIX_CASES = [  # (case, L_q, L_k, d, d_v, block_k, the maximum grows in later blocks)
    ("L_q=12, L_k=40, d=8, block_k=16 (3 blocks, the last one short)", 12, 40, 8, 8, 16, True),
    ("L_q=5, L_k=33, d=4, d_v=6, block_k=8", 5, 33, 4, 6, 8, True),
    ("L_q=3, L_k=12, d=8, block_k=1 (one key per block)", 3, 12, 8, 8, 1, True),
    ("L_q=4, L_k=10, d=8, block_k=16 (one block holds every key)", 4, 10, 8, 8, 16, False),
    (LARGE_FIX_CASE := "L_q=6, L_k=40, d=8, block_k=16, float32, scores from about 100 to 1000",
     6, 40, 8, 8, 16, True),
    (LATE_MAX_CASE := "L_q=4, L_k=40, d=8, block_k=16, float32, the middle block's scores about 100 "
                      "above the other blocks'", 4, 40, 8, 8, 16, True),
    (LOW_FIX_CASE, 4, 40, 8, 8, 16, True),
]
_FLOAT32_CASES = (LARGE_FIX_CASE, LATE_MAX_CASE, LOW_FIX_CASE)
LARGE_FIX_TOL = 1e-3  # float32 scores near 1000 carry errors near 1e-4 in any correct loop


def _fix_inputs(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _, L_q, L_k, d, d_v, _, grows = _FIX_CASES[n]
    gen = torch.Generator().manual_seed(130 + n)
    if _FIX_CASES[n][0] == LOW_FIX_CASE:  # every score about -150: exp(score) is 0 in float32
        return low_fix_inputs(L_q, L_k, d, gen)
    q = torch.randn(L_q, d, generator=gen, dtype=torch.float64)
    k = 2 * torch.randn(L_k, d, generator=gen, dtype=torch.float64)
    if grows:  # later keys line up with the queries: the running maximum grows block after block
        k = k + torch.linspace(0, 3, L_k, dtype=torch.float64)[:, None] * q.mean(0)
    v = torch.randn(L_k, d_v, generator=gen, dtype=torch.float64)
    if _FIX_CASES[n][0] == LARGE_FIX_CASE:  # scores of 100 to 1000: exp(score) overflows float32
        u = torch.nn.functional.normalize(torch.randn(d, generator=gen, dtype=torch.float64), dim=0)
        q = u + 0.05 * torch.randn(L_q, d, generator=gen, dtype=torch.float64)
        k = (100 + 900 * torch.rand(L_k, 1, generator=gen, dtype=torch.float64)) * math.sqrt(d) * u
        k = k + torch.randn(L_k, d, generator=gen, dtype=torch.float64)
        q, k, v = q.float(), k.float(), v.float()
    if _FIX_CASES[n][0] == LATE_MAX_CASE:  # scores within 3 of 0, but about 100 in the middle block
        u = torch.nn.functional.normalize(torch.randn(d, generator=gen, dtype=torch.float64), dim=0)
        q = u + 0.02 * torch.randn(L_q, d, generator=gen, dtype=torch.float64)
        c = torch.cat([6 * torch.rand(16, generator=gen, dtype=torch.float64) - 3,
                       100 + 6 * torch.rand(16, generator=gen, dtype=torch.float64),
                       6 * torch.rand(L_k - 32, generator=gen, dtype=torch.float64) - 3])
        k = c[:, None] * math.sqrt(d) * u + 0.3 * torch.randn(L_k, d, generator=gen, dtype=torch.float64)
        q, k, v = q.float(), k.float(), v.float()
    return q, k, v


def _overflow(case: str, q: torch.Tensor, k: torch.Tensor, block_k: int, got: torch.Tensor) -> CheckFailure:
    """What is observed when a float32 case gives NaN or inf: where the scores are, block by block."""
    s = q.double() @ k.double().T / math.sqrt(q.size(-1))  # (L_q, L_k)
    first, later = s[:, :block_k].amax(-1), s[:, block_k:].amax(-1)
    gap = (later - first).max().item()
    tops = [s[:, j:j + block_k].amax().item() for j in range(0, s.size(1), block_k)]
    drop = max(max(tops[:n]) - tops[n] for n in range(1, len(tops))) if len(tops) > 1 else 0.0
    after = f", and a later block's largest score is {drop:.0f} below an earlier block's" if drop > 50 else ""
    return CheckFailure(
        f"Not yet ({case}): observed NaN/inf in {int((~torch.isfinite(got)).sum())} of {got.numel()} "
        f"outputs, in float32. Here the scores run from {s.min().item():.0f} to {s.max().item():.0f}; "
        f"the first block's largest score per row is {first.min().item():.1f} to "
        f"{first.max().item():.1f}; a later block's scores reach up to {gap:.0f} above it{after}. In "
        "float32, exp(x) is inf once x exceeds ~88 (exp(88.7) = 3.4e38); the earlier cases are right. "
        "Print the largest argument your exp receives, block by block.",
        mistake="NaN/inf in float32 when an exp argument exceeds ~88")


_FIX_SEEN = {"o": 0}
FIX_TOL = 2e-5  # float64 cases: 1e-9 passes, up to this is float32 round-off; bugs differ by 0.01+


@checker
def check_flash_fix(fn: Callable[..., Any]) -> None:
    """Check ``fn(q (L_q, d), k (L_k, d), v (L_k, d_v), block_k=16) -> (L_q, d_v)`` against SDPA."""
    try:
        _guarded(_check_flash_fix)(fn)
    except NotImplementedError as err:  # the stub's raise: untouched, or kept above the learner's loop
        raise kept_raise(fn, err) from None


def _check_flash_fix(fn: Callable[..., Any]) -> None:
    refused = _refuse(fn, "repair the loop of flash_one_head instead.")
    for n, (case, L_q, L_k, d, d_v, block_k, grows) in enumerate(_FIX_CASES):
        q, k, v = _fix_inputs(n)
        watch, fused = _Watch(), SdpaWatch()
        with calls_to(refused) as seen, fused, watch:
            try:
                got = _call(fn, q, k, v, block_k=block_k, case=case, rows=(L_q, d_v, "o"))
            except CheckFailure as failure:
                raise fix_sum_axis_failure(failure, L_q, L_k, block_k, case) from failure.__cause__
        if seen or watch.fused or fused.called:
            raise CheckFailure("Your function calls a ready-made attention (course_lib's or PyTorch's "
                               "scaled_dot_product_attention): repair the loop itself.")
        expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double())  # (L_q, d_v)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (L_q, d_v):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise CheckFailure(f"Your function returns {shape} ({case}); expected a tensor ({L_q}, {d_v}).")
        got = _f64(got)
        if L_k > block_k and watch.largest >= L_q * L_k > max(L_k * max(d, d_v), L_q * d):
            raise CheckFailure(f"Your function makes a tensor of shape {watch.largest_shape} ({case}): as "
                               f"large as all {L_q} x {L_k} scores. Keep the loop over blocks of keys.")
        diff = _max_diff(got, expected)
        if case in _FLOAT32_CASES:
            if not torch.isfinite(got).all():
                raise (CheckFailure(low_said(case, q, k, got) + ".", mistake="NaN when every score is "
                                    "below about -104 in float32") if case == LOW_FIX_CASE
                       else _overflow(case, q, k, block_k, got))
            if diff <= LARGE_FIX_TOL:
                continue
        elif diff <= 1e-9:
            continue
        elif diff <= FIX_TOL:  # float32's round-off in a float64 case
            raise CheckFailure(float32_said(case, diff, "your output"), mistake=FLOAT32_MISTAKE)
        tol = LARGE_FIX_TOL if case in _FLOAT32_CASES else FIX_TOL
        if m_zero_observed(fn, q, k, v, block_k, got, tol):
            bad = int((got - expected).abs().amax(-1).gt(FIX_TOL).sum())
            raise CheckFailure(f"Not yet ({case}): {M_ZERO_SAID.format(bad=bad)}.", mistake="m starts at 0")
        if _max_diff(got, one_head_loop(q, k, v, block_k, "o")) <= FIX_TOL:
            n_blocks = math.ceil(L_k / block_k)
            ones = sum(1 for numel in watch.one_exps if numel == L_q)
            if n_blocks >= 3 and ones >= n_blocks - 1:
                reason = "o's factor is exp(0) = 1 at every block"
                raise CheckFailure(
                    f"Not yet ({case}): your output equals the loop in which o is never rescaled, "
                    f"though your code does compute a factor for it: observed an exp that returns "
                    f"exactly 1 for all {L_q} rows at {ones} of {n_blocks} blocks, even where a row's "
                    "maximum grows. exp(x) is exactly 1 only for x = 0: print m and m_new at the "
                    "moment that factor is computed.", mistake=reason)
            _FIX_SEEN["o"] += 1
            one_block = one_head_loop(*_fix_inputs(3), 16, "o")
            exact_alone = _max_diff(one_block, F.scaled_dot_product_attention(*_fix_inputs(3))) <= FIX_TOL
            ones = _call(fn, q, k, torch.ones(L_k, 1, dtype=q.dtype), block_k=block_k, case=case)
            ones = _f64(ones).flatten() if isinstance(ones, torch.Tensor) else torch.ones(1)
            same = ("observed: your loop is the one given, unchanged but for the deleted raise line, "
                    "and so is its output: " if unchanged_stub(fn) else "")
            message = (f"Not yet ({case}): {same}your output differs from exact attention by up to "
                       f"{diff:.3g}. "
                       "With every value equal to 1, attention must return 1 in every row (its weights "
                       f"add up to 1); yours returns {ones.min().item():.3g} to {ones.max().item():.3g}. "
                       f"With every key in one block "
                       f"(block_k >= L_k) the same loop is {'exact' if exact_alone else 'not exact'}; "
                       "with keys in several blocks, the rows whose largest score arrives in a later "
                       "block come out wrong.")
            if _FIX_SEEN["o"] == 1:
                raise CheckFailure(message + " Follow m, ell and o through two blocks by hand, then run "
                                   "the checker again.")
            raise CheckFailure(message + " When m grows, ell is rescaled by alpha = exp(m - m_new); is "
                               "everything else that was summed from the old m? show_solution(\"13.flash_fix\") "
                               "shows a fix.")
        if named := fix_named_more(fn, q, k, v, block_k, got, case):
            raise CheckFailure(named[0] + ".", mistake=named[1])
        if _max_diff(got, one_head_loop(q, k, v, block_k, "o inverted")) <= FIX_TOL:
            bad = int((~torch.isfinite(got)).sum())
            if said := inverted_said(fn, q, k, v, block_k, case, bad, got.numel()):
                raise CheckFailure(said, mistake="ell's and o's factors are exp(m_new - m)")
            reason = "o's factor is exp(m_new - m), the inverse of ell's"
            raise CheckFailure(
                f"Not yet ({case}): observed {bad} of {got.numel()} outputs NaN or inf. Your o is "
                "multiplied by exp(m_new - m) at each block, while ell is multiplied by exp(m - m_new): "
                "print that factor at the first block (m = -inf) and when m grows.", mistake=reason)
        if _max_diff(got, fix_inverted_zeroed(q, k, v, block_k)) <= FIX_TOL:
            said = FIX_INVERTED_SAID.format(bad=int((got - expected).abs().amax(-1).gt(FIX_TOL).sum()))
            raise CheckFailure(f"Not yet ({case}): {said}.",
                               mistake="both factors exp(m_new - m), inf made 0")
        for knob, reason in FIX_MISTAKES:
            if _max_diff(got, one_head_loop(q, k, v, block_k, knob)) <= FIX_TOL:
                said = fix_reason(knob, reason, watch.one_exps, L_q, math.ceil(L_k / block_k))
                raise CheckFailure(f"Not yet ({case}): {said}.", mistake=reason)
        finite = torch.isfinite(got).all()
        bad = (got - expected).abs().amax(-1).gt(FIX_TOL) if finite else torch.ones(L_q).bool()
        rows = int(bad.sum())
        late = later_max_said(q, k, False, block_k, bad)
        size = (" (the size of float32 round-off: this case is float64, compared to 1e-9)"
                if diff < 1e-4 and case not in _FLOAT32_CASES else "")
        raise CheckFailure(f"Not yet ({case}): your output differs from exact attention by up to "
                           f"{diff:.3g}{size}, on {rows} of {L_q} rows{late}. Print m, ell and o "
                           "after each block for one query and compare with the softmax of its scores.")
    print(f"check_flash_fix: all {len(_FIX_CASES)} cases equal PyTorch's attention (blocks of 1 key, "
          "a short last block, one block for everything, float32 scores where exp(score) overflows or "
          "underflows). "
          "Well done!")


# ----------------------------------------------------------------------------------------------
# check_flash_forward (build, ★★★)
# ----------------------------------------------------------------------------------------------


_FORWARD_CASES = [  # (case, B, h, L_q, L_k, d, is_causal, block_q, block_k, dtype)
    ("B=2, h=3, L=64, head_dim=8, blocks 16 x 16", 2, 3, 64, 64, 8, False, 16, 16, torch.float64),
    ("B=1, h=2, L_q=37, L_k=50, head_dim=8, blocks 8 x 16 (they do not divide L)",
     1, 2, 37, 50, 8, False, 8, 16, torch.float64),
    ("B=2, h=2, L=70, head_dim=4, causal, blocks 16 x 8", 2, 2, 70, 70, 4, True, 16, 8, torch.float64),
    ("B=1, h=1, L_q=20, L_k=45, head_dim=8, causal (query i sees keys 0..i), blocks 8 x 5",
     1, 1, 20, 45, 8, True, 8, 5, torch.float64),
    ("B=1, h=2, L=40, head_dim=16, causal, float32, blocks 32 x 32", 1, 2, 40, 40, 16, True, 32, 32,
     torch.float32),
    ("B=1, h=1, L=10, head_dim=8, one tile larger than L (blocks 64 x 64)", 1, 1, 10, 10, 8, False, 64, 64,
     torch.float64),
]


def _forward_inputs(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _, B, h, L_q, L_k, d, _, _, _, dtype = _FORWARD_CASES[n]
    gen = torch.Generator().manual_seed(1300 + n)
    q = torch.randn(B, h, L_q, d, generator=gen, dtype=torch.float64)
    k = 2 * torch.randn(B, h, L_k, d, generator=gen, dtype=torch.float64)
    k = k + torch.linspace(0, 2, L_k, dtype=torch.float64)[:, None] * q.mean(2, keepdim=True)  # growing max
    v = torch.randn(B, h, L_k, d, generator=gen, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _check_causal_tiles(watch: _Watch, case: str, heads: int, L_q: int, L_k: int, bq: int, bk: int) -> None:
    """Refuse a causal loop that computes tiles entirely in the future (all of them masked): each
    such tile's exp is all zeros, while every needed tile has a key <= some query of it."""
    heights = {min(bq, L_q - i0) for i0 in range(0, L_q, bq)}
    widths = {min(bk, L_k - j0) for j0 in range(0, L_k, bk)}
    extra = sum(numel / (shape[-2] * shape[-1] * heads) for shape, numel in watch.zero_exps
                if shape[-2] in heights and shape[-1] in widths and shape[-2] > 1)
    if round(extra) < 1:
        return
    needed = sum(len(range(0, min(L_k, i0 + bq, L_q), bk)) for i0 in range(0, L_q, bq))
    raise CheckFailure(
        f"Right numbers, but {needed + round(extra)} tiles computed, {needed} needed at "
        f"{'L=' + str(L_q) if L_q == L_k else f'L_q={L_q}, L_k={L_k}'} with {bq}x{bk} blocks ({case}): "
        f"{round(extra)} tile(s) of scores were computed and then masked whole (every key after every "
        "query of the tile): the loop over key tiles goes on past the tile that holds the query "
        "tile's last position.", mistake="causal loop stops one tile late")


@checker
def check_flash_forward(fn: Callable[..., Any]) -> None:
    """Check ``fn(q, k, v, is_causal=False, block_q=32, block_k=32) -> (out, lse)``: FlashAttention's
    forward, against SDPA and logsumexp in float64; the tile and causal-skipping constraints too."""
    _guarded(_check_flash_forward)(fn)


def _check_flash_forward(fn: Callable[..., Any]) -> None:
    refused = [f for f in _refuse(fn, "design the tiled forward yourself.")
               if f is not flash.merge_softmax_states]  # welcome inside, as the exercise says
    for n, (case, B, h, L_q, L_k, d, causal, bq, bk, dtype) in enumerate(_FORWARD_CASES):
        q, k, v = _forward_inputs(n)
        given = [t.clone() for t in (q, k, v)]
        watch, fused = _Watch(), SdpaWatch()
        with calls_to(refused) as seen, fused, watch:
            got = _call(fn, *given, is_causal=causal, block_q=bq, block_k=bk, case=case,
                        hint="q, k, v are (B, h, L, head_dim); return (out, lse).",
                        rows=(min(bq, L_q), d, "a tile of the output"))
        if seen:
            names = ", ".join(dict.fromkeys(f"{f.__module__}.{f.__qualname__}" for f in seen))
            raise CheckFailure(f"Your function calls {names}, a ready-made attention this exercise rebuilds "
                               "(course_lib's merge_softmax_states is welcome): design the tiles yourself.")
        if watch.fused or fused.called:
            what = "flex_attention" if "flex" in watch.fused else "scaled_dot_product_attention"
            raise CheckFailure(f"Your function calls PyTorch's attention ({what}): that is the "
                               "kernel this exercise rebuilds. Matmuls, exp, max and sums are welcome.")
        if any(not torch.equal(a, b) for a, b in zip(given, (q, k, v))):
            raise CheckFailure(f"Your function changes q, k or v in place ({case}); build new tensors.")
        if not isinstance(got, (tuple, list)) or len(got) != 2 or not all(
                isinstance(t, torch.Tensor) for t in got):
            raise CheckFailure(f"Return a pair (out, lse) of tensors ({case}), got {type(got).__name__}.")
        out, lse = got
        if tuple(out.shape) != (B, h, L_q, d) or tuple(lse.shape) != (B, h, L_q):
            raise CheckFailure(f"Wrong shapes ({case}): out {tuple(out.shape)} and lse {tuple(lse.shape)}, "
                               f"expected {(B, h, L_q, d)} and {(B, h, L_q)}"
                               f"{forward_shapes_swapped(out, lse, (B, h, L_q, d), (B, h, L_q))}.")
        qd, kd, vd = (t.double() for t in (q, k, v))
        tol = 1e-9 if dtype == torch.float64 else 2e-5
        partial = partial_tile_message(_f64(out), _f64(lse), (qd, kd, vd), causal, bq, bk, tol)
        if partial:
            raise CheckFailure(f"Likely mistake ({case}): {partial}", mistake=PARTIAL_TILE)
        if not (torch.isfinite(out).all() and torch.isfinite(lse).all()):
            if causal:
                nd_out, nd_lse = ref_forward(*(t.double() for t in (q, k, v)), True, "no diagonal")
                tol_nd = 1e-9 if dtype == torch.float64 else 2e-5
                rows_bad = (~torch.isfinite(_f64(out)).all(-1)) | (~torch.isfinite(_f64(lse)))
                if (rows_bad.any() and not rows_bad[..., 1:].any()
                        and _max_diff(_f64(out)[..., 1:, :], nd_out[..., 1:, :]) <= tol_nd
                        and _max_diff(_f64(lse)[..., 1:], nd_lse[..., 1:]) <= tol_nd):
                    reason = "the causal mask hides the diagonal: a query may attend to its own position"
                    raise CheckFailure(
                        f"Likely mistake ({case}): observed NaN or inf in query 0's row only, and every "
                        "other row equals attention where query i sees keys 0..i-1: " + reason +
                        " (query 0 then sees no key at all).", mistake=reason)
            inv = tiled_forward_variant(*(t.double() for t in (q, k, v)), causal, bq, bk, "o inverted")
            if _max_diff(_f64(out), inv[0]) <= 1e-6 and _max_diff(_f64(lse), inv[1]) <= 1e-6:
                reason = "o is rescaled upside down, by exp(m_new - m) >= 1 (inf at the first tile, where m = -inf)"
                raise CheckFailure(
                    f"Likely mistake ({case}): observed NaN or inf in {int((~torch.isfinite(out)).sum())} "
                    f"of {out.numel()} outputs while lse is right: {reason}. When the maximum grows the "
                    "old terms shrink: o takes ell's factor, exp(m - m_new) <= 1.", mistake=reason)
            raise CheckFailure(f"Your out or lse contains NaN or inf ({case}): every query here sees at "
                               "least key 0. Look at rows whose tile is fully masked: exp(-inf - (-inf)) "
                               "is NaN.")
        tile_limit = max(B * h * bq * bk, B * h * max(L_q, L_k) * d)
        if watch.largest > tile_limit and L_q * L_k > tile_limit:
            raise CheckFailure(
                f"Your function makes a tensor of {watch.largest} numbers, shape {watch.largest_shape} "
                f"({case}): more than one tile of scores (B*h*block_q*block_k = {B * h * bq * bk}) and "
                "more than the inputs. The point of the exercise: never hold the (L_q, L_k) scores, nor "
                "an (L_q, L_k) mask, at once.")
        exp_out, exp_lse = ref_forward(qd, kd, vd, causal)
        d_out, d_lse = _max_diff(_f64(out), exp_out), _max_diff(_f64(lse), exp_lse)
        if d_out <= tol and d_lse <= tol:
            n_tiles = math.ceil(L_q / bq) * math.ceil(L_k / bk)
            if causal and n_tiles >= 9 and watch.exp_elements >= 0.9 * B * h * L_q * L_k:
                raise CheckFailure(
                    f"Right numbers, but every tile is computed ({case}): {watch.exp_elements} scores "
                    f"went through exp, as many as all {L_q} x {L_k} per head. A tile whose first key "
                    "comes after its last query is entirely in the future: skip it.")
            if causal:
                _check_causal_tiles(watch, case, B * h, L_q, L_k, bq, bk)
            if watch.exp_arg_max > RAW_EXP_SLACK and are_raw_scores(torch.cat(watch.exp_positive), qd, kd):
                raise CheckFailure(raw_exp_said(case, watch.exp_arg_max), mistake="exp of raw scores")
            continue
        for knob, tiled, reason in FORWARD_MISTAKES:
            wrong = (tiled_forward_variant(qd, kd, vd, causal, bq, bk, knob) if tiled
                     else ref_forward(qd, kd, vd, causal, knob))
            if _max_diff(_f64(out), wrong[0]) <= tol and _max_diff(_f64(lse), wrong[1]) <= tol:
                raise CheckFailure(f"Likely mistake ({case}): {reason}.", mistake=reason)
        if named := (forward_named(qd, kd, vd, causal, bq, bk, _f64(out), _f64(lse), tol)
                     or forward_named_more(qd, kd, vd, causal, bq, bk, _f64(out), _f64(lse), tol)):
            raise CheckFailure(f"Likely mistake ({case}): {named[0]}.", mistake=named[1])
        which = [name for name, diff in (("out", d_out), ("lse", d_lse)) if diff > tol]
        bad = ((_f64(out) - exp_out).abs().amax(-1) > tol) | ((_f64(lse) - exp_lse).abs() > tol)
        bad = ~(~bad | (torch.isinf(exp_lse) & (_f64(lse) == exp_lse)))  # (B, h, L_q)
        rows = bad.any(0).any(0).nonzero().flatten().tolist()
        tiles = sorted({r // bq for r in rows})
        where = (f"; observed in {len(rows)} of {L_q} query positions, in query tile(s) {tiles[:8]} "
                 f"of {math.ceil(L_q / bq)} (tiles of {bq} queries; first wrong query {rows[0]})"
                 if rows else "")
        only = {"out": " (lse is right)", "lse": " (out is right)"}.get(" and ".join(which), "")
        if dtype == torch.float64 and max(d_out, d_lse) < 1e-5:
            kind = next((f"{name} is returned as {t.dtype}" for name, t in (("out", out), ("lse", lse))
                         if t.dtype != torch.float64),
                        "out and lse come back as float64, so a step in between computes in float32")
            raise CheckFailure(
                f"Not yet ({case}): {' and '.join(which)} differ from SDPA's attention and the "
                f"logsumexp of the scores by at most {max(d_out, d_lse):.2g}{only}: the size of "
                "float32 round-off (float32 keeps about 7 digits, a relative step of 6e-8). This case is "
                f"float64 and is compared to 1e-9: observed that {kind} (a .float(), a tensor made "
                "without dtype=q.dtype, or a float32 constant).", mistake="float32 round-off in a "
                "float64 case")
        where += later_max_said(qd, kd, causal, bk, bad)
        raise CheckFailure(f"Not yet ({case}): {' and '.join(which)} differ from SDPA's attention and "
                           f"the logsumexp of the scores{only} (largest difference "
                           f"{max(d_out, d_lse):.3g}){where}. None of the usual mistakes explains it; "
                           "compare one query tile at a time on a small input.")
    print(f"check_flash_forward: all {len(_FORWARD_CASES)} cases equal SDPA and logsumexp (float64 to "
          "1e-9, float32 to 2e-5), never more than a tile of scores at once, causal tiles skipped. "
          "Well done!")


# ----------------------------------------------------------------------------------------------
# check_locate (build)
# ----------------------------------------------------------------------------------------------

_LOCATE_CASES = [  # (block_table, position, block_size)
    ([7, 2, 9], 0, 4), ([7, 2, 9], 5, 4), ([7, 2, 9], 11, 4), ([13, 4, 27, 11], 47, 16),
    ([13, 4, 27, 11], 16, 16), ([3], 2, 3), ([5, 8, 1, 0, 6], 13, 3), ([12, 30], 31, 16),
    ([6, 1, 4, 8], 9, 6),  # 9 / 6 = 1.5: round() and ceil() give block 2, floor gives 1
]


@checker
def check_locate(fn: Callable[..., Any]) -> None:
    """Check ``fn(block_table, position, block_size) -> (physical block, slot)``."""
    _guarded(_check_locate)(fn)


def _outcome(fn: Callable[..., Any], table: list[int], position: int, size: int) -> Any:
    """What ``fn`` gives for one case: its result (tensors as ints), or ``("raised", name, text)``."""
    try:
        with time_limit(TIME_LIMIT, f"Your code ran for more than {TIME_LIMIT:g} s and was stopped."):
            got = fn(list(table), position, size)
    except (NotImplementedError, CheckFailure):
        raise
    except Exception as err:  # a mistake's fingerprint, named below
        return ("raised", type(err).__name__, str(err))
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = int(got.item())
    if isinstance(got, (tuple, list)) and len(got) == 2:
        got = tuple(int(x.item()) if isinstance(x, torch.Tensor) and x.numel() == 1 else x for x in got)
    return got


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and a and a[0] == "raised":
        return isinstance(b, tuple) and bool(b) and b[0] == "raised" and a[1] == b[1]
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a result that cannot be compared matches nothing
        return False


def _check_locate(fn: Callable[..., Any]) -> None:
    _refuse(fn, "read the block table yourself (two lines).")
    outcomes = [_outcome(fn, t, p, s) for t, p, s in _LOCATE_CASES]
    rights = [(t[p // s], p % s) for t, p, s in _LOCATE_CASES]
    if all(_same(o, r) for o, r in zip(outcomes, rights)):
        print(f"check_locate: all {len(_LOCATE_CASES)} cases right. Well done!")
        return
    first = next(n for n, (o, r) in enumerate(zip(outcomes, rights)) if not _same(o, r))
    for reason, wrong in LOCATE_MISTAKES + NAMED_LOCATE:
        if all(_same(o, _outcome(wrong, t, p, s)) for o, (t, p, s) in zip(outcomes, _LOCATE_CASES)):
            table, position, size = _LOCATE_CASES[first]
            theirs = _outcome(wrong, table, position, size)
            asked = ""
            if isinstance(theirs, tuple) and theirs and theirs[0] == "raised" and ": " in theirs[2]:
                asked = ": it asked for " + theirs[2].split(": ", 1)[1]
            said = locate_observed(outcomes[first], table, position, size, asked)
            raise CheckFailure(f"Observed: {said}. All {len(_LOCATE_CASES)} cases match this mistake: "
                               f"{reason}.", mistake=reason)
    raise boundary_failure(outcomes, _LOCATE_CASES) or locate_failure(outcomes, _LOCATE_CASES)
