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

import math
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
    document every position belongs to; a query sees earlier keys of its own document only. The
    mask is for at most B sequences of at most L positions (queries and keys)."""
    if not isinstance(doc_ids, torch.Tensor) or doc_ids.dim() != 2 or doc_ids.is_floating_point():
        what = (f"{doc_ids.dtype} tensor of shape {tuple(doc_ids.shape)}" if isinstance(doc_ids, torch.Tensor)
                else type(doc_ids).__name__)
        raise ValueError(f"document: doc_ids must be an integer tensor (B, L), one document id per "
                         f"position, got {what}")
    B, L = doc_ids.shape

    def mask_mod(b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202, ARG001
        try:
            same = doc_ids[b, q_idx] == doc_ids[b, kv_idx]
        except IndexError:  # eager and vmap (create_block_mask) raise it at once
            raise ValueError(f"document: doc_ids {(B, L)} has document ids for {B} sequence(s) of {L} "
                             f"positions, but the mask was asked about a sequence or position beyond "
                             f"them: use it with batch size <= {B} and L_q, L_k <= {L} (in "
                             f"create_block_mask or dense_mask), or give doc_ids for every sequence and "
                             f"position") from None
        return same & (q_idx >= kv_idx)

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
    """ALiBi: each score gets ``slope_h * (kv_idx - q_idx)``, a penalty growing with the distance.

    For ``num_heads`` query heads: ``dense_scores`` of more heads gets a ValueError that says so.
    (``flex_attention`` compiles the function into a graph, where no Python check runs: there, more
    heads than slopes end in PyTorch's IndexError.)"""
    slopes = alibi_slopes(num_heads)

    def score_mod(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202, ARG001
        try:
            slope = slopes[h]
        except IndexError:  # raised at once in eager code (dense_scores); not inside flex_attention
            raise ValueError(f"alibi: built with {num_heads} slopes (num_heads={num_heads}), but the "
                             f"scores have more heads: build alibi(H) with H = the query heads of q, "
                             f"q.size(1)") from None
        return score + (slope * (kv_idx - q_idx)).to(score.dtype)

    return score_mod


def soft_cap(cap: float) -> ScoreMod:
    """Soft-capping (Gemma 2): ``cap * tanh(score / cap)`` keeps every score inside (-cap, cap)."""
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not (math.isfinite(cap) and cap > 0):
        raise ValueError(f"soft_cap: cap must be a number > 0 and finite (Gemma 2 caps attention scores "
                         f"at 50.0; an infinite cap makes every score NaN), got {cap!r}")

    def score_mod(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202, ARG001
        return cap * torch.tanh(score / cap)

    return score_mod


def _check_sizes(sizes: tuple[object, ...], where: str) -> None:
    for name, value in zip(("B", "H", "L_q", "L_k"), sizes):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: {name} must be an int >= 1, got {value!r}")


def _indices(B: int, H: int, L_q: int, L_k: int) -> tuple[torch.Tensor, ...]:
    b = torch.arange(B)[:, None, None, None]  # (B, 1, 1, 1)
    h = torch.arange(H)[None, :, None, None]  # (1, H, 1, 1)
    q_idx = torch.arange(L_q)[None, None, :, None]  # (1, 1, L_q, 1)
    kv_idx = torch.arange(L_k)[None, None, None, :]  # (1, 1, 1, L_k)
    return b, h, q_idx, kv_idx


def dense_mask(mask_mod: MaskMod, B: int, H: int, L_q: int, L_k: int) -> torch.Tensor:
    """``mask_mod`` on every index: bool ``(B, H, L_q, L_k)`` for SDPA's ``attn_mask``."""
    _check_sizes((B, H, L_q, L_k), "dense_mask")
    b, h, q_idx, kv_idx = _indices(B, H, L_q, L_k)
    return mask_mod(b, h, q_idx, kv_idx).expand(B, H, L_q, L_k)


def dense_scores(score_mod: ScoreMod, scores: torch.Tensor) -> torch.Tensor:
    """``score_mod`` on every score of ``scores (B, H, L_q, L_k)`` (already scaled)."""
    if not isinstance(scores, torch.Tensor) or scores.dim() != 4:
        what = f"shape {tuple(scores.shape)}" if isinstance(scores, torch.Tensor) else type(scores).__name__
        fix = ("add the missing axes, e.g. scores[None] for one sequence (B = 1) or scores[:, None] for "
               "one head (H = 1)" if isinstance(scores, torch.Tensor) and scores.dim() < 4 else
               "one (L_q, L_k) matrix of scaled scores per sequence and head, e.g. q @ k.transpose(-2, -1) "
               "* scale of q, k (B, H, L, head_dim)")
        raise ValueError(f"dense_scores: scores must be a 4-D tensor (B, H, L_q, L_k), got {what}; {fix}")
    B, H, L_q, L_k = scores.shape
    return score_mod(scores, *_indices(B, H, L_q, L_k))
