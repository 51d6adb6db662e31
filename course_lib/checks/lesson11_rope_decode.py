"""Checker for lesson 11's ★★★: one decoding step with a KV cache, rotary positions at offset t.

* ``check_rope_decode(fn)``: ``fn(layer, x_t (B, 1, d_model), t, cache) -> (out (B, 1, d_model),
  (k, v))``, one decoding step of rotary grouped-query self-attention; every output must equal the
  same layer run once on the whole sequence with RoPE and a causal mask (cached = recomputed), and
  every returned cache must hold the turned keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..attention import MultiHeadAttention
from ..rope import RotaryEmbedding
from .common import CheckFailure, calls_to, checker, expect_shape, is_course_lib
from .lesson11_modern import call_learner, close64, f64, no_raw_errors
from .lesson11_rope import rope_angles, turn_halves

__all__ = ["check_rope_decode"]


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
    return turn_halves(t, rope_angles(p, t.size(-1), base))


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
DECODE_CASES = [
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
    _, d, h, kv, B, P, T, bias = DECODE_CASES[n]
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
    if close64(got[0], want_v) and close64(got[1], want_k):
        return (f"The cache you return after step t={t} ({case}) is (v, k): its first tensor holds "
                "the values and its second the keys. The cache is (k, v), keys first, as received.")
    if not close64(got[0][:, :, :-1], want_k[:, :, :-1]) or not close64(got[1][:, :, :-1],
                                                                          want_v[:, :, :-1]):
        return (f"The cache you return after step t={t} ({case}) changes the positions it received: "
                "its first t positions should be the received keys and values, as they were.")
    k_raw = _heads64(layer, "k_proj", x_t, layer.num_kv_heads)
    if close64(k_new, k_raw) and t > 0:
        return (f"Your step's output is right, but the key it appends to the cache at t={t} ({case}) "
                "is not turned, while the keys it received carry the angles of their positions: the "
                "next step would read it as a key at position 0.")
    if close64(k_new, _turn_at(k_raw, t + 1, DECODE_BASE)):
        return (f"Your step's output is right, but the key it appends to the cache at t={t} ({case}) "
                "is turned by position t + 1; the new token sits at position t (positions count "
                "from 0, and the received keys sit at 0..t-1).")
    which, mine, right = (("values", got[1], want_v) if close64(got[0], want_k)
                          else ("keys", got[0], want_k))
    return (f"Your step's output is right at t={t} ({case}), but the {which} of the cache it returns "
            "differ from the received cache plus the new token's, by up to "
            f"{(f64(mine) - right).abs().max().item():.3g}.")


@checker
@no_raw_errors
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
    for n, (case, d, h, kv, B, P, T, _) in enumerate(DECODE_CASES):
        layer, reference, x = _decode_layer(n)
        with torch.no_grad():
            expected = f64(reference(x, x, x, causal_mask(P + T)))  # (B, P+T, d): all at once
        cache = None
        want = _prefill(layer, x[:, :P], DECODE_BASE) if P else None  # float64
        if P:
            cache = tuple(c.float() for c in want)  # the prompt's cache, float32 like the layer
        for t in range(P, P + T):
            x_t = x[:, t : t + 1].clone()
            given = None if cache is None else tuple(c.clone() for c in cache)
            with calls_to(refused) as seen, torch.no_grad():
                try:
                    result = call_learner(fn, layer, x_t, t, cache, case=f"{case}, step t={t}",
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
            if not close64(out, expected[:, t : t + 1], atol=1e-4):
                # Two mistakes can give the same scores (turning the new query and key at 0, or
                # every key once more at t): the cache each returns tells them apart.
                matches = []
                for knob, name, hint in _DECODE_MISTAKES:
                    if knob in ("past_only",) and want is None:
                        continue
                    wrong, wrong_k, _ = _decode_step64(layer, x_t, t, want, DECODE_BASE, knob)
                    if close64(out, wrong, atol=1e-4):
                        matches.append((close64(new_cache[0], wrong_k, atol=1e-4), name, hint))
                if matches:
                    _, name, hint = max(matches, key=lambda m: m[0])  # the first with its cache too
                    raise CheckFailure(f"Likely mistake ({case}, step t={t}): {name}. {hint}.", mistake=name)
                raise CheckFailure(
                    f"Decoded step by step, the output at step t={t} ({case}) differs from the whole "
                    "sequence computed at once, by up to "
                    f"{(f64(out) - expected[:, t : t + 1]).abs().max().item():.3g}, though the "
                    "cache it received was right. None of the usual mistakes explains it; compare "
                    "your step's scores with those of the whole sequence's last row.")
            if not (close64(new_cache[0], want_k, atol=1e-4) and close64(new_cache[1], want_v,
                                                                            atol=1e-4)):
                raise CheckFailure(_decode_cache_message(case, t, new_cache, want_k, want_v, layer,
                                                         x_t))
            cache, want = tuple(new_cache), (want_k, want_v)
    print(f"check_rope_decode: on all {len(DECODE_CASES)} cases (prompts in the cache, and none), "
          "decoding step by step with your cache gives what the whole sequence gives at once. "
          "Well done!")
