"""Solutions to the exercises of lesson 09 (GPT); see ``course_lib.solutions``."""

from __future__ import annotations

import torch

from course_lib import causal_mask


# %% solution 09.initial_loss
def predicted_initial_loss():
    import math

    # Weights drawn from N(0, 0.02) give logits close to 0, so softmax is nearly uniform: each of
    # the 83 characters gets probability about 1/83, and the loss is -ln(1/83) = ln(83), about
    # 4.42 nats (measured a little higher, as the logits are not exactly 0).
    return math.log(83)


# %% solution 09.gpt_forward
def my_gpt_forward(model, ids):
    """ids (B, T) -> logits (B, T, V), from the parts of a course_lib GPT."""
    T = ids.size(1)
    x = model.embed.token(ids) + model.embed.position(T)  # (B, T, d) + (T, d) -> (B, T, d)
    x = model.embed.dropout(x)  # (B, T, d): dropout on the sum, in training mode only
    mask = causal_mask(T, ids.device)  # (T, T): position t sees 0..t
    for layer in model.blocks.layers:
        x = layer(x, mask)  # (B, T, d): pre-LN attention + feed-forward, residuals inside
    x = model.blocks.norm(x)  # (B, T, d): the final LayerNorm (GPT-2's ln_f)
    return model.lm_head(x)  # (B, T, V): tied to the token table


# %% solution 09.port_attention
def port_attention(ours, theirs):
    # ours: course_lib MultiHeadAttention; theirs: a Hugging Face GPT2Attention (c_attn, c_proj)
    # The fix: Conv1D stores its weight as (in, out), the transpose of nn.Linear's (out, in), so
    # every matrix is transposed. The shapes are square per block, so the bug never failed loudly.
    with torch.no_grad():
        theirs.c_attn.weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight,
                                              ours.v_proj.weight], dim=0).t())  # (3d, d) -> (d, 3d)
        theirs.c_attn.bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.c_proj.weight.copy_(ours.out_proj.weight.t())  # (d, d), transposed
        theirs.c_proj.bias.copy_(ours.out_proj.bias)
