"""Solutions to the exercises of lesson 11 (the Llama-style block); see ``course_lib.solutions``."""

from __future__ import annotations

import torch


# %% solution 11.kv_bytes
def predicted_kv_bytes():
    # Per layer the cache keeps keys AND values (2), each (batch, num_kv_heads, tokens, head_dim),
    # in float32 (4 bytes per number). head_dim = d_model // num_heads = 128 // 8 = 16; only the
    # num_kv_heads = 2 KV heads are stored, not the 8 query heads.
    keys_and_values, num_layers, num_kv_heads, head_dim = 2, 3, 2, 128 // 8
    tokens, batch_size, bytes_per_number = 50, 5, 4
    per_position = keys_and_values * num_layers * num_kv_heads * head_dim  # numbers per position
    return per_position * tokens * batch_size * bytes_per_number


# %% solution 11.rope_layout
def apply_rotary_fixed(x, cos, sin):
    """x (B, h, L, hd), cos and sin (L, hd) in Hugging Face's layout -> (B, h, L, hd)."""
    # The fix: Hugging Face's tables pair number i with number i + hd/2 (the halves), so rotate
    # halves, not neighbours (2i, 2i+1): rotate_half(x) = (-x2, x1).
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]  # (B, h, L, hd/2) each
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


# %% solution 11.gqa
def grouped_query_attention(q, k, v, mask=None):
    """q (B, h, L_q, hd), k and v (B, kv, L_k, hd), mask bool (L_q, L_k) or None
    (True = may attend) -> (B, h, L_q, hd)."""
    group = q.size(1) // k.size(1)  # query heads per KV head
    # (B, kv, L_k, hd) -> (B, h, L_k, hd): query head i gets KV head i // group
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5  # (B, h, L_q, L_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # True = may attend
    return scores.softmax(dim=-1) @ v  # (B, h, L_q, hd)
