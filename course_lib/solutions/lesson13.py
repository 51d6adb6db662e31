"""Solutions to the exercises of lesson 13 (attention at scale); see ``course_lib.solutions``."""

from __future__ import annotations

import math

import torch


# %% solution 13.score_bytes
def predicted_score_bytes():
    # One layer's scores: one number per (head, query, key) = num_heads * L * L, each float32 (4
    # bytes), for the one sequence. 32k is 32 * 1024 = 32,768 tokens.
    num_heads, L, bytes_per_number = 12, 32 * 1024, 4
    return num_heads * L * L * bytes_per_number


# %% solution 13.merge
def merge_states(m_a, ell_a, o_a, m_b, ell_b, o_b):
    """Two partial softmax states of the same rows -> the state of all their keys together."""
    m = torch.maximum(m_a, m_b)  # the new running maximum
    # a state that has seen no key has m = -inf; exp(-inf - (-inf)) would be NaN, so measure
    # from 0 in rows where both are -inf (their ell and o are 0 anyway)
    m_ref = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    alpha = torch.exp(m_a - m_ref)  # how much state a shrinks once measured from the new maximum
    beta = torch.exp(m_b - m_ref)
    ell = alpha * ell_a + beta * ell_b
    o = alpha.unsqueeze(-1) * o_a + beta.unsqueeze(-1) * o_b  # (..., d_v): rescale both, then add
    return m, ell, o


# %% solution 13.flash_fix
def flash_one_head(q, k, v, block_k=16):
    """q (L_q, d), k (L_k, d), v (L_k, d_v) -> softmax(q k^T / sqrt(d)) v, keys in blocks."""
    scale = 1.0 / math.sqrt(q.size(-1))
    m = torch.full((q.size(0),), float("-inf"), dtype=q.dtype)  # running maximum per query
    ell = torch.zeros(q.size(0), dtype=q.dtype)  # running sum of exp(score - m)
    o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)  # running sum of exp(score - m) * v
    for start in range(0, k.size(0), block_k):
        s = q @ k[start:start + block_k].T * scale  # (L_q, block_k)
        m_new = torch.maximum(m, s.amax(dim=-1))
        p = torch.exp(s - m_new[:, None])
        alpha = torch.exp(m - m_new)  # the old terms were measured from m; now from m_new
        ell = alpha * ell + p.sum(dim=-1)
        # The fix: the accumulated output shrinks with the same factor as ell whenever the
        # maximum grows (the bug added p @ v to an o still measured from the old maximum).
        o = alpha[:, None] * o + p @ v[start:start + block_k]
        m = m_new
    return o / ell[:, None]


# %% solution 13.flash_forward
def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
    """q (B, h, L_q, d), k and v (B, h, L_k, d) -> (out (B, h, L_q, d), lse (B, h, L_q))."""
    B, h, L_q, d = q.shape
    L_k = k.size(2)
    scale = 1.0 / math.sqrt(d)
    out = torch.zeros(B, h, L_q, v.size(-1), dtype=q.dtype)
    lse = torch.zeros(B, h, L_q, dtype=q.dtype)
    for i0 in range(0, L_q, block_q):
        i1 = min(i0 + block_q, L_q)
        q_i = q[:, :, i0:i1]  # (B, h, bq, d)
        m = torch.full((B, h, i1 - i0), float("-inf"), dtype=q.dtype)
        ell = torch.zeros(B, h, i1 - i0, dtype=q.dtype)
        o = torch.zeros(B, h, i1 - i0, v.size(-1), dtype=q.dtype)
        for j0 in range(0, L_k, block_k):
            if is_causal and j0 > i1 - 1:
                break  # every key of this tile (and of the later ones) is after every query
            j1 = min(j0 + block_k, L_k)
            s = q_i @ k[:, :, j0:j1].transpose(-2, -1) * scale  # (B, h, bq, bk)
            if is_causal:
                future = torch.arange(j0, j1)[None, :] > torch.arange(i0, i1)[:, None]
                s = s.masked_fill(future, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))  # finite: each query sees key j0 <= i
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m - m_new)
            ell = alpha * ell + p.sum(dim=-1)
            o = alpha[..., None] * o + p @ v[:, :, j0:j1]
            m = m_new
        out[:, :, i0:i1] = o / ell[..., None]
        lse[:, :, i0:i1] = m + torch.log(ell)
    return out, lse


# %% solution 13.locate
def locate(block_table, position, block_size):
    """The physical block and the slot in it that hold a sequence's token at ``position``."""
    logical, slot = divmod(position, block_size)  # which of the sequence's blocks, and where in it
    return block_table[logical], slot
