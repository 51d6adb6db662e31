"""Solutions to the exercises of lesson 05 (the decoder). Shown by ``show_solution("05.name")``."""

from __future__ import annotations

import torch
from torch import nn

from course_lib import FeedForward, MultiHeadAttention, padding_mask

# %% solution 05.decoder_mask
def make_decoder_mask(tgt: torch.Tensor, pad_id: int) -> torch.Tensor:
    L = tgt.size(1)
    real_key = (tgt != pad_id).unsqueeze(1)                               # (B, 1, L): the KEY axis
    past = torch.ones(L, L, dtype=torch.bool, device=tgt.device).tril()  # (L, L): s <= t
    return real_key & past                                                # (B, L, L)

# %% solution 05.predict_cross_shapes
def predicted_cross_attention_shapes():
    # one output vector per query (target position); weights: (B, heads, queries, keys)
    return (2, 5, 32), (2, 4, 5, 6)

# %% solution 05.decoder_layer
class MyDecoderLayer(nn.Module):
    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        # 1. masked self-attention, 2. cross-attention (Q: x; K, V: memory), 3. feed-forward
        x = self.norm1(x + self.dropout(self.self_attn(x, x, x, tgt_mask)))
        x = self.norm2(x + self.dropout(self.cross_attn(x, memory, memory, memory_mask)))
        return self.norm3(x + self.dropout(self.feed_forward(x)))

# %% solution 05.predict_nan
def predicted_nan_positions():
    # PyTorch reads True as "forbidden": the lower triangle hides keys s <= t, so query t sees only
    # the keys after it. The last query (4) has none left: softmax over a row of -inf is NaN.
    return [4]

# %% solution 05.next_word
def next_word_logits(model, src, tgt):
    """Scores for the word after ``tgt``: src (B, L_s), tgt (B, L_t) ids -> (B, tgt_vocab_size)."""
    src_mask = padding_mask(src, model.config.pad_id)   # (B, 1, L_s)
    memory = model.encode(src, src_mask)                # (B, L_s, d_model)
    hidden = model.decode(tgt, memory, src_mask)        # the fix: cross-attention needs src_mask
    return model.generator(hidden[:, -1])               # (B, vocab): the last position
