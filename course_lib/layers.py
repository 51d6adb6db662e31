"""Feed-forward network, encoder and decoder layers, and their stacks (lessons 04 and 05).

Submodule names follow ``torch.nn.TransformerEncoderLayer`` / ``TransformerDecoderLayer``
(``self_attn``, ``cross_attn`` (PyTorch: ``multihead_attn``), ``feed_forward.linear1/linear2``,
``norm1/norm2/norm3``), so weights can be copied across by name.

Post-LN (the paper):  x = LayerNorm(x + Dropout(Sublayer(x)))
Pre-LN (norm_first):  x = x + Dropout(Sublayer(LayerNorm(x)))   and one final LayerNorm per stack
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import MultiHeadAttention
from .tracing import trace

__all__ = ["FeedForward", "EncoderLayer", "DecoderLayer", "Encoder", "Decoder"]

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


def _check_input(x: torch.Tensor, d_model: int, where: str, name: str = "x") -> None:
    """Clear error for a wrong input width (pre-LN would otherwise fail inside LayerNorm)."""
    if x.dim() != 3 or x.size(-1) != d_model:
        raise ValueError(f"{where}: {name} must be (B, L, d_model={d_model}), got {tuple(x.shape)}")


class FeedForward(nn.Module):
    """Position-wise feed-forward network: ``linear2(dropout(activation(linear1(x))))``.

    ``(B, L, d_model) -> (B, L, d_ff) -> (B, L, d_model)``; the same weights at every position.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.1, activation: str = "relu") -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"FeedForward: activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = _ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.size(-1) != self.linear1.in_features:
            raise ValueError(
                f"FeedForward: x must be (..., d_model={self.linear1.in_features}), got {tuple(x.shape)}"
            )
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in a residual connection and LayerNorm.

    ``forward(x (B, L, d_model), mask bool (B, 1, L) | (B, L, L) | None) -> (B, L, d_model)``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias)
        self.feed_forward = FeedForward(d_model, d_ff, dropout=dropout, activation=activation)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.norm_first = norm_first

    def _self_attention(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.dropout1(self.self_attn(x, x, x, mask))

    def _feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout2(self.feed_forward(x))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        _check_input(x, self.self_attn.d_model, "EncoderLayer")
        if self.norm_first:
            x = x + self._self_attention(self.norm1(x), mask)
            x = x + self._feed_forward(self.norm2(x))
        else:
            x = self.norm1(x + self._self_attention(x, mask))  # keep BOTH x and the attention output
            x = self.norm2(x + self._feed_forward(x))
        trace("EncoderLayer", "output", x)
        return x


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, feed-forward.

    ``forward(x (B, L_t, d), memory (B, L_s, d), tgt_mask, memory_mask) -> (B, L_t, d)``;
    ``tgt_mask`` is usually ``decoder_self_attention_mask`` ``(B, L_t, L_t)``, ``memory_mask`` the
    source padding mask ``(B, 1, L_s)``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias)
        self.feed_forward = FeedForward(d_model, d_ff, dropout=dropout, activation=activation)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm3 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)
        self.norm_first = norm_first

    def _self_attention(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.dropout1(self.self_attn(x, x, x, mask))

    def _cross_attention(self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        # queries from the decoder, keys and values from the encoder output
        return self.dropout2(self.cross_attn(x, memory, memory, mask))

    def _feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout3(self.feed_forward(x))

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        _check_input(x, self.self_attn.d_model, "DecoderLayer")
        _check_input(memory, self.self_attn.d_model, "DecoderLayer", "memory")

        if self.norm_first:
            x = x + self._self_attention(self.norm1(x), tgt_mask)
            x = x + self._cross_attention(self.norm2(x), memory, memory_mask)
            x = x + self._feed_forward(self.norm3(x))
        else:
            x = self.norm1(x + self._self_attention(x, tgt_mask))
            x = self.norm2(x + self._cross_attention(x, memory, memory_mask))
            x = self.norm3(x + self._feed_forward(x))
        trace("DecoderLayer", "output", x)
        return x


class Encoder(nn.Module):
    """``num_layers`` encoder layers; with ``norm_first`` a final LayerNorm (pre-LN needs it).

    Keyword arguments after ``num_layers`` are those of ``EncoderLayer``.
    ``forward(x (B, L, d), mask) -> (B, L, d)``.
    """

    def __init__(self, num_layers: int, d_model: int, num_heads: int, d_ff: int, **layer_kwargs) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, num_heads, d_ff, **layer_kwargs) for _ in range(num_layers)
        )
        eps = layer_kwargs.get("layer_norm_eps", 1e-5)
        self.norm = nn.LayerNorm(d_model, eps=eps) if layer_kwargs.get("norm_first", False) else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x) if self.norm is not None else x


class Decoder(nn.Module):
    """``num_layers`` decoder layers; with ``norm_first`` a final LayerNorm.

    ``forward(x (B, L_t, d), memory (B, L_s, d), tgt_mask, memory_mask) -> (B, L_t, d)``.
    """

    def __init__(self, num_layers: int, d_model: int, num_heads: int, d_ff: int, **layer_kwargs) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, num_heads, d_ff, **layer_kwargs) for _ in range(num_layers)
        )
        eps = layer_kwargs.get("layer_norm_eps", 1e-5)
        self.norm = nn.LayerNorm(d_model, eps=eps) if layer_kwargs.get("norm_first", False) else None

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, memory, tgt_mask, memory_mask)
        return self.norm(x) if self.norm is not None else x
