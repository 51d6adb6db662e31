"""The lesson-02 checkers accept a correct answer and name each deliberate mistake."""

from __future__ import annotations

import math

import pytest
from _helpers import passes
import torch
from torch import nn

from course_lib.checks import check_merge_heads, check_multi_head_attention, check_split_heads

# --------------------------------------------------------------------------- split_heads


def split_ok(x, num_heads):
    B, L, d_model = x.shape
    return x.view(B, L, num_heads, d_model // num_heads).transpose(1, 2)


def split_no_transpose(x, num_heads):
    B, L, d_model = x.shape
    return x.view(B, L, num_heads, d_model // num_heads)


def split_straight(x, num_heads):
    B, L, d_model = x.shape
    return x.reshape(B, num_heads, L, d_model // num_heads)


def split_interleaved(x, num_heads):
    B, L, d_model = x.shape
    return x.view(B, L, d_model // num_heads, num_heads).permute(0, 3, 1, 2)


def split_wrong_head_dim(x, num_heads):
    B, L, d_model = x.shape
    return x.unsqueeze(1).expand(B, num_heads, L, d_model)  # every head gets all d_model features


def split_todo(x, num_heads):
    raise NotImplementedError


def test_split_heads_correct_passes(capsys):
    assert passes(check_split_heads, split_ok)
    assert "check_split_heads: all 5 cases match" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, words",
    [
        (split_no_transpose, r"heads split without the transpose"),
        (split_straight, r"reshaped straight to \(B, num_heads, L, head_dim\)"),
        (split_interleaved, r"every num_heads-th feature"),
        (split_wrong_head_dim, r"Wrong output shape.*head_dim = d_model // num_heads"),
    ],
)
def test_split_heads_names_mistake(fn, words):
    with pytest.raises(AssertionError, match=words):
        check_split_heads(fn)


def test_split_heads_unimplemented_is_friendly(capsys):
    assert check_split_heads(split_todo) is None
    assert "`split_todo` is not implemented yet" in capsys.readouterr().out


# --------------------------------------------------------------------------- merge_heads


def merge_ok(x):
    B, h, L, hd = x.shape
    return x.transpose(1, 2).reshape(B, L, h * hd)


def merge_contiguous_view(x):
    B, h, L, hd = x.shape
    return x.transpose(1, 2).contiguous().view(B, L, h * hd)


def merge_no_transpose(x):
    B, h, L, hd = x.shape
    return x.reshape(B, L, h * hd)


def merge_view_after_transpose(x):
    B, h, L, hd = x.shape
    return x.transpose(1, 2).view(B, L, h * hd)


def merge_not_reshaped(x):
    return x.transpose(1, 2)


def merge_wrong_shape(x):
    B, h, L, hd = x.shape
    return x.transpose(1, 2).reshape(B * L, h * hd)


def merge_todo(x):
    raise NotImplementedError


@pytest.mark.parametrize("fn", [merge_ok, merge_contiguous_view])
def test_merge_heads_correct_passes(fn, capsys):
    assert passes(check_merge_heads, fn)
    assert "check_merge_heads: all 4 cases match" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, words",
    [
        (merge_no_transpose, r"merged in the wrong order"),
        (merge_view_after_transpose, r"`\.view` after `\.transpose`.*not contiguous"),
        (merge_not_reshaped, r"transposed but not reshaped"),
        (merge_wrong_shape, r"Wrong output shape"),
    ],
)
def test_merge_heads_names_mistake(fn, words):
    with pytest.raises(AssertionError, match=words):
        check_merge_heads(fn)


def test_merge_heads_unimplemented_is_friendly(capsys):
    assert check_merge_heads(merge_todo) is None
    assert "`merge_todo` is not implemented yet" in capsys.readouterr().out


# --------------------------------------------------------------------------- MultiHeadAttention


class LearnerMHA(nn.Module):
    """A learner's multi-head attention, written independently of course_lib; flags inject one mistake."""

    split = "ok"  # "ok" | "straight" | "no_transpose"
    merge = "ok"  # "ok" | "straight"
    scale = "head_dim"  # "head_dim" | "none" | "d_model"
    use_out_proj = True
    use_mask = True
    invert_mask = False

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _split(self, t):
        B, L, _ = t.shape
        if self.split == "straight":
            return t.reshape(B, self.num_heads, L, self.head_dim)
        if self.split == "no_transpose":
            return t.view(B, L, self.num_heads, self.head_dim)
        return t.view(B, L, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, query, key, value, mask=None):
        B, L_q, _ = query.shape
        q, k, v = self._split(self.q_proj(query)), self._split(self.k_proj(key)), self._split(self.v_proj(value))
        divisor = {"head_dim": math.sqrt(self.head_dim), "none": 1.0, "d_model": math.sqrt(self.d_model)}[self.scale]
        scores = q @ k.transpose(-2, -1) / divisor
        if mask is not None and self.use_mask:
            m = ~mask if self.invert_mask else mask
            if m.dim() in (2, 3):
                m = m.unsqueeze(-3)
            scores = scores.masked_fill(~m, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        heads = weights @ v
        if self.merge == "straight":
            merged = heads.reshape(B, L_q, self.d_model)
        else:
            merged = heads.transpose(1, 2).reshape(B, L_q, self.d_model)
        return self.out_proj(merged) if self.use_out_proj else merged


def variant(name, **flags):
    return type(name, (LearnerMHA,), flags)


class NoOutProjModule(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.inner = LearnerMHA(d_model, num_heads)
        self.q_proj, self.k_proj, self.v_proj = self.inner.q_proj, self.inner.k_proj, self.inner.v_proj
        del self.inner

    def forward(self, query, key, value, mask=None):
        raise AssertionError("never reached: the checker stops at the state_dict")


class RenamedMHA(LearnerMHA):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.W_o = self.out_proj
        del self.out_proj


class WrongShapeMHA(LearnerMHA):
    def forward(self, query, key, value, mask=None):
        return super().forward(query, key, value, mask).mean(dim=1)  # (B, d_model)


class NoMaskArgument(LearnerMHA):
    def forward(self, query, key, value):
        return super().forward(query, key, value)


class TodoMHA(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        raise NotImplementedError


def test_multi_head_attention_correct_passes(capsys):
    assert passes(check_multi_head_attention, LearnerMHA)
    assert "check_multi_head_attention: all 6 cases match" in capsys.readouterr().out


def test_course_lib_multi_head_attention_passes(capsys):
    from course_lib import MultiHeadAttention

    assert passes(check_multi_head_attention, MultiHeadAttention)  # forward may also take return_attention
    assert "Well done" in capsys.readouterr().out


@pytest.mark.parametrize(
    "cls, words",
    [
        (variant("NoOutProjApplied", use_out_proj=False), r"missing output projection"),
        (NoOutProjModule, r"missing output projection.*self\.out_proj"),
        (variant("SplitStraight", split="straight", merge="straight"), r"heads split without the transpose"),
        (variant("SplitStraightMergeOk", split="straight"), r"heads split without the transpose"),
        (variant("SplitNoTranspose", split="no_transpose", merge="straight"), r"heads split without the transpose"),
        (variant("MergeStraight", merge="straight"), r"heads merged in the wrong order"),
        (variant("MaskIgnored", use_mask=False), r"\(self-attention with a padding mask.*mask ignored"),
        (variant("MaskInverted", invert_mask=True), r"mask inverted"),
        (variant("NoScaling", scale="none"), r"no scaling of the scores"),
        (variant("ScaledByDModel", scale="d_model"), r"scaled by sqrt\(d_model\) instead of sqrt\(head_dim\)"),
        (WrongShapeMHA, r"Wrong output shape.*\(B, L_q, d_model\)"),
        (NoMaskArgument, r"forward does not take a mask.*forward\(query, key, value, mask=None\)"),
        (RenamedMHA, r"state_dict names differ.*Missing: \['out_proj\.bias', 'out_proj\.weight'\].*W_o"),
    ],
)
def test_multi_head_attention_names_mistake(cls, words):
    with pytest.raises(AssertionError, match=words):
        check_multi_head_attention(cls)


def test_multi_head_attention_unimplemented_is_friendly(capsys):
    assert check_multi_head_attention(TodoMHA) is None
    assert "`TodoMHA` is not implemented yet" in capsys.readouterr().out
