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


# --- bad input (issue #48): what was expected, what came, how to fix it ---


@pytest.mark.parametrize("cap", [float("inf"), float("-inf"), float("nan"), 0, -2.0, "5", True])
def test_soft_cap_refuses_a_cap_that_is_not_a_finite_positive_number(cap):
    with pytest.raises(ValueError, match=r"cap must be a number > 0 and finite .* got"):
        soft_cap(cap)


def test_document_ids_used_beyond_their_size_are_named():
    doc_ids = _documents()  # (2, 300)
    words = r"doc_ids \(2, 300\) has document ids for 2 sequence\(s\) of 300 positions.*L_q, L_k <= 300"
    with pytest.raises(ValueError, match=words):
        dense_mask(document(doc_ids), B, H, 400, 400)  # positions beyond 300
    with pytest.raises(ValueError, match=words):
        dense_mask(document(doc_ids), 3, H, L, L)  # a third sequence
    with pytest.raises(ValueError, match=words):  # PyTorch's block mask evaluates it the same way
        create_block_mask(document(doc_ids), B, H, 400, 400, device="cpu")
    with pytest.raises(ValueError, match=words):  # inside and_masks too
        dense_mask(and_masks(sliding_window(4), document(doc_ids)), B, H, 301, 301)
    with pytest.raises(ValueError, match=r"integer tensor \(B, L\).*got torch.float32 tensor of shape \(2, 3\)"):
        document(torch.zeros(2, 3))


def test_alibi_on_more_heads_than_slopes_is_named():
    with pytest.raises(ValueError, match=r"alibi: built with 4 slopes \(num_heads=4\).*alibi\(H\)"):
        dense_scores(alibi(4), torch.zeros(1, 8, 5, 5))
    assert dense_scores(alibi(8), torch.zeros(1, 8, 5, 5)).shape == (1, 8, 5, 5)


@pytest.mark.parametrize("scores, got", [
    (torch.zeros(4, 5, 5), r"got shape \(4, 5, 5\); add the missing axes, e.g. scores\[None\]"),
    (torch.zeros(1, 1, 4, 5, 5), r"got shape \(1, 1, 4, 5, 5\); one \(L_q, L_k\) matrix"),
    ([[0.0]], "got list; one"),
])
def test_dense_scores_needs_four_dimensional_scores(scores, got):
    with pytest.raises(ValueError, match=r"scores must be a 4-D tensor \(B, H, L_q, L_k\), " + got):
        dense_scores(soft_cap(5.0), scores)


def test_dense_mask_needs_positive_int_sizes():
    with pytest.raises(ValueError, match="dense_mask: L_q must be an int >= 1, got 0"):
        dense_mask(causal, 1, 1, 0, 5)
    with pytest.raises(ValueError, match="dense_mask: H must be an int >= 1, got 2.0"):
        dense_mask(causal, 1, 2.0, 5, 5)
