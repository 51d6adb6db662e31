"""Greedy decoding: generate the output one token at a time (lesson 06)."""

from __future__ import annotations

import torch

from .masks import padding_mask

__all__ = ["greedy_decode"]


@torch.no_grad()
def greedy_decode(
    model: torch.nn.Module,
    src: torch.Tensor,
    max_len: int,
    start_id: int,
    end_id: int | None = None,
    src_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode ``src`` with a ``course_lib.Transformer``, always taking the most likely next token.

    The source is encoded once; at step t the decoder sees ``<start>`` plus the t tokens produced so
    far (causal mask) and the argmax of its last position is appended.

    Args:
        model: an encoder-decoder with ``encode``, ``decode`` and ``generator`` (put it in eval mode).
        src: ``(B, L_s)`` source ids.
        max_len: number of tokens to generate.
        start_id: the decoder's start symbol.
        end_id: optional end symbol: once a row has produced it, the row is padded with ``end_id``.
        src_mask: source padding mask ``(B, 1, L_s)``; default from ``model.config.pad_id``.

    Returns:
        ``(B, max_len)`` generated ids, without the start symbol.
    """
    if src.dim() != 2 or src.size(0) == 0:
        raise ValueError(f"greedy_decode: src must be a non-empty (B, L_s) tensor, got {tuple(src.shape)}")
    if max_len < 1:
        raise ValueError(f"greedy_decode: max_len must be >= 1, got {max_len}")
    if src_mask is None:
        src_mask = padding_mask(src, model.config.pad_id)
    memory = model.encode(src, src_mask)  # (B, L_s, d_model), computed once
    ys = torch.full((src.size(0), 1), start_id, dtype=torch.long, device=src.device)  # (B, 1)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        hidden = model.decode(ys, memory, src_mask)  # (B, t, d_model)
        next_id = model.generator(hidden[:, -1]).argmax(dim=-1)  # last position only -> (B,)
        if end_id is not None:
            next_id = next_id.masked_fill(finished, end_id)
            finished |= next_id == end_id
        ys = torch.cat([ys, next_id.unsqueeze(1)], dim=1)  # (B, t+1)
    return ys[:, 1:]
