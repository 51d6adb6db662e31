"""Rotary position embeddings, RoPE (lesson 11; Su et al., 2021, "RoFormer").

Instead of adding a position vector to the token, RoPE turns each query and key by an angle that
grows with its position. The head's ``head_dim`` numbers are taken as ``head_dim / 2`` planes; plane
``i`` turns by ``pos * theta_i`` with ``theta_i = base ** (-2i / head_dim)`` (fast to slow, like
lesson 03's sinusoids). A rotation keeps lengths, and the dot product of two vectors turned by
``a`` and ``b`` depends only on ``b - a``: the score of query ``m`` and key ``n`` sees the offset
``n - m`` and never ``m`` or ``n`` alone.

Which two numbers form plane ``i`` is a layout choice, and the two layouts in use disagree:

- ``"pairs"``: numbers ``(2i, 2i + 1)``, neighbours (the RoFormer paper, Meta's original Llama code);
- ``"halves"``: numbers ``(i, i + head_dim / 2)``, one from each half (Hugging Face's ``rotate_half``,
  GPT-NeoX).

Both are rotary embeddings, with the same relative property; but weights trained with one layout
give wrong outputs under the other (the planes pair different numbers), silently: the shapes match.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .validation import check_size

__all__ = ["LAYOUTS", "rotary_frequencies", "rotate_half", "rotate_pairs", "apply_rotary", "RotaryEmbedding"]

LAYOUTS = ("halves", "pairs")


def rotary_frequencies(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """``theta_i = base ** (-2i / head_dim)`` for ``i = 0 .. head_dim/2 - 1``: float32 ``(head_dim / 2,)``.

    Computed in float32 exactly as Hugging Face's ``compute_default_rope_parameters`` does.
    """
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not (math.isfinite(base) and base > 0):
        raise ValueError(
            f"rotary_frequencies: base must be a finite number > 0 (10,000 in RoFormer and Llama 2, "
            f"500,000 in Llama 3), got {base!r}; base ** (-2i / head_dim) is NaN or meaningless otherwise"
        )
    if head_dim < 2 or head_dim % 2 != 0:
        raise ValueError(
            f"rotary_frequencies: RoPE turns planes of two numbers, so head_dim must be even and "
            f">= 2, got {head_dim}; choose d_model and num_heads so that d_model // num_heads is even"
        )
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(x1, x2) -> (-x2, x1)`` with ``x1, x2`` the two halves of the last dim (layout "halves")."""
    x1, x2 = x.chunk(2, dim=-1)  # (..., d/2) each
    return torch.cat([-x2, x1], dim=-1)


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """``(a0, b0, a1, b1, ...) -> (-b0, a0, -b1, a1, ...)`` (layout "pairs")."""
    a, b = x[..., 0::2], x[..., 1::2]  # (..., d/2) each: the first and second number of each pair
    return torch.stack([-b, a], dim=-1).flatten(-2)  # (..., d/2, 2) -> (..., d)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "halves") -> torch.Tensor:
    """Turn ``x (..., L, head_dim)`` by the angles whose cosines and sines are ``cos, sin (L, head_dim)``
    (from ``RotaryEmbedding.cos_sin``, already in the layout's order): ``x cos + rotate(x) sin``."""
    rotate = rotate_half if layout == "halves" else rotate_pairs
    return x * cos + rotate(x) * sin


class RotaryEmbedding(nn.Module):
    """The cosines and sines of RoPE's angles for positions ``0 .. max_len - 1``, and the rotation.

    Args:
        head_dim: the size of one head (even).
        max_len: how many positions the table holds; a longer input is an error.
        base: ``theta_i = base ** (-2i / head_dim)``; 10,000 in RoFormer and Llama 1-2.
        layout: ``"halves"`` (Hugging Face) or ``"pairs"`` (RoFormer); see the module docstring.

    ``forward(x (B, h, L, head_dim), start=0) -> (B, h, L, head_dim)``: position ``start + j`` for row j.
    """

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0, layout: str = "halves") -> None:
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"RotaryEmbedding: layout must be one of {LAYOUTS}, got {layout!r}")
        head_dim = check_size(head_dim, "head_dim", "RotaryEmbedding")  # 8.0 -> 8
        max_len = check_size(max_len, "max_len", "RotaryEmbedding")
        inv_freq = rotary_frequencies(head_dim, base)  # (hd/2,)
        angles = torch.arange(max_len, dtype=torch.float32)[:, None] * inv_freq  # (max_len, hd/2)
        if layout == "halves":
            angles = torch.cat([angles, angles], dim=-1)  # (max_len, hd): plane i at i and i + hd/2
        else:
            angles = angles.repeat_interleave(2, dim=-1)  # (max_len, hd): plane i at 2i and 2i + 1
        self.head_dim, self.max_len, self.base, self.layout = head_dim, max_len, base, layout
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def cos_sin(self, length: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``start .. start + length - 1`` of the tables: ``(length, head_dim)`` each."""
        if isinstance(start, bool) or not isinstance(start, int):
            raise TypeError(f"RotaryEmbedding: start must be an int position, got {start!r}")
        if start < 0 or start + length > self.max_len:
            raise ValueError(
                f"RotaryEmbedding: positions {start}..{start + length - 1} are beyond the rotary "
                f"table of max_len={self.max_len} positions; build it with a larger max_len (RoPE "
                "has no weights, so a longer table costs nothing to train) or shorten the input"
            )
        return self.cos[start : start + length], self.sin[start : start + length]

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        if x.size(-1) != self.head_dim:
            raise ValueError(
                f"RotaryEmbedding: x must be (..., L, head_dim={self.head_dim}), got {tuple(x.shape)}"
            )
        cos, sin = self.cos_sin(x.size(-2), start)  # (L, hd) each
        return apply_rotary(x, cos.to(x.dtype), sin.to(x.dtype), self.layout)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_len={self.max_len}, base={self.base:g}, layout={self.layout!r}"
