"""Lesson-11 ★★★ checker, one decoding step with a KV cache and RoPE
(course_lib/checks/lesson11_rope_decode.py): right answers pass, each named mistake is caught."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _helpers import passes, solution_namespace

from course_lib.checks import CheckFailure, check_rope_decode
from course_lib.rope import RotaryEmbedding
from course_lib.solutions import solution_source


# ----------------------------------------------------------------------------------------------
# check_rope_decode (★★★)
# ----------------------------------------------------------------------------------------------


def _decode_solution():
    namespace = solution_namespace("11.apply_rope")
    exec(solution_source("11.gqa"), namespace)  # noqa: S102
    namespace["rope_at"], namespace["attend"] = namespace["apply_rope"], namespace["grouped_query_attention"]
    exec(solution_source("11.rope_decode"), namespace)  # noqa: S102
    return namespace


def _decode_variant(knob=""):
    ns = _decode_solution()
    apply_rope, attend = ns["apply_rope"], ns["grouped_query_attention"]

    def rope_decode_step(layer, x_t, t, cache):
        kv = layer.num_kv_heads
        q = layer.split_heads(layer.q_proj(x_t))
        k = layer.split_heads(layer.k_proj(x_t), kv)
        v = layer.split_heads(layer.v_proj(x_t), kv)
        pos = torch.tensor([{"pos0": 0, "one_based": t + 1}.get(knob, t)])
        if knob == "q_prev":  # the query one position behind its own key
            q = apply_rope(q, torch.tensor([max(t - 1, 0)]))
        elif knob != "q_unturned":
            q = apply_rope(q, pos)
        if knob not in ("k_unturned", "unturned_cache", "whole_at_t", "cache_unturned"):
            k = apply_rope(k, pos)
        if knob == "turn_v":
            v = apply_rope(v, pos)
        past = cache
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        keys, values = k, v
        if knob in ("unturned_cache", "turned_twice"):  # turn the whole cache by 0..t each step
            keys = apply_rope(k, torch.arange(t + 1))
        if knob == "whole_at_t":  # the whole cache turned at t, and kept so
            keys = k = apply_rope(k, torch.tensor([t]))
        if knob == "cache_unturned":  # the new key turned for attending, stored unturned
            keys = torch.cat([k[:, :, :-1], apply_rope(k[:, :, -1:], pos)], dim=2)
        if knob == "past_only":
            if past is None:
                return layer.out_proj(layer.merge_heads(torch.zeros_like(q))), (k, v)
            keys, values = past
        if knob == "new_only":
            keys, values = keys[:, :, -1:], values[:, :, -1:]
        mask = None
        if knob == "tril_mask":  # a (1, t + 1) causal mask: only column 0 is True
            mask = torch.ones(1, t + 1, dtype=torch.bool).tril()
        if knob == "modulo":
            group = layer.num_heads // kv
            heads = F.scaled_dot_product_attention(q, keys.repeat(1, group, 1, 1),
                                                   values.repeat(1, group, 1, 1))
        elif knob == "no_scale":
            group = layer.num_heads // kv
            heads = F.scaled_dot_product_attention(q, keys.repeat_interleave(group, 1),
                                                   values.repeat_interleave(group, 1), scale=1.0)
        else:
            heads = attend(q, keys, values, mask)
        merged = layer.merge_heads(heads)
        return (merged if knob == "no_out_proj" else layer.out_proj(merged)), (k, v)

    return rope_decode_step


def test_rope_decode_solution_passes(capsys):
    assert passes(check_rope_decode, _decode_solution()["rope_decode_step"])
    assert "check_rope_decode: on all" in capsys.readouterr().out


def _decode_by_einsum_float64(layer, x_t, t, cache):
    """Every number in float64, heads grouped by a view and einsum, the angles written out."""
    h, kv, hd = layer.num_heads, layer.num_kv_heads, layer.head_dim
    B = x_t.size(0)

    def proj(m, heads):
        y = F.linear(x_t.double(), m.weight.double(), None if m.bias is None else m.bias.double())
        return y.view(B, 1, heads, hd).transpose(1, 2)  # (B, heads, 1, hd)

    def turn(z):
        theta = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        a = t * theta
        z1, z2 = z[..., : hd // 2], z[..., hd // 2:]
        return torch.cat([z1 * a.cos() - z2 * a.sin(), z1 * a.sin() + z2 * a.cos()], -1)

    q, k, v = turn(proj(layer.q_proj, h)), turn(proj(layer.k_proj, kv)), proj(layer.v_proj, kv)
    if cache is not None:
        k, v = torch.cat([cache[0].double(), k], 2), torch.cat([cache[1].double(), v], 2)
    qg = q.view(B, kv, h // kv, 1, hd)  # (B, kv, group, 1, hd): query head i -> KV head i // group
    w = torch.einsum("bkgqd,bksd->bkgqs", qg, k).div(math.sqrt(hd)).softmax(-1)
    heads = torch.einsum("bkgqs,bksd->bkgqd", w, v).reshape(B, h, 1, hd)
    out = F.linear(heads.transpose(1, 2).reshape(B, 1, h * hd), layer.out_proj.weight.double(),
                   None if layer.out_proj.bias is None else layer.out_proj.bias.double())
    return out, (k, v)


def _decode_one_sequence_at_a_time(layer, x_t, t, cache):
    right = _decode_solution()["rope_decode_step"]
    outs, ks, vs = [], [], []
    for b in range(x_t.size(0)):
        one = None if cache is None else (cache[0][b : b + 1], cache[1][b : b + 1])
        out, (k, v) = right(layer, x_t[b : b + 1], t, one)
        outs.append(out), ks.append(k), vs.append(v)
    return torch.cat(outs), (torch.cat(ks), torch.cat(vs))


def _decode_decorated(decorator):
    right = _decode_solution()["rope_decode_step"]

    @decorator
    def rope_decode_step(layer, x_t, t, cache):
        return right(layer, x_t, t, cache)

    return rope_decode_step


@pytest.mark.parametrize("fn", [
    _decode_variant(), _decode_by_einsum_float64, _decode_one_sequence_at_a_time,
    _decode_decorated(torch.no_grad()), _decode_decorated(torch.inference_mode()),
])
def test_rope_decode_other_styles_pass(fn):
    assert passes(check_rope_decode, fn)


@pytest.mark.parametrize("knob, words", [
    ("pos0", "turned at position 0"), ("q_unturned", "query is not turned"),
    ("k_unturned", "new key is not turned"), ("turn_v", "values are turned"),
    ("turned_twice", "turned twice"), ("past_only", "does not see itself"),
    ("new_only", "cache is not used"), ("modulo", "i % num_kv_heads"), ("no_scale", "sqrt"),
    # issue 38: positions 1..t+1 (the prompt's cache makes the offset show), the (1, t+1) tril mask,
    # the whole cache turned at t (observed: keys turned again by t, not by their own positions),
    # the turned keys of the cache turned again each step, a forgotten out_proj, an unturned cache
    ("one_based", "positions counted from 1"), ("tril_mask", "attends to position 0 only"),
    ("whole_at_t", "turned again, all by the new position t"), ("unturned_cache", "turned twice"),
    ("no_out_proj", "out_proj is not applied"), ("cache_unturned", "appends to the cache .* is not turned"),
    ("q_prev", "query is turned by t - 1 and the new key by t"),  # a blind tryout's, 2026-11-27
])
def test_rope_decode_mistakes_are_named(knob, words):
    with pytest.raises(CheckFailure, match=words):
        check_rope_decode(_decode_variant(knob))


def test_rope_decode_whole_cache_at_t_is_not_told_position_0():
    """Issue 38: the learner who turns every key by t has already turned the new one by t."""
    with pytest.raises(CheckFailure) as failure:
        check_rope_decode(_decode_variant("whole_at_t"))
    assert "position 0" not in str(failure.value) and "own position" in str(failure.value)


def test_rope_decode_starts_from_a_prompt_in_the_cache():
    """The checker's first case hands over a prefilled cache with two-digit positions."""
    from course_lib.checks.lesson11_rope_decode import DECODE_CASES

    seen = []

    def rope_decode_step(layer, x_t, t, cache):
        seen.append((t, None if cache is None else cache[0].size(2)))
        return _decode_solution()["rope_decode_step"](layer, x_t, t, cache)

    assert passes(check_rope_decode, rope_decode_step)
    assert seen[0] == (DECODE_CASES[0][5], DECODE_CASES[0][5]) and seen[0][0] >= 10
    assert (0, None) in seen  # and one case starts from no cache


def test_rope_decode_cache_shape_and_refusals():
    right = _decode_solution()["rope_decode_step"]

    def repeated_cache(layer, x_t, t, cache):
        out, (k, v) = right(layer, x_t, t, cache)
        group = layer.num_heads // layer.num_kv_heads
        return out, (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)) if group > 1 else (k, v)

    with pytest.raises(CheckFailure, match="Keep num_kv_heads heads in the cache"):
        check_rope_decode(repeated_cache)
    with pytest.raises(CheckFailure, match="a pair"):
        check_rope_decode(lambda layer, x_t, t, cache: right(layer, x_t, t, cache)[0])

    def with_library(layer, x_t, t, cache):
        RotaryEmbedding(layer.head_dim, t + 1)(layer.split_heads(layer.q_proj(x_t)), start=t)
        return right(layer, x_t, t, cache)

    with pytest.raises(CheckFailure, match="library's rotary"):
        check_rope_decode(with_library)

    def in_place(layer, x_t, t, cache):
        out, (k, v) = right(layer, x_t, t, cache)
        if cache is not None:
            cache[0].zero_()
        return out, (k, v)

    with pytest.raises(CheckFailure, match="changes the cache it received in place"):
        check_rope_decode(in_place)


# ----------------------------------------------------------------------------------------------
# issue 38, h11's learner tryout: the attempts that got a generic line, a raw error or a wrong name
# ----------------------------------------------------------------------------------------------


def _decode_tryout(pos=None, sdpa_direct=False, scale=None, swap_cache=False):
    ns = _decode_solution()
    apply_rope, attend = ns["apply_rope"], ns["grouped_query_attention"]

    def rope_decode_step(layer, x_t, t, cache):
        kv = layer.num_kv_heads
        q, k = layer.split_heads(layer.q_proj(x_t)), layer.split_heads(layer.k_proj(x_t), kv)
        v = layer.split_heads(layer.v_proj(x_t), kv)
        p = torch.tensor([pos(t) if pos else t])
        q, k = apply_rope(q, p), apply_rope(k, p)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        if sdpa_direct:  # the KV heads never shared out among the query heads
            heads = F.scaled_dot_product_attention(q, k, v)
        elif scale:
            g = layer.num_heads // kv
            heads = F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1),
                                                   v.repeat_interleave(g, 1), scale=scale(layer))
        else:
            heads = attend(q, k, v)
        return layer.out_proj(layer.merge_heads(heads)), ((v, k) if swap_cache else (k, v))

    return rope_decode_step


@pytest.mark.parametrize("fn, words", [
    (_decode_tryout(pos=lambda t: max(t - 1, 0)), "turned at position t - 1"),
    (_decode_tryout(sdpa_direct=True), "the query heads meet the KV heads unshared"),
    (_decode_tryout(scale=lambda layer: (layer.num_heads * layer.head_dim) ** -0.5), r"sqrt\(d_model\)"),
    (_decode_tryout(swap_cache=True), r"is \(v, k\)"),
])
def test_rope_decode_tryout_mistakes_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_rope_decode(fn)


def _decode_shapes(variant):
    ns = _decode_solution()
    apply_rope, attend = ns["apply_rope"], ns["grouped_query_attention"]

    def rope_decode_step(layer, x_t, t, cache):
        kv = layer.num_kv_heads
        q = layer.split_heads(layer.q_proj(x_t))
        k = layer.split_heads(layer.k_proj(x_t), None if variant == "split" else kv)
        v = layer.split_heads(layer.v_proj(x_t), kv)
        p = torch.tensor([t])
        q, k = apply_rope(q, p), apply_rope(k, p)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        mask = torch.ones(t + 1, t + 1, dtype=torch.bool).tril() if variant == "full_mask" else None
        out = layer.out_proj(layer.merge_heads(attend(q, k, v, mask)))
        return out, (k, v)

    return rope_decode_step


@pytest.mark.parametrize("variant, words", [
    ("split", "split into num_heads = 6 heads"), ("full_mask", r"a \(t \+ 1, t \+ 1\) mask broadcasts"),
])
def test_rope_decode_second_tryout_mistakes_are_named(variant, words):
    with pytest.raises(CheckFailure, match=words):
        check_rope_decode(_decode_shapes(variant))
