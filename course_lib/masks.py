"""Attention masks, and the one convention every part of the course follows.

The convention
--------------
A mask is a **boolean** tensor. ``True`` means "this query position may attend to this key
position"; ``False`` means "hide this key from this query". A mask must broadcast to the score
matrix ``(..., L_q, L_k)``. The helpers below return:

* ``padding_mask(ids, pad_id)``     -> ``(B, 1, L_k)``  one row, broadcast over every query
* ``causal_mask(L)``                -> ``(L, L)``       lower triangle (position t sees 0..t)
* ``decoder_self_attention_mask``   -> ``(B, L, L)``    padding AND causal

``MultiHeadAttention`` adds the head axis itself (``(B, L_q, L_k)`` -> ``(B, 1, L_q, L_k)``),
so you never build 4-D masks by hand.

Careful: ``torch.nn.MultiheadAttention`` and ``F.scaled_dot_product_attention`` disagree on what
``True`` means (for ``nn.MultiheadAttention`` a boolean ``True`` means *masked out*). When you
compare with them, pass ``~mask`` to ``nn.MultiheadAttention``.
"""

from __future__ import annotations

import torch

__all__ = [
    "padding_mask",
    "causal_mask",
    "decoder_self_attention_mask",
    "check_mask",
]


def padding_mask(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Mask that hides padding keys.

    Args:
        ids: token ids ``(B, L)``.
        pad_id: the id used for padding.

    Returns:
        bool ``(B, 1, L)``: ``True`` where the key is a real token.
    """
    if ids.dim() != 2:
        raise ValueError(f"padding_mask: ids must be (B, L) token ids, got shape {tuple(ids.shape)}")
    return (ids != pad_id).unsqueeze(1)  # (B, L) -> (B, 1, L)


def causal_mask(size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Mask that hides the future: query ``t`` may attend to keys ``0..t``.

    Returns:
        bool ``(size, size)``, lower-triangular (diagonal included).
    """
    if size < 1:
        raise ValueError(f"causal_mask: size must be >= 1, got {size}")
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


def decoder_self_attention_mask(tgt: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Padding and causal mask combined, for the decoder's masked self-attention.

    Args:
        tgt: decoder input ids ``(B, L)``.

    Returns:
        bool ``(B, L, L)``: ``mask[b, t, s]`` is ``True`` iff ``s <= t`` and ``tgt[b, s]`` is not pad.
    """
    pad = padding_mask(tgt, pad_id)  # (B, 1, L)
    future = causal_mask(tgt.size(1), device=tgt.device)  # (L, L)
    return pad & future  # broadcast -> (B, L, L)


def check_mask(mask: torch.Tensor, scores_shape: torch.Size | tuple[int, ...], where: str) -> None:
    """Raise a clear error unless ``mask`` is a boolean tensor broadcastable to ``scores_shape``."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{where}: mask must be a torch.Tensor of dtype bool, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{where}: mask must have dtype torch.bool (True = may attend), got {mask.dtype}. "
            "Convert with `mask.bool()` if it holds 0/1, or `mask == 0` if it is an additive -inf mask."
        )
    try:
        torch.broadcast_shapes(mask.shape, tuple(scores_shape))
    except RuntimeError:
        raise ValueError(
            f"{where}: mask of shape {tuple(mask.shape)} does not broadcast to the attention scores "
            f"{tuple(scores_shape)} (..., L_q, L_k). Use (L_q, L_k), (B, 1, L_k) for padding or "
            "(B, L_q, L_k); see course_lib.masks."
        ) from None
    if torch.broadcast_shapes(mask.shape, tuple(scores_shape)) != torch.Size(scores_shape):
        raise ValueError(
            f"{where}: mask of shape {tuple(mask.shape)} would enlarge the scores "
            f"{tuple(scores_shape)}; it has more or larger axes than (..., L_q, L_k)."
        )
