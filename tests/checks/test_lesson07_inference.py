"""Lesson-07 checkers: correct answers in several styles pass, each named mistake is caught."""

from __future__ import annotations


import pytest
import torch
from _helpers import passes, solution_namespace

from course_lib.checks import check_cached_self_attention, check_decoder_work, check_top_p_filter
from course_lib.checks import CheckFailure


# ----------------------------------------------------------------------------------------------
# predict: decoder work
# ----------------------------------------------------------------------------------------------


def test_decoder_work_right(capsys):
    assert passes(check_decoder_work, solution_namespace("07.decoder_work")["predicted_decoder_work"])
    assert "right, 210 positions" in capsys.readouterr().out


def test_decoder_work_right_as_list_or_computed():
    assert passes(check_decoder_work, lambda: [sum(range(1, 21)), 20])


@pytest.mark.parametrize(
    "answer, words",
    [
        ((400, 20), "only t exist yet"),
        ((190, 20), "start symbol"),
        ((210, 1), "not the steps"),
        ((231, 21), "one step too many"),
        ((5, 2), "you said 5"),
    ],
)
def test_decoder_work_mistakes(answer, words):
    with pytest.raises(CheckFailure, match=words):
        check_decoder_work(lambda: answer)


def test_decoder_work_bad_type():
    with pytest.raises(CheckFailure, match="pair of integers"):
        check_decoder_work(lambda: 210)


def test_decoder_work_stub(capsys):
    def predicted_decoder_work():
        raise NotImplementedError

    check_decoder_work(predicted_decoder_work)
    assert "not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# debug: cached self-attention
# ----------------------------------------------------------------------------------------------


def test_cached_attention_solution_passes(capsys):
    assert passes(
        check_cached_self_attention, solution_namespace("07.cached_attention")["cached_self_attention_step"]
    )
    assert "all 2 cases match" in capsys.readouterr().out


def test_cached_attention_by_hand_with_fused_kernel_passes():
    """Another style: projections by hand and PyTorch's fused attention."""
    import torch.nn.functional as F

    def step(attn, x_new, past_k, past_v):
        B = x_new.size(0)
        split = lambda t: t.view(B, -1, attn.num_heads, attn.head_dim).transpose(1, 2)  # noqa: E731
        k = torch.cat([past_k, split(attn.k_proj(x_new))], dim=-2)
        v = torch.cat([past_v, split(attn.v_proj(x_new))], dim=-2)
        heads = F.scaled_dot_product_attention(split(attn.q_proj(x_new)), k, v)  # (B, h, 1, hd)
        return attn.out_proj(heads.transpose(1, 2).reshape(B, 1, -1)), k, v

    assert passes(check_cached_self_attention, step)


def test_cached_attention_attend_before_append_is_caught():
    def step(attn, x_new, past_k, past_v):  # the lesson's bug
        k_new, v_new = attn.project_kv(x_new, x_new)
        out = attn.attend(x_new, past_k, past_v)
        return out, torch.cat([past_k, k_new], dim=2), torch.cat([past_v, v_new], dim=2)

    with pytest.raises(CheckFailure, match="before its own key and value"):
        check_cached_self_attention(step)


def test_cached_attention_forgetting_the_past_is_caught():
    def step(attn, x_new, past_k, past_v):
        k_new, v_new = attn.project_kv(x_new, x_new)
        out = attn.attend(x_new, k_new, v_new)
        return out, torch.cat([past_k, k_new], dim=2), torch.cat([past_v, v_new], dim=2)

    with pytest.raises(CheckFailure, match="only to itself"):
        check_cached_self_attention(step)


def test_cached_attention_wrong_axis_is_caught():
    def step(attn, x_new, past_k, past_v):
        k_new, v_new = attn.project_kv(x_new, x_new)
        k, v = torch.cat([past_k, k_new], dim=1), torch.cat([past_v, v_new], dim=1)
        return attn.attend(x_new, k, v), k, v

    with pytest.raises(CheckFailure):
        check_cached_self_attention(step)


def test_cached_attention_stub(capsys):
    def cached_self_attention_step(attn, x_new, past_k, past_v):
        raise NotImplementedError

    check_cached_self_attention(cached_self_attention_step)
    assert "not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# build: top-p filter
# ----------------------------------------------------------------------------------------------


def test_top_p_solution_passes(capsys):
    assert passes(check_top_p_filter, solution_namespace("07.top_p")["my_top_p_filter"])
    assert "all 7 cases match" in capsys.readouterr().out


def test_top_p_threshold_style_passes():
    """Another style: find the smallest kept logit and compare, with a large negative number."""

    def top_p(logits, p):
        probs, _ = logits.softmax(-1).sort(-1, descending=True)
        n_keep = ((probs.cumsum(-1) - probs) < p).sum(-1, keepdim=True)  # (..., 1)
        threshold = logits.sort(-1, descending=True).values.gather(-1, n_keep - 1)
        return torch.where(logits >= threshold, logits, torch.full_like(logits, -1e10))

    assert passes(check_top_p_filter, top_p)


def test_top_p_one_token_short_is_caught():
    def top_p(logits, p):
        sorted_logits, order = logits.sort(-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum > p  # drops the token that crosses p
        drop[..., 0] = False
        return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))

    with pytest.raises(CheckFailure, match="one token too small"):
        check_top_p_filter(top_p)


def test_top_p_sorted_order_not_scattered_back_is_caught():
    def top_p(logits, p):
        sorted_logits, _ = logits.sort(-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = (probs.cumsum(-1) - probs) >= p
        return logits.masked_fill(drop, float("-inf"))  # forgot to map back

    with pytest.raises(CheckFailure, match="right NUMBER"):
        check_top_p_filter(top_p)


def test_top_p_empty_row_is_caught():
    def top_p(logits, p):  # shifts the mask right to keep the crossing token, but not the first one
        sorted_logits, order = logits.sort(-1, descending=True)
        drop = sorted_logits.softmax(-1).cumsum(-1) > p
        drop[..., 1:] = drop[..., :-1].clone()  # drop[..., 0] should become False
        return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))

    with pytest.raises(CheckFailure, match="keeps no token"):
        check_top_p_filter(top_p)


def test_top_p_in_place_is_caught():
    solution = solution_namespace("07.top_p")["my_top_p_filter"]

    def top_p(logits, p):
        out = solution(logits, p)
        logits.copy_(out)
        return out

    with pytest.raises(CheckFailure, match="in place"):
        check_top_p_filter(top_p)


def test_top_p_stub(capsys):
    def my_top_p_filter(logits, p):
        raise NotImplementedError

    check_top_p_filter(my_top_p_filter)
    assert "not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# every plausible mistake is rejected, and named (issue #15)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer, words",
    [
        ((20, 210), "swapped"),
        ((210, 210), "does not feed the prefix again"),
        ((400, 400), "does not feed the prefix again"),
        ((420, 40), "every decoder layer"),
        ((420, 20), "every decoder layer"),
        ((200, 20), "half of the diagonal"),
        ((210, 19), "leaves out the first step"),
        ((210, 0), "never runs"),
        ((210, 21), "one step too many"),
        ((210.0, 20.0), "pair of integers"),
    ],
)
def test_decoder_work_more_mistakes_are_named(answer, words):
    with pytest.raises(CheckFailure, match=words):
        check_decoder_work(lambda: answer)


def _by_hand(scale=True, out_proj=True, softmax_dim=-1):
    """A cached step written by hand (projections, scores, softmax), with one thing changeable."""

    def step(attn, x_new, past_k, past_v):
        k_new, v_new = attn.project_kv(x_new, x_new)
        k, v = torch.cat([past_k, k_new], dim=2), torch.cat([past_v, v_new], dim=2)
        q = attn.split_heads(attn.q_proj(x_new))  # (B, h, 1, hd)
        scores = q @ k.transpose(-2, -1)
        if scale:
            scores = scores / attn.head_dim**0.5
        heads = scores.softmax(dim=softmax_dim) @ v
        merged = attn.merge_heads(heads)
        return (attn.out_proj(merged) if out_proj else merged), k, v

    return step


def _attend_with(order="kv", q_twice=False, prepend=False, return_order="kv", grow=True):
    def step(attn, x_new, past_k, past_v):
        k_new, v_new = attn.project_kv(x_new, x_new)
        if prepend:
            k, v = torch.cat([k_new, past_k], dim=2), torch.cat([v_new, past_v], dim=2)
        else:
            k, v = torch.cat([past_k, k_new], dim=2), torch.cat([past_v, v_new], dim=2)
        query = attn.q_proj(x_new) if q_twice else x_new
        out = attn.attend(query, k, v) if order == "kv" else attn.attend(query, v, k)
        if not grow:
            k, v = past_k, past_v
        return (out, k, v) if return_order == "kv" else (out, v, k)

    return step


def test_cached_attention_by_hand_passes():
    assert passes(check_cached_self_attention, _by_hand())


@pytest.mark.parametrize(
    "step, words",
    [
        (_attend_with(order="vk"), "keys and values are swapped"),
        (_attend_with(q_twice=True), "projected twice"),
        (_by_hand(scale=False), "sqrt\\(head_dim\\)"),
        (_by_hand(out_proj=False), "output projection"),
        (_by_hand(softmax_dim=-2), "softmax runs over the query axis"),
        (_attend_with(prepend=True), "in order \\(oldest first\\)"),
        (_attend_with(return_order="vk"), "k and v swapped"),
        (_attend_with(grow=False), "grows by exactly one row"),
    ],
)
def test_cached_attention_more_mistakes_are_named(step, words):
    with pytest.raises(CheckFailure, match=words):
        check_cached_self_attention(step)


def test_cached_attention_whole_causal_mask_is_caught():
    from course_lib import causal_mask

    def step(attn, x_new, past_k, past_v):  # the (t+1, t+1) mask of the full decoder
        k_new, v_new = attn.project_kv(x_new, x_new)
        k, v = torch.cat([past_k, k_new], dim=2), torch.cat([past_v, v_new], dim=2)
        return attn.attend(x_new, k, v, causal_mask(k.size(2))), k, v

    with pytest.raises(CheckFailure, match="mask of shape .* would enlarge the scores"):
        check_cached_self_attention(step)


def _sorted_style(drop_rule, descending=True, scatter=True, softmax=True, axis=-1):
    """A nucleus filter in the sort-and-scatter style, with one thing changeable."""

    def top_p(logits, p):
        probs_all = logits.softmax(dim=axis) if softmax else logits
        probs, order = probs_all.sort(dim=-1, descending=descending)
        drop = drop_rule(probs, p)
        if scatter:
            drop = drop.scatter(-1, order, drop)
        return logits.masked_fill(drop, float("-inf"))

    return top_p


def _above(probs):
    return probs.cumsum(-1) - probs


def test_top_p_numpy_float64_style_passes():
    """Another style: numpy in float64 with a -1e9 fill."""
    import numpy as np

    def top_p(logits, p):
        x = logits.detach().double().numpy()
        e = np.exp(x - x.max(-1, keepdims=True))
        probs = e / e.sum(-1, keepdims=True)
        order = np.argsort(-probs, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(probs, order, -1)
        keep_sorted = (np.cumsum(sorted_p, -1) - sorted_p) < p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, -1)
        return torch.where(torch.from_numpy(keep), logits, torch.full_like(logits, -1e9))

    assert passes(check_top_p_filter, top_p)


def test_top_p_searchsorted_style_passes():
    def top_p(logits, p):
        sorted_logits, order = logits.sort(-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        n_keep = torch.searchsorted(cum, torch.full((*cum.shape[:-1], 1), p, dtype=cum.dtype))
        n_keep = (n_keep + 1).clamp(max=cum.size(-1))  # the token that reaches p is kept
        keep_sorted = torch.arange(cum.size(-1)) < n_keep
        keep = keep_sorted.scatter(-1, order, keep_sorted)
        return logits.masked_fill(~keep, float("-inf"))

    assert passes(check_top_p_filter, top_p)


def _threshold_style(strict):
    def top_p(logits, p):
        probs, _ = logits.softmax(-1).sort(-1, descending=True)
        above = probs.cumsum(-1) - probs
        n_keep = ((above <= p) if strict else (above < p)).sum(-1, keepdim=True)
        threshold = logits.sort(-1, descending=True).values.gather(-1, n_keep - 1)
        return logits.masked_fill(logits < threshold, float("-inf"))

    return top_p


@pytest.mark.parametrize(
    "top_p, words",
    [
        (_sorted_style(lambda q, p: _above(q) > p), "`>` where `>=` belongs"),
        (_threshold_style(strict=True), "`>` where `>=` belongs"),
        (_sorted_style(lambda q, p: q.cumsum(-1) >= p), "one token too small"),
        (_sorted_style(lambda q, p: _above(q) >= p, descending=False), "ascending"),
        (_sorted_style(lambda q, p: _above(q) >= p, softmax=False), "over the logits"),
        (_sorted_style(lambda q, p: _above(q) >= p, axis=0), "wrong axis"),
    ],
)
def test_top_p_more_mistakes_are_named(top_p, words):
    with pytest.raises(CheckFailure, match=words):
        check_top_p_filter(top_p)


def test_top_p_unsorted_cumsum_is_named():
    def top_p(logits, p):
        probs = logits.softmax(-1)
        return logits.masked_fill((probs.cumsum(-1) - probs) >= p, float("-inf"))

    with pytest.raises(CheckFailure, match="vocabulary order"):
        check_top_p_filter(top_p)


def test_top_p_output_format_mistakes_are_named():
    solution = solution_namespace("07.top_p")["my_top_p_filter"]

    def zero_fill(logits, p):
        out = solution(logits, p)
        return out.masked_fill(torch.isinf(out), 0.0)

    def probabilities(logits, p):
        return solution(logits, p).softmax(-1)

    def mask(logits, p):
        return torch.isfinite(solution(logits, p))

    def log_softmax(logits, p):
        return solution(logits, p).log_softmax(-1)

    for fn, words in (
        (zero_fill, "set to 0, not -inf"),
        (probabilities, "return probabilities"),
        (mask, "boolean mask"),
        (log_softmax, "kept logits must stay unchanged"),
    ):
        with pytest.raises(CheckFailure, match=words):
            check_top_p_filter(fn)


def test_top_p_course_lib_function_is_refused():
    from course_lib.decoding import filter_logits

    def my_top_p_filter(logits, p):  # a bare call to the reference
        return filter_logits(logits, top_p=p)

    with pytest.raises(CheckFailure, match="calls course_lib's filter_logits"):
        check_top_p_filter(my_top_p_filter)
    with pytest.raises(CheckFailure, match="course_lib's own function"):
        check_top_p_filter(filter_logits)
