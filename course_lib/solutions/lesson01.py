"""Solutions to the exercises of lesson 01 (attention); the format: `course_lib.solutions`."""

import math

import torch

# %% solution 01.top_key
def predicted_top_key():
    # Q = K = x: the query of "it" meets its own vector as a key, q . k = |x|^2 (about d_model = 16,
    # always positive); an unrelated random key gives a sum of 16 products with mean 0 and standard
    # deviation sqrt(16) = 4, so it rarely comes near 16.
    return "it"


# %% solution 01.nan_rows
def predicted_nan_rows():
    # Sentence 2 (index 1) has 7 real tokens and 5 pads. With padding hidden on both axes, each pad
    # query sees no key: softmax(-inf, ..., -inf) = 0/0 = NaN. Every other row keeps a real key, and
    # a NaN does not spread to other rows in the forward pass.
    return [(1, 7), (1, 8), (1, 9), (1, 10), (1, 11)]


# %% solution 01.attention
def my_attention(query, key, value, mask=None):
    """softmax(Q K^T / sqrt(d_k)) V with an optional boolean mask (True = may attend).

    query: (..., L_q, d_k), key: (..., L_k, d_k), value: (..., L_k, d_v),
    mask: bool, broadcastable to (..., L_q, L_k).
    Returns (output (..., L_q, d_v), weights (..., L_q, L_k)).
    """
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., L_q, L_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)  # finite "minus infinity"
    weights = scores.softmax(dim=-1)  # over the keys: each row sums to 1
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # a fully masked row: zeros, not uniform
    return weights @ value, weights  # (..., L_q, d_v), (..., L_q, L_k)


# %% solution 01.fixed_attention
def fixed_attention(query, key, value, mask=None):
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., L_q, L_k)
    if mask is not None:
        # The bug was `mask = mask.unsqueeze(1)` here. The caller's mask already broadcasts to
        # the scores (..., L_q, L_k); the extra axis turned (B, L, L) into (B, 1, L, L), which
        # against 3-D scores broadcasts to (B, B, L, L). Use the mask as it comes.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ value, weights


# %% solution 01.padding_mask
def make_padding_mask(ids, pad_id):
    """ids: (B, L) token ids -> bool (B, 1, L), True = may attend (the key is a real token)."""
    real = ids != pad_id  # (B, L): True for real tokens, whatever the pad id is
    return real.unsqueeze(1)  # (B, 1, L): hides pad KEYS (columns) for every query
