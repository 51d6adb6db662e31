"""Solutions to the exercises of lesson 09 (GPT); see ``course_lib.solutions``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

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


# %% solution 09.lm_loss
def my_lm_loss(model, window):
    """window (B, T+1) ids -> the mean next-character loss over all B*T positions (a 0-dim tensor)."""
    x, y = window[:, :-1], window[:, 1:]  # (B, T) inputs; (B, T) targets: the next character
    logits = model(x)  # (B, T, V)
    V = logits.size(-1)
    return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))  # (B*T, V) against (B*T,)


# %% solution 09.generate
def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    """Continue ids (B, T) by max_new_tokens sampled tokens -> (B, T + max_new_tokens)."""
    out = ids
    for _ in range(max_new_tokens):
        context = out[:, -model.config.max_len:]  # (B, <= max_len): learned positions end there
        with torch.no_grad():
            logits = model(context)[:, -1] / temperature  # (B, V): the last position predicts
        if top_k is not None:
            kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]  # (B, 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))  # keep the top k
        probs = logits.softmax(dim=-1)  # (B, V)
        next_id = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
        out = torch.cat([out, next_id], dim=1)  # (B, T + 1)
    return out


# %% solution 09.lm_train
def my_lm_train(model, batches, recipe):
    """Train `model` one step per (x, y) in `batches` with the recipe; return the step losses."""
    import math

    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices: projections, token table
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # biases, LayerNorm gains
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}], lr=recipe.lr, betas=recipe.betas)

    def factor(step):  # warm-up to 1, then a cosine down to min_lr / lr
        if step < recipe.warmup:
            return (step + 1) / (recipe.warmup + 1)
        progress = min(1.0, (step - recipe.warmup) / (recipe.num_steps - recipe.warmup))
        low = recipe.min_lr / recipe.lr
        return low + 0.5 * (1 + math.cos(math.pi * progress)) * (1 - low)

    losses = []
    model.train()
    for step, (x, y) in enumerate(batches):
        for group in optimizer.param_groups:
            group["lr"] = recipe.lr * factor(step)
        logits = model(x)  # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
        optimizer.step()
        losses.append(loss.item())
    return losses
