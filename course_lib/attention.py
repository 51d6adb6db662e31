"""Scaled dot-product attention and multi-head attention (lessons 01 and 02).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V            (Vaswani et al., 2017, eq. 1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

Masks follow ``course_lib.masks``: boolean, ``True`` = may attend.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .masks import causal_mask, check_mask
from .rope import RotaryEmbedding
from .tracing import trace
from .validation import check_size

__all__ = ["scaled_dot_product_attention", "split_heads", "merge_heads", "MultiHeadAttention",
           "set_fused_attention"]


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout: nn.Module | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T / sqrt(d_k)) V, with an optional boolean mask.

    Args:
        query: ``(..., L_q, d_k)``
        key:   ``(..., L_k, d_k)``
        value: ``(..., L_k, d_v)``
        mask:  bool, broadcastable to ``(..., L_q, L_k)``; ``True`` = may attend.
        dropout: optional module applied to the weights before they mix the values
            (``nn.Dropout(p)``); the returned weights are the ones *before* dropout.

    Returns:
        ``(output, weights)``: output ``(..., L_q, d_v)``, weights ``(..., L_q, L_k)``.
        A query whose keys are all masked gets zero weights and a zero output (never NaN).
    """
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise ValueError(
            "scaled_dot_product_attention: query, key and value need at least 2 dims (L, d); got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    if query.size(-1) != key.size(-1):
        raise ValueError(
            f"scaled_dot_product_attention: query and key must share their last dim d_k, got "
            f"query {tuple(query.shape)} and key {tuple(key.shape)}"
        )
    if key.size(-2) != value.size(-2):
        raise ValueError(
            f"scaled_dot_product_attention: key and value must have the same length L_k, got "
            f"key {tuple(key.shape)} and value {tuple(value.shape)}"
        )
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., L_q, L_k)
    if mask is not None:
        check_mask(mask, scores.shape, "scaled_dot_product_attention")
        # A finite "minus infinity": exp(min - max) is exactly 0 for every row that has at least
        # one visible key, and a fully masked row becomes uniform instead of NaN (0/0) ...
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    if mask is not None:
        # ... and is then zeroed, so it contributes nothing and its gradient stays finite.
        weights = weights.masked_fill(~mask, 0.0)
    mixing = dropout(weights) if dropout is not None else weights
    return mixing @ value, weights  # (..., L_q, d_v), (..., L_q, L_k)


def _check_is_causal(is_causal: object, where: str) -> None:
    """``is_causal`` must be a bool: a string such as ``"False"`` is true to Python (SDPA refuses it too)."""
    if not isinstance(is_causal, bool):
        raise TypeError(f"{where}: is_causal must be True or False, got {is_causal!r} "
                        f"({type(is_causal).__name__}); pass the bool itself (a string such as "
                        "'False' would count as true)")


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``(B, L, d) -> (B, num_heads, L, d // num_heads)``: each position's features cut into heads of
    consecutive features, the head axis before the positions (lesson 02's exercise, as a plain
    function). ``MultiHeadAttention.split_heads`` does the same with the layer's own ``head_dim``, so
    that a wrong head count fails there instead of giving other heads."""
    B, L, d = x.shape
    return x.view(B, L, num_heads, d // num_heads).transpose(1, 2)  # (B, L, h, hd) -> (B, h, L, hd)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(B, num_heads, L, head_dim) -> (B, L, num_heads * head_dim)``: the heads concatenated again,
    each position's head 0 features, then head 1's, ... (the inverse of ``split_heads``; the layer's
    ``MultiHeadAttention.merge_heads`` checks the width against its ``d_model``)."""
    B, h, L, hd = x.shape
    return x.transpose(1, 2).reshape(B, L, h * hd)  # (B, h, L, hd) -> (B, L, h, hd) -> (B, L, d)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate Q, K, V projections and an output projection.

    Args:
        d_model: width of the input and output vectors.
        num_heads: number of heads ``h``; ``d_model`` must be divisible by it
            (each head works in ``head_dim = d_model // num_heads`` dimensions).
        dropout: dropout on the attention weights.
        bias: whether the four projections have biases.
        fused: use PyTorch's fused kernel ``F.scaled_dot_product_attention`` whenever the weights
            are not asked for (``return_attention=False``). Same result (tested to 1e-5), less
            memory and time, but ``self.attn_weights`` is then ``None``. Off by default, because
            the lessons look at the weights; ``set_fused_attention(model, True)`` switches a model.
        num_kv_heads: grouped-query attention (lesson 11): keys and values get only this many heads,
            each shared by ``num_heads // num_kv_heads`` query heads. None = ``num_heads`` (multi-head
            attention, the same module as before); 1 = multi-query attention. A KV cache stores
            ``(B, num_kv_heads, t, head_dim)``: ``num_heads // num_kv_heads`` times less.
        rotary: a ``RotaryEmbedding`` (lesson 11) that turns queries and keys by their positions
            before the scores; self-attention only. None = no rotation (positions come from the
            embedding, as in lessons 01-10).

    Getting the attention weights: after every forward pass the module keeps the weights it used
    in ``self.attn_weights``, a detached tensor ``(B, num_heads, L_q, L_k)`` (before dropout).
    ``forward(..., return_attention=True)`` returns them as well, without relying on that state.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        fused: bool = False,
        num_kv_heads: int | None = None,
        rotary: RotaryEmbedding | None = None,
    ) -> None:
        super().__init__()
        if isinstance(d_model, (int, float)) and isinstance(num_heads, (int, float)) and (
                d_model <= 0 or num_heads <= 0):
            raise ValueError(f"MultiHeadAttention: d_model and num_heads must be positive, got {d_model}, {num_heads}")
        d_model = check_size(d_model, "d_model", "MultiHeadAttention")  # 48.0 -> 48; 42.5 refused
        num_heads = check_size(num_heads, "num_heads", "MultiHeadAttention")
        if num_kv_heads is not None:
            num_kv_heads = check_size(num_kv_heads, "num_kv_heads", "MultiHeadAttention")
        if d_model % num_heads != 0:
            raise ValueError(
                f"MultiHeadAttention: d_model={d_model} is not divisible by num_heads={num_heads}; "
                f"choose num_heads among the divisors of {d_model} (each head gets d_model // num_heads dims)"
            )
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
            raise ValueError(
                f"MultiHeadAttention: num_heads={num_heads} is not divisible by num_kv_heads="
                f"{num_kv_heads}; each KV head serves the same number of query heads, so choose "
                f"num_kv_heads among the divisors of {num_heads} (1 = multi-query attention)"
            )
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_model // num_heads
        if rotary is not None and rotary.head_dim != self.head_dim:
            raise ValueError(
                f"MultiHeadAttention: the rotary embedding turns head_dim={rotary.head_dim}, but the "
                f"heads have head_dim={self.head_dim} (d_model // num_heads)"
            )
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.fused = fused
        self.rotary = rotary
        self.attn_weights: torch.Tensor | None = None

    def split_heads(self, x: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """``(B, L, num_heads * head_dim) -> (B, num_heads, L, head_dim)``; ``num_heads`` defaults to
        ``self.num_heads`` (keys and values of grouped-query attention pass ``num_kv_heads``)."""
        B, L, _ = x.shape
        h = self.num_heads if num_heads is None else num_heads
        return x.view(B, L, h, self.head_dim).transpose(1, 2)  # (B, L, h, hd) -> (B, h, L, hd)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, num_heads, L, head_dim) -> (B, L, d_model)``."""
        B, _, L, _ = x.shape
        return x.transpose(1, 2).reshape(B, L, self.d_model)  # (B, h, L, hd) -> (B, L, h, hd) -> (B, L, d)

    def _check_inputs(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.dim() != 3 or t.size(-1) != self.d_model:
                raise ValueError(
                    f"MultiHeadAttention: {name} must be (B, L, d_model={self.d_model}), got {tuple(t.shape)}"
                )
            if t.size(0) == 0 or t.size(1) == 0:
                raise ValueError(f"MultiHeadAttention: {name} is empty, shape {tuple(t.shape)}")
        if not query.size(0) == key.size(0) == value.size(0):
            raise ValueError(
                "MultiHeadAttention: query, key and value must have the same batch size, got "
                f"{query.size(0)}, {key.size(0)}, {value.size(0)}"
            )
        if key.size(1) != value.size(1):
            raise ValueError(
                f"MultiHeadAttention: key and value must have the same length, got {key.size(1)} and {value.size(1)}"
            )

    def project_kv(
        self, key: torch.Tensor, value: torch.Tensor, start: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Project and split keys and values: ``(B, L_k, d_model) -> (B, num_kv_heads, L_k, head_dim)``
        each; with ``rotary``, the keys are turned for positions ``start .. start + L_k - 1``.

        ``forward`` calls it on every pass; a KV cache (``DecoderLayer.step``) calls it once per
        new position (``start`` = the positions already cached) and keeps the result.
        """
        k = self.split_heads(self.k_proj(key), self.num_kv_heads)  # (B, kv, L_k, hd)
        v = self.split_heads(self.v_proj(value), self.num_kv_heads)  # (B, kv, L_k, hd)
        if self.rotary is not None:
            k = self.rotary(k, start)
        return k, v

    def attend(
        self,
        query: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        return_attention: bool = False,
        is_causal: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend from ``query (B, L_q, d_model)`` to keys/values already projected and split,
        ``k, v: (B, num_kv_heads, L_k, head_dim)`` (from ``project_kv``). Masks and ``is_causal`` as
        in ``forward``. With ``rotary`` the queries are the last ``L_q`` of the ``L_k`` positions
        (self-attention, and a cache's newest position)."""
        _check_is_causal(is_causal, "MultiHeadAttention.attend")
        if k.dim() != 4 or k.size(1) != self.num_kv_heads or k.shape != v.shape:
            raise ValueError(
                f"MultiHeadAttention.attend: k and v must be (B, num_kv_heads={self.num_kv_heads}, "
                f"L_k, head_dim={self.head_dim}), got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        if is_causal and mask is None:
            mask = causal_mask(query.size(1), query.device)  # (L_q, L_k): the readable path needs it
        if mask is not None and mask.dim() in (2, 3):
            # (..., L_q, L_k) -> (..., 1, L_q, L_k): the same mask for all heads
            mask = mask.unsqueeze(-3)
        q = self.split_heads(self.q_proj(query))  # (B, h, L_q, hd)
        if self.rotary is not None:
            q = self.rotary(q, k.size(2) - q.size(2))  # the queries sit at the last L_q positions
        trace("MultiHeadAttention", "q after split_heads", q)
        if self.fused and not return_attention:
            # (B, h, L_q, hd), no weights stored; with is_causal the kernel skips the mask
            heads = self._fused_attention(q, k, v, None if is_causal else mask, is_causal)
            self.attn_weights = None
        else:
            group = self.num_heads // self.num_kv_heads
            if group > 1:  # grouped-query: query heads g*group .. g*group + group - 1 share KV head g
                k = k.repeat_interleave(group, dim=1)  # (B, kv, L_k, hd) -> (B, h, L_k, hd)
                v = v.repeat_interleave(group, dim=1)
            # heads: (B, h, L_q, hd), weights: (B, h, L_q, L_k)
            heads, weights = scaled_dot_product_attention(q, k, v, mask, self.dropout)
            self.attn_weights = weights.detach()
            trace("MultiHeadAttention", "attention weights", weights)
        out = self.out_proj(self.merge_heads(heads))  # (B, L_q, d_model)
        trace("MultiHeadAttention", "output", out)
        return (out, weights) if return_attention else out

    def _fused_attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """``F.scaled_dot_product_attention``: same masks (True = may attend); no weights stored."""
        if mask is not None:
            check_mask(mask, (*q.shape[:-1], k.size(-2)), "MultiHeadAttention (fused)")
        p = self.dropout.p if self.training else 0.0  # dropout on the weights during training only
        gqa = self.num_kv_heads != self.num_heads  # the kernel shares each KV head with its group
        if is_causal:  # every query sees at least itself: no row to zero afterwards
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, enable_gqa=gqa)
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, enable_gqa=gqa)
        if mask is not None:
            # A query that sees no key gets zeros, exactly as in the readable path (the pinned torch
            # already returns zeros there; this line makes it true for every backend).
            heads = heads.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        return heads

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
        return_attention: bool = False,
        is_causal: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend from ``query`` positions to ``key``/``value`` positions.

        Args:
            query: ``(B, L_q, d_model)``
            key:   ``(B, L_k, d_model)``
            value: ``(B, L_k, d_model)``
            mask:  bool, ``(L_q, L_k)``, ``(B, 1, L_k)``, ``(B, L_q, L_k)`` or already 4-D
                ``(B, 1 or num_heads, L_q, L_k)``; ``True`` = may attend.
            return_attention: also return the weights ``(B, num_heads, L_q, L_k)``.
            is_causal: a promise that ``mask`` is the causal mask (or None for it), as in a
                decoder-only model (lesson 09). The fused path then runs PyTorch's causal kernel
                without reading a mask (faster); the readable path uses the mask.

        Returns:
            ``(B, L_q, d_model)`` (and the weights when ``return_attention``).
        """
        self._check_inputs(query, key, value)
        _check_is_causal(is_causal, "MultiHeadAttention")
        if self.rotary is not None and not (key is query and value is query):
            raise ValueError(
                "MultiHeadAttention: with rotary positions this module is self-attention only; call "
                "it as attn(x, x, x) (queries and keys turned by the same positions)"
            )
        if is_causal and query.size(1) != key.size(1):
            raise ValueError(
                f"MultiHeadAttention: is_causal needs as many queries as keys, got {query.size(1)} "
                f"and {key.size(1)}"
            )
        k, v = self.project_kv(key, value)  # (B, h, L_k, hd) each
        return self.attend(query, k, v, mask, return_attention, is_causal)


def set_fused_attention(model: nn.Module, enabled: bool) -> nn.Module:
    """Switch the fused path on or off in every ``MultiHeadAttention`` of ``model``; returns it.

    With it on, attention weights are not stored (``attn_weights`` is None) unless a call asks for
    them with ``return_attention=True``. Use it for training and generation, not to look at weights.
    """
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.fused = enabled
    return model
