"""The lesson-04 checkers accept correct code in several styles and name each typical mistake."""

from __future__ import annotations

import pytest
from _helpers import passes
import torch
import torch.nn.functional as F
from torch import nn

from course_lib import EncoderLayer, FeedForward, MultiHeadAttention
from course_lib.checks import (
    check_encoder_layer, check_encoder_layer_params, check_feed_forward, check_layer_norm,
    check_layer_norm_prediction, check_repaired_encoder_block,
)
from course_lib.solutions.lesson04 import RepairedEncoderLayer

# --------------------------------------------------------------------------- feed-forward


class GoodFF(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0, variant="good"):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.variant = variant

    def forward(self, x):
        if self.variant == "no_activation":
            return self.linear2(self.linear1(x))
        if self.variant == "activation_after":
            return F.relu(self.linear2(self.linear1(x)))
        if self.variant == "gelu":
            return self.linear2(F.gelu(self.linear1(x)))
        if self.variant == "shape":
            return F.relu(self.linear1(x))
        if self.variant == "relu_twice":
            return F.relu(self.linear2(F.relu(self.linear1(x))))
        if self.variant == "residual":
            return x + self.linear2(F.relu(self.linear1(x)))
        if self.variant == "relu_first":
            return self.linear2(self.linear1(F.relu(x)))
        return self.linear2(F.relu(self.linear1(x)))


def ff_variant(variant):
    class FF(GoodFF):
        def __init__(self, d_model, d_ff, dropout=0.0):
            super().__init__(d_model, d_ff, dropout, variant)

    return FF


def test_feed_forward_correct_passes(capsys):
    assert passes(check_feed_forward, ff_variant("good"))
    assert "check_feed_forward: all 3 cases match" in capsys.readouterr().out


def test_feed_forward_course_lib_is_refused():
    with pytest.raises(AssertionError, match=r"course_lib's own `FeedForward`, not code of yours"):
        check_feed_forward(FeedForward)


@pytest.mark.parametrize(
    "variant, words",
    [
        ("no_activation", "the activation is missing"),
        ("activation_after", "applied after linear2"),
        ("gelu", "GELU is used"),
        ("shape", "Wrong output shape"),
        ("relu_twice", r"ReLU applied twice"),
        ("residual", r"a residual connection inside the feed-forward"),
        ("relu_first", r"the activation is applied to the input before linear1"),
    ],
)
def test_feed_forward_mistakes(variant, words):
    with pytest.raises(AssertionError, match=words):
        check_feed_forward(ff_variant(variant))


def test_feed_forward_wrong_names():
    class Named(nn.Module):
        def __init__(self, d_model, d_ff, dropout=0.0):
            super().__init__()
            self.fc1 = nn.Linear(d_model, d_ff)
            self.fc2 = nn.Linear(d_ff, d_model)

        def forward(self, x):
            return self.fc2(F.relu(self.fc1(x)))

    with pytest.raises(AssertionError, match=r"state_dict names differ.*linear1\.weight"):
        check_feed_forward(Named)


def test_feed_forward_unimplemented(capsys):
    class Stub(nn.Module):
        def __init__(self, d_model, d_ff, dropout=0.0):
            raise NotImplementedError

    assert check_feed_forward(Stub) is None
    assert "is not implemented yet" in capsys.readouterr().out


# --------------------------------------------------------------------------- LayerNorm


def layer_norm_fn(x, weight, bias, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, keepdim=True, unbiased=False)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def test_layer_norm_function_passes(capsys):
    assert passes(check_layer_norm, layer_norm_fn)
    assert "check_layer_norm: all 4 cases match" in capsys.readouterr().out


def test_layer_norm_pytorch_own_is_refused():
    for own in (nn.LayerNorm, F.layer_norm):
        with pytest.raises(AssertionError, match=r"PyTorch's own `\w*(LayerNorm|layer_norm)`"):
            check_layer_norm(own)


def test_layer_norm_own_class_passes():
    class LN(nn.Module):
        def __init__(self, d_model, eps=1e-5):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d_model))
            self.bias = nn.Parameter(torch.zeros(d_model))
            self.eps = eps

        def forward(self, x):
            return layer_norm_fn(x, self.weight, self.bias, self.eps)

    assert passes(check_layer_norm, LN)


def _unbiased(x, weight, bias, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(x.var(dim=-1, keepdim=True) + eps) * weight + bias


def _eps_outside(x, weight, bias, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    std = x.var(dim=-1, keepdim=True, unbiased=False).sqrt()
    return (x - mean) / (std + eps) * weight + bias


def _sequence_axis(x, weight, bias, eps=1e-5):
    mean = x.mean(dim=-2, keepdim=True)
    var = x.var(dim=-2, keepdim=True, unbiased=False)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def _batch_axis(x, weight, bias, eps=1e-5):
    mean = x.mean(dim=0, keepdim=True)
    var = x.var(dim=0, keepdim=True, unbiased=False)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def _no_affine(x, weight, bias, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], eps=eps)


def _no_keepdim(x, weight, bias, eps=1e-5):
    mean = x.mean(dim=-1)
    return (x - mean) / torch.sqrt(x.var(dim=-1, unbiased=False) + eps) * weight + bias


def _no_sqrt(x, weight, bias, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    return (x - mean) / (x.var(dim=-1, keepdim=True, unbiased=False) + eps) * weight + bias


def _whole_tensor(x, weight, bias, eps=1e-5):
    return (x - x.mean()) / torch.sqrt(x.var(unbiased=False) + eps) * weight + bias


def _last_two_axes(x, weight, bias, eps=1e-5):
    return F.layer_norm(x, x.shape[-2:], eps=eps) * weight + bias


def _var_mean_rsqrt(x, weight, bias, eps=1e-5):  # a correct style: var_mean and rsqrt
    var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
    return (x - mean) * torch.rsqrt(var + eps) * weight + bias


def test_layer_norm_var_mean_rsqrt_passes():
    assert passes(check_layer_norm, _var_mean_rsqrt)


def _flattened(x, weight, bias, eps=1e-5):
    return layer_norm_fn(x, weight, bias, eps).reshape(-1, x.shape[-1])


@pytest.mark.parametrize(
    "fn, words",
    [
        (_unbiased, "unbiased variance"),
        (_eps_outside, "eps is added outside the square root"),
        (_sequence_axis, "wrong axis \\(the sequence axis"),
        (_batch_axis, "wrong axis \\(the batch axis"),
        (_no_affine, "the gain and bias are missing"),
        (_no_keepdim, "keepdim=True"),
        (_flattened, "Wrong output shape"),
        (_no_sqrt, "no square root"),
        (_whole_tensor, "over the whole tensor"),
        (_last_two_axes, "over the last two axes"),
    ],
)
def test_layer_norm_mistakes(fn, words):
    with pytest.raises(AssertionError, match=words):
        check_layer_norm(fn)


def test_layer_norm_class_without_parameters():
    class NoAffine(nn.Module):
        def __init__(self, d_model, eps=1e-5):
            super().__init__()
            self.eps = eps

        def forward(self, x):
            return F.layer_norm(x, x.shape[-1:], eps=self.eps)

    with pytest.raises(AssertionError, match="the gain and bias are missing"):
        check_layer_norm(NoAffine)


def test_layer_norm_unimplemented(capsys):
    def layer_norm(x, weight, bias, eps=1e-5):
        raise NotImplementedError

    assert check_layer_norm(layer_norm) is None
    assert "`layer_norm` is not implemented yet" in capsys.readouterr().out


# --------------------------------------------------------------------------- encoder layer


class Layer(nn.Module):
    """A post-LN encoder layer whose forward can be switched to each typical mistake."""

    variant = "good"

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.feed_forward = FeedForward(d_model, d_ff, dropout=0.0)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout() if self.variant == "dropout_default" else nn.Dropout(dropout)

    def attn(self, x, mask):
        return self.self_attn(x, x, x, mask)

    def ff(self, x):
        if self.variant == "no_activation":
            return self.feed_forward.linear2(self.feed_forward.linear1(x))
        return self.feed_forward(x)

    def forward(self, x, mask=None):
        v = self.variant
        if v == "x_plus_x":  # the seed's bug: the attention output is computed and then dropped
            _ = self.attn(x, mask)
            x = self.norm1(x + x)
            return self.norm2(x + self.ff(x))
        if v == "seed":  # the seed's block (eval mode): attention dropped, norm2 overwrites the stream
            h = self.norm1(x)
            _ = self.attn(h, mask)
            x = self.norm2(x + x)
            return x + self.ff(x)
        if v == "no_residual":
            x = self.norm1(self.attn(x, mask))
            return self.norm2(x + self.ff(x))
        if v == "pre_ln":
            x = x + self.attn(self.norm1(x), mask)
            return x + self.ff(self.norm2(x))
        if v == "overwrite":
            x = self.norm1(x)
            x = x + self.attn(x, mask)
            x = self.norm2(x)
            return x + self.ff(x)
        if v == "mask_ignored":
            mask = None
        if v == "shape":
            return self.norm1(x + self.attn(x, mask))[:, 0]
        x = self.norm1(x + self.dropout(self.attn(x, mask)))
        return self.norm2(x + self.dropout(self.ff(x)))


def layer_variant(name):
    return type(f"Layer_{name}", (Layer,), {"variant": name})


def test_encoder_layer_correct_passes(capsys):
    assert passes(check_encoder_layer, layer_variant("good"))
    assert "check_encoder_layer: all 4 cases match" in capsys.readouterr().out


def test_encoder_layer_course_lib_is_refused():
    with pytest.raises(AssertionError, match=r"course_lib's own `EncoderLayer`, not code of yours"):
        check_encoder_layer(EncoderLayer)
    with pytest.raises(AssertionError, match=r"PyTorch's own `TransformerEncoderLayer`"):
        check_encoder_layer(nn.TransformerEncoderLayer)


@pytest.mark.parametrize(
    "variant, words",
    [
        ("x_plus_x", "the residual drops the attention output"),
        ("seed", "the residual drops the attention output .*and the norm overwrites"),
        ("no_residual", "a residual connection is missing"),
        ("pre_ln", "the norm comes before the sublayer \\(pre-LN\\)"),
        ("overwrite", "the norm overwrites the residual stream"),
        ("mask_ignored", "the mask is ignored"),
        ("no_activation", "the feed-forward is missing its activation"),
        ("shape", "Wrong output shape"),
        ("dropout_default", "dropout is active although dropout=0.0"),
    ],
)
def test_encoder_layer_mistakes(variant, words):
    with pytest.raises(AssertionError, match=words):
        check_encoder_layer(layer_variant(variant))


def test_encoder_layer_wrong_names():
    class Renamed(Layer):
        def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
            super().__init__(d_model, num_heads, d_ff, dropout)
            self.ln1 = self.norm1
            del self.norm1

        def forward(self, x, mask=None):
            x = self.ln1(x + self.attn(x, mask))
            return self.norm2(x + self.ff(x))

    with pytest.raises(AssertionError, match=r"state_dict names differ.*Missing: \['norm1\.bias'"):
        check_encoder_layer(Renamed)


def test_encoder_layer_unimplemented(capsys):
    class EncoderLayerStub(nn.Module):
        def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
            raise NotImplementedError

    assert check_encoder_layer(EncoderLayerStub) is None
    assert "`EncoderLayerStub` is not implemented yet" in capsys.readouterr().out


def test_encoder_layer_forward_unimplemented(capsys):
    class HalfDone(Layer):
        def forward(self, x, mask=None):
            raise NotImplementedError

    assert check_encoder_layer(HalfDone) is None
    assert "`HalfDone` is not implemented yet" in capsys.readouterr().out


# --------------------------------------------------------------------------- other correct styles


class _FusedAttention(nn.Module):
    """Multi-head attention with course_lib's parameter names around PyTorch's fused kernel.

    It only takes 4-D masks (B, 1 or h, L_q, L_k), as code written for F.scaled_dot_product_attention
    often does: the checker must hand it the same masks as 4-D.
    """

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, q, k, v, mask=None):
        if mask is not None and mask.dim() != 4:
            raise ValueError(f"mask must be 4-D, got {tuple(mask.shape)}")
        B, L, d = q.shape

        def split(t):  # (B, L, d) -> (B, h, L, d / h)
            return t.view(B, -1, self.h, d // self.h).transpose(1, 2)

        out = F.scaled_dot_product_attention(split(self.q_proj(q)), split(self.k_proj(k)),
                                             split(self.v_proj(v)), attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(B, L, d))


class _FunctionalNorm(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, 1e-5)


class FusedLayer(nn.Module):
    """A correct post-LN layer in another style: fused attention, 4-D masks only, F.layer_norm."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.1):
        super().__init__()
        self.self_attn = _FusedAttention(d_model, num_heads)
        self.feed_forward = FeedForward(d_model, d_ff, dropout=dropout)
        self.norm1, self.norm2 = _FunctionalNorm(d_model), _FunctionalNorm(d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        x = self.norm1(x + self.drop(self.self_attn(x, x, x, mask)))
        return self.norm2(x + self.drop(self.feed_forward(x)))


def test_encoder_layer_fused_attention_and_4d_masks_pass():
    assert passes(check_encoder_layer, FusedLayer)


def test_encoder_layer_einsum_feed_forward_passes():
    class EinsumLayer(FusedLayer):
        def forward(self, x, mask=None):
            x = self.norm1(x + self.drop(self.self_attn(x, x, x, mask)))
            ff = self.feed_forward
            hidden = F.relu(torch.einsum("bld,fd->blf", x, ff.linear1.weight) + ff.linear1.bias)
            out = torch.einsum("blf,df->bld", hidden, ff.linear2.weight) + ff.linear2.bias
            return self.norm2(x + self.drop(out))

    assert passes(check_encoder_layer, EinsumLayer)


def test_encoder_layer_crash_names_both_mask_ranks():
    class Crashes(FusedLayer):
        def forward(self, x, mask=None):
            raise RuntimeError("boom")

    with pytest.raises(AssertionError, match=r"Your code raised RuntimeError .*boom.*as 4-D .* failed too"):
        check_encoder_layer(Crashes)


# --------------------------------------------------------------------------- the repaired block (Debug)



class ExitDropout(Layer):
    def forward(self, x, mask=None):
        return self.dropout(super().forward(x, mask))


class NoDropout(Layer):
    def forward(self, x, mask=None):
        x = self.norm1(x + self.attn(x, mask))
        return self.norm2(x + self.ff(x))


class SumDropout(Layer):  # dropout on the residual sum instead of on the sublayer output
    def forward(self, x, mask=None):
        x = self.norm1(self.dropout(x + self.attn(x, mask)))
        return self.norm2(self.dropout(x + self.ff(x)))


class SumDropoutAttention(Layer):
    def forward(self, x, mask=None):
        x = self.norm1(self.dropout(x + self.attn(x, mask)))
        return self.norm2(x + self.dropout(self.ff(x)))


class InputDropout(Layer):  # dropout on the sublayer's input
    def forward(self, x, mask=None):
        x = self.norm1(x + self.attn(self.dropout(x), mask))
        return self.norm2(x + self.ff(self.dropout(x)))


class OnlyAttentionDropout(Layer):
    def forward(self, x, mask=None):
        x = self.norm1(x + self.dropout(self.attn(x, mask)))
        return self.norm2(x + self.ff(x))


class OnlyFFDropout(Layer):
    def forward(self, x, mask=None):
        x = self.norm1(x + self.attn(x, mask))
        return self.norm2(x + self.dropout(self.ff(x)))


class SwappedNorms(Layer):
    def forward(self, x, mask=None):
        x = self.norm2(x + self.dropout(self.attn(x, mask)))
        return self.norm1(x + self.dropout(self.ff(x)))


class OneNorm(Layer):
    def forward(self, x, mask=None):
        x = self.norm1(x + self.dropout(self.attn(x, mask)))
        return self.norm1(x + self.dropout(self.ff(x)))


@pytest.mark.parametrize(
    "cls, words",
    [
        (ExitDropout, r"dropout applied after the norm"),
        (NoDropout, r"dropout is not applied to the sublayer outputs"),
        (InputDropout, r"dropout is not applied to the sublayer outputs"),
        (SumDropout, r"dropout on the residual sum \(after the addition\)"),
        (SumDropoutAttention, r"dropout on the residual sum around the attention"),
        (OnlyAttentionDropout, r"dropout is missing around the feed-forward"),
        (OnlyFFDropout, r"dropout is missing around the attention"),
        (SwappedNorms, r"norm1 and norm2 swapped"),
        (OneNorm, r"the same norm \(norm1\) used for both sublayers"),
    ],
)
def test_encoder_layer_dropout_and_norm_mistakes(cls, words):
    with pytest.raises(AssertionError, match=words):
        check_encoder_layer(cls)


# --------------------------------------------------------------------------- the repaired block (Debug)


class MaskLayer(nn.Module):
    """The Debug exercise's layer, taking the tokenizer's attention_mask (B, L); switchable bugs."""

    variant = "good"

    def __init__(self, d_model, num_heads, d_ff, dropout=0.1):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout=dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        p = 0.5 if self.variant == "p_default" else dropout
        self.dropout1, self.dropout2 = nn.Dropout(p), nn.Dropout(p)

    def mask(self, am):
        v = self.variant
        if v in ("seed", "p_default", "sum_dropout"):
            return am.bool().unsqueeze(-1)          # the exercise's bug: (B, L, 1)
        if v == "ignored":
            return None
        if v == "inverted":
            return (am == 0).unsqueeze(1)
        if v == "not_bool":
            return am.unsqueeze(1)
        if v == "outer":                            # (B, L, L): also correct at real positions
            m = am.bool()
            return m.unsqueeze(1) & m.unsqueeze(2)
        if v == "indexing":
            return am[:, None, :] == 1
        return am.bool().unsqueeze(1)

    def forward(self, x, attention_mask):
        mask = self.mask(attention_mask)
        if self.variant == "sum_dropout":
            mask = attention_mask.bool().unsqueeze(1)
            x = self.norm1(self.dropout1(x + self.self_attn(x, x, x, mask)))
            return self.norm2(self.dropout2(x + self.feed_forward(x)))
        if self.variant == "swapped":
            x = self.norm2(x + self.dropout1(self.self_attn(x, x, x, mask)))
            return self.norm1(x + self.dropout2(self.feed_forward(x)))
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, mask)))
        return self.norm2(x + self.dropout2(self.feed_forward(x)))


def mask_variant(name):
    return type(f"MaskLayer_{name}", (MaskLayer,), {"variant": name})


def test_repaired_block_passes(capsys):
    assert passes(check_repaired_encoder_block, RepairedEncoderLayer)
    assert "check_repaired_encoder_block: all 4 cases pass" in capsys.readouterr().out
    for style in ("good", "outer", "indexing"):
        assert passes(check_repaired_encoder_block, mask_variant(style))


def test_repaired_block_fused_attention_passes():
    class Fused(FusedLayer):  # 4-D masks only, fused kernel
        def forward(self, x, attention_mask):
            mask = attention_mask.bool()[:, None, None, :]          # (B, 1, 1, L)
            x = self.norm1(x + self.drop(self.self_attn(x, x, x, mask)))
            return self.norm2(x + self.drop(self.feed_forward(x)))

    assert passes(check_repaired_encoder_block, Fused)


@pytest.mark.parametrize(
    "variant, words",
    [
        ("seed", r"the mask hides the padded QUERIES \(rows\) instead of the padded KEYS"),
        ("ignored", r"the padded keys are not hidden.*or no mask reaches the attention"),
        ("inverted", r"the mask is inverted"),
        ("not_bool", r"TypeError.*mask must have dtype torch.bool"),
        ("p_default", r"the mask hides the padded QUERIES"),
        ("sum_dropout", r"dropout on the residual sum"),
        ("swapped", r"norm1 and norm2 swapped"),
    ],
)
def test_repaired_block_mistakes(variant, words):
    with pytest.raises(AssertionError, match=words):
        check_repaired_encoder_block(mask_variant(variant))


def test_repaired_block_wrong_p_after_mask_fixed():
    class PDefault(MaskLayer):
        def __init__(self, d_model, num_heads, d_ff, dropout=0.1):
            super().__init__(d_model, num_heads, d_ff, dropout)
            self.dropout1 = nn.Dropout()

    with pytest.raises(AssertionError, match=r"dropout is active although dropout=0.0"):
        check_repaired_encoder_block(PDefault)


def test_repaired_block_course_lib_refused():
    with pytest.raises(AssertionError, match=r"course_lib's own `EncoderLayer`"):
        check_repaired_encoder_block(EncoderLayer)


def test_repaired_block_unimplemented(capsys):
    class RepairedEncoderLayer(MaskLayer):
        def forward(self, x, attention_mask):
            raise NotImplementedError

    assert check_repaired_encoder_block(RepairedEncoderLayer) is None
    assert "`RepairedEncoderLayer` is not implemented yet" in capsys.readouterr().out


# --------------------------------------------------------------------------- Predict: LayerNorm output

_LN_RIGHT = [[-1.34, -0.45, 0.45, 1.34], [-1.34, -0.45, 0.45, 1.34]]


def test_layer_norm_prediction_passes(capsys):
    assert passes(check_layer_norm_prediction, lambda: _LN_RIGHT)
    assert "check_layer_norm_prediction: right" in capsys.readouterr().out
    # another form: the exact tensor, computed any way
    exact = F.layer_norm(torch.tensor([[1.0, 2, 3, 4], [10, 20, 30, 40]]), (4,))
    assert passes(check_layer_norm_prediction, lambda: exact)


@pytest.mark.parametrize(
    "answer, words",
    [
        ([[-1, -1, -1, -1], [1, 1, 1, 1]], "wrong axis"),
        ([[-1.16, -0.39, 0.39, 1.16]] * 2, "unbiased variance"),
        ([[-1.34, -0.45, 0.45, 1.34], [-13.42, -4.47, 4.47, 13.42]], "keeps its scale"),
        ([[-1.5, -0.5, 0.5, 1.5], [-15, -5, 5, 15]], "only the mean is removed"),
        ([[0.89, 1.79, 2.68, 3.58]] * 2, "without subtracting the mean"),
        ([[0.0, 0.0, 0.0, 0.0]] * 2, "Not quite. For each token"),
        ([-1.34, -0.45, 0.45, 1.34], "shape \\(4,\\)"),
        ("about zero", "could not read your answer"),
    ],
)
def test_layer_norm_prediction_mistakes(answer, words):
    with pytest.raises(AssertionError, match=words):
        check_layer_norm_prediction(lambda: answer)


def test_layer_norm_prediction_unimplemented(capsys):
    def predicted_layer_norm_output():
        raise NotImplementedError

    assert check_layer_norm_prediction(predicted_layer_norm_output) is None
    assert "is not implemented yet" in capsys.readouterr().out


# --------------------------------------------------------------------------- Predict: parameter count


def test_encoder_layer_params_passes(capsys):
    assert passes(check_encoder_layer_params, lambda: 3_152_384)
    assert "right, 3,152,384" in capsys.readouterr().out
    assert passes(check_encoder_layer_params, lambda: 3152384.0)  # a float that is a whole number


@pytest.mark.parametrize(
    "answer, words",
    [
        (3_147_776, "the biases are missing"),
        (3_145_728, "the biases and the LayerNorms are missing"),
        (3_150_336, "the two LayerNorms are missing"),
        (3_151_360, "only one vector each"),
        (2_889_728, "the output projection W\\^O is missing"),
        (10_506_752, "counted once per head"),
        (2_233_088, "counted for one head only"),
        (1_577_984, "d_model -> d_model"),
        (2_103_296, "one linear layer"),
        (1_000_000, "Not quite \\(1,000,000\\). Count each part"),
        (3_152_384.5, "Give a whole number"),
        ("3M", "Give a whole number"),
    ],
)
def test_encoder_layer_params_mistakes(answer, words):
    with pytest.raises(AssertionError, match=words):
        check_encoder_layer_params(lambda: answer)


def test_encoder_layer_params_unimplemented(capsys):
    def predicted_encoder_layer_params():
        raise NotImplementedError

    assert check_encoder_layer_params(predicted_encoder_layer_params) is None
    assert "is not implemented yet" in capsys.readouterr().out


# --------------------------------------------------------------------------- issue 15: more named mistakes
@pytest.mark.parametrize("act, words", [(torch.tanh, "tanh is used"), (torch.sigmoid, "a sigmoid is used"),
                                        (F.silu, "SiLU is used"), (F.leaky_relu, "leaky ReLU is used")])
def test_feed_forward_other_activations_named(act, words):
    class Other(GoodFF):
        def __init__(self, d_model, d_ff, dropout=0.0):
            super().__init__(d_model, d_ff, dropout)

        def forward(self, x):
            return self.linear2(act(self.linear1(x)))

    with pytest.raises(AssertionError, match=words):
        check_feed_forward(Other)


def test_layer_norm_bias_before_gain_named():
    def bias_first(x, weight, bias, eps=1e-5):
        return (layer_norm_fn(x, torch.ones_like(weight), torch.zeros_like(bias), eps) + bias) * weight

    with pytest.raises(AssertionError, match=r"the bias is added before the gain"):
        check_layer_norm(bias_first)


def test_encoder_layer_inverted_mask_named():
    class Inverted(Layer):
        def forward(self, x, mask=None):
            m = None if mask is None else ~mask
            x = self.norm1(x + self.dropout(self.attn(x, m)))
            return self.norm2(x + self.dropout(self.ff(x)))

    with pytest.raises(AssertionError, match=r"the mask is inverted"):
        check_encoder_layer(Inverted)


def test_repaired_block_causal_mask_named():
    class Causal(MaskLayer):
        def mask(self, am):
            L = am.size(1)
            return am.bool().unsqueeze(1) & torch.ones(L, L, dtype=torch.bool).tril()

    with pytest.raises(AssertionError, match=r"a causal mask was added"):
        check_repaired_encoder_block(Causal)


def test_repaired_block_2d_mask_crash_is_explained():
    class TwoD(MaskLayer):
        def mask(self, am):
            return am.bool()                       # (B, L) as it comes: does not broadcast

    with pytest.raises(AssertionError, match=r"Your code raised ValueError.*does not broadcast"):
        check_repaired_encoder_block(TwoD)
