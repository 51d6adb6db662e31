"""Solutions to the exercises of lesson 03 (embeddings and positions); see ``show_solution``."""

from __future__ import annotations

import math

import torch
from torch import nn

# %% solution 03.token_norm
def predicted_token_norm() -> float:
    # Each of the 512 entries is N(0, 1), so |row|^2 is about 512 and |row| about sqrt(512) = 22.6.
    # Multiplying by sqrt(512) gives about 22.6 * 22.6 = 512.
    return 512.0

# %% solution 03.positional_encoding
def positional_encoding(max_len: int, d_model: int) -> torch.Tensor:
    position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)    # 0, 2, 4, ...: already 2i
    omega = torch.pow(10000.0, -two_i / d_model)                # (ceil(d_model / 2),)
    angles = position * omega                                   # (max_len, ceil(d_model / 2))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])          # odd d_model: one cosine fewer
    return pe

# %% solution 03.dot_distance
def predicted_dot_difference() -> float:
    # One pair contributes sin(wp) sin(wq) + cos(wp) cos(wq) = cos(w (p - q)): only the distance
    # p - q matters, and both dot products have distance 7.
    return 0.0

# %% solution 03.bert_embedding
class BertStyleEmbedding(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, max_len: int, dropout: float) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_len, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.size(1), device=ids.device)   # (L,), on the input's device
        x = self.token(ids) + self.position(positions)             # (B, L, d) + (L, d) -> (B, L, d)
        return self.dropout(self.norm(x))

# %% solution 03.fix_loop
def fixed_positional_encoding(max_len: int, d_model: int) -> torch.Tensor:
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    for pos in range(max_len):
        for i in range(0, d_model, 2):                     # i = 0, 2, 4, ...: i IS the paper's 2i
            angle = pos / 10000 ** (i / d_model)           # bug 1 fixed: i, not 2 * i
            pe[pos, i] = math.sin(angle)
            pe[pos, i + 1] = math.cos(angle)               # bug 2 fixed: the same angle as the sine
    return pe.float()
