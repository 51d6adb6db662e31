"""Positional encodings and embeddings: the paper's formula, buffers, devices, dtypes."""

import math

import pytest
import torch
from _helpers import seeded  # noqa: F401  (autouse fixture)

from course_lib import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    Transformer,
    TransformerConfig,
    TransformerEmbedding,
    sinusoidal_positional_encoding,
)


def _pe_by_formula(max_len: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same angle); float64 loops."""
    rows = []
    for pos in range(max_len):
        row = []
        for j in range(d_model):
            i = j // 2  # columns 2i and 2i+1 share the frequency of pair i
            angle = pos / 10000 ** (2 * i / d_model)
            row.append(math.sin(angle) if j % 2 == 0 else math.cos(angle))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("max_len, d_model", [(50, 16), (30, 7), (12, 1), (20, 6)])
def test_sinusoidal_encoding_equals_the_formula_element_by_element(max_len, d_model):
    pe = sinusoidal_positional_encoding(max_len, d_model)
    assert pe.shape == (max_len, d_model) and pe.dtype == torch.float32
    torch.testing.assert_close(pe.double(), _pe_by_formula(max_len, d_model), atol=1e-6, rtol=0)


def test_sinusoidal_encoding_is_not_the_blog_post_bug():
    """A popular blog post's bug: frequencies with 2*i where i already steps by 2, cos with i+1."""
    pe = sinusoidal_positional_encoding(20, 16).double()
    two_i = torch.arange(0, 16, 2, dtype=torch.float64)
    buggy = torch.sin(torch.arange(20.0, dtype=torch.float64)[:, None] / 10000 ** (2 * two_i / 16))
    assert (pe[:, 0::2] - buggy).abs().max() > 1e-2


@pytest.mark.parametrize("d_model", [8, 9])
def test_position_zero_is_zero_one_alternating(d_model):
    pe0 = sinusoidal_positional_encoding(4, d_model)[0]
    expected = torch.tensor([float(j % 2) for j in range(d_model)])  # 0, 1, 0, 1, ...
    assert torch.equal(pe0, expected)
    if d_model % 2:
        assert pe0[-1] == 0.0  # odd d_model: the last column is a sine


def test_sinusoidal_module_buffer_is_not_saved_and_follows_to():
    module = SinusoidalPositionalEncoding(16, 8)
    assert "pe" in dict(module.named_buffers())
    assert "pe" not in module.state_dict()  # persistent=False: recomputed, never saved
    assert list(module.parameters()) == []  # fixed, not trained
    module.to(torch.float64)
    assert module(5).dtype == torch.float64
    module.to(torch.device("meta"))
    assert module.pe.device.type == "meta" and module(5).device.type == "meta"


def test_transformer_buffers_follow_to():
    model = Transformer(TransformerConfig()).to(torch.float64)
    assert model.src_embed.position.pe.dtype == torch.float64
    assert model.tgt_embed.position.pe.dtype == torch.float64
    assert not any(name.endswith(".pe") for name in model.state_dict())
    model.to(torch.device("meta"))
    assert all(buf.device.type == "meta" for buf in model.buffers())


def test_learned_positions_are_created_on_the_weights_device():
    module = LearnedPositionalEmbedding(16, 8)
    out = module(5)
    assert out.shape == (5, 8)
    assert torch.equal(out, module.embedding.weight[:5])
    module.to(torch.device("meta"))
    seen = []  # device of the position ids handed to the table (a lookup with CPU ids would not fail on meta)
    module.embedding.register_forward_pre_hook(lambda _, args: seen.append(args[0].device.type))
    assert module(5).device.type == "meta"
    assert seen == ["meta"]  # position ids made on the weight's device, not the CPU
    module2 = LearnedPositionalEmbedding(16, 8).to(torch.float64)
    assert module2(3).dtype == torch.float64


def test_token_embedding_scales_by_sqrt_d_model():
    emb = TokenEmbedding(11, 16)
    ids = torch.tensor([[2, 3, 4]])
    torch.testing.assert_close(emb(ids), emb.weight[ids] * 4.0)
    unscaled = TokenEmbedding(11, 16, scale=False)
    torch.testing.assert_close(unscaled(ids), unscaled.weight[ids])


def test_transformer_embedding_sums_token_position_segment():
    emb = TransformerEmbedding(11, 16, 10, positional="learned", scale_embedding=False,
                               num_segments=2, dropout=0.0)
    ids = torch.tensor([[2, 3, 4], [5, 6, 7]])
    types = torch.tensor([[0, 1, 1], [1, 0, 0]])
    expected = emb.token.weight[ids] + emb.position.embedding.weight[:3] + emb.segment.weight[types]
    torch.testing.assert_close(emb(ids, types), expected)
    with pytest.raises(ValueError, match="positional must be"):
        TransformerEmbedding(11, 16, 10, positional="rotary")


def test_transformer_embedding_paper_style():
    emb = TransformerEmbedding(11, 16, 10, dropout=0.0)
    ids = torch.tensor([[2, 3, 4, 5]])
    expected = emb.token.weight[ids] * 4.0 + sinusoidal_positional_encoding(10, 16)[:4]
    torch.testing.assert_close(emb(ids), expected)
