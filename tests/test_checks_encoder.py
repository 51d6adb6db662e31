"""The lesson-04 checkers accept correct code and name each typical mistake."""

from __future__ import annotations

import pytest
from _helpers import passes
import torch
import torch.nn.functional as F
from torch import nn

from course_lib import EncoderLayer, FeedForward, MultiHeadAttention
from course_lib.checks import check_encoder_layer, check_feed_forward, check_layer_norm

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
        return self.linear2(F.relu(self.linear1(x)))


def ff_variant(variant):
    class FF(GoodFF):
        def __init__(self, d_model, d_ff, dropout=0.0):
            super().__init__(d_model, d_ff, dropout, variant)

    return FF


def test_feed_forward_correct_passes(capsys):
    assert passes(check_feed_forward, ff_variant("good"))
    assert "check_feed_forward: all 3 cases match" in capsys.readouterr().out


def test_feed_forward_course_lib_passes():
    assert passes(check_feed_forward, FeedForward)


@pytest.mark.parametrize(
    "variant, words",
    [
        ("no_activation", "the activation is missing"),
        ("activation_after", "applied after linear2"),
        ("gelu", "GELU is used"),
        ("shape", "Wrong output shape"),
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


def test_layer_norm_nn_layernorm_class_passes():
    assert passes(check_layer_norm, nn.LayerNorm)


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
    assert "check_encoder_layer: all 3 cases match" in capsys.readouterr().out


def test_encoder_layer_course_lib_passes():
    assert passes(check_encoder_layer, EncoderLayer)


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
