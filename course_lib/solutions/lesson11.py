"""Solutions to the exercises of lesson 11 (the Llama-style block); see ``course_lib.solutions``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


# %% solution 11.rmsnorm
class MyRMSNorm(nn.Module):
    """x (..., d_model) -> x / sqrt(mean(x^2) + eps) * weight, over the last dim."""

    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))  # the gain; no bias
        self.eps = eps

    def forward(self, x):
        mean_square = x.pow(2).mean(dim=-1, keepdim=True)  # (..., 1): one per vector
        return x / torch.sqrt(mean_square + self.eps) * self.weight


# %% solution 11.kv_bytes
def predicted_kv_bytes():
    # Per layer the cache keeps keys AND values (2), each (batch, num_kv_heads, tokens, head_dim),
    # in float32 (4 bytes per number). head_dim = d_model // num_heads = 128 // 8 = 16; only the
    # num_kv_heads = 2 KV heads are stored, not the 8 query heads.
    keys_and_values, num_layers, num_kv_heads, head_dim = 2, 3, 2, 128 // 8
    tokens, batch_size, bytes_per_number = 50, 5, 4
    per_position = keys_and_values * num_layers * num_kv_heads * head_dim  # numbers per position
    return per_position * tokens * batch_size * bytes_per_number


# %% solution 11.apply_rope
def apply_rope(x, positions, base=10000.0):
    """x (..., L, hd), positions (L,) ints -> x with plane i = (x_i, x_{i + hd/2}) of row j turned
    by the angle positions[j] * base ** (-2i / hd)."""
    half = x.size(-1) // 2
    i = torch.arange(half, dtype=torch.float64)
    theta = base ** (-2 * i / x.size(-1))  # (hd/2,): fast planes first
    angles = positions.double()[:, None] * theta  # (L, hd/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]  # (..., L, hd/2): the two numbers of every plane
    # the 2-D rotation of each plane: (u, v) -> (u cos - v sin, u sin + v cos)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


# %% solution 11.rope_layout
def apply_rotary_fixed(x, cos, sin):
    """x (B, h, L, hd), cos and sin (L, hd) in Hugging Face's layout -> (B, h, L, hd)."""
    # The fix: Hugging Face's tables pair number i with number i + hd/2 (the halves), so rotate
    # halves, not neighbours (2i, 2i+1): rotate_half(x) = (-x2, x1).
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]  # (B, h, L, hd/2) each
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


# %% solution 11.swiglu
class MySwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), d_ff sized to a GELU network's weights at 4 d_model."""

    def __init__(self, d_model):
        super().__init__()
        # 3 matrices of d_model x d_ff = 2 matrices of d_model x 4 d_model -> d_ff = 8 d_model / 3
        d_ff = round(8 * d_model / 3)
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


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


# %% solution 11.rope_decode
def rope_decode_step(layer, x_t, t, cache):
    """One step: x_t (B, 1, d_model) at position t (positions count from 0); cache (k, v) of
    positions 0..t-1, keys turned by their own positions, or None. Returns (out (B, 1, d_model),
    (k, v) of positions 0..t, in the same form)."""
    h, kv = layer.num_heads, layer.num_kv_heads
    q = layer.split_heads(layer.q_proj(x_t))  # (B, h, 1, hd)
    k = layer.split_heads(layer.k_proj(x_t), kv)  # (B, kv, 1, hd)
    v = layer.split_heads(layer.v_proj(x_t), kv)  # (B, kv, 1, hd)
    position = torch.tensor([t])  # the new token sits at position t, after t cached ones
    q, k = rope_at(q, position), rope_at(k, position)  # each key turned once, by its own position
    if cache is not None:
        k = torch.cat([cache[0], k], dim=2)  # (B, kv, t + 1, hd)
        v = torch.cat([cache[1], v], dim=2)
    heads = attend(q, k, v)  # (B, h, 1, hd), grouped-query: no mask, every cached position is <= t
    return layer.out_proj(layer.merge_heads(heads)), (k, v)
