"""The fused path of MultiHeadAttention (F.scaled_dot_product_attention) equals the readable one."""

import copy

import pytest
import torch
from _helpers import assert_close, seeded  # noqa: F401  (seeded: autouse fixture)

from course_lib import (
    MultiHeadAttention,
    Transformer,
    TransformerConfig,
    causal_mask,
    decoder_self_attention_mask,
    padding_mask,
)
from course_lib.attention import set_fused_attention

B, L, D, H = 3, 6, 16, 4


def _pair(dropout: float = 0.0) -> tuple[MultiHeadAttention, MultiHeadAttention]:
    readable = MultiHeadAttention(D, H, dropout=dropout)
    fused = copy.deepcopy(readable)
    fused.fused = True
    return readable.eval(), fused.eval()


def _padded_ids() -> torch.Tensor:
    ids = torch.randint(2, 9, (B, L))
    ids[1, -2:] = 0  # two pads
    ids[2, :] = 0  # a fully padded row: every query of it sees no key
    return ids


MASKS = {
    "none": lambda ids: None,
    "padding (B, 1, L)": lambda ids: padding_mask(ids, 0),
    "padding 4-D (B, 1, 1, L)": lambda ids: padding_mask(ids, 0).unsqueeze(1),
    "causal (L, L)": lambda ids: causal_mask(L),
    "padding and causal (B, L, L)": lambda ids: decoder_self_attention_mask(ids, 0),
    "per head (B, H, L, L)": lambda ids: torch.rand(B, H, L, L) > 0.5,
}


@pytest.mark.parametrize("name", list(MASKS))
def test_fused_equals_readable(name):
    readable, fused = _pair()
    x = torch.randn(B, L, D)
    mask = MASKS[name](_padded_ids())
    expected = readable(x, x, x, mask)
    got = fused(x, x, x, mask)
    assert torch.isfinite(got).all()
    assert_close(got, expected)
    assert fused.attn_weights is None  # the fused path stores no weights
    assert readable.attn_weights is not None


def test_fully_masked_row_is_zero_on_both_paths_with_finite_gradients():
    readable, fused = _pair()
    mask = padding_mask(_padded_ids(), 0)  # row 2 sees nothing
    for module in (readable, fused):
        x = torch.randn(B, L, D, requires_grad=True)
        heads_out = module(x, x, x, mask)
        # the output of a fully masked query is out_proj(0) = its bias
        assert_close(heads_out[2], module.out_proj.bias.expand(L, D))
        heads_out.sum().backward()
        assert torch.isfinite(x.grad).all()


def test_cross_attention_with_different_lengths():
    readable, fused = _pair()
    q, kv = torch.randn(B, 4, D), torch.randn(B, L, D)
    mask = padding_mask(_padded_ids(), 0)
    assert_close(fused(q, kv, kv, mask), readable(q, kv, kv, mask))


def test_gradients_equal():
    readable, fused = _pair()
    x1 = torch.randn(B, L, D, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    mask = decoder_self_attention_mask(_padded_ids(), 0)
    readable(x1, x1, x1, mask).pow(2).sum().backward()
    fused(x2, x2, x2, mask).pow(2).sum().backward()
    assert_close(x2.grad, x1.grad, atol=1e-4)
    for (n, p1), (_, p2) in zip(readable.named_parameters(), fused.named_parameters()):
        assert_close(p2.grad, p1.grad, atol=1e-4), n


def test_return_attention_uses_the_readable_path():
    readable, fused = _pair()
    x = torch.randn(B, L, D)
    out_f, w_f = fused(x, x, x, causal_mask(L), return_attention=True)
    out_r, w_r = readable(x, x, x, causal_mask(L), return_attention=True)
    assert_close(out_f, out_r)
    assert_close(w_f, w_r)
    assert fused.attn_weights is not None


def test_dropout_only_in_training():
    _, fused = _pair(dropout=0.5)
    x = torch.randn(B, L, D)
    fused.eval()
    assert_close(fused(x, x, x), fused(x, x, x))  # eval: deterministic
    fused.train()
    assert not torch.allclose(fused(x, x, x), fused(x, x, x))  # training: dropout on the weights


def test_fused_path_checks_the_mask():
    _, fused = _pair()
    x = torch.randn(B, L, D)
    with pytest.raises(TypeError, match="bool"):
        fused(x, x, x, torch.ones(B, 1, L))
    with pytest.raises(ValueError, match="broadcast"):
        fused(x, x, x, torch.ones(B, 1, L + 1, dtype=torch.bool))


@pytest.mark.parametrize("norm_first", [False, True])
def test_config_switch_and_set_fused_attention(norm_first):
    config = TransformerConfig(norm_first=norm_first, num_encoder_layers=1, num_decoder_layers=2)
    model = Transformer(config).eval()
    fused_model = Transformer(
        TransformerConfig(**{**config.__dict__, "fused_attention": True})
    ).eval()
    fused_model.load_state_dict(model.state_dict())
    attn = [m for m in fused_model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(attn) == 1 + 2 * 2 and all(m.fused for m in attn)
    src, tgt = _padded_ids(), torch.randint(1, 9, (B, 5))
    src[2, 0] = 3  # keep one real token in the padded row (a source of only pads is not a sequence)
    expected = model(src, tgt)
    assert_close(fused_model(src, tgt), expected)
    assert set_fused_attention(model, True) is model
    assert all(m.fused for m in model.modules() if isinstance(m, MultiHeadAttention))
    assert_close(model(src, tgt), expected)
    set_fused_attention(model, False)
    assert not any(m.fused for m in model.modules() if isinstance(m, MultiHeadAttention))
