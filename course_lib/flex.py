"""Masks and score changes without a matrix: PyTorch's FlexAttention (lesson 13).

``torch.nn.attention.flex_attention.flex_attention(q, k, v, score_mod=..., block_mask=...)`` takes
attention's variations as two small functions of indices instead of an ``(L_q, L_k)`` tensor:

* ``mask_mod(b, h, q_idx, kv_idx) -> bool``: may query ``q_idx`` of sequence ``b``, head ``h``,
  attend to key ``kv_idx``? ``create_block_mask`` evaluates it once at every pair of indices and keeps,
  per tile of 128 x 128, only whether the tile is empty (skipped), full or partial; the kernel calls it
  again inside the partial tiles.
* ``score_mod(score, b, h, q_idx, kv_idx) -> score``: changes one scaled score before the softmax
  (a position bias such as ALiBi, or Gemma 2's soft-capping).

Each function here returns such a ``mask_mod`` or ``score_mod``; ``dense_mask`` and ``dense_scores``
evaluate them on every index, the matrices a dense SDPA call would need, to prove them equal.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["causal", "sliding_window", "document", "alibi_slopes", "alibi", "soft_cap",
           "and_masks", "dense_mask", "dense_scores"]

MaskMod = Callable[..., torch.Tensor]
ScoreMod = Callable[..., torch.Tensor]


def causal(b, h, q_idx, kv_idx):  # noqa: ANN001, ANN201, ARG001 (flex's signature)
    """Query i may attend to keys 0..i."""
    return q_idx >= kv_idx


def sliding_window(window: int) -> MaskMod:
    """Causal, and only the last ``window`` keys (the query's own included): Mistral's local attention."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"sliding_window: window must be an int >= 1, got {window!r}")

    def mask_mod(b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202, ARG001
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)

    return mask_mod


def document(doc_ids: torch.Tensor) -> MaskMod:
    """Causal attention within each document of a packed sequence: ``doc_ids (B, L)`` says which
    document every position belongs to; a query sees earlier keys of its own document only."""
    if not isinstance(doc_ids, torch.Tensor) or doc_ids.dim() != 2 or doc_ids.is_floating_point():
        raise ValueError("document: doc_ids must be an integer tensor (B, L), one document id per position")

    def mask_mod(b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202, ARG001
        return (doc_ids[b, q_idx] == doc_ids[b, kv_idx]) & (q_idx >= kv_idx)

    return mask_mod


def and_masks(*mask_mods: MaskMod) -> MaskMod:
    """A mask_mod that allows what every one of ``mask_mods`` allows."""
    def mask_mod(b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202
        allowed = mask_mods[0](b, h, q_idx, kv_idx)
        for other in mask_mods[1:]:
            allowed = allowed & other(b, h, q_idx, kv_idx)
        return allowed

    return mask_mod


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's slope per head (Press et al., 2022), for a power of two: ``2^(-8 (h+1) / num_heads)``."""
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1 or \
            num_heads & (num_heads - 1):
        raise ValueError(f"alibi_slopes: num_heads must be a power of two, got {num_heads!r}")
    return 2.0 ** (-8.0 * torch.arange(1, num_heads + 1, dtype=torch.float64) / num_heads)


def alibi(num_heads: int) -> ScoreMod:
    """ALiBi: each score gets ``slope_h * (kv_idx - q_idx)``, a penalty growing with the distance."""
    slopes = alibi_slopes(num_heads)

    def score_mod(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202, ARG001
        return score + (slopes[h] * (kv_idx - q_idx)).to(score.dtype)

    return score_mod


def soft_cap(cap: float) -> ScoreMod:
    """Soft-capping (Gemma 2): ``cap * tanh(score / cap)`` keeps every score inside (-cap, cap)."""
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
        raise ValueError(f"soft_cap: cap must be a number > 0, got {cap!r}")

    def score_mod(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202, ARG001
        return cap * torch.tanh(score / cap)

    return score_mod


def _indices(B: int, H: int, L_q: int, L_k: int) -> tuple[torch.Tensor, ...]:
    b = torch.arange(B)[:, None, None, None]  # (B, 1, 1, 1)
    h = torch.arange(H)[None, :, None, None]  # (1, H, 1, 1)
    q_idx = torch.arange(L_q)[None, None, :, None]  # (1, 1, L_q, 1)
    kv_idx = torch.arange(L_k)[None, None, None, :]  # (1, 1, 1, L_k)
    return b, h, q_idx, kv_idx


def dense_mask(mask_mod: MaskMod, B: int, H: int, L_q: int, L_k: int) -> torch.Tensor:
    """``mask_mod`` on every index: bool ``(B, H, L_q, L_k)`` for SDPA's ``attn_mask``."""
    b, h, q_idx, kv_idx = _indices(B, H, L_q, L_k)
    return mask_mod(b, h, q_idx, kv_idx).expand(B, H, L_q, L_k)


def dense_scores(score_mod: ScoreMod, scores: torch.Tensor) -> torch.Tensor:
    """``score_mod`` on every score of ``scores (B, H, L_q, L_k)`` (already scaled)."""
    B, H, L_q, L_k = scores.shape
    return score_mod(scores, *_indices(B, H, L_q, L_k))
