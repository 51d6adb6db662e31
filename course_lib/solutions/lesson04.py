"""Solutions to the exercises of lesson 04 (the encoder). Shown by ``show_solution("04.name")``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course_lib import FeedForward, MultiHeadAttention

# %% solution 04.feed_forward
class MyFeedForward(nn.Module):
    # FFN(x) = max(0, x W1 + b1) W2 + b2, the same weights at every position
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)      # W1, b1
        self.linear2 = nn.Linear(d_ff, d_model)      # W2, b2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.relu(self.linear1(x))             # (B, L, d_model) -> (B, L, d_ff)
        return self.linear2(hidden)                  # (B, L, d_ff) -> (B, L, d_model)

# %% solution 04.predict_layer_norm
def predicted_layer_norm_output():
    # Token 1: mean 2.5, biased variance ((1.5)^2 + (0.5)^2 + (0.5)^2 + (1.5)^2) / 4 = 1.25,
    # std 1.118, so (x - 2.5) / 1.118 = [-1.34, -0.45, 0.45, 1.34].
    # Token 2 is token 1 times 10: its mean and std are 10 times larger too, so the ratio is the
    # same.
    return [[-1.34, -0.45, 0.45, 1.34],
            [-1.34, -0.45, 0.45, 1.34]]

# %% solution 04.layer_norm
class MyLayerNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))   # gain
        self.bias = nn.Parameter(torch.zeros(d_model))    # bias
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)                          # (..., 1)
        var = x.var(dim=-1, keepdim=True, unbiased=False)            # biased variance
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias

# %% solution 04.encoder_layer
class MyEncoderLayer(nn.Module):
    # forward(x (B, L, d_model), mask bool (B, 1, L) | (B, L, L) | None) -> (B, L, d_model)
    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout=dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, mask)))  # keep x AND the attention
        x = self.norm2(x + self.dropout2(self.feed_forward(x)))
        return x

# %% solution 04.predict_params
def predicted_encoder_layer_params():
    d_model, d_ff = 512, 2048
    attention = 4 * (d_model * d_model + d_model)                 # W^Q, W^K, W^V, W^O and biases
    feed_forward = (d_model * d_ff + d_ff) + (d_ff * d_model + d_model)
    layer_norms = 2 * (d_model + d_model)                         # gain and bias, twice
    return attention + feed_forward + layer_norms    # 3,152,384 (the number of heads adds nothing)

# %% solution 04.repair_block
class RepairedEncoderLayer(nn.Module):
    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout=dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # attention_mask (B, L) -> (B, 1, L): one row of KEYS, broadcast over every query. The bug,
        # unsqueeze(-1), made (B, L, 1): it hid the pad queries and let every token attend to pads.
        mask = attention_mask.bool().unsqueeze(1)
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, mask)))
        x = self.norm2(x + self.dropout2(self.feed_forward(x)))
        return x
