"""Tests of the lesson-05 checkers: a correct answer passes, every named mistake is caught by name."""

from __future__ import annotations

import pytest
from _helpers import passes
import torch
from torch import nn

from course_lib import DecoderLayer, causal_mask, decoder_self_attention_mask, padding_mask
from course_lib.checks import check_decoder_layer, check_decoder_masks

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
}


def test_good_mask_matches_course_lib():
    t = torch.tensor([[0, 4, 5, 0]])
    assert torch.equal(good_mask(t, 0).expand(1, 4, 4), decoder_self_attention_mask(t, 0))


def test_check_decoder_masks_passes_correct(capsys):
    assert passes(check_decoder_masks, good_mask)
    assert "check_decoder_masks: all 5 cases match" in capsys.readouterr().out


def test_check_decoder_masks_passes_course_lib_and_plain_causal_shape():
    assert passes(check_decoder_masks, decoder_self_attention_mask)
    # (B, 1, L) & (L, L) built in another order, still right
    assert passes(check_decoder_masks, lambda t, p: causal_mask(t.size(1)) & padding_mask(t, p))


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

        steps = [
            ("self", self_block, self.norm1),
            ("cross", cross_block, self.norm2),
            ("ff", self.feed_forward, self.norm3),
        ]
        if m == "cross_first":
            steps = [steps[1], steps[0], steps[2]]
        for name, block, norm in steps:
            if m == "pre_ln":
                x = x + block(norm(x))
            elif m == f"no_residual_{name}":
                x = norm(block(x))
            else:
                x = norm(x + block(x))
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

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = self.norm1(x + self.self_attn(x, x, x, tgt_mask))
        x = self.norm2(x + self.cross_attn(x, memory, memory, memory_mask))
        return self.norm3(x + self.feed_forward(x))


def test_check_decoder_layer_passes_correct(capsys):
    assert passes(check_decoder_layer, IndependentDecoderLayer)
    assert "check_decoder_layer: all 3 cases match" in capsys.readouterr().out
    assert passes(check_decoder_layer, layer_with(None))


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
