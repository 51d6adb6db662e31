"""Lesson 03 checkers: a correct answer passes, every named mistake is caught with its own message,
and an exercise that is not done yet prints one friendly line."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _helpers import passes
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.checks import (
    check_embedding_layer,
    check_fixed_positional_encoding,
    check_pe_dot_prediction,
    check_positional_encoding,
    check_token_embedding,
    check_token_norm_prediction,
)


# ----------------------------------------------------------------------------- positional encoding
def make_pe(sin_pair_exp=None, cos_pair_exp=None, base=10000.0, swap=False, start=0, multiply=False):
    """Independent loop implementation from the paper's formula, with switches for the mistakes.

    ``sin_pair_exp(two_i, d)`` / ``cos_pair_exp(two_i, d)`` give the exponent for the pair whose sine is in
    column ``two_i`` (default: the paper's ``two_i / d``)."""
    sin_pair_exp = sin_pair_exp or (lambda two_i, d: two_i / d)
    cos_pair_exp = cos_pair_exp or (lambda two_i, d: two_i / d)

    def pe_fn(max_len, d_model):
        pe = torch.zeros(max_len, d_model, dtype=torch.float64)
        for p in range(max_len):
            pos = p + start
            for two_i in range(0, d_model, 2):
                f_sin = base ** sin_pair_exp(two_i, d_model)
                f_cos = base ** cos_pair_exp(two_i, d_model)
                a_sin = pos * f_sin if multiply else pos / f_sin
                a_cos = pos * f_cos if multiply else pos / f_cos
                first, second = (math.cos, math.sin) if swap else (math.sin, math.cos)
                pe[p, two_i] = first(a_sin)
                if two_i + 1 < d_model:
                    pe[p, two_i + 1] = second(a_cos)
        return pe.float()

    return pe_fn


def vectorized_pe(max_len, d_model):
    position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    inv_freq = torch.exp(-torch.arange(0, d_model, 2).float() * math.log(10000.0) / d_model)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(position * inv_freq)
    pe[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])
    return pe


def test_pe_correct_loop_and_vectorized_pass(capsys):
    assert passes(check_positional_encoding, make_pe())
    assert "check_positional_encoding: all 7 cases match" in capsys.readouterr().out
    assert passes(check_positional_encoding, vectorized_pe)


def interleaved_pe(max_len, d_model):
    # outer product for the angles, sin/cos interleaved by stack + flatten, trimmed for an odd d_model
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), omega)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)[:, :d_model]


def test_pe_interleaved_outer_product_passes():
    assert passes(check_positional_encoding, interleaved_pe)


def test_pe_float64_output_accepted():
    assert passes(check_positional_encoding, lambda n, d: make_pe()(n, d).double())


@pytest.mark.parametrize(
    "fn, words",
    [
        (make_pe(lambda t, d: 2 * t / d, lambda t, d: 2 * t / d), r"off by a factor of 2 \(the `2\*i` bug"),
        (make_pe(cos_pair_exp=lambda t, d: (t + 2) / d), r"cosine uses the next pair's frequency \(the `i\+1` bug\)"),
        (make_pe(lambda t, d: 2 * t / d, lambda t, d: 2 * (t + 1) / d),
         r"both bugs of a popular blog post's loop at once"),
        (make_pe(cos_pair_exp=lambda t, d: (t + 1) / d), r"its own index j in the exponent"),
        (make_pe(lambda t, d: t / (2 * d), lambda t, d: t / (2 * d)), r"exponent halved"),
        (make_pe(swap=True), r"sin and cos swapped"),
        (make_pe(base=1000.0), r"wrong base \(1000 instead of 10000\)"),
        (make_pe(base=100000.0), r"wrong base \(100000 instead of 10000\)"),
        (make_pe(base=math.e), r"wrong base \(e instead of 10000\)"),
        (make_pe(start=1), r"positions start at 1"),
        (make_pe(multiply=True), r"multiplied by 10000\^\(2i/d_model\) instead of dividing"),
        (lambda n, d: make_pe()(n, d).T.contiguous(), r"positions and dimensions transposed"),
        (lambda n, d: make_pe()(n, d).unsqueeze(0), r"Wrong output shape"),
    ],
)
def test_pe_named_mistakes(fn, words):
    with pytest.raises(AssertionError, match=words):
        check_positional_encoding(fn)


def test_pe_per_column_loop_is_the_blog_post_matrix():
    # every column j, exponent 2*j/d, sine on even, cosine on odd columns (another blog post's loop)
    def per_column(max_len, d_model):
        pe = torch.zeros(max_len, d_model)
        for pos in range(max_len):
            for j in range(d_model):
                angle = pos / 10000 ** (2 * j / d_model)
                pe[pos, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
        return pe

    with pytest.raises(AssertionError, match="both bugs of a popular blog post's loop at once"):
        check_positional_encoding(per_column)


def test_pe_odd_d_model_crash_gets_a_hint():
    def even_only(max_len, d_model):
        position = torch.arange(max_len).float().unsqueeze(1)
        inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2).float() / d_model)
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * inv_freq)
        pe[:, 1::2] = torch.cos(position * inv_freq)  # one column too many when d_model is odd
        return pe

    with pytest.raises(AssertionError, match=r"crashes for an odd d_model.*d_model // 2"):
        check_positional_encoding(even_only)


def test_pe_unexplained_difference_is_generic():
    with pytest.raises(AssertionError, match="None of the usual mistakes"):
        check_positional_encoding(lambda n, d: make_pe()(n, d) + 0.01)


def test_pe_not_implemented_prints_friendly_line(capsys):
    def positional_encoding(max_len, d_model):
        raise NotImplementedError

    assert check_positional_encoding(positional_encoding) is None
    out = capsys.readouterr().out
    assert "`positional_encoding` is not implemented yet" in out


# ------------------------------------------------------------------ debug: the blog post's loop
def blog_loop(double=True, next_cos=True):
    """The blog post's loop (i steps by 2), with each of its two bugs switchable."""
    def pe_fn(max_len, d_model):
        pe = torch.zeros(max_len, d_model, dtype=torch.float64)
        for pos in range(max_len):
            for i in range(0, d_model, 2):
                f = 2 if double else 1
                pe[pos, i] = math.sin(pos / 10000 ** (f * i / d_model))
                j = i + 1 if next_cos else i
                pe[pos, i + 1] = math.cos(pos / 10000 ** (f * j / d_model))
        return pe.float()

    return pe_fn


def test_fixed_loop_alternatives_pass(capsys):
    assert passes(check_fixed_positional_encoding, blog_loop(double=False, next_cos=False))
    out = capsys.readouterr().out
    assert "check_fixed_positional_encoding: all 5 cases match the paper's formula." in out
    assert "Both bugs fixed" in out
    assert out.count("\n") == 1
    assert passes(check_fixed_positional_encoding, vectorized_pe)
    assert passes(check_fixed_positional_encoding, lambda n, d: make_pe()(n, d).double())


def test_fixed_loop_even_only_is_enough():
    # the loop of the exercise crashes for an odd d_model; the checker never asks for one
    def no_odd(max_len, d_model):
        assert d_model % 2 == 0, "odd d_model"
        return blog_loop(double=False, next_cos=False)(max_len, d_model)

    assert passes(check_fixed_positional_encoding, no_odd)


@pytest.mark.parametrize(
    "fn, words",
    [
        (blog_loop(), r"both bugs of a popular blog post's loop at once"),
        (blog_loop(double=True, next_cos=False), r"off by a factor of 2 \(the `2\*i` bug"),
        (blog_loop(double=False, next_cos=True), r"its own index j in the exponent"),
        (make_pe(cos_pair_exp=lambda t, d: (t + 2) / d), r"the `i\+1` bug"),
        (lambda n, d: make_pe()(n, d)[:, :-1], r"Wrong output shape"),
    ],
)
def test_fixed_loop_named_mistakes(fn, words):
    with pytest.raises(AssertionError, match=words):
        check_fixed_positional_encoding(fn)


def test_fixed_loop_not_implemented(capsys):
    def fixed_positional_encoding(max_len, d_model):
        raise NotImplementedError

    assert check_fixed_positional_encoding(fixed_positional_encoding) is None
    assert "`fixed_positional_encoding` is not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------- predict, then run
@pytest.mark.parametrize("answer", [512, 512.0, 480.0, torch.tensor(550.0), np.float64(511.8)])
def test_token_norm_prediction_right(answer, capsys):
    assert passes(check_token_norm_prediction, lambda: answer)
    out = capsys.readouterr().out
    assert out.startswith("check_token_norm_prediction: right, about 512.") and out.count("\n") == 1


@pytest.mark.parametrize(
    "answer, words",
    [
        (22.6, r"the norm BEFORE the sqrt\(d_model\) factor"),
        (1.0, r"the paper's small initialisation"),
        (16, r"the norm of a positional-encoding vector"),
        (11585.0, r"times d_model; the factor is sqrt\(d_model\)"),
        (262144, r"SQUARED norm"),
        (300.0, r"Your prediction 300 is off\. Each of the 512 entries"),
        ("512", r"should be one number"),
        (float("nan"), r"return a finite number"),
        (torch.ones(2), r"should be one number"),
    ],
)
def test_token_norm_prediction_wrong(answer, words):
    with pytest.raises(AssertionError, match=words):
        check_token_norm_prediction(lambda: answer)


@pytest.mark.parametrize("answer", [0, 0.0, -0.0005, torch.tensor(0.0), np.float32(0.0)])
def test_pe_dot_prediction_right(answer, capsys):
    assert passes(check_pe_dot_prediction, lambda: answer)
    out = capsys.readouterr().out
    assert out.startswith("check_pe_dot_prediction: right, 0.") and out.count("\n") == 1


@pytest.mark.parametrize(
    "answer, words",
    [
        (23.26, r"ONE of the two dot products"),
        (-23.26, r"ONE of the two dot products"),
        (5.0, r"Your prediction 5 is off\. Per pair"),
        (True, r"should be one number"),
    ],
)
def test_pe_dot_prediction_wrong(answer, words):
    with pytest.raises(AssertionError, match=words):
        check_pe_dot_prediction(lambda: answer)


def test_predictions_not_implemented(capsys):
    def predicted_token_norm():
        raise NotImplementedError

    def predicted_dot_difference():
        raise NotImplementedError

    assert check_token_norm_prediction(predicted_token_norm) is None
    assert check_pe_dot_prediction(predicted_dot_difference) is None
    out = capsys.readouterr().out
    assert "`predicted_token_norm` is not implemented yet" in out
    assert "`predicted_dot_difference` is not implemented yet" in out


def test_lesson03_solutions_pass(capsys):
    from course_lib.solutions import lesson03 as sol

    check_token_norm_prediction(sol.predicted_token_norm)
    check_positional_encoding(sol.positional_encoding)
    check_pe_dot_prediction(sol.predicted_dot_difference)
    check_embedding_layer(sol.BertStyleEmbedding)
    check_fixed_positional_encoding(sol.fixed_positional_encoding)
    out = capsys.readouterr().out
    assert out.count("\n") == 5 and "not implemented" not in out


# ----------------------------------------------------------------------------- token embedding
def token_class(factor):
    class Tok(nn.Module):
        def __init__(self, vocab_size, d_model):
            super().__init__()
            self.embedding = nn.Embedding(vocab_size, d_model)
            self.vocab_size, self.d_model = vocab_size, d_model

        def forward(self, ids):
            return self.embedding(ids) * factor(self.vocab_size, self.d_model)

    return Tok


def test_token_embedding_correct_passes(capsys):
    assert passes(check_token_embedding, token_class(lambda v, d: math.sqrt(d)))
    assert "check_token_embedding: all 4 cases match" in capsys.readouterr().out


@pytest.mark.parametrize(
    "factor, words",
    [
        (lambda v, d: 1.0, r"missing the sqrt\(d_model\) scale"),
        (lambda v, d: d, r"scaled by d_model instead of sqrt\(d_model\)"),
        (lambda v, d: 1 / math.sqrt(d), r"divided by sqrt\(d_model\) instead of multiplied"),
        (lambda v, d: math.sqrt(v), r"scaled by sqrt\(vocab_size\)"),
    ],
)
def test_token_embedding_named_mistakes(factor, words):
    with pytest.raises(AssertionError, match=words):
        check_token_embedding(token_class(factor))


def test_token_embedding_wrong_shape():
    class Mean(token_class(lambda v, d: math.sqrt(d))):
        def forward(self, ids):
            return super().forward(ids).mean(dim=1)  # (B, d_model): one vector per sentence

    with pytest.raises(AssertionError, match=r"Wrong output shape.*\(B, L, d_model\)"):
        check_token_embedding(Mean)


def test_token_embedding_wrong_names():
    class Named(nn.Module):
        def __init__(self, vocab_size, d_model):
            super().__init__()
            self.table = nn.Embedding(vocab_size, d_model)

        def forward(self, ids):
            return self.table(ids) * math.sqrt(self.table.embedding_dim)

    with pytest.raises(AssertionError, match=r"expected parameters named \['embedding.weight'\], found \['table.weight'\]"):
        check_token_embedding(Named)


def test_token_embedding_not_implemented(capsys):
    class ScaledTokenEmbedding(nn.Module):
        def __init__(self, vocab_size, d_model):
            raise NotImplementedError

    assert check_token_embedding(ScaledTokenEmbedding) is None
    assert "`ScaledTokenEmbedding` is not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------- BERT-style layer
def bert_layer(variant="right"):
    class BertStyle(nn.Module):
        def __init__(self, vocab_size, d_model, max_len, dropout):
            super().__init__()
            self.token = nn.Embedding(vocab_size, d_model)
            self.position = nn.Embedding(max_len, d_model)
            self.norm = nn.LayerNorm(d_model)
            self.dropout = nn.Dropout() if variant == "p=0.5" else nn.Dropout(dropout)
            self.d_model = d_model

        def forward(self, ids):
            L = ids.size(1)
            start = 1 if variant == "from 1" else 0
            positions = torch.arange(start, start + L, device=ids.device)
            tok = self.token(ids)
            if variant == "scaled":
                tok = tok * math.sqrt(self.d_model)
            pos = self.position(positions)
            if variant == "no pos":
                return self.dropout(self.norm(tok))
            if variant == "no norm":
                return self.dropout(tok + pos)
            if variant == "norm tokens":
                return self.dropout(self.norm(tok) + pos)
            if variant == "dropout first":
                return self.norm(self.dropout(tok + pos))
            if variant == "no dropout":
                return self.norm(tok + pos)
            return self.dropout(self.norm(tok + pos))

    return BertStyle


def test_embedding_layer_correct_passes(capsys):
    assert passes(check_embedding_layer, bert_layer())
    assert "check_embedding_layer: all 6 cases match" in capsys.readouterr().out


def test_embedding_layer_other_correct_styles_pass():
    class SlicedTable(nn.Module):
        # positions by slicing the table's weight, functional dropout with the module's own rate
        def __init__(self, vocab_size, d_model, max_len, dropout):
            super().__init__()
            self.token = nn.Embedding(vocab_size, d_model)
            self.position = nn.Embedding(max_len, d_model)
            self.norm = nn.LayerNorm(d_model)
            self.p = dropout

        def forward(self, ids):
            x = self.token(ids) + self.position.weight[: ids.size(1)]
            return F.dropout(self.norm(x), self.p, self.training)

    class BatchedPositions(bert_layer()):
        # position ids of shape (B, L), as Hugging Face builds them
        def forward(self, ids):
            B, L = ids.shape
            positions = torch.arange(L, device=ids.device).unsqueeze(0).expand(B, L)
            return self.dropout(self.norm(self.token(ids) + self.position(positions)))

    assert passes(check_embedding_layer, SlicedTable)
    assert passes(check_embedding_layer, BatchedPositions)


@pytest.mark.parametrize(
    "variant, words",
    [
        ("scaled", r"scaled by sqrt\(d_model\) \(BERT does not scale\)"),
        ("no norm", r"no LayerNorm after the sum"),
        ("norm tokens", r"LayerNorm applied to the tokens before adding the positions"),
        ("no pos", r"positions not added"),
        ("from 1", r"positions start at 1 instead of 0"),
        ("p=0.5", r"dropout with p=0.5 \(`nn.Dropout\(\)` without an argument\)"),
        ("dropout first", r"dropout applied before the LayerNorm"),
        ("no dropout", r"no dropout in training mode"),
    ],
)
def test_embedding_layer_named_mistakes(variant, words):
    with pytest.raises(AssertionError, match=words):
        check_embedding_layer(bert_layer(variant))


def test_embedding_layer_names_and_shape():
    class Renamed(nn.Module):
        def __init__(self, vocab_size, d_model, max_len, dropout):
            super().__init__()
            self.tok = nn.Embedding(vocab_size, d_model)
            self.position = nn.Embedding(max_len, d_model)
            self.norm = nn.LayerNorm(d_model)

        def forward(self, ids):
            return self.norm(self.tok(ids) + self.position(torch.arange(ids.size(1))))

    with pytest.raises(AssertionError, match=r"expected parameters named .*'token.weight'.*found .*'tok.weight'"):
        check_embedding_layer(Renamed)

    class Summed(bert_layer()):
        def forward(self, ids):
            return super().forward(ids).sum(dim=0)  # lost the batch dimension

    with pytest.raises(AssertionError, match=r"Wrong output shape.*broadcasting over B"):
        check_embedding_layer(Summed)


def test_embedding_layer_not_implemented(capsys):
    class BertStyleEmbedding(nn.Module):
        def __init__(self, vocab_size, d_model, max_len, dropout):
            super().__init__()

        def forward(self, ids):
            raise NotImplementedError

    # no parameters yet: the friendly line must come before any complaint about names
    assert check_embedding_layer(BertStyleEmbedding) is None
    assert "`BertStyleEmbedding` is not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------- issue 15: more mistakes
def pe_integer_exponent(max_len, d_model):
    position = torch.arange(max_len).unsqueeze(1).float()
    two_i = torch.arange(0, d_model, 2)
    angles = position / 10000 ** (two_i // d_model)              # WRONG: // is 0 for every column
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe


def pe_integer_angle(max_len, d_model):
    pe = torch.zeros(max_len, d_model)
    for pos in range(max_len):
        for i in range(0, d_model, 2):
            angle = pos // 10000 ** (i / d_model)                # WRONG: floor of the angle
            pe[pos, i] = math.sin(angle)
            if i + 1 < d_model:
                pe[pos, i + 1] = math.cos(angle)
    return pe


def pe_halves(max_len, d_model):
    position = torch.arange(max_len).unsqueeze(1).float()
    angles = position / 10000 ** (torch.arange(0, d_model, 2).float() / d_model)
    return torch.cat([torch.sin(angles), torch.cos(angles[:, : d_model // 2])], dim=-1)  # WRONG


@pytest.mark.parametrize(
    "fn, words",
    [
        (pe_integer_exponent, r"integer division `//` in the exponent"),
        (pe_integer_angle, r"integer division `//` in the angle"),
        (pe_halves, r"sin and cos concatenated in halves"),
        (make_pe(base=1000.0), r"wrong base \(1000 instead of 10000\)"),
        (make_pe(start=1), r"positions start at 1 instead of 0"),
    ],
)
def test_pe_more_named_mistakes(fn, words):
    with pytest.raises(AssertionError, match=words):
        check_positional_encoding(fn)


def test_pe_course_lib_own_function_is_refused():
    from course_lib import sinusoidal_positional_encoding

    for check in (check_positional_encoding, check_fixed_positional_encoding):
        with pytest.raises(AssertionError, match=r"course_lib's own `sinusoidal_positional_encoding`"):
            check(sinusoidal_positional_encoding)


def test_embedding_layer_positions_from_ids_named():
    class FromIds(bert_layer()):
        def forward(self, ids):
            return self.dropout(self.norm(self.token(ids) + self.position(ids)))   # WRONG

    with pytest.raises(AssertionError, match=r"positions looked up with the token ids"):
        check_embedding_layer(FromIds)


def test_embedding_layer_index_error_is_named_not_raw():
    from course_lib.checks import CheckFailure

    class FromIds(bert_layer()):
        def forward(self, ids):
            return self.dropout(self.norm(self.token(ids) + self.position(ids)))   # WRONG

    import course_lib.checks.lesson03_embeddings as emb

    old = emb._LAYER_CASES
    emb._LAYER_CASES = [(50, 32, 40, (3, 9))]       # ids beyond max_len: the lookup crashes
    try:
        with pytest.raises(CheckFailure, match=r"IndexError.*`self.position\(ids\)`"):
            check_embedding_layer(FromIds)
    finally:
        emb._LAYER_CASES = old


def test_embedding_layer_course_lib_refused():
    from course_lib import TokenEmbedding, TransformerEmbedding

    with pytest.raises(AssertionError, match=r"course_lib's own `TransformerEmbedding`"):
        check_embedding_layer(TransformerEmbedding)
    with pytest.raises(AssertionError, match=r"course_lib's own `TokenEmbedding`"):
        check_token_embedding(TokenEmbedding)


def test_pe_sine_everywhere_named():
    def all_sines(max_len, d_model):
        pe = torch.zeros(max_len, d_model)
        for pos in range(max_len):
            for j in range(d_model):
                pe[pos, j] = math.sin(pos / 10000 ** ((j - j % 2) / d_model))
        return pe

    with pytest.raises(AssertionError, match=r"sine in every column"):
        check_positional_encoding(all_sines)


def test_embedding_layer_dropout_twice_named():
    class Twice(bert_layer()):
        def forward(self, ids):
            x = self.dropout(self.token(ids) + self.position(torch.arange(ids.size(1))))
            return self.dropout(self.norm(x))

    with pytest.raises(AssertionError, match=r"dropout applied twice"):
        check_embedding_layer(Twice)
