"""Token embeddings and positional information (lesson 03).

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))                   (paper, section 3.5)

Both entries of the pair (2i, 2i+1) share one frequency. ``TransformerEmbedding`` combines
token, position and (optionally) segment embeddings; with the right switches it is the paper's
embedding layer or BERT's.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .tracing import trace
from .validation import check_ids

__all__ = [
    "sinusoidal_positional_encoding",
    "TokenEmbedding",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "TransformerEmbedding",
]


def sinusoidal_positional_encoding(max_len: int, d_model: int) -> torch.Tensor:
    """The paper's fixed positional encoding.

    Returns:
        float32 ``(max_len, d_model)``: even columns ``2i`` hold ``sin(pos * w_i)``, odd columns
        ``2i+1`` hold ``cos(pos * w_i)`` with ``w_i = 10000^(-2i / d_model)``. For odd ``d_model``
        the last column is a sine.
    """
    if max_len < 1 or d_model < 1:
        raise ValueError(f"sinusoidal_positional_encoding: max_len and d_model must be >= 1, got {max_len}, {d_model}")
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # 0, 2, 4, ...: already "2i"
    inv_freq = torch.pow(10000.0, -two_i / d_model)  # (ceil(d_model / 2),)
    angles = position * inv_freq  # (max_len, ceil(d_model / 2))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])  # odd d_model: one cosine column fewer
    return pe.float()


class TokenEmbedding(nn.Module):
    """Lookup table, scaled by sqrt(d_model) as in the paper (section 3.4).

    Args:
        vocab_size, d_model: table size.
        scale: multiply by ``sqrt(d_model)`` (the paper: yes; BERT: no).
        padding_idx: row kept at zero and not trained (optional).

    ``forward(ids (B, L)) -> (B, L, d_model)``.
    """

    def __init__(self, vocab_size: int, d_model: int, scale: bool = True, padding_idx: int | None = None) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.scale = math.sqrt(d_model) if scale else 1.0

    @property
    def weight(self) -> nn.Parameter:
        """The ``(vocab_size, d_model)`` table (shared with the output layer when tied)."""
        return self.embedding.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = check_ids(ids, self.vocab_size, "TokenEmbedding")  # any integer dtype -> int64
        return self.embedding(ids) * self.scale


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoidal positions, stored as a (non-trained, non-saved) buffer.

    ``forward(length) -> (length, d_model)`` on the buffer's device.
    """

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model), persistent=False)

    def forward(self, length: int) -> torch.Tensor:
        if length > self.max_len:
            raise ValueError(
                f"SinusoidalPositionalEncoding: sequence length {length} exceeds max_len={self.max_len}; "
                "build the model with a larger max_len or truncate the input"
            )
        return self.pe[:length]


class LearnedPositionalEmbedding(nn.Module):
    """One trained vector per position (BERT, GPT). ``forward(length) -> (length, d_model)``."""

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)

    def forward(self, length: int) -> torch.Tensor:
        if length > self.max_len:
            raise ValueError(
                f"LearnedPositionalEmbedding: sequence length {length} exceeds max_len={self.max_len}; "
                "there is no trained vector for later positions"
            )
        positions = torch.arange(length, device=self.embedding.weight.device)  # on the model's device
        return self.embedding(positions)


class TransformerEmbedding(nn.Module):
    """token (+ position) (+ segment) -> optional LayerNorm -> dropout.

    Args:
        vocab_size, d_model, max_len: sizes.
        positional: ``"sinusoidal"`` (the paper), ``"learned"`` (BERT) or ``"none"`` (lesson 11:
            RoPE turns queries and keys inside attention instead).
        scale_embedding: multiply token vectors by ``sqrt(d_model)`` (paper: True, BERT: False).
        num_segments: size of the segment (token-type) table; 0 for none (BERT: 2).
        layer_norm: apply LayerNorm after the sum (BERT: True).
        layer_norm_eps: its epsilon (BERT: 1e-12).
        dropout: dropout on the sum (paper: 0.1).
        padding_idx: passed to the token table.

    ``forward(ids (B, L), token_type_ids (B, L) | None) -> (B, L, d_model)``.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        max_len: int,
        positional: str = "sinusoidal",
        scale_embedding: bool = True,
        num_segments: int = 0,
        layer_norm: bool = False,
        layer_norm_eps: float = 1e-5,
        dropout: float = 0.1,
        padding_idx: int | None = None,
    ) -> None:
        super().__init__()
        self.token = TokenEmbedding(vocab_size, d_model, scale=scale_embedding, padding_idx=padding_idx)
        if positional == "sinusoidal":
            self.position: nn.Module = SinusoidalPositionalEncoding(max_len, d_model)
        elif positional == "learned":
            self.position = LearnedPositionalEmbedding(max_len, d_model)
        elif positional == "none":  # positions enter elsewhere (RoPE, lesson 11) or not at all
            self.position = None
        else:
            raise ValueError(
                f"TransformerEmbedding: positional must be 'sinusoidal', 'learned' or 'none', got {positional!r}"
            )
        self.segment = nn.Embedding(num_segments, d_model) if num_segments > 0 else None
        self.norm = nn.LayerNorm(d_model, eps=layer_norm_eps) if layer_norm else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.token(ids)  # (B, L, d)
        if self.position is not None:
            x = x + self.position(ids.size(1))  # (B, L, d) + (L, d) -> (B, L, d)
        if self.segment is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(ids)
            elif token_type_ids.shape != ids.shape:
                raise ValueError(
                    f"TransformerEmbedding: token_type_ids must have the shape of ids {tuple(ids.shape)}, "
                    f"got {tuple(token_type_ids.shape)}"
                )
            x = x + self.segment(token_type_ids)
        elif token_type_ids is not None:
            raise ValueError("TransformerEmbedding: token_type_ids given, but the layer has num_segments=0")
        if self.norm is not None:
            x = self.norm(x)
        trace("TransformerEmbedding", "embeddings", x)
        return self.dropout(x)
