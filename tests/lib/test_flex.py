"""course_lib.flex: each mask_mod and score_mod through PyTorch's FlexAttention (eager, on CPU)
equals a dense mask or bias through ``F.scaled_dot_product_attention``, in float64."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from course_lib.flex import (alibi, alibi_slopes, and_masks, causal, dense_mask, dense_scores, document,
                             sliding_window, soft_cap)

B, H, L, D = 2, 4, 300, 16  # L not a multiple of flex's 128-wide tiles
TOL = 1e-12


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        yield


def _qkv(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, D, generator=gen, dtype=torch.float64) for _ in range(3)]


def _documents():
    doc_ids = torch.zeros(B, L, dtype=torch.long)
    doc_ids[0, 70:] = 1
    doc_ids[0, 200:] = 2
    doc_ids[1, 150:] = 1  # sequence 1: two documents
    return doc_ids


MASKS = {
    "causal": lambda: causal,
    "sliding_window_50": lambda: sliding_window(50),
    "documents": lambda: document(_documents()),
    "documents_and_window": lambda: and_masks(document(_documents()), sliding_window(40)),
}


@pytest.mark.parametrize("name", MASKS)
def test_mask_mods_equal_a_dense_mask_through_sdpa(name):
    mask_mod = MASKS[name]()
    q, k, v = _qkv()
    block_mask = create_block_mask(mask_mod, B, H, L, L, device="cpu")
    ours = flex_attention(q, k, v, block_mask=block_mask)
    dense = dense_mask(mask_mod, B, H, L, L)
    assert dense.dtype == torch.bool and dense.shape == (B, H, L, L)
    assert (ours - F.scaled_dot_product_attention(q, k, v, attn_mask=dense)).abs().max() <= TOL


def test_the_dense_masks_are_what_they_claim():
    window = dense_mask(sliding_window(3), 1, 1, 6, 6)[0, 0]
    assert window.sum(-1).tolist() == [1, 2, 3, 3, 3, 3] and not window.triu(1).any()
    docs = dense_mask(document(_documents()), B, 1, L, L)
    assert not docs[0, 0, 70:, :70].any() and docs[0, 0, 69, :70].all() and docs[1, 0, 150, 150]


def test_alibi_equals_a_float_bias_through_sdpa():
    q, k, v = _qkv(1)
    score_mod = alibi(H)
    ours = flex_attention(q, k, v, score_mod=score_mod,
                          block_mask=create_block_mask(causal, None, None, L, L, device="cpu"))
    bias = dense_scores(score_mod, torch.zeros(B, H, L, L, dtype=torch.float64))
    bias = bias.masked_fill(~dense_mask(causal, B, H, L, L), float("-inf"))
    assert (ours - F.scaled_dot_product_attention(q, k, v, attn_mask=bias)).abs().max() <= TOL
    assert bias[0, 2, 10, 4] == -6 * alibi_slopes(H)[2]  # slope times the distance, 6
    assert alibi_slopes(8).tolist() == [2.0 ** -i for i in range(1, 9)]


def test_soft_capping_equals_the_capped_softmax():
    q, k, v = _qkv(2)
    q = 4 * q  # large scores, so that the cap matters
    ours = flex_attention(q, k, v, score_mod=soft_cap(5.0))
    scores = dense_scores(soft_cap(5.0), q @ k.transpose(-2, -1) / D ** 0.5)
    assert scores.abs().max() < 5.0
    assert (ours - scores.softmax(-1) @ v).abs().max() <= TOL
    assert (ours - F.scaled_dot_product_attention(q, k, v)).abs().max() > 1e-3  # the cap changes it


def test_bad_arguments_get_clear_errors():
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        sliding_window(0)
    with pytest.raises(ValueError, match="power of two"):
        alibi(6)
    with pytest.raises(ValueError, match="cap must be a number > 0"):
        soft_cap(-1)
    with pytest.raises(ValueError, match="integer tensor"):
        document(torch.zeros(L))
