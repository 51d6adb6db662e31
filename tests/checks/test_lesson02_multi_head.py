"""The lesson-02 checkers of the layer (course_lib/checks/lesson02_multi_head.py: the parameter count, the
multi-head attention class) accept a correct answer and name each deliberate mistake."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from _helpers import passes
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.attention import split_heads
from course_lib.checks import check_multi_head_attention, check_parameter_count_prediction
from course_lib.solutions import lesson02


# --------------------------------------------------------------------------- predicted parameter count


LINEAR = 512 * 512 + 512


def predict_ok():
    return (4 * LINEAR, 4 * LINEAR)


def predict_ok_list_of_numpy_ints():
    return [np.int64(4 * LINEAR), 4.0 * LINEAR]


def predict_todo():
    raise NotImplementedError


@pytest.mark.parametrize("fn", [predict_ok, predict_ok_list_of_numpy_ints, lesson02.predicted_parameter_counts])
def test_parameter_count_prediction_right_passes(fn, capsys):
    assert passes(check_parameter_count_prediction, fn)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "right, 1,050,624 parameters" in out and "does not change" in out


@pytest.mark.parametrize(
    "answer, words",
    [
        ((4 * 512 * 512,) * 2, r"left out the biases"),
        ((3 * LINEAR,) * 2, r"left out the output projection"),
        ((3 * 512 * 512,) * 2, r"left out the biases and the output projection"),
        ((8 * 3 * LINEAR + LINEAR, 4 * LINEAR), r"full-width 512 x 512 projections.*head_dim = 512 // 8 = 64"),
        ((8 * 4 * LINEAR, 4 * LINEAR), r"whole 512 x 512 attention layer per head"),
        ((3 * (512 * 64 + 64) + LINEAR, 4 * LINEAR), r"projections of one head only"),
        ((4 * LINEAR, 4 * LINEAR + 1), r"with 1 head you predicted.*number of heads does not change the count"),
        ((4 * LINEAR,), r"Return two numbers"),
        ((1.5, 2), r"whole number"),
    ],
)
def test_parameter_count_prediction_names_mistake(answer, words):
    with pytest.raises(AssertionError, match=words):
        check_parameter_count_prediction(lambda: answer)


def test_parameter_count_prediction_unimplemented_is_friendly(capsys):
    assert check_parameter_count_prediction(predict_todo) is None
    assert "`predict_todo` is not implemented yet" in capsys.readouterr().out


# --------------------------------------------------------------------------- MultiHeadAttention


class LearnerMHA(nn.Module):
    """A learner's multi-head attention, written independently of course_lib; flags inject one mistake."""

    split = "ok"  # "ok" | "straight" | "no_transpose" | "interleaved"
    merge = "ok"  # "ok" | "straight" | "interleaved"
    scale = "head_dim"  # "head_dim" | "none" | "d_model" | "twice"
    use_out_proj = True
    use_mask = True
    invert_mask = False
    mask_after_softmax = False
    softmax_dim = -1
    one_head = False
    inputs = "ok"  # "ok" | "kv_swapped" | "query_only"
    projections = ("q", "k", "v")

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _split(self, t):
        B, L, _ = t.shape
        h, hd = (1, self.d_model) if self.one_head else (self.num_heads, self.head_dim)
        if self.split == "straight":
            return t.reshape(B, h, L, hd)
        if self.split == "no_transpose":
            return t.view(B, L, h, hd)
        if self.split == "interleaved":
            return torch.stack([t[..., i::h] for i in range(h)], dim=1)
        return t.view(B, L, h, hd).transpose(1, 2)

    def forward(self, query, key, value, mask=None):
        B, L_q, _ = query.shape
        if self.inputs == "kv_swapped":
            key, value = value, key
        elif self.inputs == "query_only":
            key = value = query
        proj = {"q": self.q_proj, "k": self.k_proj, "v": self.v_proj, "x": lambda t: t}
        q = self._split(proj[self.projections[0]](query))
        k = self._split(proj[self.projections[1]](key))
        v = self._split(proj[self.projections[2]](value))
        hd = q.size(-1)
        divisor = {"head_dim": math.sqrt(hd), "none": 1.0, "d_model": math.sqrt(self.d_model),
                   "twice": float(hd)}[self.scale]
        scores = q @ k.transpose(-2, -1) / divisor
        m = None
        if mask is not None and self.use_mask:
            m = ~mask if self.invert_mask else mask
            if m.dim() in (2, 3):
                m = m.unsqueeze(-3)
            if not self.mask_after_softmax:
                scores = scores.masked_fill(~m, float("-inf"))
        weights = torch.softmax(scores, dim=self.softmax_dim)
        if m is not None and self.mask_after_softmax:
            weights = weights.masked_fill(~m, 0.0)
        heads = weights @ v
        if self.merge == "straight":
            merged = heads.reshape(B, L_q, self.d_model)
        elif self.merge == "interleaved":
            merged = heads.permute(0, 2, 3, 1).reshape(B, L_q, self.d_model)
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


class SlicedStrided(lesson02.SlicedMultiHeadAttention):
    """The sliced exercise with `q[..., i::num_heads]`: every num_heads-th column per head."""

    def forward(self, query, key, value, mask=None):
        q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        h = self.num_heads
        heads = [lesson02.scaled_dot_product_attention(q[..., i::h], k[..., i::h], v[..., i::h], mask)[0]
                 for i in range(h)]
        return self.out_proj(torch.cat(heads, dim=-1))


class SlicedScaledTwice(lesson02.SlicedMultiHeadAttention):
    """Divides q by sqrt(head_dim) and then calls course_lib's attention, which divides again."""

    def forward(self, query, key, value, mask=None):
        q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        hd = self.head_dim
        heads = [lesson02.scaled_dot_product_attention(q[..., i * hd:(i + 1) * hd] / math.sqrt(hd),
                                                       k[..., i * hd:(i + 1) * hd],
                                                       v[..., i * hd:(i + 1) * hd], mask)[0]
                 for i in range(self.num_heads)]
        return self.out_proj(torch.cat(heads, dim=-1))


class SubclassOfCourseLib(course_lib_mha := __import__("course_lib").MultiHeadAttention):
    """course_lib's class under another name: nothing of the learner's to check."""


class WrapsCourseLib(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.inner = course_lib_mha(d_model, num_heads)

    def forward(self, query, key, value, mask=None):
        return self.inner(query, key, value, mask)


class CallsReferenceSplit(LearnerMHA):
    def _split(self, t):
        return split_heads(t, self.num_heads)


class MaskUnsqueezedSliced(lesson02.SlicedMultiHeadAttention):
    def forward(self, query, key, value, mask=None):
        if mask is not None:
            mask = mask.unsqueeze(1)
        return super().forward(query, key, value, mask)


class CatDim1(lesson02.SlicedMultiHeadAttention):
    def forward(self, query, key, value, mask=None):
        q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        hd = self.head_dim
        heads = [lesson02.scaled_dot_product_attention(q[..., i*hd:(i+1)*hd], k[..., i*hd:(i+1)*hd], v[..., i*hd:(i+1)*hd], mask)[0] for i in range(self.num_heads)]
        return self.out_proj(torch.cat(heads, dim=1))


class HardHd(lesson02.SlicedMultiHeadAttention):
    def forward(self, query, key, value, mask=None):
        q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        hd = 8
        heads = [lesson02.scaled_dot_product_attention(q[..., i*hd:(i+1)*hd], k[..., i*hd:(i+1)*hd], v[..., i*hd:(i+1)*hd], mask)[0] for i in range(self.num_heads)]
        return self.out_proj(torch.cat(heads, dim=-1))


class KTransposed12(LearnerMHA):
    def forward(self, query, key, value, mask=None):
        B, L_q, _ = query.shape
        q, k, v = self._split(self.q_proj(query)), self._split(self.k_proj(key)), self._split(self.v_proj(value))
        s = q @ k.transpose(1, 2) / math.sqrt(self.head_dim)
        return self.out_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(B, L_q, self.d_model))


class FillZero(LearnerMHA):
    def forward(self, query, key, value, mask=None):
        B, L_q, _ = query.shape
        q, k, v = self._split(self.q_proj(query)), self._split(self.k_proj(key)), self._split(self.v_proj(value))
        s = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if mask is not None:
            m = mask.unsqueeze(-3) if mask.dim() < 4 else mask
            s = s.masked_fill(~m, 0.0)
        return self.out_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(B, L_q, self.d_model))


class NoVProj(LearnerMHA):
    def forward(self, query, key, value, mask=None):
        B, L_q, _ = query.shape
        q, k, v = self._split(self.q_proj(query)), self._split(self.k_proj(key)), self._split(value)
        s = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if mask is not None:
            m = mask.unsqueeze(-3) if mask.dim() < 4 else mask
            s = s.masked_fill(~m, -1e9)
        return self.out_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(B, L_q, self.d_model))


class OutProjPerHead(lesson02.SlicedMultiHeadAttention):
    def forward(self, query, key, value, mask=None):
        q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        hd = self.head_dim
        heads = [lesson02.scaled_dot_product_attention(q[..., i*hd:(i+1)*hd], k[..., i*hd:(i+1)*hd], v[..., i*hd:(i+1)*hd], mask)[0] for i in range(self.num_heads)]
        return torch.cat(heads, dim=-1) @ self.out_proj.weight + self.out_proj.bias  # W not transposed


class SlicedChunkEinsum(lesson02.SlicedMultiHeadAttention):
    """Right, in another style: chunk, einsum, a hand-written softmax, -1e9 fill, float64 inside."""

    def forward(self, query, key, value, mask=None):
        qs = self.q_proj(query).double().chunk(self.num_heads, dim=-1)
        ks = self.k_proj(key).double().chunk(self.num_heads, dim=-1)
        vs = self.v_proj(value).double().chunk(self.num_heads, dim=-1)
        heads = []
        for q, k, v in zip(qs, ks, vs):
            scores = torch.einsum("bqd,bkd->bqk", q, k) / q.size(-1) ** 0.5
            if mask is not None:
                scores = scores.masked_fill(mask == 0, -1e9)
            e = (scores - scores.amax(-1, keepdim=True)).exp()
            heads.append(torch.einsum("bqk,bkd->bqd", e / e.sum(-1, keepdim=True), v))
        return self.out_proj(torch.cat(heads, dim=-1).float())


class TodoMHA(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        raise NotImplementedError


class EinsumAnnotatedMHA(LearnerMHA):
    """einsum, and the Annotated Transformer's mask handling: always `mask.unsqueeze(1)` (3-D masks only)."""

    def forward(self, query, key, value, mask=None):
        B, L_q, _ = query.shape
        q, k, v = self._split(self.q_proj(query)), self._split(self.k_proj(key)), self._split(self.v_proj(value))
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores.masked_fill(mask.unsqueeze(1) == 0, -1e9)
        heads = torch.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v)
        return self.out_proj(heads.transpose(1, 2).reshape(B, L_q, self.d_model))


class FusedSdpaMHA(LearnerMHA):
    """PyTorch's fused attention; the mask goes straight to it, so it must already be 4-D (or (L, L))."""

    def forward(self, query, key, value, mask=None):
        B, L_q, _ = query.shape
        q, k, v = self._split(self.q_proj(query)), self._split(self.k_proj(key)), self._split(self.v_proj(value))
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(heads.transpose(1, 2).reshape(B, L_q, self.d_model)), None  # (out, weights)


class MinusInfMHA(LearnerMHA):
    """Right on everything asked; -inf in the scores gives NaN when a sequence is all padding."""

    def forward(self, query, key, value, mask=None):
        B, L_q, _ = query.shape
        q, k, v = self._split(self.q_proj(query)), self._split(self.k_proj(key)), self._split(self.v_proj(value))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores.masked_fill(~(mask.unsqueeze(-3) if mask.dim() < 4 else mask), float("-inf"))
        heads = scores.softmax(-1) @ v
        return self.out_proj(heads.transpose(1, 2).reshape(B, L_q, self.d_model))


@pytest.mark.parametrize("cls", [FusedSdpaMHA, lesson02.SlicedMultiHeadAttention])
def test_multi_head_attention_correct_passes(cls, capsys):
    assert passes(check_multi_head_attention, cls)
    out = capsys.readouterr().out
    assert out == "check_multi_head_attention: all 7 cases match course_lib's reference. Well done!\n"


@pytest.mark.parametrize(
    "cls, words",
    [(MinusInfMHA, r"your output holds NaN"), (LearnerMHA, r"your output holds NaN"),
     (EinsumAnnotatedMHA, r"zero weights.*finite number"), (SlicedChunkEinsum, r"zero weights.*finite number")],
)
def test_multi_head_attention_failing_only_on_an_unasked_input_passes_and_names_it(cls, words, capsys):
    assert passes(check_multi_head_attention, cls)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "all 7 cases match course_lib's reference. Well done!" in out
    assert "Not asked by the exercise" in out and "a sequence that is all padding" in out
    assert re.search(words, out)


@pytest.mark.parametrize(
    "cls, words",
    [
        (course_lib_mha, r"handed in course_lib's own `MultiHeadAttention`"),
        (SubclassOfCourseLib, r"handed in course_lib's own `MultiHeadAttention`"),
        (WrapsCourseLib, r"holds course_lib's MultiHeadAttention"),
        (CallsReferenceSplit, r"calls course_lib's `split_heads`"),
    ],
)
def test_multi_head_attention_names_course_libs_own_code(cls, words):
    with pytest.raises(AssertionError, match=words):
        check_multi_head_attention(cls)


@pytest.mark.parametrize(
    "cls, words",
    [
        (variant("NoOutProjApplied", use_out_proj=False), r"missing output projection"),
        (NoOutProjModule, r"missing output projection.*self\.out_proj"),
        (variant("SplitStraight", split="straight", merge="straight"), r"heads split without the transpose"),
        (variant("SplitStraightMergeOk", split="straight"), r"heads split without the transpose"),
        (variant("SplitNoTranspose", split="no_transpose", merge="straight"), r"heads split without the transpose"),
        (variant("MergeStraight", merge="straight"), r"heads merged in the wrong order"),
        (variant("MaskIgnored", use_mask=False),
         r"\(self-attention with a padding mask, mask \(B, 1, L_k\)\): mask ignored.*also tried as"),
        (variant("MaskInverted", invert_mask=True), r"mask inverted"),
        (variant("NoScaling", scale="none"), r"no scaling of the scores"),
        (variant("ScaledByDModel", scale="d_model"), r"scaled by sqrt\(d_model\) instead of sqrt\(head_dim\)"),
        (variant("ScaledTwice", scale="twice"), r"scores scaled twice"),
        (SlicedScaledTwice, r"scores scaled twice"),
        (variant("SoftmaxOverQueries", softmax_dim=-2), r"softmax over the queries \(dim=-2\)"),
        (variant("MaskAfterSoftmax", mask_after_softmax=True), r"mask applied after the softmax"),
        (variant("SplitInterleaved", split="interleaved"), r"every num_heads-th column"),
        (SlicedStrided, r"every num_heads-th column"),
        (variant("MergeInterleaved", merge="interleaved"), r"heads interleaved when merged"),
        (variant("OneHead", one_head=True), r"one head of width d_model"),
        (variant("KeyValueSwapped", inputs="kv_swapped"), r"\(cross-attention, key != value\): key and value "
                                                          r"inputs swapped"),
        (variant("KeysFromQuery", inputs="query_only"), r"\(cross-attention, L_q=3 != L_k=6\).*keys and values "
                                                        r"taken from the query"),
        (variant("AllThroughQProj", projections=("q", "q", "q")),
         r"projections mixed up \(query through q_proj, key through q_proj, value through q_proj\)"),
        (variant("ValueThroughKProj", projections=("q", "k", "k")), r"value through k_proj"),
        (variant("QKSwapped", projections=("k", "q", "v")), r"query through k_proj, key through q_proj"),
        (variant("KeyNotProjected", projections=("q", "x", "v")), r"key not projected"),
        (NoVProj, r"value not projected"),
        (FillZero, r"hidden scores set to 0 instead of -inf"),
        (OutProjPerHead, r"W\^O applied untransposed"),
        (CatDim1, r"projection got 8 features per position instead of d_model = 24.*torch\.cat\(heads, dim=-1\)"),
        (HardHd, r"a size fixed in the code.*d_model=12 with num_heads=4"),
        (MaskUnsqueezedSliced, r"raised ValueError \(self-attention with a padding mask.*sliced version.*do not add an "
                               r"axis"),
        (KTransposed12, r"raised RuntimeError \(self-attention, no mask\).*k\.transpose\(-2, -1\)"),
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


class CrashesOnAnyMask(LearnerMHA):
    def forward(self, query, key, value, mask=None):
        if mask is not None:
            raise RuntimeError("The size of tensor a (4) must match the size of tensor b (2)")
        return super().forward(query, key, value)


def test_multi_head_attention_names_the_crash_and_every_mask_layout_tried():
    with pytest.raises(AssertionError, match=r"raised RuntimeError \(self-attention with a padding mask, mask "
                                             r"\(B, 1, L_k\)\).*also tried as \(B, 1, L_k\), \(B, 1, 1, L_k\)"):
        check_multi_head_attention(CrashesOnAnyMask)
