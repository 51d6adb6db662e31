"""Lesson 01 checkers: a correct answer passes, each named mistake gets its own message."""

from __future__ import annotations

import math

import pytest
from _helpers import passes
import torch

from course_lib.checks import check_attention_mask, check_scaled_dot_product_attention


# ---------------------------------------------------------------- scaled dot-product attention

def make_attention(
    scale: str = "sqrt_dk",
    softmax_dim: int = -1,
    mask_mode: str = "ok",
    fill: str = "safe",
):
    """An attention function written the way a learner would, with one configurable mistake."""

    def attention(query, key, value, mask=None):
        divisor = {
            "sqrt_dk": math.sqrt(query.size(-1)),
            "none": 1.0,
            "dk": float(query.size(-1)),
            "sqrt_lk": math.sqrt(key.size(-2)),
            "sqrt_dv": math.sqrt(value.size(-1)),
        }[scale]
        scores = torch.matmul(query, key.transpose(-2, -1)) / divisor
        keep = None
        if mask is not None and mask_mode != "ignore":
            keep = mask if mask_mode == "ok" else ~mask
            low = float("-inf") if fill == "-inf" else torch.finfo(scores.dtype).min
            scores = scores.masked_fill(~keep, low)
        weights = torch.softmax(scores, dim=softmax_dim)
        if keep is not None and fill == "safe":
            weights = weights.masked_fill(~keep, 0.0)
        return torch.matmul(weights, value), weights

    return attention


def test_correct_attention_passes(capsys):
    assert passes(check_scaled_dot_product_attention, make_attention())
    assert "all 5 cases match" in capsys.readouterr().out


def test_reference_itself_passes():
    from course_lib import scaled_dot_product_attention

    assert passes(check_scaled_dot_product_attention, scaled_dot_product_attention)


def test_attention_with_nan_to_num_passes():
    """-inf followed by zeroing the NaN rows is a valid fix too."""

    def attention(query, key, value, mask=None):
        scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.nan_to_num(scores.softmax(-1), nan=0.0)
        return weights @ value, weights

    assert passes(check_scaled_dot_product_attention, attention)


def test_unimplemented_attention_prints_friendly_line(capsys):
    def my_attention(query, key, value, mask=None):
        raise NotImplementedError

    assert check_scaled_dot_product_attention(my_attention) is None
    out = capsys.readouterr().out
    assert "`my_attention` is not implemented yet" in out


def test_single_tensor_return_is_rejected():
    def attention(query, key, value, mask=None):
        return make_attention()(query, key, value, mask)[0]

    with pytest.raises(AssertionError, match=r"Return \(output, weights\)"):
        check_scaled_dot_product_attention(attention)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"scale": "none"}, "missing scale"),
        ({"scale": "dk"}, r"divided by d_k \(no square root\)"),
        ({"scale": "sqrt_lk"}, r"sqrt\(L_k\), the number of keys"),
        ({"scale": "sqrt_dv"}, r"sqrt\(d_v\), the value size"),
        ({"softmax_dim": -2}, r"softmax over the wrong axis \(the query axis"),
        ({"softmax_dim": 1}, r"softmax over the wrong axis \(the query axis"),
        ({"softmax_dim": 2}, r"softmax over the wrong axis \(the query axis"),
        ({"mask_mode": "ignore"}, "mask ignored"),
        ({"mask_mode": "invert"}, "mask inverted"),
        ({"mask_mode": "invert", "fill": "-inf"}, "mask inverted"),
        ({"fill": "-inf"}, "contains NaN or inf.*finite minimum"),
        ({"fill": "no_zeroing"}, "fully masked row not zeroed"),
    ],
)
def test_attention_mistakes_are_named(kwargs, words):
    with pytest.raises(AssertionError, match=words):
        check_scaled_dot_product_attention(make_attention(**kwargs))


def test_scale_by_sqrt_lq_is_named():
    def attention(query, key, value, mask=None):
        scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-2))
        weights = scores.softmax(-1)
        return weights @ value, weights

    with pytest.raises(AssertionError, match=r"sqrt\(L_q\), the number of queries"):
        check_scaled_dot_product_attention(attention)


def test_transposed_output_is_a_wrong_shape():
    def attention(query, key, value, mask=None):
        out, weights = make_attention()(query, key, value, mask)
        return out.transpose(-2, -1), weights

    with pytest.raises(AssertionError, match=r"Wrong output shape: output has shape \(2, 7, 3\), expected \(2, 3, 7\)"):
        check_scaled_dot_product_attention(attention)


def test_forgotten_key_transpose_is_explained():
    def attention(query, key, value, mask=None):
        weights = (query @ key / math.sqrt(query.size(-1))).softmax(-1)
        return weights @ value, weights

    with pytest.raises(AssertionError, match="raised RuntimeError.*forget to transpose key"):
        check_scaled_dot_product_attention(attention)


def test_bmm_on_4d_inputs_is_explained():
    def attention(query, key, value, mask=None):
        weights = torch.bmm(query, key.transpose(1, 2)).div(math.sqrt(query.size(-1))).softmax(-1)
        return torch.bmm(weights, value), weights

    with pytest.raises(AssertionError, match=r"4-D inputs with a head axis.*not torch.bmm|not torch.bmm"):
        check_scaled_dot_product_attention(attention)


# ---------------------------------------------------------------- padding mask

def make_mask_fn(mistake: str = ""):
    def make_padding_mask(ids, pad_id):
        real = ids != (0 if mistake == "pad0" else pad_id)  # (B, L)
        if mistake == "wrong_dtype":
            return real.unsqueeze(1).float()
        if mistake == "inverted":
            return (ids == pad_id).unsqueeze(1)
        if mistake == "queries":
            return real.unsqueeze(2)  # (B, L, 1)
        if mistake == "queries_full":
            return real.unsqueeze(2).expand(-1, -1, ids.size(1))
        if mistake == "both":
            return real.unsqueeze(2) & real.unsqueeze(1)
        if mistake == "flat":
            return real
        if mistake == "causal":
            L = ids.size(1)
            return real.unsqueeze(1) & torch.ones(L, L, dtype=torch.bool).tril()
        if mistake == "4d":
            return real[:, None, None, :]
        if mistake == "full":
            return real.unsqueeze(1).expand(-1, ids.size(1), -1)
        return real.unsqueeze(1)

    return make_padding_mask


def test_correct_mask_passes(capsys):
    assert passes(check_attention_mask, make_mask_fn())
    assert "check_attention_mask: all 5 cases match" in capsys.readouterr().out


def test_full_key_padding_mask_passes():
    """A (B, L, L) mask that hides the same pad keys for every query is equivalent."""
    assert passes(check_attention_mask, make_mask_fn("full"))


def test_reference_mask_passes(capsys):
    from course_lib.masks import padding_mask

    assert passes(check_attention_mask, padding_mask)
    assert "check_attention_mask: all 5 cases match" in capsys.readouterr().out


def test_unimplemented_mask_prints_friendly_line(capsys):
    def make_padding_mask(ids, pad_id):
        raise NotImplementedError

    assert check_attention_mask(make_padding_mask) is None
    assert "`make_padding_mask` is not implemented yet" in capsys.readouterr().out


@pytest.mark.parametrize(
    "mistake, words",
    [
        ("wrong_dtype", r"Wrong dtype.*torch.float32, expected torch.bool.*True = may attend"),
        ("inverted", "mask inverted: True on the pads"),
        ("queries", r"padding on the query axis instead of the keys: \(B, L, 1\).*unsqueeze\(1\)"),
        ("queries_full", r"padding on the query axis instead of the keys"),
        ("both", "padding on both axes: the pad queries become fully masked rows"),
        ("pad0", r"pad_id=3.*pad_id ignored \(0 is hard-coded\)"),
        ("flat", r"Wrong shape.*is \(B, L\), one flag per token.*unsqueeze\(1\)"),
        ("causal", "causal part included"),
        ("4d", r"Wrong output shape: the mask has shape \(3, 1, 1, 5\), expected \(3, 1, 5\)"),
    ],
)
def test_mask_mistakes_are_named(mistake, words):
    with pytest.raises(AssertionError, match=words):
        check_attention_mask(make_mask_fn(mistake))


def test_wrong_shape_that_does_not_broadcast_is_named():
    def make_padding_mask(ids, pad_id):
        return (ids != pad_id).unsqueeze(1)[..., :-1]  # one key short

    with pytest.raises(AssertionError, match=r"Wrong output shape: the mask has shape \(3, 1, 4\), expected \(3, 1, 5\)"):
        check_attention_mask(make_padding_mask)


def test_crash_is_explained():
    def make_padding_mask(ids, pad_id):
        return ids.ne(pad_id).unsqueeze(1).view(-1, 7)

    with pytest.raises(AssertionError, match=r"raised RuntimeError.*unsqueeze\(1\)"):
        check_attention_mask(make_padding_mask)
