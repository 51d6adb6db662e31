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


# %% solution 13.flash_backward_tile
def my_backward_tile(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0, is_causal=False):
    """One query tile and one key tile -> (dq_i, dk_j, dv_j), what this tile adds to each."""
    s = q_i @ k_j.T * scale  # (Bq, Bk): this tile's scores, as in the forward pass
    if is_causal:  # query i0 + r sees key j0 + c only if j0 + c <= i0 + r (absolute positions)
        rows = torch.arange(i0, i0 + q_i.size(0))[:, None]
        cols = torch.arange(j0, j0 + k_j.size(0))[None, :]
        s = s.masked_fill(cols > rows, float("-inf"))
    p = torch.exp(s - lse_i[:, None])  # the softmax's probabilities: L holds each row's max and sum
    dv_j = p.T @ d_out_i  # (Bk, d_v): O = P V, so dV = P^T dO
    dp = d_out_i @ v_j.T  # (Bq, Bk): and dP = dO V^T
    ds = p * (dp - D_i[:, None])  # the softmax's backward; D_i = rowsum(P * dP) over the whole row
    dq_i = ds @ k_j * scale  # (Bq, d): S = Q K^T * scale
    dk_j = ds.T @ q_i * scale  # (Bk, d)
    return dq_i, dk_j, dv_j


# %% solution 13.io_ratio
def predicted_io_bytes():
    # Numbers moved between slow and fast memory by one head's forward pass, L = 16k, d = 64.
    L, d, block = 16 * 1024, 64, 256
    # Standard attention: read Q and K, write S (L x L); read S, write P; read P and V, write O.
    standard = (2 * L * d + L * L) + (L * L + L * L) + (L * L + L * d + L * d)
    # FlashAttention-2: read Q once, all of K and V once per query tile (L / block of them),
    # write O and the log-sum-exp (one number per query). S and P stay in fast memory.
    flash = L * d + (L // block) * 2 * L * d + L * d + L
    return 4 * standard, 4 * flash  # float32: 4 bytes a number; the ratio is about 7.9


# %% solution 13.paged_attention
def my_paged_attention(q, k_blocks, v_blocks, block_table, length):
    """One query per head against a sequence's pages, one block (one tile) at a time."""
    num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_blocks.size(1), k_blocks.size(2)
    group = num_heads // num_kv_heads  # query heads per KV head
    scale = 1.0 / math.sqrt(head_dim)
    m = torch.full((num_heads,), float("-inf"), dtype=q.dtype)  # the state of no key at all
    ell = torch.zeros(num_heads, dtype=q.dtype)
    o = torch.zeros(num_heads, head_dim, dtype=q.dtype)
    for logical in range(math.ceil(length / block_size)):
        physical = block_table[logical]  # where the block table says this block lives
        filled = min(block_size, length - logical * block_size)  # the last block may be partly full
        k = k_blocks[physical, :, :filled].repeat_interleave(group, dim=0)  # (num_heads, filled, d)
        v = v_blocks[physical, :, :filled].repeat_interleave(group, dim=0)
        s = (k @ q.unsqueeze(-1)).squeeze(-1) * scale  # (num_heads, filled): this tile's scores
        m_tile = s.amax(dim=-1)
        p = torch.exp(s - m_tile.unsqueeze(-1))
        m, ell, o = merge_states(m, ell, o, m_tile, p.sum(dim=-1), (p.unsqueeze(-1) * v).sum(dim=1))
    return o / ell.unsqueeze(-1)
