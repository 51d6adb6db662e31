"""Lesson-07 checkers: correct answers in several styles pass, each named mistake is caught."""

from __future__ import annotations

import importlib

import pytest
import torch
from _helpers import passes

from course_lib.checks import check_cached_self_attention, check_decoder_work, check_top_p_filter
from course_lib.checks._common import CheckFailure
from course_lib.solutions import solution_source


def _solution(key: str) -> dict:
    """The names a solution block defines (run with the solution file's header imports)."""
    module = importlib.import_module("course_lib.solutions.lesson07")
    namespace: dict = dict(vars(module))
    exec(solution_source(key), namespace)  # noqa: S102  (our own solution file)
    return namespace


# ----------------------------------------------------------------------------------------------
# predict: decoder work
# ----------------------------------------------------------------------------------------------


def test_decoder_work_right(capsys):
    assert passes(check_decoder_work, _solution("07.decoder_work")["predicted_decoder_work"])
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
        check_cached_self_attention, _solution("07.cached_attention")["cached_self_attention_step"]
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
    assert passes(check_top_p_filter, _solution("07.top_p")["my_top_p_filter"])
    assert "all 6 cases match" in capsys.readouterr().out


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
    solution = _solution("07.top_p")["my_top_p_filter"]

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
