"""Checkers for the exercises of lesson 07 (inference: the KV cache, sampling).

* ``check_decoder_work(fn)``: ``fn() -> (without_cache, with_cache)``, the predicted number of
  positions that go through the decoder while greedy decoding generates 20 tokens for one source,
  recomputing the prefix and with a KV cache (a "predict, then run" question). The checker counts.
* ``check_cached_self_attention(fn)``: ``fn(attn, x_new (B, 1, d), past_k, past_v) -> (out
  (B, 1, d), k, v)`` with ``past_k/v`` ``(B, h, t, hd)`` and ``k/v`` ``(B, h, t+1, hd)``: one step
  of cached causal self-attention with a ``course_lib.MultiHeadAttention`` ``attn`` (the lesson's
  debug exercise).
  Reference: row t of ``attn(x, x, x, causal_mask)``.
* ``check_top_p_filter(fn)``: ``fn(logits (..., V), p) -> logits`` with every token outside the
  nucleus set to ``-inf``; reference ``course_lib.decoding.filter_logits(logits, top_p=p)``. Among
  equal logits any choice of tokens is accepted (only the number kept and their order must be
  right); a function that calls course_lib's ``filter_logits`` is refused, with a message saying so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..attention import MultiHeadAttention
from ..decoding import filter_logits, greedy_decode
from ..masks import causal_mask
from ..model import Transformer, TransformerConfig
from .common import CheckFailure, calls_to, checker, expect_shape, is_course_lib, passed, run_learner

__all__ = ["check_decoder_work", "check_cached_self_attention", "check_top_p_filter"]


# ----------------------------------------------------------------------------------------------
# check_decoder_work (predict)
# ----------------------------------------------------------------------------------------------


def count_decoder_positions(new_tokens: int, use_cache: bool) -> int:
    """Greedy decoding of one source: the number of positions the first decoder layer processes."""
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(d_model=16, num_heads=2, d_ff=32, max_len=64)).eval()
    counted = []
    hook = model.decoder.layers[0].feed_forward.register_forward_hook(  # input (B, positions, d)
        lambda module, inputs, output: counted.append(inputs[0].size(1))
    )
    try:
        greedy_decode(model, torch.tensor([[3, 4, 5]]), new_tokens, start_id=1, use_cache=use_cache)
    finally:
        hook.remove()
    return sum(counted)


@checker
def check_decoder_work(fn: Callable[[], Any]) -> None:
    """Check ``fn() -> (without_cache, with_cache)`` for 20 new tokens, one source (B = 1)."""
    n = 20
    got = run_learner(fn, case="your prediction", hint="Return two integers, e.g. (100, 10).")
    if not (
        isinstance(got, (tuple, list))
        and len(got) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in got)
    ):
        raise CheckFailure(f"Return a pair of integers (without_cache, with_cache), got {got!r}.")
    without, with_cache = count_decoder_positions(n, False), count_decoder_positions(n, True)
    got = tuple(got)
    why = (
        f"Without a cache, step t feeds <sos> plus the t-1 tokens so far: 1 + 2 + ... + {n} = "
        f"{n} x {n + 1} / 2 = {without} positions, which grows as n^2. With a cache each step "
        f"feeds only the newest token: {with_cache} positions, and the {n} x {n - 1} / 2 = "
        f"{without - with_cache} others are read back from the cache as keys and values."
    )
    if tuple(got) == (without, with_cache):
        print(
            f"check_decoder_work: right, {without} positions without a cache and {with_cache} "
            f"with one. {why}"
        )
        return
    if got == (with_cache, without):
        raise CheckFailure(
            f"Not quite: the two numbers are swapped. The first is WITHOUT a cache (the larger "
            f"one), the second WITH a cache. {why}"
        )
    if got[1] == got[0] and got[0] in (without, n * n):
        raise CheckFailure(
            "Not quite (with a cache): the cache does not feed the prefix again; each step feeds "
            f"only its newest token, and the earlier ones are read back as keys and values. {why}"
        )
    layers = 2  # the checker's model, and lesson 07's, have 2 decoder layers
    if got in ((layers * without, layers * with_cache), (layers * without, with_cache)):
        raise CheckFailure(
            f"Not quite: {got[0]} counts every decoder layer ({layers} here). Count each "
            f"position once per step, as the question says. {why}"
        )
    one_too_many = "counts one step too many: the last token is produced, never fed back"
    confusions = {
        n * n: f"{n * n} = {n} x {n} counts all {n} positions at every step; at step t only t "
        "exist yet",
        n * (n - 1) // 2: f"{n * (n - 1) // 2} leaves out the start symbol, which goes through "
        "the decoder too",
        n * n // 2: f"{n * n // 2} = {n}² / 2 forgets half of the diagonal: 1 + 2 + ... + n = "
        "n(n+1)/2",
        (n + 1) * (n + 2) // 2: f"{(n + 1) * (n + 2) // 2} {one_too_many}",
        1: "1 would be one step; the cache saves recomputing the past, not the steps: every new "
        "token still needs one pass",
        n + 1: f"{n + 1} {one_too_many}",
    }
    with_cache_confusions = {
        n - 1: f"{n - 1} leaves out the first step, which feeds the start symbol",
        0: "0 would mean the decoder never runs; the cache saves recomputing the past, not the "
        "steps: every new token still needs one pass",
    }
    for value, label in ((got[0], "without a cache"), (got[1], "with a cache")):
        truth = without if label == "without a cache" else with_cache
        if value != truth:
            extra = with_cache_confusions if label == "with a cache" else {}
            reason = extra.get(value) or confusions.get(value, f"you said {value}")
            raise CheckFailure(f"Not quite ({label}): {reason}. {why}")


# ----------------------------------------------------------------------------------------------
# check_cached_self_attention (debug)
# ----------------------------------------------------------------------------------------------


def _step_by_step(fn: Callable[..., Any], attn: MultiHeadAttention, x: torch.Tensor, case: str):
    """Feed ``x (B, L, d)`` one position at a time; return the outputs (B, L, d) and final k, v."""
    B, L, _ = x.shape
    k = torch.zeros(B, attn.num_heads, 0, attn.head_dim)
    v = torch.zeros(B, attn.num_heads, 0, attn.head_dim)
    outs = []
    hint = (
        "The cache holds (B, num_heads, t, head_dim): positions along dim=2. Print the shapes of "
        "past_k, k_new and what you pass to attn.attend."
    )
    for t in range(L):
        got = run_learner(fn, attn, x[:, t : t + 1], k, v, case=f"{case}, step {t}", hint=hint)
        if not (isinstance(got, (tuple, list)) and len(got) == 3):
            raise CheckFailure(
                f"Return three tensors (out, k, v) ({case}, step {t}), got {type(got).__name__}."
            )
        out, k_new, v_new = got
        expect_shape(out, (B, 1, attn.d_model), f"out ({case}, step {t})")
        expect_shape(
            k_new,
            (B, attn.num_heads, t + 1, attn.head_dim),
            f"k ({case}, step {t})",
            "The cache grows by exactly one row per step: (B, num_heads, t+1, head_dim) after "
            "step t.",
        )
        expect_shape(v_new, (B, attn.num_heads, t + 1, attn.head_dim), f"v ({case}, step {t})")
        if t == 0:
            with torch.no_grad():
                k0, v0 = attn.project_kv(x[:, :1], x[:, :1])  # (B, h, 1, hd)
            swapped = torch.allclose(k_new, v0, atol=1e-5) and torch.allclose(v_new, k0, atol=1e-5)
            if swapped and not torch.allclose(k0, v0, atol=1e-5):
                raise CheckFailure(
                    f"The returned cache has k and v swapped ({case}, step 0): return (out, k, v), "
                    "keys first."
                )
        outs.append(out)
        k, v = k_new, v_new
    return torch.cat(outs, dim=1), k, v


def _cached_variants(attn: MultiHeadAttention, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """What plausible wrong steps output for ``x (B, L, d)`` fed one position at a time, (B, L, d).

    Keys name the mistake; every variant is computed from ``attn``'s own weights.
    """
    B, L, d = x.shape
    K, V = attn.project_kv(x, x)  # (B, h, L, hd)
    scale = 1.0 / math.sqrt(attn.head_dim)

    def heads_out(q, keys, values, use_scale=True, out_proj=True):
        # q (B, h, 1, hd), keys/values (B, h, n, hd) -> (B, d); n = 0 gives zeros (no key to see)
        if keys.size(2) == 0:
            heads = torch.zeros_like(q)
        else:
            scores = q @ keys.transpose(-2, -1) * (scale if use_scale else 1.0)
            heads = scores.softmax(-1) @ values
        merged = attn.merge_heads(heads)[:, 0]  # (B, d)
        return attn.out_proj(merged) if out_proj else merged

    q = attn.split_heads(attn.q_proj(x))  # (B, h, L, hd)
    q_twice = attn.split_heads(attn.q_proj(attn.q_proj(x)))
    rows: dict[str, list[torch.Tensor]] = {
        "past_only": [], "self_only": [], "swapped": [], "q_twice": [], "no_scale": [],
        "no_out_proj": [], "sum_values": [],
    }
    for t in range(L):
        qt, upto = q[:, :, t : t + 1], slice(0, t + 1)
        rows["past_only"].append(heads_out(qt, K[:, :, :t], V[:, :, :t]))
        rows["self_only"].append(heads_out(qt, K[:, :, t : t + 1], V[:, :, t : t + 1]))
        rows["swapped"].append(heads_out(qt, V[:, :, upto], K[:, :, upto]))
        rows["q_twice"].append(heads_out(q_twice[:, :, t : t + 1], K[:, :, upto], V[:, :, upto]))
        rows["no_scale"].append(heads_out(qt, K[:, :, upto], V[:, :, upto], use_scale=False))
        rows["no_out_proj"].append(heads_out(qt, K[:, :, upto], V[:, :, upto], out_proj=False))
        summed = V[:, :, upto].sum(dim=2, keepdim=True)  # softmax over the query axis: weights 1
        rows["sum_values"].append(attn.out_proj(attn.merge_heads(summed)[:, 0]))
    return {name: torch.stack(r, dim=1) for name, r in rows.items()}


_CACHED_MISTAKES = [
    (
        "past_only",
        "the new position attends to the cache before its own key and value are appended, so it "
        "never sees itself (and at step 0 it sees nothing at all). In the full decoder the causal "
        "mask lets position t see 0..t, itself included: append first, then attend.",
    ),
    (
        "self_only",
        "the new position attends only to itself; the past keys and values are not used. "
        "Concatenate the cache and the new row, then attend over all of them.",
    ),
    (
        "swapped",
        "keys and values are swapped: the query is compared with the values and the keys are "
        "averaged. attn.attend(query, k, v) takes the keys first.",
    ),
    (
        "q_twice",
        "the query is projected twice: attn.attend applies q_proj itself, so pass it x_new, not "
        "attn.q_proj(x_new).",
    ),
    (
        "no_scale",
        "the scores are not divided by sqrt(head_dim) (the attention you wrote by hand leaves out "
        "the scaling).",
    ),
    (
        "no_out_proj",
        "the output projection attn.out_proj is missing after merging the heads.",
    ),
    (
        "sum_values",
        "every attention weight is 1, so the values are summed: the softmax runs over the query "
        "axis (one query here), not over the keys. Use softmax(dim=-1).",
    ),
]


@checker
def check_cached_self_attention(fn: Callable[..., Any]) -> None:
    """Check one step of cached causal self-attention against full causal attention, every step."""
    cases = 0
    for B, L, d, h, seed in ((2, 5, 16, 4, 0), (1, 7, 12, 3, 1)):
        case = f"B={B}, {L} steps, d_model={d}, {h} heads"
        torch.manual_seed(seed)
        attn = MultiHeadAttention(d, h).eval()
        with torch.no_grad():  # random biases too: a missing projection cannot hide behind zeros
            for name, param in attn.named_parameters():
                if name.endswith("bias"):
                    param.normal_(0.0, 0.3)
        x = torch.randn(B, L, d)
        with torch.no_grad():
            expected = attn(x, x, x, causal_mask(L))  # (B, L, d): row t sees rows 0..t
            variants = _cached_variants(attn, x)
            exp_k, exp_v = attn.project_kv(x, x)
            out, k, v = _step_by_step(fn, attn, x, case)
        cases += 1
        if torch.allclose(out, expected, atol=1e-5):
            if torch.allclose(k, exp_v, atol=1e-5) and torch.allclose(v, exp_k, atol=1e-5):
                raise CheckFailure(
                    f"The outputs are right but the returned cache is not ({case}): k and v are "
                    "swapped. Return (out, k, v), keys first."
                )
            if not (torch.allclose(k, exp_k, atol=1e-5) and torch.allclose(v, exp_v, atol=1e-5)):
                raise CheckFailure(
                    f"The outputs are right but the returned cache is not ({case}): k and v must "
                    "hold the keys and values of every position so far, in order (oldest first)."
                )
            continue
        for name, message in _CACHED_MISTAKES:
            wrong = variants[name]
            first = 1 if name == "past_only" else 0  # step 0 of that bug: no key at all
            if torch.allclose(out[:, first:], wrong[:, first:], atol=1e-5):
                raise CheckFailure(f"Likely mistake ({case}): {message}", mistake=name)
        diff = (out - expected).abs().max().item()
        bad_steps = ((out - expected).abs().amax(dim=(0, 2)) > 1e-5).nonzero().flatten().tolist()
        raise CheckFailure(
            f"Output differs from the full causal self-attention ({case}): largest difference "
            f"{diff:.3g}, at steps {bad_steps}. None of the usual mistakes explains it; compare "
            "step 0 and step 1 by hand."
        )
    passed("check_cached_self_attention", cases)


# ----------------------------------------------------------------------------------------------
# check_top_p_filter (build)
# ----------------------------------------------------------------------------------------------


def _dropped(x: torch.Tensor) -> torch.Tensor:
    """Positions a softmax gives (practically) zero probability: -inf or a very negative number."""
    return x <= -1e9


def _calls(fn: Callable[..., Any], target: Callable[..., Any], *args: Any) -> tuple[Any, bool]:
    """Run ``fn(*args)``; also say whether ``target`` (a Python function) ran during the call."""
    with calls_to([target]) as seen:
        result = run_learner(fn, *args, case="your function", hint="")
    return result, bool(seen)


def _ordered_nucleus(logits: torch.Tensor, keep: torch.Tensor, want: torch.Tensor) -> bool:
    """True if ``keep`` keeps ``want`` tokens per row and none of them is less likely than a
    dropped one: the same nucleus as any other, up to the choice among equal logits."""
    if not torch.equal(keep.sum(-1), want):
        return False
    lowest_kept = logits.masked_fill(~keep, float("inf")).amin(-1)
    highest_dropped = logits.masked_fill(keep, float("-inf")).amax(-1)
    return bool((lowest_kept >= highest_dropped).all())


def _top_p_variants(logits: torch.Tensor, p: float) -> dict[str, torch.Tensor]:
    """Keep masks ``(..., V)`` of plausible wrong nucleus filters (True = kept)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(dim=-1)
    cum = probs.cumsum(dim=-1)

    def back(keep_sorted: torch.Tensor) -> torch.Tensor:
        return keep_sorted.scatter(-1, order, keep_sorted)

    first = torch.zeros_like(cum, dtype=torch.bool)
    first[..., 0] = True
    variants = {
        "strict": back((cum - probs) <= p),  # drop only if the mass above is > p
        "short": back((cum <= p) | first),  # drops the token that reaches p
        "short_lt": back((cum < p) | first),
        "not_scattered": (cum - probs) < p,  # the sorted decision applied in vocabulary order
    }
    asc_logits, asc_order = logits.sort(dim=-1, stable=True)
    asc_probs = asc_logits.softmax(-1)
    keep_asc = (asc_probs.cumsum(-1) - asc_probs) < p
    variants["ascending"] = keep_asc.scatter(-1, asc_order, keep_asc)
    raw = sorted_logits  # no softmax: the cumulative sum of the logits themselves
    keep_raw = (raw.cumsum(-1) - raw) < p
    variants["no_softmax"] = back(keep_raw)
    vocab_probs = logits.softmax(-1)  # no sort: the cumulative sum in vocabulary order
    variants["unsorted"] = (vocab_probs.cumsum(-1) - vocab_probs) < p
    if logits.dim() >= 2 and logits.size(0) > 1:  # softmax over the batch axis
        wrong, wrong_order = logits.softmax(dim=0).sort(dim=-1, descending=True, stable=True)
        keep_wrong = (wrong.cumsum(-1) - wrong) < p
        variants["softmax_axis"] = keep_wrong.scatter(-1, wrong_order, keep_wrong)
        wrong_sorted = sorted_logits.softmax(dim=0)  # ... of the sorted logits
        variants["softmax_axis_sorted"] = back((wrong_sorted.cumsum(-1) - wrong_sorted) < p)
    return variants


_TOP_P_MISTAKES = [
    (
        "strict",
        "`>` where `>=` belongs: a token is dropped only when the mass ranked above it EXCEEDS p, "
        "so when that mass is exactly p the nucleus keeps one token too many. The nucleus is "
        "complete as soon as its mass reaches p: drop a token if the mass above it is >= p.",
    ),
    (
        "short",
        "the nucleus is one token too small: you keep tokens while the cumulative probability is "
        "below p, and drop the token that crosses p. The nucleus is the smallest set whose mass "
        "reaches p: keep a token if the mass of the tokens ranked ABOVE it is still < p.",
    ),
    (
        "short_lt",
        "the nucleus is one token too small: you keep tokens while the cumulative probability is "
        "below p, and drop the token that crosses p. The nucleus is the smallest set whose mass "
        "reaches p: keep a token if the mass of the tokens ranked ABOVE it is still < p.",
    ),
    (
        "not_scattered",
        "you keep the right NUMBER of tokens but not the right ones: the decision made in sorted "
        "order is applied in vocabulary order. Map it back (scatter with the sort indices), or "
        "compare each logit with the smallest kept logit.",
    ),
    (
        "ascending",
        "the sort is ascending, so the cumulative sum starts from the LEAST likely tokens and the "
        "nucleus keeps the unlikely tail. Sort in descending order (descending=True).",
    ),
    (
        "no_softmax",
        "the cumulative sum is taken over the logits, not over probabilities. Apply softmax "
        "(to the sorted logits, or before sorting) first.",
    ),
    (
        "unsorted",
        "the cumulative sum runs in vocabulary order; the nucleus is built from the most likely "
        "token down. Sort by probability first.",
    ),
    (
        "softmax_axis",
        "softmax runs over the wrong axis (the batch axis): the probabilities of one row must be "
        "normalised over its own vocabulary, softmax(dim=-1).",
    ),
    (
        "softmax_axis_sorted",
        "softmax runs over the wrong axis (the batch axis): the probabilities of one row must be "
        "normalised over its own vocabulary, softmax(dim=-1).",
    ),
]


@checker
def check_top_p_filter(fn: Callable[..., Any]) -> None:
    """Check ``fn(logits (..., V), p)`` against the nucleus of ``filter_logits(logits, top_p=p)``"""
    gen = torch.Generator().manual_seed(0)
    # Probabilities 1/2, 1/4, 1/8, 1/8 in float64: the mass above the third token is exactly
    # 0.75 = p (in float64, and in float32 if you convert), so `>` and `>=` keep different sets.
    exact = torch.log(torch.tensor([[0.125, 0.5, 0.125, 0.25], [0.25, 0.125, 0.5, 0.125]],
                                   dtype=torch.float64))
    cases = [
        ("one row, p=0.75", torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), 0.75),
        ("one row, p=0.85", torch.log(torch.tensor([0.05, 0.3, 0.5, 0.15])), 0.85),
        ("a batch (4, 10), p=0.9", torch.randn(4, 10, generator=gen) * 2, 0.9),
        ("a batch (2, 3, 12), p=0.5", torch.randn(2, 3, 12, generator=gen) * 3, 0.5),
        ("p=1.0 keeps everything", torch.randn(3, 6, generator=gen), 1.0),
        ("tiny p=0.01 keeps the top token", torch.randn(3, 6, generator=gen), 0.01),
        ("mass exactly p (float64, probabilities 1/2, 1/4, 1/8, 1/8), p=0.75", exact, 0.75),
    ]
    if fn is filter_logits or is_course_lib(fn):
        raise CheckFailure(
            "You handed in course_lib's own function, not yours: the exercise is to write the "
            "nucleus filter yourself (the lesson uses course_lib's filter_logits until yours "
            "passes)."
        )
    suspects: list[str] | None = None  # mistakes that explain every failed case so far
    first_failure = ""
    for case, logits, p in cases:
        original = logits.clone()
        got, called = _calls(fn, filter_logits, logits, p)
        if called:
            raise CheckFailure(
                "Your function calls course_lib's filter_logits, the reference it is checked "
                "against: the exercise is to write the nucleus filter yourself (sort, softmax, "
                "cumulative sum)."
            )
        if not torch.equal(logits, original):
            raise CheckFailure(
                f"Your function changed its input logits in place ({case}); work on a copy "
                "(masked_fill, not masked_fill_)."
            )
        if isinstance(got, torch.Tensor) and got.dtype == torch.bool:
            raise CheckFailure(
                f"You return a boolean mask ({case}); return the filtered LOGITS: the same "
                "logits, with the tokens outside the nucleus set to -inf (logits.masked_fill)."
            )
        expect_shape(got, tuple(logits.shape), f"the filtered logits ({case})")
        expected = filter_logits(logits, top_p=p)
        keep, got_keep = ~torch.isinf(expected), ~_dropped(got)
        want = keep.sum(-1)
        if _ordered_nucleus(logits, got_keep, want):
            if not torch.allclose(got[got_keep], logits[got_keep]):
                finite = got[torch.isfinite(got)]
                if ((finite >= 0) & (finite <= 1)).all() and got.isfinite().any():
                    raise CheckFailure(
                        f"You return probabilities ({case}); return the logits themselves, with "
                        "the tokens outside the nucleus set to -inf (softmax comes later)."
                    )
                raise CheckFailure(
                    f"The kept logits must stay unchanged ({case}); only the others become -inf "
                    "(softmax renormalises afterwards)."
                )
            continue
        in_unit = ((got >= 0) & (got <= 1)).all()
        sums_to_one = torch.allclose(got.sum(-1).double(), torch.ones(1).double(), atol=1e-4)
        if got_keep.all() and in_unit and sums_to_one:
            raise CheckFailure(
                f"You return probabilities ({case}); return the logits themselves, with the "
                "tokens outside the nucleus set to -inf (softmax comes later)."
            )
        if got_keep.all() and (got[~keep] == 0).all():
            raise CheckFailure(
                f"Likely mistake ({case}): the dropped tokens are set to 0, not -inf. A logit of 0 "
                "is an ordinary logit; only -inf gives probability 0 after softmax."
            )
        if not got_keep.any(dim=-1).all():
            raise CheckFailure(
                f"Likely mistake ({case}): a row keeps no token at all, so softmax gives NaN. "
                "The most likely token is always kept, even when its probability exceeds p."
            )
        variants = _top_p_variants(logits, p)
        matching = []
        for name, message in _TOP_P_MISTAKES:
            variant = variants.get(name)
            if variant is None:
                continue
            lowest = logits.masked_fill(~variant, float("inf")).amin(-1, keepdim=True)
            with_ties = logits >= lowest  # the variant, written as "keep logits >= a threshold"
            if (
                torch.equal(got_keep, variant)
                or torch.equal(got_keep, with_ties)
                or (
                    _ordered_nucleus(logits, variant, variant.sum(-1))
                    and _ordered_nucleus(logits, got_keep, variant.sum(-1))
                )
            ):
                matching.append(message)
        # Several mistakes can give the same tokens on one case: the later cases tell them apart.
        candidates = matching if suspects is None else [m for m in suspects if m in matching]
        if len(set(candidates)) == 1:
            raise CheckFailure(f"Likely mistake ({case}): {candidates[0]}", mistake=candidates[0])
        if candidates:
            suspects, first_failure = candidates, first_failure or case
            continue
        if suspects:
            break
        raise CheckFailure(
            f"Wrong tokens kept ({case}): expected {want.tolist()} per row, you kept "
            f"{got_keep.sum(-1).tolist()}. None of the usual mistakes explains it: sort by "
            "probability, take the cumulative sum, keep the smallest prefix whose mass reaches p."
        )
    if suspects:
        raise CheckFailure(f"Likely mistake ({first_failure}): {suspects[0]}", mistake=suspects[0])
    passed("check_top_p_filter", len(cases))
