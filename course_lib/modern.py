"""The parts of a modern (Llama-style) block that GPT-2 does not have (lesson 11).

- ``RMSNorm`` (Zhang and Sennrich, 2019): LayerNorm without centring and without a bias,
  ``x / sqrt(mean(x^2) + eps) * weight``.
- ``SwiGLU`` (Shazeer, 2020): a gated feed-forward, ``W2 (Swish(x W) * (x V))``, with three matrices
  instead of two; ``swiglu_d_ff`` keeps the parameter count of a ``4 d_model`` GELU network.
- ``kv_cache_bytes``: what a KV cache of grouped-query attention stores, by formula.

Rotary embeddings are in ``course_lib.rope``; grouped-query attention is ``num_kv_heads`` in
``MultiHeadAttention``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["RMSNorm", "SwiGLU", "swiglu_d_ff", "make_norm", "kv_cache_bytes"]


class RMSNorm(nn.Module):
    """Root-mean-square normalisation: ``x / sqrt(mean(x^2, last dim) + eps) * weight``.

    ``(..., d_model) -> (..., d_model)``. No mean is subtracted and there is no bias: ``d_model``
    parameters instead of LayerNorm's ``2 d_model``, and one reduction instead of two. Computed in
    float32 whatever the input's dtype, as Hugging Face's ``LlamaRMSNorm`` does.
    """

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (math.isfinite(eps) and eps > 0):
            raise ValueError(f"RMSNorm: eps must be a finite number > 0, got {eps!r} (a row of zeros "
                             "would give 0 / 0 = NaN)")
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.size(-1) != self.weight.numel():
            raise ValueError(f"RMSNorm: x must be (..., d_model={self.weight.numel()}), got {tuple(x.shape)}")
        x32 = x.float()
        rms_inv = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return self.weight * (x32 * rms_inv).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}"


def make_norm(kind: str, d_model: int, eps: float) -> nn.Module:
    """``"layernorm"`` -> ``nn.LayerNorm``, ``"rmsnorm"`` -> ``RMSNorm``."""
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=eps)
    if kind == "rmsnorm":
        return RMSNorm(d_model, eps=eps)
    raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {kind!r}")


class SwiGLU(nn.Module):
    """Gated feed-forward: ``linear2(dropout(silu(gate(x)) * up(x)))``.

    ``(B, L, d_model) -> (B, L, d_ff)`` twice (``gate``: the paper's W, through Swish = SiLU; ``up``:
    its V, the values the gate lets through) ``-> (B, L, d_model)`` (``linear2``: W2, named as in
    ``FeedForward`` so that code which scales the output projection treats both alike). Hugging
    Face's ``LlamaMLP`` calls them ``gate_proj``, ``up_proj`` and ``down_proj``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, bias: bool = False) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.size(-1) != self.gate.in_features:
            raise ValueError(f"SwiGLU: x must be (..., d_model={self.gate.in_features}), got {tuple(x.shape)}")
        return self.linear2(self.dropout(F.silu(self.gate(x)) * self.up(x)))


def swiglu_d_ff(d_model: int, multiple_of: int = 1) -> int:
    """The hidden width that gives SwiGLU's three matrices the weights of GELU's two at ``4 d_model``:
    ``3 d d_ff = 2 d (4 d)`` so ``d_ff = 2/3 * 4 d``, rounded up to a multiple of ``multiple_of``
    (Llama rounds to 256 at full size; 1 keeps the count closest)."""
    d_ff = round(2 * 4 * d_model / 3)
    return -(-d_ff // multiple_of) * multiple_of


def kv_cache_bytes(
    num_layers: int, num_kv_heads: int, head_dim: int, tokens: int, batch_size: int = 1,
    bytes_per_number: int = 4,
) -> int:
    """Bytes a KV cache holds: keys and values (2) for every layer, KV head, position and sequence.

    ``2 * num_layers * num_kv_heads * head_dim * tokens * batch_size * bytes_per_number``
    (float32: 4 bytes; bfloat16: 2). Grouped-query attention divides it by ``num_heads / num_kv_heads``.
    """
    return 2 * num_layers * num_kv_heads * head_dim * tokens * batch_size * bytes_per_number
