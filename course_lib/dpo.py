"""Direct preference optimisation, DPO (Rafailov et al. 2023), on the course's GPT (lesson 16).

For an instruction x with a chosen answer y_c and a rejected one y_r, the policy π (the model being
trained, initialised from the SFT model) and the frozen reference π_ref (the SFT model itself):

    loss = -log σ(β ((log π(y_c|x) - log π_ref(y_c|x)) - (log π(y_r|x) - log π_ref(y_r|x))))

``log π(y|x)`` is a **sum** over the answer's tokens (the end token included) of the log-probability
of each, given everything before it: the probability of the whole answer, as the derivation needs.
Prompt positions and padding carry no label (-100) and add nothing. ``β (log π - log π_ref)`` is the
implicit reward of an answer; TRL logs its mean for the chosen and the rejected answers, their
margin, and the accuracy (the share of pairs whose chosen reward is the larger): ``reward_metrics``,
with TRL's names.

A batch holds the B chosen sequences first, then the B rejected ones (TRL's concatenated forward:
one pass of ``(2B, T)`` through each model). Equal to trl 1.16.0's ``DPOTrainer`` with
``loss_type="sigmoid"`` (tests/lib/test_dpo.py): the loss and its gradients on the same
log-probabilities to float64 precision; and through ``DPOTrainer.compute_loss`` on the same model
(``GPT2LMHeadModel`` holding our weights) and the same batch, to float32 precision, because TRL's fused
LM head computes each token's log-softmax in float32 whatever the model's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .chat import ChatTemplate
from .sft import IGNORE_INDEX, sft_batch, sft_example

__all__ = ["DPOOutput", "preference_batch", "sequence_log_probs", "chosen_rejected_log_probs", "dpo_loss",
           "reward_metrics"]


def preference_batch(template: ChatTemplate, instructions: Sequence[str], chosen: Sequence[str],
                     rejected: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids (2B, T)`` and ``labels (2B, T)``: rows ``0..B-1`` are ``instructions[i]`` with
    ``chosen[i]``, rows ``B..2B-1`` with ``rejected[i]`` (``sft_example``: labels only on the answer
    and its ``<|end|>``), right-padded with ``<|end|>`` (label -100)."""
    for name, texts in (("instructions", instructions), ("chosen", chosen), ("rejected", rejected)):
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise TypeError(f"preference_batch: {name} must be a list of str, got {type(texts).__name__}")
    if not instructions or not len(instructions) == len(chosen) == len(rejected):
        raise ValueError(f"preference_batch: need as many instructions, chosen and rejected answers (>= 1), "
                         f"got {len(instructions)}, {len(chosen)}, {len(rejected)}")
    pairs = [sft_example(template, x, y) for x, y in zip(instructions, chosen)]
    pairs += [sft_example(template, x, y) for x, y in zip(instructions, rejected)]
    return sft_batch(pairs, template.end_id)


def sequence_log_probs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log π(y|x)`` of each row: the sum over labelled positions of ``log softmax(logits[:, t])``
    at ``labels[:, t + 1]``; -100 labels (prompt, padding) add nothing. ``logits (N, T, V)``,
    ``labels (N, T)`` -> ``(N,)`` in the logits' dtype."""
    if not isinstance(logits, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise TypeError("sequence_log_probs: logits and labels must be tensors")
    if logits.dim() != 3 or labels.shape != logits.shape[:2] or logits.size(1) < 2:
        raise ValueError(f"sequence_log_probs: logits must be (N, T, V) and labels (N, T) with T >= 2, got "
                         f"{tuple(logits.shape)} and {tuple(labels.shape)}")
    if not logits.dtype.is_floating_point or labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise TypeError(f"sequence_log_probs: logits must be float and labels integer ids, got {logits.dtype} "
                        f"and {labels.dtype}")
    targets = labels[:, 1:].long()  # (N, T-1): the next token of each position
    counted = targets != IGNORE_INDEX
    if ((targets < 0) & counted).any() or (targets >= logits.size(-1)).any():
        raise ValueError(f"sequence_log_probs: labels must be ids in [0, {logits.size(-1) - 1}] or -100")
    if not counted.any(dim=1).all():
        raise ValueError("sequence_log_probs: a row has no labelled token (an empty answer?); every answer "
                         "has at least its end token")
    log_p = logits[:, :-1].log_softmax(dim=-1)  # (N, T-1, V)
    picked = log_p.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (N, T-1)
    return torch.where(counted, picked, torch.zeros_like(picked)).sum(dim=1)  # (N,)


def chosen_rejected_log_probs(model: torch.nn.Module, input_ids: torch.Tensor,
                              labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward pass of ``preference_batch``'s ``(2B, T)`` through ``model`` (ids -> logits);
    returns ``(chosen (B,), rejected (B,))`` sequence log-probabilities."""
    if input_ids.dim() != 2 or input_ids.size(0) % 2:
        raise ValueError(f"chosen_rejected_log_probs: input_ids must be (2B, T), chosen rows then rejected "
                         f"rows, got {tuple(input_ids.shape)}")
    logps = sequence_log_probs(model(input_ids), labels)  # (2B,)
    chosen, rejected = logps.chunk(2)  # (B,), (B,)
    return chosen, rejected


class DPOOutput(NamedTuple):
    """``dpo_loss``'s result: ``losses (B,)`` (the batch loss is their mean) and the implicit rewards
    ``chosen_rewards (B,)``, ``rejected_rewards (B,)`` = β (log π - log π_ref), detached."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor


def dpo_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
             ref_chosen_logps: torch.Tensor, ref_rejected_logps: torch.Tensor,
             beta: float = 0.1) -> DPOOutput:
    """DPO's sigmoid loss per pair, ``-log σ(β ((pc - rc) - (pr - rr)))``; every input ``(B,)``."""
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"dpo_loss: beta must be a finite number > 0, got {beta!r}")
    logps = (policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    if not all(isinstance(x, torch.Tensor) for x in logps):
        raise TypeError("dpo_loss: the four log-probabilities must be tensors of shape (B,)")
    if not all(x.dim() == 1 and x.shape == logps[0].shape and x.numel() > 0 for x in logps):
        raise ValueError(f"dpo_loss: the four log-probabilities must all be (B,), got "
                         f"{[tuple(x.shape) for x in logps]}")
    if not all(x.dtype.is_floating_point for x in logps):
        raise TypeError(f"dpo_loss: log-probabilities must be float tensors, got {[x.dtype for x in logps]}")
    chosen_logratios = policy_chosen_logps - ref_chosen_logps  # (B,)
    rejected_logratios = policy_rejected_logps - ref_rejected_logps  # (B,)
    losses = -F.logsigmoid(beta * (chosen_logratios - rejected_logratios))  # (B,)
    return DPOOutput(losses, beta * chosen_logratios.detach(), beta * rejected_logratios.detach())


def reward_metrics(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> dict[str, float]:
    """TRL's reward metrics of a batch: ``rewards/chosen``, ``rewards/rejected`` (means),
    ``rewards/margins`` (mean of chosen - rejected) and ``rewards/accuracies`` (share of pairs whose
    chosen reward is strictly larger)."""
    if chosen_rewards.shape != rejected_rewards.shape or chosen_rewards.dim() != 1:
        raise ValueError(f"reward_metrics: both rewards must be (B,), got {tuple(chosen_rewards.shape)} and "
                         f"{tuple(rejected_rewards.shape)}")
    return {"rewards/chosen": chosen_rewards.mean().item(),
            "rewards/rejected": rejected_rewards.mean().item(),
            "rewards/margins": (chosen_rewards - rejected_rewards).mean().item(),
            "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean().item()}
