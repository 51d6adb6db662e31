"""Lesson 01 checkers: correct answers in several styles pass, each named mistake gets its own message."""

from __future__ import annotations

import math

import pytest
from _helpers import passes
import torch

from course_lib.checks import (
    check_attention_mask, check_fixed_attention, check_nan_rows_prediction, check_scaled_dot_product_attention,
    check_top_key_prediction,
)


# ---------------------------------------------------------------- scaled dot-product attention

def make_attention(
    scale: str = "sqrt_dk",
    softmax_dim: int = -1,
    mask_mode: str = "ok",
    fill: str = "safe",
    swap: bool = False,
):
    """An attention function written the way a learner would, with one configurable mistake."""

    def attention(query, key, value, mask=None):
        divisor = {
            "sqrt_dk": math.sqrt(query.size(-1)),
            "none": 1.0,
            "dk": float(query.size(-1)),
            "sqrt_lk": math.sqrt(key.size(-2)),
            "sqrt_dv": math.sqrt(value.size(-1)),
            "fixed4": 4.0,  # the lesson's global d_k = 16
            "fixed8": 8.0,
            "multiply": 1.0 / math.sqrt(query.size(-1)),
            "after_softmax": 1.0,
        }[scale]
        scores = torch.matmul(query, key.transpose(-2, -1)) / divisor
        keep = None
        if mask is not None and mask_mode != "ignore":
            if mask_mode == "unsqueeze":
                mask = mask.unsqueeze(1)
            keep = ~mask if mask_mode == "invert" else mask
            low = {"-inf": float("-inf"), "zero": 0.0, "zero_only": 0.0}.get(
                fill, torch.finfo(scores.dtype).min)
            if fill != "after_softmax":
                scores = scores.masked_fill(~keep, low)
        weights = torch.softmax(scores, dim=softmax_dim)
        if keep is not None and fill in ("safe", "zero", "after_softmax"):
            weights = weights.masked_fill(keep if mask_mode == "invert_zeroing" else ~keep, 0.0)
        if scale == "after_softmax":
            weights = weights / math.sqrt(query.size(-1))
        output = torch.matmul(weights, value)
        return (weights, output) if swap else (output, weights)

    return attention


def test_correct_attention_passes(capsys):
    assert passes(check_scaled_dot_product_attention, make_attention())
    assert "all 6 cases match" in capsys.readouterr().out


def test_reference_itself_is_not_the_learners():
    from course_lib import scaled_dot_product_attention

    with pytest.raises(AssertionError, match="This is course_lib's own `scaled_dot_product_attention`.*"
                                             "checks nothing of yours"):
        check_scaled_dot_product_attention(scaled_dot_product_attention)


def test_a_function_that_calls_course_lib_is_told():
    import course_lib
    from course_lib import scaled_dot_product_attention as alias

    def my_attention(query, key, value, mask=None):
        return alias(query, key, value, mask)

    def through_the_module(query, key, value, mask=None):
        return course_lib.attention.scaled_dot_product_attention(query, key, value, mask=mask)

    for fn in (my_attention, through_the_module):
        with pytest.raises(AssertionError, match=f"`{fn.__name__}` calls course_lib's own "
                                                 "`scaled_dot_product_attention`"):
            check_scaled_dot_product_attention(fn)


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
        ({"scale": "fixed4"}, r"divided by a fixed 4 = sqrt\(16\) \(a global d_k or d_model"),
        ({"scale": "fixed8"}, r"divided by 8, not by sqrt\(d_k\) = sqrt\(16\) = 4"),
        ({"scale": "multiply"}, r"multiplied by sqrt\(d_k\) instead of divided"),
        ({"scale": "after_softmax"}, r"weights are divided by sqrt\(d_k\) after the softmax"),
        ({"softmax_dim": 0}, r"softmax over the batch axis \(dim=0\)"),
        ({"fill": "after_softmax"}, "mask applied after the softmax"),
        ({"fill": "zero_only"}, r"hidden scores set to 0 instead of a very negative number \("),
        ({"fill": "zero"}, "hidden scores set to 0 .*then the hidden weights zeroed"),
        ({"mask_mode": "invert_zeroing"}, "mask inverted in the zeroing after the softmax"),
        ({"mask_mode": "unsqueeze"}, r"one axis too many.*gains an axis inside the function"),
        ({"swap": True}, r"Outputs swapped.*Return \(output, weights\), in that order"),
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
        if mistake == "lengths":  # assumes right padding
            return (torch.arange(ids.size(1)) < real.sum(-1, keepdim=True)).unsqueeze(1)
        if mistake == "or_causal":
            L = ids.size(1)
            return real.unsqueeze(1) | torch.ones(L, L, dtype=torch.bool).tril()
        if mistake == "front":
            return real.unsqueeze(0)  # (1, B, L)
        if mistake == "gt0":
            return (ids > 0).unsqueeze(1)
        return real.unsqueeze(1)

    return make_padding_mask


def test_correct_mask_passes(capsys):
    assert passes(check_attention_mask, make_mask_fn())
    assert "check_attention_mask: all 5 cases match" in capsys.readouterr().out


def test_full_key_padding_mask_passes():
    """A (B, L, L) mask that hides the same pad keys for every query is equivalent."""
    assert passes(check_attention_mask, make_mask_fn("full"))


def test_reference_mask_is_not_the_learners():
    from course_lib import decoder_self_attention_mask, padding_mask

    with pytest.raises(AssertionError, match="This is course_lib's own `padding_mask`"):
        check_attention_mask(padding_mask)

    def make_padding_mask(ids, pad_id):
        return padding_mask(ids, pad_id)

    with pytest.raises(AssertionError, match="`make_padding_mask` calls course_lib's own `padding_mask`"):
        check_attention_mask(make_padding_mask)

    def from_the_decoder_mask(ids, pad_id):
        return decoder_self_attention_mask(ids, pad_id)[:, :1]

    with pytest.raises(AssertionError, match="calls course_lib's own `decoder_self_attention_mask`"):
        check_attention_mask(from_the_decoder_mask)


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
        ("queries", r"padding on the query axis instead of the keys: the pad rows are hidden.*"
                    r"unsqueeze\(1\)"),
        ("queries_full", r"padding on the query axis instead of the keys"),
        ("both", "padding on both axes: the pad queries become fully masked rows"),
        ("pad0", r"pad_id=3.*pad_id ignored \(0 is hard-coded\)"),
        ("flat", r"Wrong shape.*is \(B, L\), one flag per token.*unsqueeze\(1\)"),
        ("causal", "causal part included"),
        ("4d", r"Wrong output shape: the mask has shape \(3, 1, 1, 5\), expected \(3, 1, 5\)"),
        ("lengths", r"left padding.*mask built from the lengths.*assumes the pads are at the end"),
        ("or_causal", r"padding and causal combined with \| \(or\)"),
        ("front", r"\(1, 3, 5\) has the new axis in front \(unsqueeze\(0\)\)"),
        ("gt0", r"pad_id=3.*pad_id ignored \(0 is hard-coded\)"),
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


# ---------------------------------------------------------------- more correct styles

def test_einsum_attention_passes():
    def attention(query, key, value, mask=None):
        scores = torch.einsum("...qd,...kd->...qk", query, key) / query.size(-1) ** 0.5
        if mask is not None:
            scores = scores.masked_fill(mask.logical_not(), torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)
        if mask is not None:
            weights = weights * mask
        return torch.einsum("...qk,...kv->...qv", weights, value), weights

    assert passes(check_scaled_dot_product_attention, attention)


def test_fused_sdpa_with_separate_weights_passes():
    """PyTorch's fused kernel for the output, the weights computed alongside."""
    import torch.nn.functional as F

    def attention(query, key, value, mask=None):
        weights = make_attention()(query, key, value, mask)[1]
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
        return out, weights

    assert passes(check_scaled_dot_product_attention, attention)


def test_mask_from_ne_and_indexing_passes():
    def make_padding_mask(ids, pad_id):
        return torch.ne(ids, pad_id)[:, None, :]

    assert passes(check_attention_mask, make_padding_mask)


# ---------------------------------------------------------------- predict: the top key


TOKENS = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "it", "[SEP]"]


def top_key_inputs():
    x = torch.randn(len(TOKENS), 16, generator=torch.Generator().manual_seed(0))
    x[5] = x[1]  # the two "the" share their embedding, as in the lesson
    return x, x, TOKENS, "it"


@pytest.mark.parametrize("answer", ["it", " it", 7, torch.tensor(7)])
def test_top_key_right_answers_pass(answer, capsys):
    assert passes(check_top_key_prediction, lambda: answer, *top_key_inputs())
    assert "right, 'it'" in capsys.readouterr().out


def test_top_key_wrong_token_is_explained():
    with pytest.raises(AssertionError, match=r"Not 'cat'.*\|x\|\^2.*learned in training"):
        check_top_key_prediction(lambda: "cat", *top_key_inputs())


def test_top_key_wrong_position_is_named():
    with pytest.raises(AssertionError, match=r"Not position 2 \('cat'\)"):
        check_top_key_prediction(lambda: 2, *top_key_inputs())


@pytest.mark.parametrize("answer, words", [("dog", "not a token of the sentence"), (3.0, "Return one token"),
                                            (42, "outside the sentence")])
def test_top_key_bad_answers_are_explained(answer, words):
    with pytest.raises(AssertionError, match=words):
        check_top_key_prediction(lambda: answer, *top_key_inputs())


def test_top_key_when_query_differs_from_key():
    """With projections the truth is whatever the scores say; the checker computes it."""
    q, k, tokens, it = top_key_inputs()
    k = k.flip(0)
    best = tokens[int((q[tokens.index(it)] @ k.T).argmax())]
    assert passes(check_top_key_prediction, lambda: best, q, k, tokens, it)


def test_top_key_stub_prints_not_implemented(capsys):
    def predicted_top_key():
        raise NotImplementedError

    assert check_top_key_prediction(predicted_top_key, *top_key_inputs()) is None
    assert "`predicted_top_key` is not implemented yet" in capsys.readouterr().out


# ---------------------------------------------------------------- predict: the NaN rows

IDS = torch.tensor([[101, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 102],
                    [101, 3, 4, 5, 6, 7, 102, 0, 0, 0, 0, 0]])
NAN_ROWS = [(1, 7), (1, 8), (1, 9), (1, 10), (1, 11)]


@pytest.mark.parametrize("answer", [NAN_ROWS, set(NAN_ROWS), tuple(reversed(NAN_ROWS)),
                                    [[1, t] for t in range(7, 12)], IDS == 0])
def test_nan_rows_right_answers_pass(answer, capsys):
    assert passes(check_nan_rows_prediction, lambda: answer, IDS, 0)
    assert "right, 5 rows" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    ([], r"you predicted none.*harmless only while a row keeps one visible key"),
    ([(1, t) for t in range(12)], r"see at least one real key.*does not spread from row to row"),
    ([(1, 7)], r"You missed \(1, 8\), \(1, 9\), \(1, 10\), \(1, 11\): pad queries as well"),
    (NAN_ROWS + [(0, 11)], r"Sentence\(s\) \[0\] have no padding"),
    ([7, 8, 9, 10, 11], r"Return a list of \(sentence, position\) pairs"),
    ([(2, 0)], "outside the batch"),
    ([(2, t) for t in range(8, 13)], r"outside the batch.*Python counts from 0"),
    (torch.zeros(2, 12), "bool tensor of shape"),
])
def test_nan_rows_wrong_answers_are_explained(answer, words):
    with pytest.raises(AssertionError, match=words):
        check_nan_rows_prediction(lambda: answer, IDS, 0)


def test_nan_rows_truth_follows_the_pad_id():
    ids = torch.tensor([[4, 0, 5, 3, 3]])  # pad_id 3; 0 is a real token here
    assert passes(check_nan_rows_prediction, lambda: [(0, 3), (0, 4)], ids, 3)


def test_nan_rows_stub_prints_not_implemented(capsys):
    def predicted_nan_rows():
        raise NotImplementedError

    assert check_nan_rows_prediction(predicted_nan_rows, IDS, 0) is None
    assert "`predicted_nan_rows` is not implemented yet" in capsys.readouterr().out


# ---------------------------------------------------------------- debug: the mask that gains an axis

def make_fixed(bug: str = ""):
    def fixed_attention(query, key, value, mask=None):
        scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
        if mask is not None:
            if bug == "unsqueeze" or (bug == "unsqueeze_3d" and mask.dim() == 3):
                mask = mask.unsqueeze(1)
            if bug == "unsqueeze0":
                mask = mask.unsqueeze(0)
            if bug == "invert":
                mask = ~mask
            low = float("-inf") if bug == "-inf" else torch.finfo(scores.dtype).min
            scores = scores.masked_fill(~mask, low)
        weights = scores.softmax(dim=-1)
        if mask is not None and bug not in ("-inf", "no_zeroing"):
            weights = weights.masked_fill(~mask, 0.0)
        return weights @ value, weights

    return fixed_attention


def test_fixed_attention_passes(capsys):
    assert passes(check_fixed_attention, make_fixed())
    assert "check_fixed_attention: fixed, all 7 cases match" in capsys.readouterr().out


def test_fixed_attention_alternatives_pass():
    from course_lib import scaled_dot_product_attention

    def delegating(query, key, value, mask=None):
        return scaled_dot_product_attention(query, key, value, mask)

    def with_where(query, key, value, mask=None):
        scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
        if mask is not None:
            scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
        weights = scores.softmax(-1)
        if mask is not None:
            weights = torch.where(mask, weights, 0.0)
        return weights @ value, weights

    assert passes(check_fixed_attention, with_where)
    with pytest.raises(AssertionError, match="`delegating` calls course_lib's own.*Fix the function"):
        check_fixed_attention(delegating)
    with pytest.raises(AssertionError, match="This is course_lib's own `scaled_dot_product_attention`"):
        check_fixed_attention(scaled_dot_product_attention)


@pytest.mark.parametrize("bug, words", [
    ("unsqueeze", r"decoder mask \(B, L, L\)\): \(2, 2, 6, 8\), expected \(2, 6, 8\).*gains an axis"
                  r" inside the function, \(2, 1, 6, 6\)"),
    ("unsqueeze0", r"\(1, 2, 6, 8\), expected \(2, 6, 8\): one axis too many.*gain an axis inside"),
    ("no_zeroing", "fully masked row not zeroed"),
    ("invert", "mask inverted: you hid the allowed keys"),
    ("unsqueeze_3d", r"one axis too many.*without unsqueeze"),
    ("-inf", r"fully masked row.*contains NaN or inf"),
])
def test_fixed_attention_mistakes_are_named(bug, words):
    with pytest.raises(AssertionError, match=words):
        check_fixed_attention(make_fixed(bug))


def test_fixed_attention_crash_is_explained():
    def fixed_attention(query, key, value, mask=None):
        scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
        if mask is not None:
            scores = scores.masked_fill(~mask.unsqueeze(-1), torch.finfo(scores.dtype).min)
        weights = scores.softmax(-1)
        return weights @ value, weights

    with pytest.raises(AssertionError, match=r"raised RuntimeError.*gain an axis inside the function"):
        check_fixed_attention(fixed_attention)


def test_fixed_attention_mask_ignored_is_named():
    def fixed_attention(query, key, value, mask=None):
        return make_fixed()(query, key, value, None)

    with pytest.raises(AssertionError, match="mask ignored"):
        check_fixed_attention(fixed_attention)


def test_fixed_attention_stub_prints_not_implemented(capsys):
    def fixed_attention(query, key, value, mask=None):
        raise NotImplementedError

    assert check_fixed_attention(fixed_attention) is None
    assert "`fixed_attention` is not implemented yet" in capsys.readouterr().out


def test_lesson_00_quotes_the_real_message():
    """Lesson 00 quotes this checker's message for a missing scale; the quote must stay true."""
    from pathlib import Path

    import nbformat

    path = Path(__file__).resolve().parents[2] / "notebooks" / "00_introduction.ipynb"
    text = next(c.source for c in nbformat.read(path, as_version=4).cells if "AssertionError: Likely" in c.source)
    quote = " ".join(line[2:] for line in text.splitlines() if line.startswith("> "))
    with pytest.raises(AssertionError) as error:
        check_scaled_dot_product_attention(make_attention(scale="none"))
    assert quote == f"AssertionError: {error.value}"


def test_lesson_00_quotes_the_real_pass_line(capsys):
    """Lesson 00 quotes the one line a correct attention function prints; it must stay true."""
    from pathlib import Path

    import nbformat

    path = Path(__file__).resolve().parents[2] / "notebooks" / "00_introduction.ipynb"
    text = next(c.source for c in nbformat.read(path, as_version=4).cells if "AssertionError: Likely" in c.source)
    assert passes(check_scaled_dot_product_attention, make_attention())
    line = capsys.readouterr().out.strip()
    assert f"`{line}`" in " ".join(text.split())


def test_attention_that_needs_a_batch_axis_is_named():
    """The exercise asks for any number of leading axes, (L, d) included."""

    def attention(query, key, value, mask=None):
        if query.dim() < 3:
            raise ValueError("expected a batch axis")
        return make_attention()(query, key, value, mask)

    with pytest.raises(AssertionError, match=r"raised ValueError \(2-D inputs \(L, d\)"):
        check_scaled_dot_product_attention(attention)


def test_lesson_00_quotes_the_real_own_function_message():
    """Lesson 00 quotes what the checker says to course_lib's own function; the quote must stay true."""
    from pathlib import Path

    import nbformat

    from course_lib import scaled_dot_product_attention

    path = Path(__file__).resolve().parents[2] / "notebooks" / "00_introduction.ipynb"
    text = next(c.source for c in nbformat.read(path, as_version=4).cells
                if "AssertionError: This is course_lib's own" in c.source)
    quote = " ".join(line[2:] for line in text.splitlines() if line.startswith("> "))
    with pytest.raises(AssertionError) as error:
        check_scaled_dot_product_attention(scaled_dot_product_attention)
    assert quote == f"AssertionError: {error.value}"


# ---------------------------------------------------------------- answers that lie (#49)

class EqualToAll(str):
    """A str subclass equal to every token, whose strip/lower keep it."""

    def __eq__(self, other):
        return True

    __hash__ = str.__hash__

    def strip(self, *chars):
        return self

    def lower(self):
        return self


class LyingTensor(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.allclose, torch.equal, torch.Tensor.__eq__, torch.Tensor.nonzero):
            return torch.tensor([[1, t] for t in range(7, 12)]) if func is torch.Tensor.nonzero else True
        return super().__torch_function__(func, types, args, kwargs or {})


def test_top_key_refuses_a_str_equal_to_everything():
    with pytest.raises(AssertionError, match="'zebra' is not a token of the sentence"):
        check_top_key_prediction(lambda: EqualToAll("zebra"), *top_key_inputs())
    with pytest.raises(AssertionError, match=r"Not 'cat'"):
        check_top_key_prediction(lambda: EqualToAll("cat"), *top_key_inputs())
    assert passes(check_top_key_prediction, lambda: EqualToAll("it"), *top_key_inputs())  # its value is right


def test_nan_rows_refuses_a_tensor_that_lies():
    lying = torch.zeros(2, 12, dtype=torch.bool).as_subclass(LyingTensor)
    assert lying.nonzero().tolist() == [list(p) for p in NAN_ROWS]  # what the checker would have read
    with pytest.raises(AssertionError, match="you predicted none"):
        check_nan_rows_prediction(lambda: lying, IDS, 0)
    assert passes(check_nan_rows_prediction, lambda: (IDS == 0).as_subclass(LyingTensor), IDS, 0)


def test_attention_outputs_that_lie_are_refused():
    """Zeros of a tensor subclass whose allclose says "equal" are judged as the zeros they are."""
    def flatterer(query, key, value, mask=None):
        out = torch.zeros(*query.shape[:-1], value.shape[-1]).as_subclass(LyingTensor)
        weights = torch.zeros(*query.shape[:-1], key.shape[-2]).as_subclass(LyingTensor)
        return out, weights

    with pytest.raises(AssertionError):
        check_scaled_dot_product_attention(flatterer)
    with pytest.raises(AssertionError):
        check_fixed_attention(flatterer)

    def right_but_subclassed(query, key, value, mask=None):
        scores = query @ key.transpose(-2, -1) / query.size(-1) ** 0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = scores.softmax(dim=-1)
        if mask is not None:
            weights = weights.masked_fill(~mask, 0.0)
        return (weights @ value).as_subclass(LyingTensor), weights.as_subclass(LyingTensor)

    assert passes(check_scaled_dot_product_attention, right_but_subclassed)
