"""Solutions to lesson 02's exercises (multi-head attention): show_solution("02.split_heads")."""

import torch
from torch import nn

from course_lib import scaled_dot_product_attention

# %% solution 02.parameters
def predicted_parameter_counts():
    # Four projections (W^Q, W^K, W^V of all heads stacked, and W^O), each a 512 x 512 matrix
    # plus a bias of 512. Eight heads of head_dim 64 stack to the same 512 x 512 matrices as one
    # head of width 512.
    one_linear = 512 * 512 + 512
    return (4 * one_linear, 4 * one_linear)  # (1_050_624, 1_050_624)

# %% solution 02.split_heads
def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    '''(B, L, d_model) -> (B, num_heads, L, head_dim).'''
    B, L, d_model = x.shape
    x = x.view(B, L, num_heads, d_model // num_heads)  # each position's features cut into heads
    return x.transpose(1, 2)  # (B, L, num_heads, head_dim) -> (B, num_heads, L, head_dim)

# %% solution 02.merge_heads
def merge_heads(x: torch.Tensor) -> torch.Tensor:
    '''(B, num_heads, L, head_dim) -> (B, L, num_heads * head_dim).'''
    B, num_heads, L, head_dim = x.shape
    x = x.transpose(1, 2)  # the fix: (B, num_heads, L, head_dim) -> (B, L, num_heads, head_dim)
    return x.reshape(B, L, num_heads * head_dim)  # or x.contiguous().view(...): heads side by side

# %% solution 02.sliced_attention
class SlicedMultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)  # (B, L, d_model) each
        heads = []
        for i in range(self.num_heads):
            cols = slice(i * self.head_dim, (i + 1) * self.head_dim)  # head i's columns
            out_i, _ = scaled_dot_product_attention(q[..., cols], k[..., cols], v[..., cols], mask)
            heads.append(out_i)  # (B, L_q, head_dim)
        return self.out_proj(torch.cat(heads, dim=-1))  # (B, L_q, d_model)

# %% solution 02.view
def predicted_view_works():
    # view never copies. Cutting an axis always works; gluing two axes works only if they lie back
    # to back in memory (outer stride = inner size x inner stride). swapped's strides: (24, 2, 8, 1).
    return (
        False,  # glues num_heads (stride 8) and head_dim (size 2, stride 1): 8 != 2 x 1
        True,  # only cuts L = 4 into 2 x 2
        False,  # glues L (stride 2) and num_heads (size 3, stride 8): 2 != 3 x 8
        True,  # transposing back makes it contiguous again, then anything goes
    )
