"""Supervised fine-tuning with the loss on the answer only (lesson 16).

An instruction and its answer are one sequence, ``<|user|>instruction<|end|><|assistant|>answer<|end|>``
(``course_lib.chat``). The model is trained on it as on any text, next token at every position,
except that the prompt's positions carry no loss: their labels are ``IGNORE_INDEX`` (-100, the
``ignore_index`` of ``F.cross_entropy`` and of Hugging Face). The model learns to produce answers,
not to predict the instructions it is given; the final ``<|end|>`` is a label, so it learns to stop.

Labels follow Hugging Face's convention: ``labels (B, T)`` lies under ``input_ids (B, T)`` and the
loss shifts them, so position t's logits are scored on ``labels[t + 1]``. The loss is the mean over
every answer token of the batch (not a mean of per-answer means): a long answer weighs more.

This equals TRL's completion-only loss (trl 1.16.0, tests/lib/test_sft.py): ``SFTTrainer`` with
``completion_only_loss=True`` on a conversational prompt-completion data set builds a
``completion_mask`` from where the prompt's ids (``apply_chat_template(prompt,
add_generation_prompt=True)``) stop matching the whole conversation's, sets the labels outside it
to -100 (``_prepare_dataset``'s ``build_labels``), pads them with -100
(``DataCollatorForLanguageModeling``) and divides the summed ``-log p`` of the labelled tokens by
their number (``SFTTrainer.compute_loss``). The labels are equal, id for id; the loss is equal to
float32 precision, because TRL's fused LM head computes its log-softmax in float32 whatever the
model's dtype (``trl.kernels.chunked_logprob``); the float64 reference of the same definition is the
model's own loss on TRL's labels.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .chat import ChatTemplate
from .gpt import lm_loss

__all__ = ["IGNORE_INDEX", "sft_example", "sft_batch", "sft_loss"]

IGNORE_INDEX = -100


def sft_example(template: ChatTemplate, instruction: str, answer: str,
                mask_prompt: bool = True) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of one instruction and its answer, both of length T.

    ``input_ids`` = ``template.prompt(instruction)`` + ``answer`` + ``<|end|>``; ``labels`` = the same
    ids with every prompt position (``<|user|>`` to ``<|assistant|>`` included) set to
    ``IGNORE_INDEX``, or left as they are with ``mask_prompt=False`` (the loss on every token).
    """
    if not isinstance(template, ChatTemplate):
        raise TypeError(f"sft_example: template must be a ChatTemplate, got {type(template).__name__}")
    prompt, reply = template.example(instruction, answer)
    ids = prompt + reply
    labels = ([IGNORE_INDEX] * len(prompt) + reply) if mask_prompt else list(ids)
    return ids, labels


def sft_batch(examples: Sequence[tuple[Sequence[int], Sequence[int]]],
              pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad ``(input_ids, labels)`` pairs into ``input_ids (B, T)`` (``pad_id``) and
    ``labels (B, T)`` (``IGNORE_INDEX``), T the longest example (as TRL's collator pads).

    Right padding needs no attention mask in a causal model: a real position never sees a later one.
    """
    if not examples:
        raise ValueError("sft_batch: no examples")
    if isinstance(pad_id, bool) or not isinstance(pad_id, int) or pad_id < 0:
        raise ValueError(f"sft_batch: pad_id must be an id >= 0, got {pad_id!r}")
    for i, pair in enumerate(examples):
        if not isinstance(pair, Sequence) or len(pair) != 2 or not all(hasattr(x, "__len__") for x in pair) \
                or len(pair[0]) != len(pair[1]) or len(pair[0]) == 0:
            raise ValueError(f"sft_batch: example {i} must be a pair (input_ids, labels) of lists of one "
                             "non-zero length (a list of such pairs, as sft_example returns them)")
    T = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), T), IGNORE_INDEX, dtype=torch.long)
    for b, (ids, lab) in enumerate(examples):
        input_ids[b, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.long)
        labels[b, : len(lab)] = torch.as_tensor(list(lab), dtype=torch.long)
    return input_ids, labels


def sft_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the labelled tokens: ``logits[:, t]`` scored on ``labels[:, t + 1]``,
    positions labelled ``IGNORE_INDEX`` left out. ``logits (B, T, V)``, ``labels (B, T)`` -> scalar."""
    if not isinstance(logits, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise TypeError("sft_loss: logits and labels must be tensors")
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(f"sft_loss: logits must be (B, T, V) and labels (B, T), got {tuple(logits.shape)} "
                         f"and {tuple(labels.shape)}")
    if logits.size(1) < 2:
        raise ValueError("sft_loss: a sequence of one token has no next token to predict")
    return lm_loss(logits[:, :-1], labels[:, 1:])  # (B, T-1, V) against (B, T-1): the next token
