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
  nucleus set to ``-inf``; reference ``course_lib.decoding.filter_logits(logits, top_p=p)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..attention import MultiHeadAttention
from ..decoding import filter_logits, greedy_decode
from ..masks import causal_mask
from ..model import Transformer, TransformerConfig
from ._common import CheckFailure, checker, expect_shape, passed, run_learner

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
    one_too_many = "counts one step too many: the last token is produced, never fed back"
    confusions = {
        n * n: f"{n * n} = {n} x {n} counts all {n} positions at every step; at step t only t "
        "exist yet",
        n * (n - 1) // 2: f"{n * (n - 1) // 2} leaves out the start symbol, which goes through "
        "the decoder too",
        (n + 1) * (n + 2) // 2: f"{(n + 1) * (n + 2) // 2} {one_too_many}",
        1: "1 would be one step; the cache saves recomputing the past, not the steps: every new "
        "token still needs one pass",
        n + 1: f"{n + 1} {one_too_many}",
    }
    for value, label in ((got[0], "without a cache"), (got[1], "with a cache")):
        truth = without if label == "without a cache" else with_cache
        if value != truth:
            reason = confusions.get(value, f"you said {value}")
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
        "Append the new key and value to the cache along the position axis (dim=2 of "
        "(B, num_heads, t, head_dim)), then attend with the new query over all t+1 rows."
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
        outs.append(out)
        k, v = k_new, v_new
    return torch.cat(outs, dim=1), k, v


@checker
def check_cached_self_attention(fn: Callable[..., Any]) -> None:
    """Check one step of cached causal self-attention against full causal attention, every step."""
    cases = 0
    for B, L, d, h, seed in ((2, 5, 16, 4, 0), (1, 7, 12, 3, 1)):
        case = f"B={B}, {L} steps, d_model={d}, {h} heads"
        torch.manual_seed(seed)
        attn = MultiHeadAttention(d, h).eval()
        x = torch.randn(B, L, d)
        with torch.no_grad():
            expected = attn(x, x, x, causal_mask(L))  # (B, L, d): row t sees rows 0..t
            past_only = torch.stack(
                [  # the bug: the new row attends to the cache BEFORE it is appended
                    (
                        attn(x[:, t : t + 1], x[:, :t], x[:, :t], None)[:, 0]
                        if t
                        else attn.out_proj.bias.expand(B, d)
                    )
                    for t in range(L)
                ],
                dim=1,
            )
            self_only = torch.cat(
                [attn(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1]) for t in range(L)], 1
            )
            exp_k, exp_v = attn.project_kv(x, x)
            out, k, v = _step_by_step(fn, attn, x, case)
        cases += 1
        if torch.allclose(out, expected, atol=1e-5):
            if not (torch.allclose(k, exp_k, atol=1e-5) and torch.allclose(v, exp_v, atol=1e-5)):
                raise CheckFailure(
                    f"The outputs are right but the returned cache is not ({case}): k and v must "
                    "hold the keys and values of every position so far, in order (oldest first)."
                )
            continue
        if torch.allclose(out[:, 1:], past_only[:, 1:], atol=1e-5):
            raise CheckFailure(
                f"Likely mistake ({case}): the new position attends to the cache before its own "
                "key and value "
                "are appended, so it never sees itself (and at step 0 it sees nothing at all). In "
                "the full "
                "decoder the causal mask lets position t see 0..t, itself included: append first, "
                "then attend."
            )
        if torch.allclose(out, self_only, atol=1e-5):
            raise CheckFailure(
                f"Likely mistake ({case}): the new position attends only to itself; the past keys "
                "and values "
                "are not used. Concatenate the cache and the new row, then attend over all of them."
            )
        diff = (out - expected).abs().max().item()
        raise CheckFailure(
            f"Output differs from the full causal self-attention ({case}): largest difference "
            f"{diff:.3g}. Compare step 0 and step 1 by hand."
        )
    passed("check_cached_self_attention", cases)


# ----------------------------------------------------------------------------------------------
# check_top_p_filter (build)
# ----------------------------------------------------------------------------------------------


def _dropped(x: torch.Tensor) -> torch.Tensor:
    """Positions a softmax gives (practically) zero probability: -inf or a very negative number."""
    return x <= -1e9


@checker
def check_top_p_filter(fn: Callable[..., Any]) -> None:
    """Check ``fn(logits (..., V), p)`` against the nucleus of ``filter_logits(logits, top_p=p)``"""
    gen = torch.Generator().manual_seed(0)
    cases = [
        ("one row, p=0.75", torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), 0.75),
        ("one row, p=0.85", torch.log(torch.tensor([0.05, 0.3, 0.5, 0.15])), 0.85),
        ("a batch (4, 10), p=0.9", torch.randn(4, 10, generator=gen) * 2, 0.9),
        ("a batch (2, 3, 12), p=0.5", torch.randn(2, 3, 12, generator=gen) * 3, 0.5),
        ("p=1.0 keeps everything", torch.randn(3, 6, generator=gen), 1.0),
        ("tiny p=0.01 keeps the top token", torch.randn(3, 6, generator=gen), 0.01),
    ]
    for case, logits, p in cases:
        original = logits.clone()
        got = run_learner(
            fn, logits, p, case=case, hint="Return a tensor of the same shape as logits."
        )
        if not torch.equal(logits, original):
            raise CheckFailure(
                f"Your function changed its input logits in place ({case}); work on a copy "
                "(masked_fill, not masked_fill_)."
            )
        expect_shape(got, tuple(logits.shape), f"the filtered logits ({case})")
        expected = filter_logits(logits, top_p=p)
        keep, got_keep = ~torch.isinf(expected), ~_dropped(got)
        if torch.equal(keep, got_keep):
            if not torch.allclose(got[keep], logits[keep]):
                raise CheckFailure(
                    f"The kept logits must stay unchanged ({case}); only the others become -inf "
                    "(softmax renormalises afterwards)."
                )
            continue
        probs = logits.softmax(-1)
        if not got_keep.any(dim=-1).all():
            raise CheckFailure(
                f"Likely mistake ({case}): a row keeps no token at all, so softmax gives NaN. "
                "The most likely token is always kept, even when its probability exceeds p."
            )
        kept_mass = (probs * got_keep).sum(-1)
        if (got_keep.sum(-1) < keep.sum(-1)).any() and (kept_mass < p - 1e-6).any():
            raise CheckFailure(
                f"Likely mistake ({case}): the nucleus is one token too small: you keep tokens "
                "while the cumulative "
                "probability is below p, and drop the token that crosses p. The nucleus is the "
                "smallest set whose "
                "mass reaches p: keep a token if the mass of the tokens ranked ABOVE it is still "
                "< p."
            )
        if got_keep.sum(-1).tolist() == keep.sum(-1).tolist():
            raise CheckFailure(
                f"Likely mistake ({case}): you keep the right NUMBER of tokens but not the right "
                "ones. After "
                "sorting, map the decision back to the vocabulary order (scatter with the sort "
                "indices), or "
                "compare each logit with the smallest kept logit."
            )
        raise CheckFailure(
            f"Wrong tokens kept ({case}): expected {keep.sum(-1).tolist()} per row, you kept "
            f"{got_keep.sum(-1).tolist()}. Sort by probability, take the cumulative sum, keep the "
            "smallest prefix "
            "whose mass reaches p."
        )
    passed("check_top_p_filter", len(cases))
