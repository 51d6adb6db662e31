"""scaled_dot_product_attention and MultiHeadAttention against PyTorch's implementations."""

import pytest
import torch
import torch.nn.functional as F
from _helpers import assert_close, copy_mha, seeded  # noqa: F401  (seeded: autouse fixture)
from torch import nn

from course_lib import MultiHeadAttention, causal_mask, padding_mask, scaled_dot_product_attention

B, H, L_Q, L_K, D = 2, 3, 5, 7, 8


def _ids_with_padding(batch: int, length: int) -> torch.Tensor:
    """Token ids (pad = 0) whose rows end in 0, 2 and 3 pads (every row keeps a real token)."""
    ids = torch.randint(2, 9, (batch, length))
    for b in range(batch):
        n_pad = [0, 2, 3][b % 3]
        if n_pad:
            ids[b, -n_pad:] = 0
    return ids


# --------------------------------------------------------------------------------------------
# scaled_dot_product_attention vs F.scaled_dot_product_attention (boolean mask: True = attend)
# --------------------------------------------------------------------------------------------


def _qkv(l_q: int = L_Q, l_k: int = L_K):
    return torch.randn(B, H, l_q, D), torch.randn(B, H, l_k, D), torch.randn(B, H, l_k, D + 2)


def test_sdpa_matches_torch_without_mask():
    q, k, v = _qkv()
    out, weights = scaled_dot_product_attention(q, k, v)
    assert out.shape == (B, H, L_Q, D + 2) and weights.shape == (B, H, L_Q, L_K)
    assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert_close(weights, torch.softmax(q @ k.transpose(-2, -1) / D**0.5, dim=-1))


def test_sdpa_matches_torch_with_padding_mask():
    q, k, v = _qkv()
    mask = padding_mask(_ids_with_padding(B, L_K), 0).unsqueeze(1)  # (B, 1, 1, L_k)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert (weights[1, ..., -2:] == 0).all()  # padded keys get exactly zero weight
    assert_close(weights.sum(-1), torch.ones(B, H, L_Q))


def test_sdpa_matches_torch_with_causal_mask():
    q, k, v = _qkv(L_Q, L_Q)
    mask = causal_mask(L_Q)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert (weights.triu(1) == 0).all()


def test_sdpa_mask_is_not_applied_inverted():
    """A guard that the parity tests can fail: the inverted mask gives a different result."""
    q, k, v = _qkv(L_Q, L_Q)
    mask = causal_mask(L_Q)
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    inverted = F.scaled_dot_product_attention(q, k, v, attn_mask=~mask | torch.eye(L_Q, dtype=torch.bool))
    assert (out - inverted).abs().max() > 1e-2


# --------------------------------------------------------------------------------------------
# MultiHeadAttention vs nn.MultiheadAttention(batch_first=True) with copied weights
# --------------------------------------------------------------------------------------------

D_MODEL, NUM_HEADS = 16, 4


def _pair(dropout: float = 0.1):
    ours = MultiHeadAttention(D_MODEL, NUM_HEADS, dropout=dropout).eval()
    theirs = nn.MultiheadAttention(D_MODEL, NUM_HEADS, dropout=dropout, batch_first=True).eval()
    copy_mha(ours, theirs)
    return ours, theirs


def _compare(ours, theirs, query, key, value, our_mask=None, **torch_masks):
    out, weights = ours(query, key, value, our_mask, return_attention=True)
    ref, ref_weights = theirs(query, key, value, need_weights=True, average_attn_weights=False, **torch_masks)
    assert out.shape == (query.size(0), query.size(1), D_MODEL)
    assert weights.shape == (query.size(0), NUM_HEADS, query.size(1), key.size(1))
    assert_close(out, ref)
    assert_close(weights, ref_weights)  # per head
    _, ref_avg = theirs(query, key, value, need_weights=True, average_attn_weights=True, **torch_masks)
    assert_close(weights.mean(dim=1), ref_avg)  # averaged over heads
    assert torch.equal(ours.attn_weights, weights.detach())  # the documented hook holds the same weights


def test_mha_self_attention_matches_torch():
    ours, theirs = _pair()
    x = torch.randn(B, L_Q, D_MODEL)
    _compare(ours, theirs, x, x, x)


def test_mha_cross_attention_matches_torch_with_different_lengths():
    ours, theirs = _pair()
    query, memory = torch.randn(B, L_Q, D_MODEL), torch.randn(B, L_K, D_MODEL)
    assert L_Q != L_K
    _compare(ours, theirs, query, memory, memory)


def test_mha_padding_mask_matches_torch_key_padding_mask():
    ours, theirs = _pair()
    ids = _ids_with_padding(3, L_K)
    query, memory = torch.randn(3, L_Q, D_MODEL), torch.randn(3, L_K, D_MODEL)
    mask = padding_mask(ids, 0)  # (B, 1, L_k), True = real token
    # PyTorch: key_padding_mask True = IGNORE, so it is ~ours without the query axis.
    _compare(ours, theirs, query, memory, memory, mask, key_padding_mask=~mask.squeeze(1))


def test_mha_causal_mask_matches_torch_attn_mask():
    ours, theirs = _pair()
    x = torch.randn(B, L_Q, D_MODEL)
    mask = causal_mask(L_Q)
    # PyTorch: a boolean attn_mask True = NOT allowed.
    _compare(ours, theirs, x, x, x, mask, attn_mask=~mask)


def test_mha_padding_and_causal_mask_matches_torch():
    ours, theirs = _pair()
    ids = _ids_with_padding(B, L_Q)
    ids[:, 0] = 5  # position 0 is real so every causal row sees at least one key
    x = torch.randn(B, L_Q, D_MODEL)
    mask = padding_mask(ids, 0) & causal_mask(L_Q)  # (B, L, L)
    _compare(ours, theirs, x, x, x, mask, attn_mask=~causal_mask(L_Q), key_padding_mask=ids == 0)


def test_mha_parity_fails_with_a_wrong_mask():
    """The comparison is sensitive: forgetting the mask on our side is detected."""
    ours, theirs = _pair()
    x = torch.randn(B, L_Q, D_MODEL)
    ref, _ = theirs(x, x, x, attn_mask=~causal_mask(L_Q))
    assert (ours(x, x, x) - ref).abs().max() > 1e-3


def test_split_and_merge_heads_are_inverse_and_put_heads_second():
    mha = MultiHeadAttention(D_MODEL, NUM_HEADS)
    x = torch.randn(B, L_Q, D_MODEL)
    heads = mha.split_heads(x)
    assert heads.shape == (B, NUM_HEADS, L_Q, D_MODEL // NUM_HEADS)
    assert torch.equal(heads[:, 1], x[..., 4:8])  # head 1 owns dims 4..7 of every position
    assert torch.equal(mha.merge_heads(heads), x)


def test_head_dim_and_attributes():
    mha = MultiHeadAttention(24, 6)
    assert (mha.d_model, mha.num_heads, mha.head_dim) == (24, 6, 4)
    assert mha.attn_weights is None  # nothing stored before the first forward


@pytest.mark.parametrize("flag", ["False", "True", 0, 1, None, torch.tensor(True)])
def test_is_causal_must_be_a_bool(flag):
    """A string such as "False" is true to Python: SDPA refuses it, and so does MultiHeadAttention
    (forward, and attend, which ParallelSelfAttention and the KV cache call) (issue #48)."""
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    words = r"is_causal must be True or False, got .*; pass the bool itself"
    with pytest.raises(TypeError, match="MultiHeadAttention: " + words):
        mha(x, x, x, is_causal=flag)
    k, v = mha.project_kv(x, x)
    with pytest.raises(TypeError, match="MultiHeadAttention.attend: " + words):
        mha.attend(x, k, v, is_causal=flag)
