"""Solutions to the exercises of lesson 16 (instructions and preferences); see ``course_lib.solutions``."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn  # noqa: F401 (the blocks may use it)

from course_lib.dpo import chosen_rejected_log_probs, dpo_loss


# %% solution 16.label_count
def predicted_label_count():
    # The rendered example is <|user|> instruction <|end|> <|assistant|> answer <|end|>, one id per
    # character. The prompt (<|user|> up to and including <|assistant|>) is given to the model: its
    # labels are -100. The answer's characters carry loss, and so does the <|end|> that closes it
    # (that is how the model learns to stop). The shift needs no correction: labels lie under the
    # inputs and the loss shifts them.
    answer = "Uneasy lies the head that wears a crown."
    return len(answer) + 1  # the answer's 40 characters + <|end|>


# %% solution 16.sft_labels
def sft_labels(prompt_ids, answer_ids, end_id):
    """``(input_ids, labels)``, both of length len(prompt) + len(answer) + 1: the prompt masked."""
    input_ids = list(prompt_ids) + list(answer_ids) + [end_id]  # the answer closed by <|end|>
    labels = [-100] * len(prompt_ids) + list(answer_ids) + [end_id]  # loss on the answer and its end
    return input_ids, labels  # the loss shifts the labels itself: no shift here


# %% solution 16.sequence_log_probs
def my_sequence_log_probs(logits, labels):
    """``logits (N, T, V)``, ``labels (N, T)`` -> ``(N,)``: the sum of log p of every labelled next token."""
    log_p = logits[:, :-1].log_softmax(dim=-1)  # (N, T-1, V): position t predicts token t + 1
    targets = labels[:, 1:]  # (N, T-1)
    counted = targets != -100  # the prompt and the padding add nothing
    picked = log_p.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (N, T-1)
    return (picked * counted).sum(dim=1)  # (N,): a sum, the log-probability of the whole answer


# %% solution 16.dpo_at_start
def predicted_dpo_at_start():
    # The policy is a copy of the reference: log π - log π_ref = 0 for the chosen answer and for the
    # rejected one, so the margin is 0 whatever β, and the loss is -log σ(0) = -log(1/2) = log 2.
    return 0.6931


# %% solution 16.dpo_loss
def my_dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta):
    """Every input ``(B,)`` -> ``(losses (B,), chosen_rewards (B,), rejected_rewards (B,))``."""
    chosen_logratios = policy_chosen_logps - ref_chosen_logps  # (B,)
    rejected_logratios = policy_rejected_logps - ref_rejected_logps  # (B,)
    # -log σ(x) = log(1 + e^(-x)) = softplus(-x); F.logsigmoid computes it without overflow
    losses = -F.logsigmoid(beta * (chosen_logratios - rejected_logratios))  # (B,)
    chosen_rewards = beta * chosen_logratios.detach()  # metrics to log, not part of the loss
    rejected_rewards = beta * rejected_logratios.detach()
    return losses, chosen_rewards, rejected_rewards


# %% solution 16.dpo_fix
def dpo_train_fixed(sft_model, input_ids, labels, beta, lr, steps):
    """DPO from ``sft_model``: the policy trains, the reference stays the SFT model. -> (policy, reference)"""
    policy = copy.deepcopy(sft_model)
    reference = copy.deepcopy(sft_model).requires_grad_(False)  # frozen: no gradient reaches it
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)  # the policy's parameters only
    for _ in range(steps):
        chosen, rejected = chosen_rejected_log_probs(policy, input_ids, labels)
        with torch.no_grad():  # the reference only gives numbers to compare with
            ref_chosen, ref_rejected = chosen_rejected_log_probs(reference, input_ids, labels)
        loss = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta).losses.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return policy, reference
