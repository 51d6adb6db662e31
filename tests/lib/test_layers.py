"""EncoderLayer, DecoderLayer and their stacks against torch.nn.Transformer{Encoder,Decoder}[Layer]."""

import pytest
import torch
from _helpers import assert_close, copy_layer, seeded  # noqa: F401  (seeded: autouse fixture)
from torch import nn

from course_lib import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
    causal_mask,
    decoder_self_attention_mask,
    padding_mask,
)

B, L_S, L_T, D_MODEL, NUM_HEADS, D_FF, DROPOUT = 3, 7, 5, 16, 4, 32, 0.1


def _ids(batch: int, length: int, pads: tuple[int, ...]) -> torch.Tensor:
    """Ids without pad except the last pads[b] positions of row b (pad = 0)."""
    ids = torch.randint(2, 9, (batch, length))
    for b, n in enumerate(pads):
        if n:
            ids[b, -n:] = 0
    return ids


SRC_IDS = _ids(B, L_S, (0, 2, 3))
TGT_IDS = _ids(B, L_T, (0, 1, 2))

CONFIGS = [
    pytest.param(norm_first, activation, id=f"{'pre' if norm_first else 'post'}-LN-{activation}")
    for norm_first in (False, True)
    for activation in ("relu", "gelu")
]


@pytest.mark.parametrize("norm_first, activation", CONFIGS)
def test_encoder_layer_matches_torch(norm_first, activation):
    ours = EncoderLayer(D_MODEL, NUM_HEADS, D_FF, DROPOUT, activation, norm_first).eval()
    theirs = nn.TransformerEncoderLayer(
        D_MODEL, NUM_HEADS, D_FF, DROPOUT, activation, batch_first=True, norm_first=norm_first
    ).eval()
    copy_layer(ours, theirs)
    x = torch.randn(B, L_S, D_MODEL)
    # padding only
    assert_close(ours(x, padding_mask(SRC_IDS, 0)), theirs(x, src_key_padding_mask=SRC_IDS == 0))
    # padding and causal (PyTorch: True = NOT allowed)
    mask = padding_mask(SRC_IDS, 0) & causal_mask(L_S)
    expected = theirs(x, src_mask=~causal_mask(L_S), src_key_padding_mask=SRC_IDS == 0)
    assert_close(ours(x, mask), expected)
    # no mask
    assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("norm_first, activation", CONFIGS)
def test_decoder_layer_matches_torch(norm_first, activation):
    ours = DecoderLayer(D_MODEL, NUM_HEADS, D_FF, DROPOUT, activation, norm_first).eval()
    theirs = nn.TransformerDecoderLayer(
        D_MODEL, NUM_HEADS, D_FF, DROPOUT, activation, batch_first=True, norm_first=norm_first
    ).eval()
    copy_layer(ours, theirs)
    x, memory = torch.randn(B, L_T, D_MODEL), torch.randn(B, L_S, D_MODEL)
    got = ours(x, memory, decoder_self_attention_mask(TGT_IDS, 0), padding_mask(SRC_IDS, 0))
    expected = theirs(
        x, memory, tgt_mask=~causal_mask(L_T),
        tgt_key_padding_mask=TGT_IDS == 0, memory_key_padding_mask=SRC_IDS == 0,
    )
    assert got.shape == (B, L_T, D_MODEL)
    assert_close(got, expected)
    assert_close(ours(x, memory), theirs(x, memory))


def test_layer_parity_detects_a_swapped_norm_order():
    """The comparison can fail: a post-LN layer differs from PyTorch's pre-LN layer."""
    ours = EncoderLayer(D_MODEL, NUM_HEADS, D_FF, 0.0, norm_first=False).eval()
    theirs = nn.TransformerEncoderLayer(D_MODEL, NUM_HEADS, D_FF, 0.0, batch_first=True, norm_first=True).eval()
    copy_layer(ours, theirs)
    x = torch.randn(B, L_S, D_MODEL)
    assert (ours(x) - theirs(x)).abs().max() > 1e-2


@pytest.mark.parametrize("norm_first", [True, False], ids=["pre-LN-final-norm", "post-LN"])
def test_encoder_stack_matches_torch(norm_first):
    ours = Encoder(3, D_MODEL, NUM_HEADS, D_FF, dropout=DROPOUT, norm_first=norm_first).eval()
    layer = nn.TransformerEncoderLayer(D_MODEL, NUM_HEADS, D_FF, DROPOUT, batch_first=True, norm_first=norm_first)
    norm = nn.LayerNorm(D_MODEL) if norm_first else None
    theirs = nn.TransformerEncoder(layer, 3, norm=norm, enable_nested_tensor=False).eval()
    for ours_layer, their_layer in zip(ours.layers, theirs.layers, strict=True):
        copy_layer(ours_layer, their_layer)
    assert (ours.norm is not None) == norm_first  # pre-LN needs the final LayerNorm
    if norm_first:
        theirs.norm.load_state_dict(ours.norm.state_dict())
    x = torch.randn(B, L_S, D_MODEL)
    assert_close(ours(x, padding_mask(SRC_IDS, 0)), theirs(x, src_key_padding_mask=SRC_IDS == 0))


@pytest.mark.parametrize("norm_first", [True, False], ids=["pre-LN-final-norm", "post-LN"])
def test_decoder_stack_matches_torch(norm_first):
    ours = Decoder(3, D_MODEL, NUM_HEADS, D_FF, dropout=DROPOUT, norm_first=norm_first, activation="gelu").eval()
    layer = nn.TransformerDecoderLayer(
        D_MODEL, NUM_HEADS, D_FF, DROPOUT, "gelu", batch_first=True, norm_first=norm_first
    )
    norm = nn.LayerNorm(D_MODEL) if norm_first else None
    theirs = nn.TransformerDecoder(layer, 3, norm=norm).eval()
    for ours_layer, their_layer in zip(ours.layers, theirs.layers, strict=True):
        copy_layer(ours_layer, their_layer)
    if norm_first:
        theirs.norm.load_state_dict(ours.norm.state_dict())
    x, memory = torch.randn(B, L_T, D_MODEL), torch.randn(B, L_S, D_MODEL)
    got = ours(x, memory, decoder_self_attention_mask(TGT_IDS, 0), padding_mask(SRC_IDS, 0))
    expected = theirs(
        x, memory, tgt_mask=~causal_mask(L_T),
        tgt_key_padding_mask=TGT_IDS == 0, memory_key_padding_mask=SRC_IDS == 0,
    )
    assert_close(got, expected)


def test_stack_layers_are_independent_copies():
    enc = Encoder(2, D_MODEL, NUM_HEADS, D_FF)
    w0, w1 = enc.layers[0].self_attn.q_proj.weight, enc.layers[1].self_attn.q_proj.weight
    assert w0.data_ptr() != w1.data_ptr() and not torch.equal(w0, w1)


def test_feed_forward_is_position_wise():
    ff = FeedForward(D_MODEL, D_FF, dropout=0.0)
    x = torch.randn(B, L_S, D_MODEL)
    out = ff(x)
    assert out.shape == x.shape
    assert_close(out[:, 3], ff(x[:, 3:4])[:, 0])  # each position transformed on its own
    expected = ff.linear2(torch.relu(ff.linear1(x)))
    assert_close(out, expected)


def test_encoder_layer_keeps_the_residual_and_the_attention_output():
    """Seed bug: `x = norm(x + x)` drops attention. Zeroing the attention output must change the result."""
    layer = EncoderLayer(D_MODEL, NUM_HEADS, D_FF, dropout=0.0).eval()
    x = torch.randn(B, L_S, D_MODEL)
    before = layer(x)
    with torch.no_grad():
        layer.self_attn.out_proj.weight.zero_()
        layer.self_attn.out_proj.bias.zero_()
    after = layer(x)
    assert (before - after).abs().max() > 1e-3
    # with attention silenced the layer is exactly norm2(h + ff(h)), h = norm1(x)
    h = layer.norm1(x)
    assert_close(after, layer.norm2(h + layer.feed_forward(h)))
