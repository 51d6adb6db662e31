"""Checkers for the exercises of lesson 13 (attention at scale).

* ``check_score_bytes(fn)``: ``fn() -> number``, the bytes of one layer's score matrix of GPT-2
  small (12 heads) at L = 32,768 in float32, one sequence (a "predict, then run" question).
* ``check_merge_states(fn)``: ``fn(m_a, ell_a, o_a, m_b, ell_b, o_b) -> (m, ell, o)``, the merge of
  two partial softmax states. Reference: course_lib's ``merge_softmax_states`` and the softmax;
  also an empty state and scores up to 1000 (absolute exponentials overflow there).
* ``check_flash_fix(fn)``: ``fn(q (L_q, d), k (L_k, d), v (L_k, d_v), block_k=16) -> (L_q, d_v)``,
  the repaired one-head tiled attention of the Debug exercise. Reference: PyTorch's SDPA; the last
  case is float32 with scores of 100 to 1000 (exp without the running maximum overflows).
* ``check_flash_forward(fn)``: ``fn(q, k, v, is_causal=False, block_q=32, block_k=32) -> (out, lse)``,
  the learner's FlashAttention forward (★★★). Reference: SDPA and ``torch.logsumexp`` of the
  scores; also checked: no tensor larger than a tile or the inputs, and causal tiles skipped (no
  tile computed that is masked whole).
* ``check_locate(fn)``: ``fn(block_table, position, block_size) -> (physical block, slot)``.

Every checker compares in float64, runs the learner's code under a time limit on one thread, and
turns any raw error into a message (the conventions of ``common``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .. import flash, paged
from .common import CheckFailure, calls_to, checker, is_course_lib, one_thread, time_limit

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


def _call(fn: Callable[..., Any], *args: Any, case: str, hint: str = "", **kwargs: Any) -> Any:
    """``fn(*args)`` under the time limit; a crash becomes a ``CheckFailure`` naming the case."""
    try:
        with time_limit(TIME_LIMIT, f"Your code ran for more than {TIME_LIMIT:g} s ({case}) and was "
                                    "stopped: does a loop never end (a step of 0, a while loop)?"):
            return fn(*args, **kwargs)
    except (NotImplementedError, CheckFailure):
        raise
    except Exception as err:
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


class _FusedWatch(TorchFunctionMode):
    """Records whether ``F.scaled_dot_product_attention`` is called (any backend, any dtype)."""

    def __init__(self) -> None:
        super().__init__()
        self.called = False

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if func is F.scaled_dot_product_attention:
            self.called = True
        return func(*args, **(kwargs or {}))


class _Watch(TorchDispatchMode):
    """Records, while the learner's code runs: the largest tensor any operation returns, the
    elements that go through ``exp`` (or a softmax), and whether SDPA or flex attention ran."""

    def __init__(self) -> None:
        super().__init__()
        self.largest, self.largest_shape, self.exp_elements, self.fused = 0, (), 0, ""
        self.zero_exps: list[tuple[tuple[int, ...], int]] = []  # (shape, numel) of all-zero exp outputs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)
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
        return out


# ----------------------------------------------------------------------------------------------
# check_score_bytes (predict)
# ----------------------------------------------------------------------------------------------

HEADS, TOKENS, BYTES = 12, 32 * 1024, 4


def score_bytes_answer() -> int:
    return HEADS * TOKENS * TOKENS * BYTES


_SCORE_MISCOUNTS = [  # (factor on the answer, what it means)
    (1 / HEADS, "that is one head's scores: every one of the 12 heads has its own (L, L) matrix"),
    (HEADS, "that counts 12 of something twice: one layer has 12 heads, and the question asks for "
            "one layer, not GPT-2 small's 12 layers"),
    (1 / BYTES, "that is the number of scores, not bytes: a float32 number takes 4 bytes"),
    (1 / 2, "half the answer: 2 bytes per number is float16 or bfloat16; float32 takes 4"),
    (2, "twice the answer: 8 bytes per number is float64, or you counted the scores and the "
        "softmax's probabilities (ask only for the scores, Q K^T)"),
    (1 / TOKENS, "that grows with L, not L^2: each of the L queries has a score for each of the L keys"),
    ((32000 / TOKENS) ** 2, "32k here is 32 * 1024 = 32,768 tokens, not 32,000"),
    (1 / (HEADS * BYTES), "that is one head's number of scores: count all 12 heads, 4 bytes each"),
    (0.5 + 0.5 / TOKENS, "that counts only the scores on and below the diagonal: the matrix Q K^T is "
                         "computed whole; the causal mask hides half of it afterwards"),
]


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
    for factor, reason in _SCORE_MISCOUNTS:
        if abs(got - right * factor) <= 1e-9 * right * factor:
            raise CheckFailure(f"Not quite: {reason}.", mistake=reason)
    for unit, name in ((2**30, "GiB"), (1e9, "GB"), (2**20, "MiB"), (1e6, "MB"), (2**10, "KiB"),
                       (1e3, "kB")):
        if abs(got - right / unit) <= 0.01 * right / unit:
            raise CheckFailure(f"Observed: {got:,g}, which is the answer in {name} ({right:,} bytes / "
                               f"{unit:,g}): return plain bytes.", mistake=f"answer in {name}")
    raise CheckFailure("Not quite: " + ("too small: a factor is missing" if got < right else
                                        "too large: a factor is too big") +
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
    return cases


LARGE_MERGE_CASE = "4 rows, 4 + 6 keys, large scores (100 to 1000)"


def _merge_mistakes() -> list[tuple[str, Callable[..., tuple[torch.Tensor, ...]]]]:
    def scaled(m_a, ell_a, o_a, m_b, ell_b, o_b, inverted=False):
        m = torch.maximum(m_a, m_b)
        ref = torch.where(torch.isinf(m), 0.0, m)
        a, b = (torch.exp(ref - m_a), torch.exp(ref - m_b)) if inverted else (
            torch.exp(m_a - ref), torch.exp(m_b - ref))
        return m, a, b

    def no_o(*s):
        m, a, b = scaled(*s)
        return m, a * s[1] + b * s[4], s[2] + s[5]

    def no_ell(*s):
        m, a, b = scaled(*s)
        return m, s[1] + s[4], a[..., None] * s[2] + b[..., None] * s[5]

    def nothing(*s):
        return torch.maximum(s[0], s[3]), s[1] + s[4], s[2] + s[5]

    def inverted(*s):
        m, a, b = scaled(*s, inverted=True)
        return m, a * s[1] + b * s[4], a[..., None] * s[2] + b[..., None] * s[5]

    def normalised(*s):
        m, ell, o = flash.merge_softmax_states(*s)
        return m, ell, o / ell[..., None]

    def max_of_o(*s):
        m, ell, _ = flash.merge_softmax_states(*s)
        m_a_wins = (s[0] >= s[3])[..., None]
        return m, ell, torch.where(m_a_wins, s[2], s[5])

    return [
        ("o not rescaled: the output sums o_a + o_b as they are, while ell is rescaled. Each state's "
         "o is measured from its own maximum; bring both to the new maximum m, with the same "
         "factors exp(m_a - m) and exp(m_b - m) as ell", no_o),
        ("ell not rescaled: ell_a + ell_b as they are. Each sum of exp(score - m_a) must be brought "
         "to the new maximum: times exp(m_a - m)", no_ell),
        ("neither ell nor o rescaled: each state's sums are measured from its own maximum; multiply "
         "state a's by exp(m_a - m) and state b's by exp(m_b - m) before adding", nothing),
        ("rescaled the wrong way: exp(m - m_a) instead of exp(m_a - m). The new maximum is larger, "
         "so the older terms shrink: the factor is <= 1", inverted),
        ("o divided by ell: return the running sum o, not yet divided; the division happens once, "
         "after the last block, so that later merges can still rescale it", normalised),
        ("o of the state with the larger maximum only: both states' values count, each rescaled",
         max_of_o),
    ]


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
                        hint="The inputs are m (...), ell (...), o (..., d_v) of state a, then of state b.")
        if seen:
            raise CheckFailure("Your function calls course_lib's merge_softmax_states, the function this "
                               "exercise builds: write the merge yourself.")
        if any(not torch.equal(a, b) for a, b in zip(given, inputs)):
            raise CheckFailure(f"Your function changes its inputs in place ({case}); build new tensors.")
        if not isinstance(got, (tuple, list)) or len(got) != 3 or not all(
                isinstance(t, torch.Tensor) for t in got):
            raise CheckFailure(f"Return three tensors (m, ell, o), got {type(got).__name__} ({case}).")
        m, ell, o = (_f64(t) for t in got)
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
        if any(torch.isnan(t).any() for t in (m, ell, o)):
            raise CheckFailure(
                f"Your result contains NaN ({case}). A state that has seen no key has m = -inf, and "
                "exp(-inf - (-inf)) = exp(nan): choose what to subtract so that such a row stays 0, "
                "never NaN.")
        if all(_near(t, e) for t, e in zip((m, ell, o), expected)):
            continue
        for reason, wrong in _merge_mistakes():
            if all(t.shape == x.shape and _near(t, x) for t, x in zip((m, ell, o), wrong(*inputs))):
                raise CheckFailure(f"Likely mistake ({case}): {reason}.", mistake=reason)
        names = [n for n, t, e in zip(("m", "ell", "o"), (m, ell, o), expected) if not _near(t, e)]
        raise CheckFailure(f"Not yet ({case}): {', '.join(names)} differ from the state of all the keys "
                           "together. Check on one row with pen and paper: m is the larger maximum, and "
                           "every term exp(score - m_a) becomes exp(score - m).")
    print(f"check_merge_states: all {len(_merge_cases())} cases right: the merged state is the "
          "softmax over all the keys (o / ell), also when a state has seen no key. Well done!")


# ----------------------------------------------------------------------------------------------
# check_flash_fix (debug)
# ----------------------------------------------------------------------------------------------


def _one_head(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_k: int, knob: str = "") -> torch.Tensor:
    """The Debug exercise's loop, right (knob "") or with one of the usual bugs."""
    scale = 1.0 if knob == "no scale" else 1.0 / math.sqrt(q.size(-1))
    m = torch.full((q.size(0),), -math.inf, dtype=q.dtype)
    ell = torch.zeros(q.size(0), dtype=q.dtype)
    o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
    stop = k.size(0) - block_k + 1 if knob == "last block dropped" else k.size(0)
    for start in range(0, max(stop, 1), block_k):
        s = q @ k[start:start + block_k].T * scale
        m_new = torch.maximum(m, s.amax(-1))
        p = torch.exp(s - m_new[:, None])
        alpha = torch.exp(m - m_new)
        ell = (ell if knob == "neither" else alpha * ell) + p.sum(-1)
        if knob == "o inverted":
            alpha = torch.exp(m_new - m)
        o = (o if knob in ("o", "neither") else alpha[:, None] * o) + p @ v[start:start + block_k]
        m = m_new
    return o / ell[:, None]


_FIX_CASES = [  # (case, L_q, L_k, d, d_v, block_k, the maximum grows in later blocks)
    ("L_q=12, L_k=40, d=8, block_k=16 (3 blocks, the last one short)", 12, 40, 8, 8, 16, True),
    ("L_q=5, L_k=33, d=4, d_v=6, block_k=8", 5, 33, 4, 6, 8, True),
    ("L_q=3, L_k=12, d=8, block_k=1 (one key per block)", 3, 12, 8, 8, 1, True),
    ("L_q=4, L_k=10, d=8, block_k=16 (one block holds every key)", 4, 10, 8, 8, 16, False),
    (LARGE_FIX_CASE := "L_q=6, L_k=40, d=8, block_k=16, float32, scores from about 100 to 1000",
     6, 40, 8, 8, 16, True),
]
LARGE_FIX_TOL = 1e-3  # float32 scores near 1000 carry errors near 1e-4 in any correct loop


def _fix_inputs(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _, L_q, L_k, d, d_v, _, grows = _FIX_CASES[n]
    gen = torch.Generator().manual_seed(130 + n)
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
    return q, k, v


_FIX_SEEN = {"o": 0}
FIX_TOL = 2e-5  # float32 arithmetic inside passes; the usual bugs differ by 0.01 or more


@checker
def check_flash_fix(fn: Callable[..., Any]) -> None:
    """Check ``fn(q (L_q, d), k (L_k, d), v (L_k, d_v), block_k=16) -> (L_q, d_v)`` against SDPA."""
    _guarded(_check_flash_fix)(fn)


def _check_flash_fix(fn: Callable[..., Any]) -> None:
    refused = _refuse(fn, "repair the loop of flash_one_head instead.")
    for n, (case, L_q, L_k, d, d_v, block_k, grows) in enumerate(_FIX_CASES):
        q, k, v = _fix_inputs(n)
        watch, fused = _Watch(), _FusedWatch()
        with calls_to(refused) as seen, fused, watch:
            got = _call(fn, q, k, v, block_k=block_k, case=case)
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
        if case == LARGE_FIX_CASE:
            if not torch.isfinite(got).all():
                top = (q.double() @ k.double().T / math.sqrt(d)).max().item()
                raise CheckFailure(
                    f"Not yet ({case}): observed NaN/inf in {int((~torch.isfinite(got)).sum())} of "
                    f"{got.numel()} outputs, in float32, where the scores reach {top:.0f}. The cases before "
                    "it are right. In float32, exp overflows once scores exceed ~88.",
                    mistake="NaN/inf in float32 when scores exceed ~88")
            if diff <= LARGE_FIX_TOL:
                continue
        elif diff <= FIX_TOL:
            continue
        if _max_diff(got, _one_head(q, k, v, block_k, "o")) <= FIX_TOL:
            _FIX_SEEN["o"] += 1
            one_block = _one_head(*_fix_inputs(3), 16, "o")
            exact_alone = _max_diff(one_block, F.scaled_dot_product_attention(*_fix_inputs(3))) <= FIX_TOL
            ones = _call(fn, q, k, torch.ones(L_k, 1, dtype=q.dtype), block_k=block_k, case=case)
            ones = _f64(ones).flatten() if isinstance(ones, torch.Tensor) else torch.ones(1)
            message = (f"Not yet ({case}): your output differs from exact attention by up to {diff:.3g}. "
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
        if _max_diff(got, _one_head(q, k, v, block_k, "o inverted")) <= FIX_TOL:
            bad = int((~torch.isfinite(got)).sum())
            reason = "o's factor is exp(m_new - m), the inverse of ell's"
            raise CheckFailure(
                f"Not yet ({case}): observed {bad} of {got.numel()} outputs NaN or inf. Your o is "
                "multiplied by exp(m_new - m) at each block, while ell is multiplied by exp(m - m_new): "
                "print that factor at the first block (m = -inf) and when m grows.", mistake=reason)
        for knob, reason in (("neither", "neither ell nor o shrinks when the maximum grows: the terms "
                                         "summed before stay measured from the old maximum"),
                             ("last block dropped", "the keys of the last, shorter block are never read: "
                                                    "L_k is not a multiple of block_k here"),
                             ("no scale", "the scores are not divided by sqrt(head_dim)")):
            if _max_diff(got, _one_head(q, k, v, block_k, knob)) <= FIX_TOL:
                raise CheckFailure(f"Not yet ({case}): {reason}.", mistake=reason)
        raise CheckFailure(f"Not yet ({case}): your output differs from exact attention by up to "
                           f"{diff:.3g}. Print m, ell and o after each block for one query and compare "
                           "with the softmax of its scores.")
    print(f"check_flash_fix: all {len(_FIX_CASES)} cases equal PyTorch's attention (blocks of 1 key, "
          "a short last block, one block for everything). Well done!")


# ----------------------------------------------------------------------------------------------
# check_flash_forward (build, ★★★)
# ----------------------------------------------------------------------------------------------


def _ref_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, knob: str = ""
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention and log-sum-exp from the whole score matrix, right (knob "") or wrong."""
    L_q, L_k = q.size(-2), k.size(-2)
    scale = 1.0 if knob == "no scale" else 1.0 / math.sqrt(q.size(-1))
    s = q @ k.transpose(-2, -1) * scale
    if is_causal:
        offset = {"bottom-right": L_k - L_q, "no diagonal": -1}.get(knob, 0)
        s = s.masked_fill(~torch.ones(L_q, L_k, dtype=torch.bool).tril(offset), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    out = torch.nan_to_num(torch.softmax(s, dim=-1)) @ v
    if knob == "lse without m":
        lse = torch.log(torch.exp(s - s.amax(-1, keepdim=True)).sum(-1))
    if knob == "lse log2":
        lse = lse / math.log(2)
    if knob == "lse without log":
        top = s.amax(-1)
        lse = top + torch.exp(s - top[..., None]).sum(-1)
    return out, lse


def _tiled_knob(q, k, v, is_causal, bq, bk, knob):  # noqa: ANN001, ANN202
    """The tiled forward with a bug that only tiles show: o not rescaled, lse saved too early,
    the last short tile dropped, output not divided by ell."""
    B, h, L_q, _ = q.shape
    L_k, scale = k.size(2), 1.0 / math.sqrt(q.size(-1))
    out, lse = torch.zeros(B, h, L_q, v.size(-1), dtype=q.dtype), torch.zeros(B, h, L_q, dtype=q.dtype)
    for i0 in range(0, L_q, bq):
        i1 = min(i0 + bq, L_q)
        m = torch.full((B, h, i1 - i0), -math.inf, dtype=q.dtype)
        ell, o = torch.zeros_like(m), torch.zeros(B, h, i1 - i0, v.size(-1), dtype=q.dtype)
        first_lse = None
        stop = L_k - bk + 1 if knob == "last tile dropped" else L_k
        for j0 in range(0, max(stop, 1), bk):
            if is_causal and j0 > i1 - 1:
                break
            j1 = min(j0 + bk, L_k)
            s = q[:, :, i0:i1] @ k[:, :, j0:j1].transpose(-2, -1) * scale
            if is_causal:
                s = s.masked_fill(torch.arange(j0, j1)[None] > torch.arange(i0, i1)[:, None], -math.inf)
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m - m_new)
            ell = alpha * ell + p.sum(-1)
            if knob == "o inverted":
                alpha = torch.exp(m_new - m)
            o = (o if knob == "o not rescaled" else alpha[..., None] * o) + p @ v[:, :, j0:j1]
            if knob in ("divided every tile", "divided every tile and at the end"):
                o = o / ell[..., None]
            m = m_new
            if first_lse is None:
                first_lse = m + torch.log(ell)
        out[:, :, i0:i1] = o if knob in ("not divided", "divided every tile") else o / ell[..., None]
        lse[:, :, i0:i1] = first_lse if knob == "lse too early" else m + torch.log(ell)
    return out, lse


_FORWARD_MISTAKES = [  # (knob, tiled?, what it is)
    ("o not rescaled", True, "lse is right but out is not, in the rows whose largest score arrives in "
                             "a later tile of keys; out equals a loop whose o is not rescaled when the "
                             "running maximum grows (the Debug exercise's bug)"),
    ("lse too early", True, "the log-sum-exp is saved after the first tile of keys, not after the last: "
                            "the output is right, lse is not. Compute L_i = m + log(ell) once every "
                            "tile of keys has been merged"),
    ("last tile dropped", True, "the last, shorter tile is never read (its length is not a multiple of "
                                "the block size): let the last tile end at min(start + block, L)"),
    ("not divided", True, "the output is not divided by ell after the last tile"),
    ("divided every tile", True, "o is divided by the running sum ell in every tile, while the next "
                                 "tile still adds unnormalised terms to it: divide once, after the "
                                 "last tile"),
    ("divided every tile and at the end", True, "o is divided by the running sum ell in every tile (and "
                                                "again at the end): keep o unnormalised in the loop and "
                                                "divide once, after the last tile"),
    ("lse without log", False, "lse is m + ell, the log-sum-exp without the log: L_i = m + log(ell)"),
    ("no scale", False, "the scores are not divided by sqrt(head_dim)"),
    ("bottom-right", False, "the causal mask is aligned to the bottom right (query i sees keys up to "
                            "i + L_k - L_q): this exercise uses SDPA's is_causal, query i sees keys 0..i"),
    ("no diagonal", False, "the causal mask hides the diagonal: a query may attend to its own position"),
    ("lse without m", False, "lse is log(ell) without the running maximum: L_i = m + log(ell)"),
    ("lse log2", False, "lse is in base 2: use the natural logarithm, as torch.logsumexp"),
]

_FORWARD_CASES = [  # (case, B, h, L_q, L_k, d, is_causal, block_q, block_k, dtype)
    ("B=2, h=3, L=64, head_dim=8, blocks 16 x 16", 2, 3, 64, 64, 8, False, 16, 16, torch.float64),
    ("B=1, h=2, L_q=37, L_k=50, head_dim=8, blocks 8 x 16 (they do not divide L)",
     1, 2, 37, 50, 8, False, 8, 16, torch.float64),
    ("B=2, h=2, L=70, head_dim=4, causal, blocks 16 x 8", 2, 2, 70, 70, 4, True, 16, 8, torch.float64),
    ("B=1, h=1, L_q=20, L_k=45, head_dim=8, causal (query i sees keys 0..i), blocks 8 x 8",
     1, 1, 20, 45, 8, True, 8, 8, torch.float64),
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
        "tile's last position.",
        mistake="causal loop stops one tile late")


@checker
def check_flash_forward(fn: Callable[..., Any]) -> None:
    """Check ``fn(q, k, v, is_causal=False, block_q=32, block_k=32) -> (out, lse)``: FlashAttention's
    forward, against SDPA and logsumexp in float64; the tile and causal-skipping constraints too."""
    _guarded(_check_flash_forward)(fn)


def _check_flash_forward(fn: Callable[..., Any]) -> None:
    refused = _refuse(fn, "design the tiled forward yourself.")
    for n, (case, B, h, L_q, L_k, d, causal, bq, bk, dtype) in enumerate(_FORWARD_CASES):
        q, k, v = _forward_inputs(n)
        given = [t.clone() for t in (q, k, v)]
        watch, fused = _Watch(), _FusedWatch()
        with calls_to(refused) as seen, fused, watch:
            got = _call(fn, *given, is_causal=causal, block_q=bq, block_k=bk, case=case,
                        hint="q, k, v are (B, h, L, head_dim); return (out, lse).")
        if seen:
            raise CheckFailure("Your function calls course_lib's FlashAttention (course_lib.flash), the "
                               "reference: design the tiles yourself.")
        if watch.fused or fused.called:
            raise CheckFailure("Your function calls PyTorch's attention (scaled_dot_product_attention or "
                               "flex_attention): that is the "
                               "kernel this exercise rebuilds. Matmuls, exp, max and sums are welcome.")
        if any(not torch.equal(a, b) for a, b in zip(given, (q, k, v))):
            raise CheckFailure(f"Your function changes q, k or v in place ({case}); build new tensors.")
        if not isinstance(got, (tuple, list)) or len(got) != 2 or not all(
                isinstance(t, torch.Tensor) for t in got):
            raise CheckFailure(f"Return a pair (out, lse) of tensors ({case}), got {type(got).__name__}.")
        out, lse = got
        if tuple(out.shape) != (B, h, L_q, d) or tuple(lse.shape) != (B, h, L_q):
            raise CheckFailure(f"Wrong shapes ({case}): out {tuple(out.shape)} and lse {tuple(lse.shape)}, "
                               f"expected {(B, h, L_q, d)} and {(B, h, L_q)}.")
        if not (torch.isfinite(out).all() and torch.isfinite(lse).all()):
            if causal:
                nd_out, nd_lse = _ref_forward(*(t.double() for t in (q, k, v)), True, "no diagonal")
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
            inv = _tiled_knob(*(t.double() for t in (q, k, v)), causal, bq, bk, "o inverted")
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
        qd, kd, vd = (t.double() for t in (q, k, v))
        exp_out, exp_lse = _ref_forward(qd, kd, vd, causal)
        tol = 1e-9 if dtype == torch.float64 else 2e-5
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
            continue
        for knob, tiled, reason in _FORWARD_MISTAKES:
            wrong = (_tiled_knob(qd, kd, vd, causal, bq, bk, knob) if tiled
                     else _ref_forward(qd, kd, vd, causal, knob))
            if _max_diff(_f64(out), wrong[0]) <= tol and _max_diff(_f64(lse), wrong[1]) <= tol:
                raise CheckFailure(f"Likely mistake ({case}): {reason}.", mistake=reason)
        which = [name for name, diff in (("out", d_out), ("lse", d_lse)) if diff > tol]
        raise CheckFailure(f"Not yet ({case}): {' and '.join(which)} differ from SDPA's attention and "
                           f"the logsumexp of the scores (largest difference {max(d_out, d_lse):.3g}). "
                           "None of the usual mistakes explains it; compare one query tile at a time "
                           "on a small input.")
    print(f"check_flash_forward: all {len(_FORWARD_CASES)} cases equal SDPA and logsumexp (float64 to "
          "1e-9, float32 to 2e-5), never more than a tile of scores at once, causal tiles skipped. "
          "Well done!")


# ----------------------------------------------------------------------------------------------
# check_locate (build)
# ----------------------------------------------------------------------------------------------

_LOCATE_CASES = [  # (block_table, position, block_size)
    ([7, 2, 9], 0, 4), ([7, 2, 9], 5, 4), ([7, 2, 9], 11, 4), ([13, 4, 27, 11], 47, 16),
    ([13, 4, 27, 11], 16, 16), ([3], 2, 3), ([5, 8, 1, 0, 6], 13, 3), ([12, 30], 31, 16),
]


@checker
def check_locate(fn: Callable[..., Any]) -> None:
    """Check ``fn(block_table, position, block_size) -> (physical block, slot)``."""
    _guarded(_check_locate)(fn)


def _check_locate(fn: Callable[..., Any]) -> None:
    _refuse(fn, "read the block table yourself (two lines).")
    for table, position, size in _LOCATE_CASES:
        case = f"block_table {table}, position {position}, block_size {size}"
        got = _call(fn, list(table), position, size, case=case)
        if isinstance(got, (tuple, list)) and len(got) == 2:
            got = tuple(int(x.item()) if isinstance(x, torch.Tensor) else x for x in got)
        logical, slot = divmod(position, size)
        right = (table[logical], slot)
        if got == right:
            continue
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = int(got.item())
        if isinstance(got, numbers.Integral) and got == table[logical] * size + slot:
            raise CheckFailure(f"({case}) observed {got}: an index into the pool's flat array of slots "
                               f"(block * block_size + slot); return the pair (physical block "
                               f"table[{logical}] = {table[logical]}, slot {slot}).",
                               mistake="the pool's flat index")
        if not (isinstance(got, tuple) and len(got) == 2):
            raise CheckFailure(f"Return a pair (physical block, slot), got {got!r} ({case}).")
        if got == (logical, slot):
            raise CheckFailure(f"({case}) you return the logical block {logical}: the block table maps it "
                               f"to the physical block table[{logical}] = {table[logical]}.")
        if got == (slot, table[logical]) or got == (slot, logical):
            raise CheckFailure(f"({case}) the two numbers are swapped: return (physical block, slot).")
        if got[1] == slot and got[0] != table[logical] and 0 <= logical - 1 < len(table) and \
                got[0] == table[logical - 1]:
            raise CheckFailure(f"({case}) one block too early: position {position} is in logical block "
                               f"{position} // {size} = {logical} (blocks count from 0).")
        if position >= 1:
            earlier = divmod(position - 1, size)
            if got == (table[earlier[0]], earlier[1]):
                raise CheckFailure(f"({case}) observed {got}: that is where position {position - 1} is "
                                   f"stored, not {position}. Positions count from 0; use the position as "
                                   "it is, not position - 1.", mistake="position - 1")
        else:
            if got == (table[-1], size - 1):
                raise CheckFailure(f"({case}) observed {got}: the last slot of the last block, where "
                                   "position -1 would be. Positions count from 0; use the position as "
                                   "it is, not position - 1.", mistake="position - 1")
        flat = table[logical] * size + slot
        if got[0] == flat or got == (flat, slot) or got == (logical * size + slot, slot):
            raise CheckFailure(f"({case}) observed {got}: {got[0]} is an index into the pool's flat array "
                               f"of slots (block * block_size + slot); return the physical block "
                               f"table[{logical}] = {table[logical]} and the slot {slot} apart.",
                               mistake="the pool's flat index")
        n = len(table)
        by_len = (table[position // n] if position // n < n else None, position % n)
        if got == by_len or (got[0] == table[logical] and got[1] == position % n != slot) or (
                got[1] == slot and position // n < n and got[0] == table[position // n] != table[logical]):
            raise CheckFailure(f"({case}) observed {got}: that divides by the table's length {n}, not by "
                               f"block_size = {size}. Each block holds block_size positions; the table "
                               "only says where each block is.", mistake="division by the table's length")
        raise CheckFailure(f"Not yet ({case}): you return {got}, expected {right}. Logical block n holds "
                           "positions n * block_size .. (n + 1) * block_size - 1.")
    print(f"check_locate: all {len(_LOCATE_CASES)} cases right. Well done!")
