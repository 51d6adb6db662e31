"""The usual mistakes of lesson 13's exercises, as code: ``lesson13_scale``'s checkers compute what
each candidate mistake returns on the same inputs and name the one that matches ("differential
diagnosis"). Nothing here is a checker; every function is a wrong (or right) variant of the thing the
learner builds.

* ``SCORE_MISCOUNTS``: factors on the score bytes, with what each means.
* ``merge_variants()``: wrong merges of two softmax states ``(m, ell, o)``.
* ``one_head_loop(q (L_q, d), k (L_k, d), v (L_k, d_v), block_k, knob) -> (L_q, d_v)``: the Debug
  exercise's loop, right (knob "") or with one bug; ``FIX_MISTAKES`` lists the knobs.
* ``ref_forward`` and ``tiled_forward_variant``: FlashAttention's forward ``(out, lse)``, right or wrong;
  ``FORWARD_MISTAKES`` lists the knobs.
* ``partial_tile_message(out, lse, (q, k, v), causal, bq, bk, tol)``: what is observed when the last,
  partial query or key tile is left out ("" otherwise).
* ``LOCATE_MISTAKES``: wrong readings of a block table, ``fn(table, position, block_size)``.
* ``broadcast_hint(err, rows, what)``: a clear sentence for a per-row factor that was not made a column.
"""

from __future__ import annotations

import ast
import inspect
import math
import re
import textwrap
from collections.abc import Callable
from typing import Any

import torch

from .. import flash
from .common import CheckFailure

__all__ = ["later_max_said", "SCORE_MISCOUNTS", "score_decompositions", "merge_variants", "one_head_loop", "FIX_MISTAKES", "ref_forward",
           "tiled_forward_variant", "FORWARD_MISTAKES", "LOCATE_MISTAKES", "broadcast_hint",
           "PARTIAL_TILE", "partial_tile_message", "fix_reason", "kept_raise", "FIX_STUB",
           "unchanged_stub", "FLOAT32_MISTAKE", "float32_said", "float32_gap"]

HEADS, TOKENS, BYTES, D_MODEL, HEAD_DIM = 12, 32 * 1024, 4, 768, 64

_ONE_HEAD = "one head's scores: every one of the 12 heads has its own (L, L) matrix"
_BITS = ("8 times too large: that counts bits, 32 per float32 number; a byte is 8 bits, so a float32 "
         "number takes 4 bytes")
SCORE_MISCOUNTS: list[tuple[float, str]] = [  # (factor on the answer, what it means)
    (1 / HEADS, "that is " + _ONE_HEAD),
    (HEADS, "that counts 12 of something twice: one layer has 12 heads, and the question asks for "
            "one layer, not GPT-2 small's 12 layers"),
    (1 / BYTES, "that is the number of scores, not bytes: a float32 number takes 4 bytes"),
    (1 / 2, "half the answer, which fits two readings: either 2 bytes per number (float16 or "
            "bfloat16; float32 takes 4), or only half of the (L, L) matrix, as if a causal mask "
            "saved the masked half (Q K^T is computed whole; the mask hides half of it afterwards)"),
    (2, "twice the answer: 8 bytes per number is float64, or you counted the scores and the "
        "softmax's probabilities (ask only for the scores, Q K^T)"),
    (8, "exactly " + _BITS),
    (8 / HEADS, "8/12 of the answer: 8 times too large (bits: 32 per float32 number, not 4 bytes) and "
                "12 times too small (" + _ONE_HEAD + ")"),
    (2 / HEADS, "1/6 of the answer: " + _ONE_HEAD + ", and 8 bytes per number (float64) where float32 "
                "takes 4"),
    (1 / (2 * HEADS), "1/24 of the answer: " + _ONE_HEAD + ", and 2 bytes per number (float16) where "
                      "float32 takes 4"),
    (1 / TOKENS, "that grows with L, not L^2: each of the L queries has a score for each of the L keys"),
    ((32000 / TOKENS) ** 2, "32k here is 32 * 1024 = 32,768 tokens, not 32,000"),
    (1 / (HEADS * BYTES), "that is one head's number of scores: count all 12 heads, 4 bytes each"),
    (0.5 + 0.5 / TOKENS, "that counts only the scores on and below the diagonal: the matrix Q K^T is "
                         "computed whole; the causal mask hides half of it afterwards"),
    (D_MODEL / TOKENS, "768/32,768 of the answer: that is L x 768 (d_model) numbers per head where the "
                       "scores have L x L, one per (query, key) pair; 768 is the width of a token's "
                       "vector, not the number of keys"),
    (HEAD_DIM / TOKENS, "64/32,768 of the answer: that is the size of Q (12 heads x L x 64 = L x 768 "
                        "numbers), not of the scores Q K^T, which have L x L per head"),
    (HEAD_DIM, "64 times the answer, and 64 = 768 / 12 fits two readings: either d_model = 768 in "
               "place of the 12 heads (each of the 12 heads has one (L, L) matrix; 768 is the width "
               "of a token's vector), or each score counted as head_dim = 64 numbers (a score is one "
               "number, a dot product of two 64-number vectors)"),
    (1 / 32, "1/32 of the answer, as if the scores grew like L: 32,768 tokens are 32 times 1,024, "
             "and observed 32 x (the count for 1,024 tokens); each of the L queries has a score for "
             "each of the L keys, so 32 times the tokens is 32 x 32 = 1,024 times the scores"),
    (D_MODEL, "768 times the answer: each score is one number per head, not d_model = 768 numbers"),
]


_SCORE_SLOTS = [  # (the question's factor, {value: what that value means, "" for the right one})
    ("heads", {HEADS: "", 1: "1 head, not 12", D_MODEL: "d_model = 768 in place of the 12 heads",
               HEADS * HEADS: "12 layers x 12 heads, not one layer's 12 heads"}),
    ("queries", {TOKENS: "", 32000: "32,000 queries, not 32,768", 1024: "1,024 queries, not 32,768"}),
    ("keys", {TOKENS: "", 32000: "32,000 keys, not 32,768", 1024: "1,024 keys, not 32,768",
              HEAD_DIM: "head_dim = 64 in place of the 32,768 keys", 1: "no keys axis (L, not L²)"}),
    ("bytes", {BYTES: "", 1: "1 byte a number (numbers, not bytes)", 2: "2 bytes a number (float16)",
               8: "8 bytes a number (float64)", 32: "32 a number (bits, not bytes)"}),
    ("extra", {1: "", HEAD_DIM: "an extra factor head_dim = 64 (a score is one number)",
               2: "an extra factor 2 (scores and probabilities both counted)"}),
]


def score_decompositions(got: float) -> list[str]:
    """The readings of ``got`` as heads x queries x keys x bytes (x an extra factor) with the fewest
    slots off the question's 12 x 32,768 x 32,768 x 4, each as what is off; [] when none fits."""
    best: list[list[str]] = []
    readings: list[tuple[float, list[str]]] = [(1.0, [])]
    for _, values in _SCORE_SLOTS:
        readings = [(f * v, off + ([what] if what else [])) for f, off in readings
                    for v, what in values.items()]
    fits = [off for f, off in readings if off and f == got]
    if fits:
        fewest = min(len(off) for off in fits)
        best = [off for off in fits if len(off) == fewest]
    return [" and ".join(off) for off in best]


def merge_variants() -> list[tuple[str, Callable[..., tuple[torch.Tensor, ...]]]]:
    """``(what it is, fn(m_a, ell_a, o_a, m_b, ell_b, o_b) -> (m, ell, o))`` for the usual wrong
    merges; m (...), ell (...), o (..., d_v)."""

    def factors(m_a, m_b, inverted=False):  # noqa: ANN001, ANN202
        m = torch.maximum(m_a, m_b)
        ref = torch.where(torch.isinf(m), 0.0, m)
        if inverted:
            return m, torch.exp(ref - m_a), torch.exp(ref - m_b)
        return m, torch.exp(m_a - ref), torch.exp(m_b - ref)

    def combine(fa_ell, fb_ell, fa_o, fb_o, ell_is=None, o_is=None):  # noqa: ANN001, ANN202
        def merge(m_a, ell_a, o_a, m_b, ell_b, o_b):  # noqa: ANN001, ANN202
            m, a, b = factors(m_a, m_b)
            one = torch.ones_like(a)
            pick = {"a": a, "b": b, "1": one}
            ell = pick[fa_ell] * ell_a + pick[fb_ell] * ell_b
            o = pick[fa_o][..., None] * o_a + pick[fb_o][..., None] * o_b
            return m, ell, o
        return merge

    def inverted(m_a, ell_a, o_a, m_b, ell_b, o_b):  # noqa: ANN001, ANN202
        m, a, b = factors(m_a, m_b, inverted=True)
        return m, a * ell_a + b * ell_b, a[..., None] * o_a + b[..., None] * o_b

    def normalised(*s):  # noqa: ANN002, ANN202
        m, ell, o = flash.merge_softmax_states(*s)
        return m, ell, o / ell[..., None]

    def max_of_o(*s):  # noqa: ANN002, ANN202
        m, ell, _ = flash.merge_softmax_states(*s)
        return m, ell, torch.where((s[0] >= s[3])[..., None], s[2], s[5])

    def larger_kept(m_a, ell_a, o_a, m_b, ell_b, o_b):  # noqa: ANN001, ANN202
        pick = m_a >= m_b
        return (torch.where(pick, m_a, m_b), torch.where(pick, ell_a, ell_b),
                torch.where(pick[..., None], o_a, o_b))

    def ell_weighted(m_a, ell_a, o_a, m_b, ell_b, o_b):  # noqa: ANN001, ANN202
        ell = ell_a + ell_b
        mean = (ell_a[..., None] * o_a + ell_b[..., None] * o_b) / ell[..., None]
        return torch.maximum(m_a, m_b), ell, torch.where(ell[..., None] > 0, mean, 0.0)

    def log_ell(*s):  # noqa: ANN002, ANN202
        m, ell, o = flash.merge_softmax_states(*s)
        return m, torch.log(ell), o

    def no_exp(m_a, ell_a, o_a, m_b, ell_b, o_b):  # noqa: ANN001, ANN202
        m = torch.maximum(m_a, m_b)
        ref = torch.where(torch.isinf(m), 0.0, m)
        a, b = (torch.nan_to_num(x - ref, neginf=0.0) for x in (m_a, m_b))
        return m, a * ell_a + b * ell_b, a[..., None] * o_a + b[..., None] * o_b

    def lse_as_ell(*s):  # noqa: ANN002, ANN202
        m, ell, o = flash.merge_softmax_states(*s)
        return m, m + torch.log(ell), o

    return [
        ("o not rescaled: the output sums o_a + o_b as they are, while ell is rescaled. Each state's "
         "o is measured from its own maximum; bring both to the new maximum m, with the same "
         "factors exp(m_a - m) and exp(m_b - m) as ell", combine("a", "b", "1", "1")),
        ("ell not rescaled: ell_a + ell_b as they are. Each sum of exp(score - m_a) must be brought "
         "to the new maximum: times exp(m_a - m)", combine("1", "1", "a", "b")),
        ("neither ell nor o rescaled: each state's sums are measured from its own maximum; multiply "
         "state a's by exp(m_a - m) and state b's by exp(m_b - m) before adding",
         combine("1", "1", "1", "1")),
        ("the factors are swapped: observed ell = exp(m_b - m) * ell_a + exp(m_a - m) * ell_b (and o "
         "alike), right only on the rows where m_a = m_b. Each state's sums were measured from its "
         "own maximum, so state a's take exp(m_a - m)", combine("b", "a", "b", "a")),
        ("only state a is rescaled: your ell and o are right on the rows where m_b >= m_a and wrong "
         "where m_a > m_b; there state b's sums, measured from m_b, need exp(m_b - m) < 1 too",
         combine("a", "1", "a", "1")),
        ("only state b is rescaled: your ell and o are right on the rows where m_a >= m_b and wrong "
         "where m_b > m_a; there state a's sums, measured from m_a, need exp(m_a - m) < 1 too",
         combine("1", "b", "1", "b")),
        ("rescaled the wrong way: exp(m - m_a) instead of exp(m_a - m). The new maximum is larger, "
         "so the older terms shrink: the factor is <= 1", inverted),
        ("o divided by ell: return the running sum o, not yet divided; the division happens once, "
         "after the last block, so that later merges can still rescale it", normalised),
        ("o of the state with the larger maximum only: both states' values count, each rescaled",
         max_of_o),
        ("observed: your (m, ell, o) on every row is the state with the larger maximum, as it is; "
         "the other state's keys are dropped. The merged state holds the keys of both, so its ell and "
         "o add both states' terms, each brought to the larger maximum", larger_kept),
        ("observed: your ell = ell_a + ell_b and your o = (ell_a o_a + ell_b o_b) / (ell_a + ell_b), "
         "an average of the two o's weighted by ell: the maxima m_a and m_b are not used, though "
         "each state's ell and o are sums of exp(score - its own maximum). Also, o stays a running "
         "sum, not an average", ell_weighted),
        ("your ell is the natural log of the merged sum: observed ell = log(exp(m_a - m) * ell_a + "
         "exp(m_b - m) * ell_b) (m and o are right). ell is a plain sum of exponentials, not a "
         "log-sum-exp", log_ell),
        ("observed: your factors are m_a - m and m_b - m, the differences themselves, with no exp: "
         "ell = (m_a - m) * ell_a + (m_b - m) * ell_b (and o alike; the larger state's factor is then "
         "0). A term exp(score - m_a) becomes exp(score - m) by a product of exponentials, "
         "exp(score - m_a) * exp(m_a - m)", no_exp),
        ("your ell is m + log(ell), the log-sum-exp of the merged state, not the sum ell itself "
         "(observed: m and o right, and exp(your ell) = the right sum times exp(m)). The state keeps "
         "ell, the sum of exp(score - m); the log-sum-exp is made from it only at the end",
         lse_as_ell),
    ]


def later_max_said(q: torch.Tensor, k: torch.Tensor, causal: bool, block_k: int,
                   bad: torch.Tensor) -> str:
    """Whether the wrong rows ``bad`` (..., L_q) are exactly the rows whose largest score arrives in
    a later block of keys than the first (q (..., L_q, d), k (..., L_k, d)), as a clause ("" if not)."""
    s = q.double() @ k.double().transpose(-2, -1)  # (..., L_q, L_k); the scale keeps the argmax
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    late = s.argmax(-1) >= block_k  # (..., L_q)
    if not late.any() or late.all() or not torch.equal(late, bad):
        return ""
    return (f": exactly the {int(late.sum())} rows whose largest score arrives in a later block of "
            f"keys than the first are wrong, the {int((~late).sum())} whose maximum is in the first "
            "block are right, so the error appears when the running maximum grows")


def one_head_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_k: int, knob: str = ""
                  ) -> torch.Tensor:
    """The Debug exercise's loop over blocks of keys, right (knob "") or with one bug (see
    ``FIX_MISTAKES``): q (L_q, d), k (L_k, d), v (L_k, d_v) -> (L_q, d_v)."""
    width = {"scale from v": v.size(-1), "o, scale from block_k": block_k}.get(knob, q.size(-1))
    scale = {"no scale": 1.0, "scale 1/d": 1.0 / width}.get(knob, 1.0 / math.sqrt(width))
    m = torch.full((q.size(0),), -math.inf, dtype=q.dtype)
    ell = torch.zeros(q.size(0), dtype=q.dtype)
    o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
    stop = k.size(0) - block_k + 1 if knob == "last block dropped" else k.size(0)
    for start in range(0, max(stop, 1), block_k):
        s = q @ k[start:start + block_k].T * scale  # (L_q, block)
        vb = v[start:start + block_k]
        if knob == "block max":
            p = torch.exp(s - s.amax(-1, keepdim=True))
            ell, o = ell + p.sum(-1), o + p @ vb
            continue
        m_new = torch.maximum(m, s.amax(-1))
        ref = {"p from old max": torch.where(torch.isinf(m), m_new, m),
               "p from old max, 0 first": torch.where(torch.isinf(m), 0.0, m),
               "p from block max": s.amax(-1)}.get(knob, m_new)
        p = torch.exp(s - ref[:, None])
        alpha = torch.exp(m - m_new)
        a_ell = {"neither": 1.0, "ell": 1.0, "ell twice": alpha * alpha}.get(knob, alpha)
        a_o = {"neither": 1.0, "o": 1.0, "o, scale from block_k": 1.0, "o inverted": torch.exp(m_new - m), "o twice": alpha * alpha}
        a_o = a_o.get(knob, alpha)
        a_o = a_o[:, None] if isinstance(a_o, torch.Tensor) else a_o
        if knob == "new terms rescaled":
            ell, o = alpha * (ell + p.sum(-1)), alpha[:, None] * (o + p @ vb)
        elif knob == "o rescaled after adding":
            ell, o = alpha * ell + p.sum(-1), alpha[:, None] * (o + p @ vb)
        elif knob == "factor on the new term":
            ell, o = alpha * ell + p.sum(-1), o + alpha[:, None] * (p @ vb)
        elif knob == "block normalised":
            ell, o = alpha * ell + p.sum(-1), alpha[:, None] * o + (p @ vb) / p.sum(-1, keepdim=True)
        else:
            ell, o = a_ell * ell + p.sum(-1), a_o * o + p @ vb
        if knob in ("divided every block", "divided every block only"):
            o = o / ell[:, None]
        if knob != "m never updated":
            m = m_new
        if knob == "first block only":  # a return inside the loop
            break
    if knob == "last block's sum":
        return o / p.sum(-1)[:, None]
    return o if knob == "divided every block only" else o / ell[:, None]


_OLD_MAX = ("your output equals the loop in which the new block's p = exp(s - m) is measured from "
            "the previous maximum m (at the first block, where m = -inf, from m_new or from 0), while "
            "ell and o were brought to m_new: the terms of one sum are measured from two different "
            "maxima")
FIX_MISTAKES = [  # (knob of one_head_loop, what is observed)
    ("neither", "your output equals the loop in which neither ell nor o shrinks when the running "
                "maximum grows: the terms summed before stay measured from the old maximum"),
    ("ell", "your output equals the loop in which o is rescaled by exp(m - m_new) when the maximum "
            "grows but ell is not: ell keeps terms measured from the old maximum"),
    ("block max", "your output equals a sum in which each block's terms are exp(score - that block's "
                  "own maximum), added up as they are: a block whose maximum is lower weighs as much "
                  "as the one with the top score (with all values 1 the rows still give 1, yet the "
                  "weights between blocks are wrong)"),
    ("ell twice", "your output equals the loop in which ell is multiplied by exp(m - m_new) twice per "
                  "block and o once: the rows whose maximum grows come out too large"),
    ("o twice", "your output equals the loop in which o is multiplied by exp(m - m_new) twice per "
                "block and ell once: the rows whose maximum grows come out too small"),
    ("new terms rescaled", "your output equals the loop in which the new block's terms are multiplied "
                           "by exp(m - m_new) too (the factor is applied after adding): only what "
                           "was summed before was measured from the old maximum"),
    ("divided every block", "your output equals the loop in which o is divided by ell in every block "
                            "and once more at the end"),
    ("divided every block only", "your output equals the loop in which o is divided by ell in every "
                                 "block, while the next block adds unnormalised terms to it"),
    ("m never updated", "your output equals the softmax over the last block's keys only: m stays "
                        "-inf, so exp(m - m_new) = 0 wipes the earlier blocks at every step"),
    ("o rescaled after adding", "your output equals the loop in which o = exp(m - m_new) * (o + the "
                                "new block's p @ v): the new block's terms, already measured from "
                                "m_new, are multiplied by the factor too (ell is right)"),
    ("p from old max", _OLD_MAX),
    ("p from old max, 0 first", _OLD_MAX),
    ("p from block max", "your output equals the loop in which each block's p = exp(s - that block's "
                         "own maximum), while ell and o are rescaled by exp(m - m_new) to the running "
                         "maximum: the new block's terms are measured from the block's maximum, the "
                         "sums before them from m_new"),
    ("first block only", "your output equals attention over the first block of keys alone (keys "
                         "0..block_k - 1): the keys of the later blocks never reach the result, as if "
                         "the function returned after the first pass through the loop"),
    ("o, scale from block_k", "your output equals the loop as given (o never rescaled when the "
                              "maximum grows) with the scores multiplied by 1/sqrt(block_k), not "
                              "1/sqrt(d): the scale was changed, and the loop's own bug is still "
                              "there"),
    ("scale 1/d", "your output equals attention whose scores are multiplied by 1/d, not by "
                  "1/sqrt(d), the scale of softmax(q kᵀ / √d)"),
    ("block normalised", "your output equals the loop in which the new block's p @ v is divided by "
                         "that block's own sum p.sum() before it is added to o, while ell still adds "
                         "p.sum(): o then holds averages, ell sums, and o / ell mixes the two"),
    ("scale from v", "your output equals attention whose scores are divided by sqrt(d_v), the width "
                     "of v, not sqrt(d), the width of q and k (they differ here)"),
    ("factor on the new term", "your output equals the loop in which exp(m - m_new) multiplies the "
                               "new block's p @ v as it is added to o: ell is right, but in o the new "
                               "terms, already measured from m_new, shrink, while the terms summed "
                               "before stay measured from the old maximum"),
    ("last block's sum", "the loop's o is right, but your output equals that o divided by the last "
                         "block's sum p.sum() alone: every row comes out scaled by ell / (the last "
                         "block's sum) >= 1, ell being the sum over all the keys"),
    ("last block dropped", "the keys of the last, shorter block are never read: L_k is not a "
                           "multiple of block_k here"),
    ("no scale", "the scores are not divided by sqrt(head_dim)"),
]


def fix_reason(knob: str, reason: str, one_exps: list[int], rows: int, blocks: int) -> str:
    """What the Debug checker says when the loop with ``knob`` matches: ``reason``, and for "neither"
    (no factor applied) whether the learner's code did compute factors that all came out exactly 1
    (``one_exps``: the sizes of the exp outputs that were all 1; ``rows`` queries, ``blocks`` blocks)."""
    ones = sum(1 for numel in one_exps if numel == rows)
    if knob != "neither" or blocks < 2 or ones < blocks:
        return reason
    return (f"{reason}, though your code does compute factors for them: observed an exp that returns "
            f"exactly 1 for all {rows} rows {ones} times in {blocks} blocks, even where a row's "
            "maximum grows. exp(x) is exactly 1 only for x = 0: print m and m_new at the moment "
            "those factors are computed")


FIX_STUB = """def flash_one_head(q, k, v, block_k=16):
    # TODO: remove the raise, then find and fix the bug
    raise NotImplementedError
    scale = 1.0 / math.sqrt(q.size(-1))
    m = torch.full((q.size(0),), float("-inf"), dtype=q.dtype)  # running maximum per query
    ell = torch.zeros(q.size(0), dtype=q.dtype)  # running sum of exp(score - m)
    o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)  # running sum of exp(score - m) * v
    for start in range(0, k.size(0), block_k):
        s = q @ k[start:start + block_k].T * scale  # (L_q, block_k)
        m_new = torch.maximum(m, s.amax(dim=-1))
        p = torch.exp(s - m_new[:, None])
        ell = torch.exp(m - m_new) * ell + p.sum(dim=-1)
        o = o + p @ v[start:start + block_k]
        m = m_new
    return o / ell[:, None]
"""  # the Debug exercise's stub as the notebook gives it (a test compares)


def _body(source: str) -> list[str] | None:
    """The statements of the first function in ``source`` (ast dumps), the stub's raise left out;
    None without a function or a loop."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return None
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)), None)
    if fn is None or not any(isinstance(n, ast.For) for n in ast.walk(fn)):
        return None
    return [ast.dump(n) for n in fn.body if not (isinstance(n, ast.Raise) and isinstance(
        n.exc, ast.Name) and n.exc.id == "NotImplementedError")]


def unchanged_stub(fn: Any) -> bool:
    """Whether ``fn``'s statements are the Debug stub's, the raise line left out (comments aside)."""
    try:
        body = _body(inspect.getsource(fn))
    except (OSError, TypeError):
        return False
    return body is not None and body == _body(FIX_STUB)


def kept_raise(fn: Any, err: NotImplementedError) -> BaseException:
    """The stub's ``raise NotImplementedError`` still runs: ``err`` itself when ``fn`` is the stub as
    given (not tried yet) or its source cannot be read, a CheckFailure when the code below the raise
    is not the stub's (the learner changed it, but the raise stops it before it runs)."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return err
    body = _body(source)
    if body is None or body == _body(FIX_STUB):
        return err
    return CheckFailure("Observed: your flash_one_head raises NotImplementedError, the stub's "
                        "`raise` line, before the loop runs, while the code below it differs from "
                        "the stub's: your changes are never run. Delete the raise line and run the "
                        "checker again.", mistake="the stub's raise kept")


FLOAT32_MISTAKE = "float32 arithmetic in a float64 case"


def float32_gap(got: tuple[Any, ...], expected: tuple[torch.Tensor, ...]) -> float | None:
    """The largest difference when every tensor of ``got`` is off ``expected`` by float32's round-off
    only (1e-5 relative to the largest value), None otherwise (right, or further off)."""
    gaps = []
    for t, e in zip(got, expected):
        if not isinstance(t, torch.Tensor) or t.shape != e.shape or not torch.equal(
                torch.isfinite(t), torch.isfinite(e)):
            return None
        finite = torch.isfinite(e)
        gap = (t.double()[finite] - e[finite]).abs().max().item() if finite.any() else 0.0
        if gap > 1e-5 * (1.0 + e[finite].abs().max().item() if finite.any() else 1.0):
            return None
        gaps.append(gap)
    return max(gaps) if gaps else None


def float32_said(case: str, largest: float, where: str) -> str:
    """What is observed when a float64 case is off by float32's round-off only (``largest``)."""
    return (f"Not yet ({case}): {where} differs from the exact result by at most {largest:.2g}: the "
            "size of float32 round-off (float32 keeps about 7 digits, a relative step of 6e-8). This "
            "case is float64 and is compared to 1e-9: observed that a step computes in float32 (a "
            ".float(), a tensor made without dtype=..., or a float32 constant).")


def ref_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, knob: str = ""
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention (B, h, L_q, d_v) and log-sum-exp (B, h, L_q) from the whole score matrix,
    right (knob "") or wrong."""
    L_q, L_k = q.size(-2), k.size(-2)
    scale = {"no scale": 1.0, "scale 1/d": 1.0 / q.size(-1)}.get(knob, 1.0 / math.sqrt(q.size(-1)))
    s = q @ k.transpose(-2, -1) * scale  # (B, h, L_q, L_k)
    if is_causal:
        offset = {"bottom-right": L_k - L_q, "no diagonal": -1}.get(knob, 0)
        s = s.masked_fill(~torch.ones(L_q, L_k, dtype=torch.bool).tril(offset), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    out = torch.nan_to_num(torch.softmax(s, dim=-1)) @ v
    if knob == "lse without m":
        lse = torch.log(torch.exp(s - s.amax(-1, keepdim=True)).sum(-1))
    if knob == "lse is max":
        lse = s.amax(-1)
    if knob == "lse log2":
        lse = lse / math.log(2)
    if knob == "lse without log":
        top = s.amax(-1)
        lse = top + torch.exp(s - top[..., None]).sum(-1)
    return out, lse


def _skipped(knob: str, i0: int, i1: int, j0: int, bq: int, bk: int) -> bool:
    """Whether a causal loop with this bug skips key tile j0 for the query tile [i0, i1)."""
    if knob == "skip by tile index":
        return j0 // bk > i0 // bq
    if knob == "skip from the first query":
        return j0 > i0
    if knob == "skip one tile early":
        return j0 >= i1 - 1 and j0 > 0
    return j0 > i1 - 1


def tiled_forward_variant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, bq: int,
                          bk: int, knob: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The tiled forward with a bug that only tiles show: q (B, h, L_q, d), k, v (B, h, L_k, d) ->
    (out (B, h, L_q, d), lse (B, h, L_q))."""
    B, h, L_q, _ = q.shape
    L_k, scale = k.size(2), 1.0 / math.sqrt(q.size(-1))
    out, lse = torch.zeros(B, h, L_q, v.size(-1), dtype=q.dtype), torch.zeros(B, h, L_q, dtype=q.dtype)
    for i0 in range(0, L_q, bq):
        i1 = min(i0 + bq, L_q)
        m = torch.full((B, h, i1 - i0), -math.inf, dtype=q.dtype)
        ell, o = torch.zeros_like(m), torch.zeros(B, h, i1 - i0, v.size(-1), dtype=q.dtype)
        first_lse = last_lse = None
        stop = L_k - bk + 1 if knob == "last tile dropped" else L_k
        for j0 in range(0, max(stop, 1), bk):
            if is_causal and _skipped(knob, i0, i1, j0, bq, bk):
                break
            j1 = min(j0 + bk, L_k)
            s = q[:, :, i0:i1] @ k[:, :, j0:j1].transpose(-2, -1) * scale  # (B, h, tile, tile)
            if is_causal and knob == "mask inside the tile":  # positions from 0 in every tile
                if j1 - 1 > i0:
                    future = torch.ones(i1 - i0, j1 - j0, dtype=torch.bool).triu(1)  # (tile, tile)
                    s = s.masked_fill(future, -math.inf)
            elif is_causal:
                s = s.masked_fill(torch.arange(j0, j1)[None] > torch.arange(i0, i1)[:, None],
                                  0.0 if knob == "mask with 0" else -math.inf)
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m - m_new)
            if knob == "both inverted":  # exp(m_new - m), the first tile's inf zeroed
                alpha = torch.where(torch.isinf(m), torch.zeros_like(m), torch.exp(m_new - m))
            ell = {"ell twice": alpha * alpha, "ell not rescaled": 1.0}.get(knob, alpha) * ell + p.sum(-1)
            if knob == "o inverted":
                alpha = torch.exp(m_new - m)
            if knob == "o inverted, inf zeroed":  # exp(m_new - m) on o, the first tile's inf made 0
                alpha = torch.nan_to_num(torch.exp(m_new - m), posinf=0.0)
            p_o = p  # the p that o adds: from m_new, or from the previous maximum (0 at the first tile)
            if knob in ("p from old max", "p from old max, m_new first"):
                first = torch.zeros_like(m) if knob == "p from old max" else m_new
                p_o = torch.exp(s - torch.where(torch.isinf(m), first, m)[..., None])
            o = (o if knob == "o not rescaled" else alpha[..., None] * o) + p_o @ v[:, :, j0:j1]
            if knob in ("divided every tile", "divided every tile and at the end"):
                o = o / ell[..., None]
            m = m_new
            last_lse = torch.logsumexp(s, dim=-1)
            if first_lse is None:
                first_lse = m + torch.log(ell)
        out[:, :, i0:i1] = o if knob in ("not divided", "divided every tile") else o / ell[..., None]
        lse[:, :, i0:i1] = {"lse too early": first_lse, "lse last tile": last_lse}.get(knob,
                                                                                     m + torch.log(ell))
    return out, lse


FORWARD_MISTAKES = [  # (knob, tiled?, what it is)
    ("o not rescaled", True, "lse is right but out is not, in the rows whose largest score arrives in "
                             "a later tile of keys; out equals a loop whose o is not rescaled when the "
                             "running maximum grows (the Debug exercise's bug)"),
    ("lse too early", True, "the log-sum-exp is saved after the first tile of keys, not after the last: "
                            "the output is right, lse is not. Compute L_i = m + log(ell) once every "
                            "tile of keys has been merged"),
    ("last tile dropped", True, "the last, shorter tile is never read (its length is not a multiple of "
                                "the block size): let the last tile end at min(start + block, L)"),
    ("both inverted", True, "out and lse equal a loop whose factor is exp(m_new - m) >= 1 (0 at the "
                            "first tile), applied to ell and o: when the running maximum grows, the "
                            "sums of the earlier tiles are multiplied by a number above 1 instead of "
                            "shrinking toward the new maximum"),
    ("lse last tile", True, "out is right, but lse equals the log-sum-exp of the last tile of keys "
                            "alone (for causal rows, the tile of the diagonal): the keys of the earlier "
                            "tiles are missing from it, while m and ell hold all of them"),
    ("not divided", True, "the output is not divided by ell after the last tile"),
    ("divided every tile", True, "o is divided by the running sum ell in every tile, while the next "
                                 "tile still adds unnormalised terms to it: divide once, after the "
                                 "last tile"),
    ("divided every tile and at the end", True, "o is divided by the running sum ell in every tile (and "
                                                "again at the end): keep o unnormalised in the loop and "
                                                "divide once, after the last tile"),
    ("skip by tile index", True, "right when block_q = block_k, wrong here where they differ: your "
                                 "causal skip drops key tiles that hold visible keys. Your results equal "
                                 "a loop that skips key tile j when j > i (tile indices); with blocks of "
                                 "different sizes tile j starts at key j * block_k and query tile i ends "
                                 "at query (i + 1) * block_q - 1: compare positions, not tile indices"),
    ("skip from the first query", True, "your causal skip drops key tiles that start after the query "
                                        "tile's FIRST query, though its later queries still see keys "
                                        "there: a key tile is wholly in the future only when its first "
                                        "key comes after the tile's LAST query"),
    ("skip one tile early", True, "your causal skip drops the key tile whose first key is the query "
                                  "tile's last position (the diagonal key of that query): skip only "
                                  "tiles whose first key comes after the last query"),
    ("ell twice", True, "out equals a loop in which ell is multiplied by exp(m - m_new) twice per tile "
                        "and o once: the rows whose maximum grows in a later tile come out too large; "
                        "ell and o take the same factor, once"),
    *[(knob, True, "lse is right, but out equals a loop whose o adds exp(S − m) V with m the running "
                   "maximum before this tile (at the first tile, where m = −inf, " + first + "), "
                   "while ell adds p = exp(S − m_new): o's new terms and its rescaled old ones are "
                   "measured from different maxima") for knob, first in (
        ("p from old max", "0"), ("p from old max, m_new first", "m_new"))],
    ("o inverted, inf zeroed", True, "lse is right, but out equals a loop whose o is multiplied by "
                                     "exp(m_new - m) >= 1 (its inf at the first tile made 0) while ell "
                                     "takes exp(m - m_new) <= 1: when the maximum grows, o's old terms "
                                     "grow instead of shrinking"),
    ("ell not rescaled", True, "out and lse equal a loop whose o is multiplied by exp(m - m_new) when "
                               "the running maximum grows, but ell is not: ell keeps the earlier tiles' "
                               "terms measured from the old maximum, so on the rows whose maximum "
                               "arrives in a later tile ell is too large (out is scaled down, lse "
                               "up)"),
    ("mask inside the tile", True, "out and lse equal a loop whose causal mask is built from the "
                                   "positions inside the tile, counted from 0 (column > row, as "
                                   "triu(1) of the tile), not from the tile's own positions i0 + row "
                                   "and j0 + column: in diagonal tiles that do not start at the same "
                                   "position, queries see future keys or lose past ones"),
    ("mask with 0", True, "out and lse equal a loop whose causal mask sets the hidden scores to 0, not "
                          "−inf: exp(0 − m) is no zero, so every hidden key in a diagonal tile still "
                          "gets a weight"),
    ("scale 1/d", False, "out and lse equal attention whose scores are multiplied by 1/head_dim, not "
                         "by 1/sqrt(head_dim), SDPA's scale"),
    ("lse without log", False, "lse is m + ell, the log-sum-exp without the log: L_i = m + log(ell)"),
    ("no scale", False, "the scores are not divided by sqrt(head_dim)"),
    ("bottom-right", False, "the causal mask is aligned to the bottom right (query i sees keys up to "
                            "i + L_k - L_q): this exercise uses SDPA's is_causal, query i sees keys 0..i"),
    ("no diagonal", False, "the causal mask hides the diagonal: a query may attend to its own position"),
    ("lse is max", False, "out is right, but lse equals each row's largest score, the running maximum m: "
                          "the log-sum-exp is m + log(ell), and log(ell) is missing (lse is too small "
                          "by log(ell), between 0 and log(L_k))"),
    ("lse without m", False, "lse is log(ell) without the running maximum: L_i = m + log(ell)"),
    ("lse log2", False, "lse is in base 2: use the natural logarithm, as torch.logsumexp"),
]


PARTIAL_TILE = "the last, partial tile is left out (the blocks do not divide the lengths here)"


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| where b is finite; inf when a and b are not finite at the same places."""
    finite = torch.isfinite(b)
    if not torch.equal(torch.isfinite(a), finite):
        return math.inf
    return (a[finite] - b[finite]).abs().max().item() if finite.any() else 0.0


def _rows_match(out: torch.Tensor, lse: torch.Tensor, want: tuple[torch.Tensor, torch.Tensor], rows: slice,
                tol: float) -> bool:
    """Whether the query rows ``rows`` of out (B, h, L_q, d_v) and lse (B, h, L_q) equal ``want``'s."""
    return (_max_diff(out[..., rows, :], want[0][..., rows, :]) <= tol
            and _max_diff(lse[..., rows], want[1][..., rows]) <= tol)


def partial_tile_message(out: torch.Tensor, lse: torch.Tensor, qkv: tuple[torch.Tensor, ...],
                         causal: bool, bq: int, bk: int, tol: float) -> str:
    """What is observed when the last, partial query or key tile is left out ("" otherwise): the rows
    of the full query tiles equal attention over the full key tiles (or the exact one), the rest not.
    out (B, h, L_q, d_v), lse (B, h, L_q) and q, k, v in float64."""
    L_q, L_k = qkv[0].size(-2), qkv[1].size(-2)
    full_q, full_k = L_q - L_q % bq, L_k - L_k % bk
    if full_q == L_q and full_k == L_k or full_q == 0 or full_k == 0:
        return ""
    exact = ref_forward(*qkv, causal)
    dropped = tiled_forward_variant(*qkv, causal, bq, bk, "last tile dropped")
    head, tail = slice(0, full_q), slice(full_q, L_q)
    head_exact = _rows_match(out, lse, exact, head, tol)
    keys_dropped = full_k < L_k and not head_exact and _rows_match(out, lse, dropped, head, tol)
    if not keys_dropped and not head_exact:
        return ""
    tail_ok = full_q == L_q or _rows_match(out, lse, exact, tail, tol) or (
        keys_dropped and _rows_match(out, lse, dropped, tail, tol))
    if tail_ok and not keys_dropped:
        return ""
    said = []
    if keys_dropped:
        said.append(f"queries 0..{full_q - 1} (the full query tiles) equal attention over keys "
                    f"0..{full_k - 1} only: the last {L_k - full_k} keys ({L_k} = {L_k // bk} x {bk} + "
                    f"{L_k % bk}, a partial key tile) are never read")
    if not tail_ok:
        bad = int((~torch.isfinite(out[..., tail, :])).sum() + (~torch.isfinite(lse[..., tail])).sum())
        what = f" ({bad} NaN or inf among them)" if bad else ""
        said.append(f"the rows of the last, partial query tile, queries {full_q}..{L_q - 1} ({L_q} = "
                    f"{L_q // bq} x {bq} + {L_q % bq}), are wrong{what}"
                    + ("" if keys_dropped else ", while the rows before them are right"))
    return (f"observed: {'; '.join(said)}. {PARTIAL_TILE[0].upper()}{PARTIAL_TILE[1:]}: a loop must "
            "also visit the last, shorter tile, which ends at min(start + block, L).")


def _at(table: list[int], n: Any) -> int:
    """``table[n]`` as a list index: an IndexError for n outside 0..len - 1, a TypeError for a float."""
    if isinstance(n, float):
        raise TypeError("list indices must be integers or slices, not float")
    if not 0 <= n < len(table):
        raise IndexError(f"list index out of range: block index {n} of a table with {len(table)} "
                         f"blocks, 0..{len(table) - 1}")
    return table[n]


def _one_early(t: list[int], p: int, s: int) -> tuple[int, int]:
    return t[p // s - 1], p % s


LOCATE_MISTAKES: list[tuple[str, Callable[[list[int], int, int], Any]]] = [  # (what, fn)
    ("block index and slot swapped: block_table[position % block_size] with slot position // "
     "block_size (division and modulo exchanged)", lambda t, p, s: (_at(t, p % s), p // s)),
    ("block index from the modulo: block_table[position % block_size] (the slot, position % "
     "block_size, is right)", lambda t, p, s: (_at(t, p % s), p % s)),
    ("slot from the division: position // block_size (that is the logical block; the slot is the "
     "remainder)", lambda t, p, s: (_at(t, p // s), p // s)),
    ("block index rounded to the nearest integer, round(position / block_size): positions in the "
     "second half of a block go to the next block", lambda t, p, s: (_at(t, round(p / s)), p % s)),
    ("block index rounded up, ceil(position / block_size): every position but a block's first goes to "
     "the next block", lambda t, p, s: (_at(t, math.ceil(p / s)), p % s)),
    ("block index from the inverse map: block_table.index(logical block) asks which entry holds the "
     "number logical block; the table is read forward, block_table[logical block] is the physical "
     "block", lambda t, p, s: (t.index(p // s), p % s)),
    ("slot measured from the physical block's start, position - physical * block_size: the slot "
     "is measured inside the logical block, position - logical * block_size",
     lambda t, p, s: (_at(t, p // s), p - _at(t, p // s) * s)),
    ("slot counted from 1: slots run 0..block_size - 1", lambda t, p, s: (_at(t, p // s), p % s + 1)),
    ("block index one too large, block_table[position // block_size + 1]: blocks count from 0",
     lambda t, p, s: (_at(t, p // s + 1), p % s)),
    ("one block too early, block_table[position // block_size - 1] (index -1 of a Python list is "
     "its last entry): blocks count from 0", _one_early),
    ("block index from true division, block_table[position / block_size]: a float is no list index; "
     "the integer division // gives the block", lambda t, p, s: (_at(t, p / s), p % s)),
    ("position - 1: that is where the previous token is stored; positions count from 0, use the "
     "position as it is", lambda t, p, s: (t[(p - 1) // s], (p - 1) % s)),
    ("division by the table's length instead of block_size: block_table[position // len(table)], "
     "slot position % len(table). Each block holds block_size positions; the table only says where "
     "each block is", lambda t, p, s: (t[p // len(t)], p % len(t))),
    ("block index divided by the table's length, block_table[position // len(table)]: each block holds "
     "block_size positions; the table only says where each block is",
     lambda t, p, s: (t[p // len(t)], p % s)),
    ("block index from the table's length, block_table[position // len(table) % len(table)]: each "
     "block holds block_size positions; the table only says where each block is",
     lambda t, p, s: (t[p // len(t) % len(t)], p % s)),
    ("slot from the table's length, position % len(table): each block holds block_size positions, "
     "slots 0..block_size - 1", lambda t, p, s: (_at(t, p // s), p % len(t))),
    ("the table's last entry, block_table[-1], for every position: that is where the next token "
     "goes, not where a stored position lives; entry n of the table is where logical block n lives",
     lambda t, p, s: (t[-1], p % s)),
    ("the table's first entry, block_table[0], for every position: entry n of the table is where "
     "logical block n lives", lambda t, p, s: (t[0], p % s)),
    ("slot given as an address in the pool, physical block * block_size + offset: the slot is the "
     "offset inside the block, 0..block_size - 1", lambda t, p, s: (_at(t, p // s), _at(t, p // s) * s
                                                                   + p % s)),
    ("slot given as the block's first position, (position // block_size) * block_size: the slot is "
     "the offset inside the block, position % block_size", lambda t, p, s: (_at(t, p // s),
                                                                             p // s * s)),
    ("the table read from its end, block_table[-1 - logical block]: entry n, counted from the "
     "start, is where logical block n lives", lambda t, p, s: (t[-1 - p // s], p % s)),
    ("slot counted from the block's end, block_size - 1 - offset: slots count from the block's "
     "start, position % block_size", lambda t, p, s: (_at(t, p // s), s - 1 - p % s)),
    ("an index into the pool's flat array of slots (physical block * block_size + slot): return the "
     "pair (physical block, slot) apart", lambda t, p, s: _at(t, p // s) * s + p % s),
]


_SHAPES = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)")


def broadcast_hint(err: BaseException, rows: int, cols: int, what: str) -> str:
    """A sentence for PyTorch's broadcasting error when a factor with one number per row, shape
    (rows,), meets a (rows, cols) tensor; "" when the error is something else."""
    found = _SHAPES.search(str(err))
    if not isinstance(err, RuntimeError) or not found or rows == cols:
        return ""
    if {int(found.group(1)), int(found.group(2))} != {rows, cols}:
        return ""
    return (f"Observed: PyTorch could not broadcast a tensor of {rows} numbers, one per row, against "
            f"{what} of shape (..., {rows}, {cols}) ({err}). Broadcasting lines shapes up from the "
            f"right, so the {rows} numbers meet the {cols} columns; a factor that scales each row is "
            f"a column, shape (..., {rows}, 1).")
