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
    """Train `model` one step per (x, y) in `batches` with AdamW written out; return the losses."""
    import math

    beta1, beta2 = recipe.betas
    eps = 1e-8  # torch.optim.AdamW's default
    params = list(model.parameters())  # the tied matrix (token table = lm_head) once
    decay = [recipe.weight_decay if p.dim() >= 2 else 0.0 for p in params]  # matrices only
    m = [torch.zeros_like(p) for p in params]  # first moment: the mean of the gradients
    v = [torch.zeros_like(p) for p in params]  # second moment: the mean of their squares

    def rate(step):  # step counts from 0
        if step < recipe.warmup:  # lr/(w+1), 2lr/(w+1), ..., w lr/(w+1)
            return recipe.lr * (step + 1) / (recipe.warmup + 1)
        progress = min(1.0, (step - recipe.warmup) / (recipe.num_steps - recipe.warmup))
        cosine = 0.5 * (1 + math.cos(math.pi * progress))  # 1 at the peak, 0 at num_steps
        return recipe.min_lr + cosine * (recipe.lr - recipe.min_lr)

    losses = []
    model.train()
    for step, (x, y) in enumerate(batches):
        lr, t = rate(step), step + 1  # t: Adam's step count, from 1
        logits = model(x)  # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        for p in params:
            p.grad = None
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, recipe.max_grad_norm)  # the total norm of all
        with torch.no_grad():
            for p, wd, m_p, v_p in zip(params, decay, m, v):
                if p.grad is None:
                    continue
                m_p.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v_p.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                m_hat = m_p / (1 - beta1**t)  # bias correction: m and v start at 0
                v_hat = v_p / (1 - beta2**t)
                p.mul_(1 - lr * wd)  # decoupled weight decay, on the weights of step t - 1
                p.sub_(lr * m_hat / (v_hat.sqrt() + eps))
        losses.append(loss.item())
    return losses
