"""Feed-forward network, encoder and decoder layers, and their stacks (lessons 04 and 05).

Submodule names follow ``torch.nn.TransformerEncoderLayer`` / ``TransformerDecoderLayer``
(``self_attn``, ``cross_attn`` (PyTorch: ``multihead_attn``), ``feed_forward.linear1/linear2``,
``norm1/norm2/norm3``), so weights can be copied across by name.

Post-LN (the paper):  x = LayerNorm(x + Dropout(Sublayer(x)))
Pre-LN (norm_first):  x = x + Dropout(Sublayer(LayerNorm(x)))   and one final LayerNorm per stack
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .attention import MultiHeadAttention
from .modern import SwiGLU, make_norm
from .rope import RotaryEmbedding
from .tracing import trace

__all__ = [
    "FeedForward", "EncoderLayer", "DecoderLayer", "Encoder", "Decoder", "LayerKVCache",
    "cached_self_attention",
]

# "gelu_tanh": GELU's tanh approximation, the one GPT-2 uses (Hugging Face calls it "gelu_new").
_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": partial(F.gelu, approximate="tanh")}


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

    Lesson 11's modern block is the same layer with other parts: ``norm="rmsnorm"``,
    ``activation="swiglu"`` (a ``SwiGLU`` feed-forward, bias as ``bias``), ``num_kv_heads``
    (grouped-query attention) and ``rotary`` (a ``RotaryEmbedding`` shared by the layers).
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
        fused_attention: bool = False,
        norm: str = "layernorm",
        num_kv_heads: int | None = None,
        rotary: RotaryEmbedding | None = None,
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(
            d_model, num_heads, dropout, bias, fused_attention, num_kv_heads=num_kv_heads, rotary=rotary
        )
        if activation == "swiglu":
            self.feed_forward: nn.Module = SwiGLU(d_model, d_ff, dropout=dropout, bias=bias)
        else:
            self.feed_forward = FeedForward(d_model, d_ff, dropout=dropout, activation=activation)
        self.norm1 = make_norm(norm, d_model, layer_norm_eps)
        self.norm2 = make_norm(norm, d_model, layer_norm_eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.norm_first = norm_first

    def _self_attention(self, x: torch.Tensor, mask: torch.Tensor | None, is_causal: bool = False) -> torch.Tensor:
        return self.dropout1(self.self_attn(x, x, x, mask, is_causal=is_causal))

    def _feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout2(self.feed_forward(x))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        """``is_causal``: ``mask`` is the causal mask (a decoder-only model); see MultiHeadAttention."""
        _check_input(x, self.self_attn.d_model, "EncoderLayer")
        if self.norm_first:
            x = x + self._self_attention(self.norm1(x), mask, is_causal)
            x = x + self._feed_forward(self.norm2(x))
        else:
            x = self.norm1(x + self._self_attention(x, mask, is_causal))  # keep BOTH x and the attention output
            x = self.norm2(x + self._feed_forward(x))
        trace("EncoderLayer", "output", x)
        return x

    def step(self, x: torch.Tensor, cache: "LayerKVCache", mask: torch.Tensor | None = None) -> torch.Tensor:
        """One generation step of a decoder-only model (lesson 09), where this layer runs with a
        causal mask: only the newest position ``x (B, 1, d_model)`` goes through, its key and value
        are appended to ``cache`` (``LayerKVCache.empty``), and the result equals row t of
        ``forward`` on all t+1 positions with the causal mask. ``mask``: bool ``(B, 1, t+1)``
        or None (see every position)."""
        _check_input(x, self.self_attn.d_model, "EncoderLayer.step")
        if x.size(1) != 1:
            raise ValueError(f"EncoderLayer.step: x must be one position (B, 1, d_model), got {tuple(x.shape)}")
        if self.norm_first:
            x = x + self.dropout1(cached_self_attention(self.self_attn, self.norm1(x), cache, mask))
            x = x + self._feed_forward(self.norm2(x))
        else:
            x = self.norm1(x + self.dropout1(cached_self_attention(self.self_attn, x, cache, mask)))
            x = self.norm2(x + self._feed_forward(x))
        return x


@dataclass
class LayerKVCache:
    """What one decoder layer keeps between generation steps (lesson 07).

    self_k, self_v:   ``(B, num_kv_heads, t, head_dim)``: the self-attention keys and values of the
                      t positions decoded so far; ``DecoderLayer.step`` appends one row per step.
                      (``num_kv_heads`` = ``num_heads`` except with grouped-query attention.)
    cross_k, cross_v: ``(B, num_heads, L_s, head_dim)``: the cross-attention keys and values of the
                      memory; they never change, so they are computed once
                      (``DecoderLayer.start_cache``). None in a layer without cross-attention
                      (``EncoderLayer.step``: a decoder-only model, lesson 09).
    """

    self_k: torch.Tensor
    self_v: torch.Tensor
    cross_k: torch.Tensor | None = None
    cross_v: torch.Tensor | None = None

    @classmethod
    def empty(cls, batch_size: int, attn: MultiHeadAttention, like: torch.Tensor) -> "LayerKVCache":
        """A cache with no position yet and no cross-attention: ``self_k/v (B, kv, 0, head_dim)``."""
        empty = like.new_zeros(batch_size, attn.num_kv_heads, 0, attn.head_dim)  # (B, kv, 0, hd)
        return cls(empty, empty)

    def reorder(self, index: torch.Tensor) -> "LayerKVCache":
        """Keep batch rows ``index`` (B_new,), in that order (beam search reorders its beams)."""
        return LayerKVCache(*(t.index_select(0, index) if t is not None else None for t in
                              (self.self_k, self.self_v, self.cross_k, self.cross_v)))


def cached_self_attention(
    attn: MultiHeadAttention, h: torch.Tensor, cache: LayerKVCache, mask: torch.Tensor | None
) -> torch.Tensor:
    """Self-attention of the newest position ``h (B, 1, d_model)`` over every position so far.

    Projects only the new row's key and value (with rotary positions: turned for position t, the
    number already cached), appends them to ``cache.self_k/v`` (in place), then attends. Append
    FIRST: the new position must see itself, as it does in the full causal mask.
    """
    k, v = attn.project_kv(h, h, start=cache.self_k.size(2))  # (B, kv, 1, hd): the new row only
    cache.self_k = torch.cat([cache.self_k, k], dim=2)  # (B, kv, t, hd) -> (B, kv, t+1, hd)
    cache.self_v = torch.cat([cache.self_v, v], dim=2)
    return attn.attend(h, cache.self_k, cache.self_v, mask)  # (B, 1, d_model)


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
        fused_attention: bool = False,
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout, bias, fused_attention)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout, bias, fused_attention)
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

    def start_cache(self, memory: torch.Tensor) -> LayerKVCache:
        """An empty self-attention cache and the memory's cross-attention keys and values.

        ``memory (B, L_s, d_model)`` -> ``LayerKVCache`` with ``self_k/v (B, h, 0, hd)`` and
        ``cross_k/v (B, h, L_s, hd)``.
        """
        _check_input(memory, self.self_attn.d_model, "DecoderLayer.start_cache", "memory")
        cross_k, cross_v = self.cross_attn.project_kv(memory, memory)  # once, not every step
        B, h, _, hd = cross_k.shape
        empty = cross_k.new_zeros(B, h, 0, hd)  # (B, h, 0, hd): no position decoded yet
        return LayerKVCache(empty, empty, cross_k, cross_v)

    def step(
        self,
        x: torch.Tensor,
        cache: LayerKVCache,
        self_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One generation step: only the newest position goes through the layer.

        Args:
            x: ``(B, 1, d_model)`` the newest position's input (position t).
            cache: this layer's cache; ``self_k/v`` grow from t to t+1 rows here (in place).
            self_mask: bool ``(B, 1, t+1)``: which of the t+1 decoded positions the new one may see
                (no causal part is needed: nothing later exists yet). None = all.
            memory_mask: the source padding mask ``(B, 1, L_s)``.

        Returns:
            ``(B, 1, d_model)``, equal to row t of ``forward`` on all t+1 positions.
        """
        _check_input(x, self.self_attn.d_model, "DecoderLayer.step")
        if x.size(1) != 1:
            raise ValueError(
                f"DecoderLayer.step: x must be one position (B, 1, d_model), got {tuple(x.shape)}"
            )

        def self_attention(h: torch.Tensor) -> torch.Tensor:  # h: (B, 1, d_model)
            return self.dropout1(cached_self_attention(self.self_attn, h, cache, self_mask))

        def cross_attention(h: torch.Tensor) -> torch.Tensor:  # the memory's keys/values, cached
            out = self.cross_attn.attend(h, cache.cross_k, cache.cross_v, memory_mask)
            return self.dropout2(out)

        if self.norm_first:
            x = x + self_attention(self.norm1(x))
            x = x + cross_attention(self.norm2(x))
            x = x + self._feed_forward(self.norm3(x))
        else:
            x = self.norm1(x + self_attention(x))
            x = self.norm2(x + cross_attention(x))
            x = self.norm3(x + self._feed_forward(x))
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
        kind = layer_kwargs.get("norm", "layernorm")
        self.norm = make_norm(kind, d_model, eps) if layer_kwargs.get("norm_first", False) else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask, is_causal)
        return self.norm(x) if self.norm is not None else x

    def start_cache(self, batch_size: int, like: torch.Tensor) -> list[LayerKVCache]:
        """One empty ``LayerKVCache`` per layer (no cross-attention), for ``step``."""
        return [LayerKVCache.empty(batch_size, layer.self_attn, like) for layer in self.layers]

    def step(self, x: torch.Tensor, caches: list[LayerKVCache], mask: torch.Tensor | None = None) -> torch.Tensor:
        """Newest position ``x (B, 1, d_model)`` -> ``(B, 1, d_model)`` (``EncoderLayer.step``),
        for a stack run with a causal mask (a decoder-only model)."""
        for layer, cache in zip(self.layers, caches):
            x = layer.step(x, cache, mask)
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
        kind = layer_kwargs.get("norm", "layernorm")
        self.norm = make_norm(kind, d_model, eps) if layer_kwargs.get("norm_first", False) else None

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

    def start_cache(self, memory: torch.Tensor) -> list[LayerKVCache]:
        """One ``LayerKVCache`` per layer: empty self-attention caches, the memory's keys/values."""
        return [layer.start_cache(memory) for layer in self.layers]

    def step(
        self,
        x: torch.Tensor,
        caches: list[LayerKVCache],
        self_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Newest position ``x (B, 1, d_model)`` -> ``(B, 1, d_model)`` (``DecoderLayer.step``)."""
        for layer, cache in zip(self.layers, caches):
            x = layer.step(x, cache, self_mask, memory_mask)
        return self.norm(x) if self.norm is not None else x
