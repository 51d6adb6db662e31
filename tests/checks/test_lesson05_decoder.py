"""Tests of the lesson-05 checkers: a correct answer passes, every named mistake is caught by name."""

from __future__ import annotations

import pytest
from _helpers import passes
import torch
from torch import nn

import torch.nn.functional as F

from course_lib import DecoderLayer, Transformer, causal_mask, decoder_self_attention_mask, padding_mask
from course_lib.checks import (
    check_cross_attention_shapes, check_decoder_layer, check_decoder_masks, check_nan_positions,
    check_next_word_logits,
)
from course_lib.solutions.lesson05 import next_word_logits

# ---------------------------------------------------------------------------------------------
# check_decoder_masks
# ---------------------------------------------------------------------------------------------


def _tril(L: int) -> torch.Tensor:
    return torch.ones(L, L, dtype=torch.bool).tril()


def good_mask(tgt, pad_id):
    return (tgt != pad_id).unsqueeze(1) & _tril(tgt.size(1))  # written independently of course_lib


MASK_MISTAKES = {
    "causal only": lambda t, p: _tril(t.size(1)),
    "padding only": lambda t, p: (t != p).unsqueeze(1),
    "upper triangle": lambda t, p: (t != p).unsqueeze(1) & _tril(t.size(1)).T,
    "upper triangle, strict": lambda t, p: (t != p).unsqueeze(1) & _tril(t.size(1)).T.triu(1),
    "diagonal excluded": lambda t, p: (t != p).unsqueeze(1) & _tril(t.size(1)).tril(-1),
    "inverted": lambda t, p: ~((t != p).unsqueeze(1) & _tril(t.size(1))),
    "not bool": lambda t, p: ((t != p).unsqueeze(1) & _tril(t.size(1))).float(),
    "query axis": lambda t, p: (t != p).unsqueeze(2) & _tril(t.size(1)),
    "pad zero": lambda t, p: (t != 0).unsqueeze(1) & _tril(t.size(1)),
    "wrong shape": lambda t, p: ((t != p).unsqueeze(1) & _tril(t.size(1))).unsqueeze(1),
    "tril diagonal 1": lambda t, p: (t != p).unsqueeze(1)
    & torch.ones(t.size(1), t.size(1), dtype=torch.bool).tril(diagonal=1),
    "or": lambda t, p: (t != p).unsqueeze(1) | _tril(t.size(1)),
}

MASK_MESSAGES = {
    "causal only": r"causal only, padding ignored",
    "padding only": r"padding only, the future is visible",
    "upper triangle": r"upper triangle: the future instead of the past",
    "upper triangle, strict": r"upper triangle: the future instead of the past",
    "diagonal excluded": r"diagonal excluded",
    "inverted": r"inverted mask",
    "not bool": r"Wrong dtype.*expected torch.bool",
    "query axis": r"padding applied on the query axis instead of the key axis",
    "pad zero": r"pad id hard-coded as 0",
    "wrong shape": r"Wrong mask shape",
    "tril diagonal 1": r"tril\(diagonal=1\): every position also sees the next one",
    "or": r"padding OR causal instead of AND",
}


def test_good_mask_matches_course_lib():
    t = torch.tensor([[0, 4, 5, 0]])
    assert torch.equal(good_mask(t, 0).expand(1, 4, 4), decoder_self_attention_mask(t, 0))


def test_check_decoder_masks_passes_correct(capsys):
    assert passes(check_decoder_masks, good_mask)
    assert "check_decoder_masks: all 5 cases match" in capsys.readouterr().out


def test_check_decoder_masks_passes_other_plain_torch_styles():
    # (L, L) & (B, 1, L) in the other order, triu on the transpose, a 3-D result built by expand
    assert passes(check_decoder_masks, lambda t, p: _tril(t.size(1)) & (t != p)[:, None, :])
    assert passes(check_decoder_masks,
                  lambda t, p: torch.ones(t.size(1), t.size(1)).triu().T.bool() & (t != p).unsqueeze(-2))

    def with_arange(tgt, pad_id):
        pos = torch.arange(tgt.size(1))
        return (pos[None, :] <= pos[:, None]).expand(tgt.size(0), -1, -1) & (tgt != pad_id)[:, None]

    assert passes(check_decoder_masks, with_arange)


import course_lib  # noqa: E402  (the module, for the attribute-access case below)


@pytest.mark.parametrize("fn", [
    decoder_self_attention_mask,
    lambda t, p: decoder_self_attention_mask(t, p),
    lambda t, p: causal_mask(t.size(1)) & padding_mask(t, p),
    lambda t, p: course_lib.masks.causal_mask(t.size(1)) & (t != p).unsqueeze(1),
], ids=["the function itself", "a wrapper", "causal_mask and padding_mask", "course_lib.masks."])
def test_check_decoder_masks_says_when_course_lib_is_handed_in(fn):
    with pytest.raises(AssertionError, match=r"You handed in course_lib's `(decoder_self_attention_mask|"
                                             r"causal_mask)`.*plain torch"):
        check_decoder_masks(fn)


@pytest.mark.parametrize("name", sorted(MASK_MISTAKES))
def test_check_decoder_masks_names_mistake(name):
    with pytest.raises(AssertionError, match=MASK_MESSAGES[name]):
        check_decoder_masks(MASK_MISTAKES[name])


def test_check_decoder_masks_not_implemented(capsys):
    def make_decoder_mask(tgt, pad_id):
        raise NotImplementedError

    assert check_decoder_masks(make_decoder_mask) is None
    out = capsys.readouterr().out
    assert "check_decoder_masks: `make_decoder_mask` is not implemented yet" in out


# ---------------------------------------------------------------------------------------------
# check_decoder_layer
# ---------------------------------------------------------------------------------------------


class ConfigurableDecoderLayer(DecoderLayer):
    """course_lib's submodules with a hand-written forward that can make one mistake at a time."""

    mistake: str | None = None

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
        super().__init__(d_model, num_heads, d_ff, dropout=dropout)

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        m = self.mistake
        self_mask = {"no_causal": None, "swapped": memory_mask}.get(m, tgt_mask)
        cross_mask = {"no_memory_mask": None, "swapped": tgt_mask, "cross_tgt_mask": tgt_mask}.get(m, memory_mask)

        def self_block(h):
            return self.self_attn(h, h, h, self_mask)

        def cross_block(h):
            q = memory if m == "q_from_memory" else h
            kv = h if m == "kv_from_decoder" else memory
            return self.cross_attn(q, kv, kv, cross_mask)

        norms = {"norm1_everywhere": (self.norm1,) * 3,
                 "norms_reversed": (self.norm3, self.norm2, self.norm1),
                 "norm2_for_ff": (self.norm1, self.norm2, self.norm2)}.get(
            m, (self.norm1, self.norm2, self.norm3))
        steps = [
            ("self", self_block, norms[0], self.dropout1),
            ("cross", cross_block, norms[1], self.dropout2),
            ("ff", self.feed_forward, norms[2], self.dropout3),
        ]
        if m == "cross_first":
            steps = [steps[1], steps[0], steps[2]]
        if m == "no_norm3":
            steps[2] = ("ff", self.feed_forward, nn.Identity(), self.dropout3)
        if m == "dropout_always_on":
            steps = [(n, b, nm, lambda t: F.dropout(t, 0.3)) for n, b, nm, _ in steps]
        layer_input = x
        for name, block, norm, drop in steps:
            if m == "stale_cross" and name == "cross":
                x = norm(x + drop(cross_block(layer_input)))
                continue
            if m == "no_dropout" or m == f"no_dropout_{name}":
                drop = nn.Identity()
            if m == "pre_ln":
                x = x + drop(block(norm(x)))
            elif m == f"no_residual_{name}":
                x = norm(drop(block(x)))
            elif m == "dropout_on_sum":
                x = norm(drop(x + block(x)))
            elif m == "dropout_after_norm":
                x = drop(norm(x + block(x)))
            else:
                x = norm(x + drop(block(x)))
        if m == "wrong_shape":
            return x[:, -1]  # only the last position
        return x


def layer_with(mistake):
    return type(f"DecoderLayer_{mistake}", (ConfigurableDecoderLayer,), {"mistake": mistake})


LAYER_MESSAGES = {
    "kv_from_decoder": r"cross-attention keys and values come from the decoder instead of memory",
    "q_from_memory": r"cross-attention queries come from memory instead of the decoder",
    "no_causal": r"causal mask ignored in self-attention",
    "no_memory_mask": r"memory mask ignored in cross-attention",
    "swapped": r"tgt_mask and memory_mask swapped",
    "cross_tgt_mask": r"cross-attention given tgt_mask instead of memory_mask",
    "cross_first": r"sublayers in the wrong order \(cross-attention before self-attention\)",
    "no_residual_self": r"residual dropped around the self-attention",
    "no_residual_cross": r"residual dropped around the cross-attention",
    "no_residual_ff": r"residual dropped around the feed-forward",
    "pre_ln": r"pre-LN instead of post-LN",
    "wrong_shape": r"Wrong output shape",
    "norm1_everywhere": r"norm1 used for all three sublayers",
    "norms_reversed": r"LayerNorms mixed up \(self-attention -> norm3, cross-attention -> norm2, "
                      r"feed-forward -> norm1\)",
    "norm2_for_ff": r"LayerNorms mixed up \(.*feed-forward -> norm2\)",
    "no_dropout": r"training mode.*no dropout on the sublayer outputs",
    "no_dropout_ff": r"training mode.*no dropout on the feed-forward's output",
    "no_dropout_cross": r"training mode.*no dropout on the cross-attention's output",
    "dropout_on_sum": r"training mode.*dropout applied to the residual sum",
    "dropout_after_norm": r"training mode.*dropout applied after the LayerNorm",
    "no_norm3": r"LayerNorm missing after the feed-forward \(norm3 not applied\)",
    "stale_cross": r"cross-attention reads the layer's input x instead of the self-attention",
    "dropout_always_on": r"dropout is active in eval mode",
}


class IndependentDecoderLayer(nn.Module):
    """A correct post-LN decoder layer written out by hand (not course_lib.DecoderLayer)."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
        super().__init__()
        from course_lib import FeedForward, MultiHeadAttention

        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))
        self.drop = nn.Dropout(dropout)

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = self.norm1(x + self.drop(self.self_attn(x, x, x, tgt_mask)))
        x = self.norm2(x + self.drop(self.cross_attn(x, memory, memory, memory_mask)))
        return self.norm3(x + self.drop(self.feed_forward(x)))


class LoopDecoderLayer(nn.Module):
    """Another correct style: the sublayers in a loop, F.dropout with a stored p."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
        super().__init__()
        from course_lib import FeedForward, MultiHeadAttention

        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))
        self.p = dropout

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        for sub, norm in ((lambda h: self.self_attn(h, h, h, tgt_mask), self.norm1),
                          (lambda h: self.cross_attn(h, memory, memory, memory_mask), self.norm2),
                          (self.feed_forward, self.norm3)):
            x = norm(x + F.dropout(sub(x), self.p, self.training))
        return x


def test_check_decoder_layer_passes_correct(capsys):
    assert passes(check_decoder_layer, IndependentDecoderLayer)
    assert "check_decoder_layer: all 4 cases match" in capsys.readouterr().out
    assert passes(check_decoder_layer, layer_with(None))
    assert passes(check_decoder_layer, LoopDecoderLayer)


def test_check_decoder_layer_says_when_course_lib_is_handed_in():
    class Mine(DecoderLayer):
        pass

    for cls in (DecoderLayer, Mine):
        with pytest.raises(AssertionError, match=r"You handed in course_lib's `DecoderLayer`"):
            check_decoder_layer(cls)


@pytest.mark.parametrize("mistake", sorted(LAYER_MESSAGES))
def test_check_decoder_layer_names_mistake(mistake):
    with pytest.raises(AssertionError, match=LAYER_MESSAGES[mistake]):
        check_decoder_layer(layer_with(mistake))


def test_check_decoder_layer_names_state_dict_mismatch():
    class Renamed(IndependentDecoderLayer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.ln1 = self.norm1
            del self.norm1

        def forward(self, x, memory, tgt_mask=None, memory_mask=None):
            x = self.ln1(x + self.self_attn(x, x, x, tgt_mask))
            x = self.norm2(x + self.cross_attn(x, memory, memory, memory_mask))
            return self.norm3(x + self.feed_forward(x))

    with pytest.raises(AssertionError, match=r"state_dict names differ.*Missing: \['norm1.bias', 'norm1.weight'\]"):
        check_decoder_layer(Renamed)


def test_check_decoder_layer_not_implemented(capsys):
    class DecoderLayerStub(nn.Module):
        def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
            super().__init__()
            raise NotImplementedError

    assert check_decoder_layer(DecoderLayerStub) is None
    assert "check_decoder_layer: `DecoderLayerStub` is not implemented yet" in capsys.readouterr().out


def test_check_decoder_layer_not_implemented_in_forward(capsys):
    class MyDecoderLayer(IndependentDecoderLayer):
        def forward(self, x, memory, tgt_mask=None, memory_mask=None):
            raise NotImplementedError

    assert check_decoder_layer(MyDecoderLayer) is None
    assert "check_decoder_layer: `MyDecoderLayer` is not implemented yet" in capsys.readouterr().out


def test_check_decoder_layer_reports_a_crash_in_forward():
    class Crashes(IndependentDecoderLayer):
        def forward(self, x, memory, tgt_mask=None, memory_mask=None):
            return self.cross_attn(x, memory[:, :1], memory, memory_mask)  # key and value lengths differ

    with pytest.raises(AssertionError, match=r"Your code raised ValueError \(.*memory \(2, 5, 16\)\)"):
        check_decoder_layer(Crashes)


class _FusedAttention(nn.Module):
    """course_lib's parameter names around PyTorch's fused kernel; takes 4-D masks only."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, q, k, v, mask=None):
        if mask is not None and mask.dim() != 4:
            raise ValueError(f"mask must be 4-D, got {tuple(mask.shape)}")
        B, L_q, d = q.shape

        def split(t):  # (B, L, d) -> (B, h, L, d / h)
            return t.view(B, -1, self.h, d // self.h).transpose(1, 2)

        out = F.scaled_dot_product_attention(split(self.q_proj(q)), split(self.k_proj(k)),
                                             split(self.v_proj(v)), attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(B, L_q, d))


class FusedDecoderLayer(IndependentDecoderLayer):
    """A correct decoder layer in another style: fused attention that only accepts 4-D masks."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
        super().__init__(d_model, num_heads, d_ff, dropout)
        self.self_attn = _FusedAttention(d_model, num_heads)
        self.cross_attn = _FusedAttention(d_model, num_heads)


def test_check_decoder_layer_passes_fused_attention_with_4d_masks():
    assert passes(check_decoder_layer, FusedDecoderLayer)


# ---------------------------------------------------------------------------------------------
# check_cross_attention_shapes (Predict)
# ---------------------------------------------------------------------------------------------


def test_cross_attention_shapes_pass(capsys):
    assert passes(check_cross_attention_shapes, lambda: ((2, 5, 32), (2, 4, 5, 6)))
    assert "check_cross_attention_shapes: right" in capsys.readouterr().out
    # other forms: lists, torch.Size
    assert passes(check_cross_attention_shapes, lambda: [[2, 5, 32], torch.Size([2, 4, 5, 6])])


@pytest.mark.parametrize(
    "answer, words",
    [
        (((2, 6, 32), (2, 4, 5, 6)), "one vector per QUERY"),
        (((2, 4, 5, 8), (2, 4, 5, 6)), "before merge_heads"),
        (((2, 5, 32), (2, 4, 6, 5)), "rows are queries"),
        (((2, 5, 32), (2, 5, 6)), "there is a head axis"),
        (((2, 5, 32), (2, 4, 5, 5)), "cross-attention is rectangular"),
        (((2, 5, 32), (1, 2)), "expected \\(B, num_heads, L_q, L_k\\)"),
        (((2, 5), (2, 4, 5, 6)), "expected \\(B, L_t, d_model\\)"),
        ((2, 5, 32), "Return two shapes"),
        ((("a", 5, 32), (2, 4, 5, 6)), "a tuple of ints"),
    ],
)
def test_cross_attention_shapes_mistakes(answer, words):
    with pytest.raises(AssertionError, match=words):
        check_cross_attention_shapes(lambda: answer)


def test_cross_attention_shapes_unimplemented(capsys):
    def predicted_cross_attention_shapes():
        raise NotImplementedError

    assert check_cross_attention_shapes(predicted_cross_attention_shapes) is None
    assert "is not implemented yet" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# check_nan_positions (Predict)
# ---------------------------------------------------------------------------------------------


def test_nan_positions_pass(capsys):
    assert passes(check_nan_positions, lambda: [4])
    assert "check_nan_positions: right, only position 4" in capsys.readouterr().out
    assert passes(check_nan_positions, lambda: torch.tensor([4]))  # another form
    assert passes(check_nan_positions, lambda: (4,))


@pytest.mark.parametrize(
    "answer, words",
    [
        ([], "Not every library turns a row"),
        ([0], "You read the mask in our convention"),
        ([0, 1, 2, 3, 4], "does not spread"),
        ([3, 4], "list the keys it may still see"),
        ("last", "Return a list of positions"),
    ],
)
def test_nan_positions_mistakes(answer, words):
    with pytest.raises(AssertionError, match=words):
        check_nan_positions(lambda: answer)


def test_nan_positions_unimplemented(capsys):
    def predicted_nan_positions():
        raise NotImplementedError

    assert check_nan_positions(predicted_nan_positions) is None
    assert "is not implemented yet" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# check_next_word_logits (Debug)
# ---------------------------------------------------------------------------------------------


def _masked(model, src, tgt):
    return padding_mask(src, model.config.pad_id)


def test_next_word_logits_passes(capsys):
    assert passes(check_next_word_logits, next_word_logits)
    assert "check_next_word_logits: all 3 cases match" in capsys.readouterr().out
    # other correct styles: the forward pass itself, or explicit keyword masks
    assert passes(check_next_word_logits, lambda model, src, tgt: model(src, tgt)[:, -1])

    def with_keywords(model, src, tgt):
        src_mask = _masked(model, src, tgt)
        memory = model.encode(src, src_mask=src_mask)
        return model.generator(model.decode(tgt, memory, src_mask=src_mask))[:, -1]

    assert passes(check_next_word_logits, with_keywords)


def _no_mask_in_decode(model, src, tgt):
    memory = model.encode(src, _masked(model, src, tgt))
    return model.generator(model.decode(tgt, memory, None)[:, -1])


def _no_mask_at_all(model, src, tgt):
    memory = model.encode(src, torch.ones_like(_masked(model, src, tgt)))
    return model.generator(model.decode(tgt, memory, None)[:, -1])


@pytest.mark.parametrize(
    "fn, words",
    [
        (_no_mask_in_decode, r"\(padded sources\): the source mask is missing in decode"),
        (_no_mask_at_all, "the source mask is missing in encode and in decode"),
        (lambda model, src, tgt: model(src, tgt)[:, 0], "first position instead of the last"),
        (lambda model, src, tgt: model(src, tgt)[:, -1].softmax(-1), "softmax applied"),
        (lambda model, src, tgt: model(src, tgt), "Wrong output shape"),
    ],
)
def test_next_word_logits_mistakes(fn, words):
    with pytest.raises(AssertionError, match=words):
        check_next_word_logits(fn)


def test_next_word_logits_unimplemented(capsys):
    def next_word_logits(model, src, tgt):
        raise NotImplementedError

    assert check_next_word_logits(next_word_logits) is None
    assert "is not implemented yet" in capsys.readouterr().out
