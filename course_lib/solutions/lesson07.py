"""Solutions to the exercises of lesson 07 (inference); see ``course_lib.solutions``."""

from __future__ import annotations

import torch


# %% solution 07.decoder_work
def predicted_decoder_work():
    # Without a cache, step t feeds <sos> + t-1 tokens: 1 + 2 + ... + 20 = 20 * 21 / 2 = 210.
    # With a cache, each step feeds only the newest token: 20.
    return (210, 20)


# %% solution 07.cached_attention
def cached_self_attention_step(attn, x_new, past_k, past_v):
    """x_new (B, 1, d_model); past_k, past_v (B, h, t, hd) -> (out, k, v): k, v (B, h, t+1, hd)"""
    k_new, v_new = attn.project_kv(x_new, x_new)  # (B, h, 1, hd): the new position's key and value
    k = torch.cat([past_k, k_new], dim=2)  # the fix: append FIRST ...
    v = torch.cat([past_v, v_new], dim=2)
    out = attn.attend(x_new, k, v)  # ... then attend over all t+1 rows, itself included
    return out, k, v


# %% solution 07.top_p
def my_top_p_filter(logits, p):
    """logits (..., V) -> the same, with every token outside the nucleus set to -inf."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # most likely first
    probs = sorted_logits.softmax(dim=-1)
    mass_above = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each token
    drop_sorted = mass_above >= p  # the nucleus is complete without this token
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))
