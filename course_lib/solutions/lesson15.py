"""Solutions to the exercises of lesson 15 (fine-tuning and LoRA); see ``course_lib.solutions``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


# %% solution 15.lora_params
def predicted_lora_params():
    # LoRA trains A (r, d_in) and B (d_out, r) for every target: r * (d_in + d_out) numbers.
    # The lesson's base has ONE block (d_model 128, d_ff 512): q, k, v and out_proj are
    # 128 -> 128, linear1 is 128 -> 512, linear2 is 512 -> 128. W, the biases and everything
    # outside the targets stay frozen, so they do not count.
    r, d_model, d_ff, num_layers = 8, 128, 512, 1
    attention = 4 * r * (d_model + d_model)  # q_proj, k_proj, v_proj, out_proj
    feed_forward = r * (d_model + d_ff) + r * (d_ff + d_model)  # linear1, linear2
    return num_layers * (attention + feed_forward)


# %% solution 15.lora_linear
class MyLoRALinear(nn.Module):
    """A frozen nn.Linear ``base`` (d_in -> d_out) plus ``(alpha / r) B A x``.

    ``lora_A (r, d_in)``, ``lora_B (d_out, r)``; ``forward(x (..., d_in)) -> (..., d_out)``."""

    def __init__(self, base, r, alpha):
        super().__init__()
        self.base_layer = base
        self.in_features, self.out_features = base.in_features, base.out_features
        for p in base.parameters():  # W and b stay as they are
            p.requires_grad_(False)
        w = base.weight
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features, dtype=w.dtype, device=w.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # PEFT's (and nn.Linear's) init
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r, dtype=w.dtype, device=w.device))
        self.scaling = alpha / r
        self.merged = False

    def forward(self, x):
        out = self.base_layer(x)  # (..., d_out): W x + b
        if self.merged:  # B A is inside W already
            return out
        return out + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scaling

    def delta_weight(self):
        return (self.lora_B @ self.lora_A) * self.scaling  # (d_out, r) @ (r, d_in)

    @torch.no_grad()
    def merge(self):
        if not self.merged:  # merging twice would add B A twice
            self.base_layer.weight += self.delta_weight()
            self.merged = True

    @torch.no_grad()
    def unmerge(self):
        if self.merged:
            self.base_layer.weight -= self.delta_weight()
            self.merged = False


# %% solution 15.add_lora
def add_lora_to(model, r, alpha, lora_class):
    """Wrap every nn.Linear named one of TARGETS in ``lora_class(linear, r, alpha)``; freeze the rest."""
    targets = ("q_proj", "k_proj", "v_proj", "out_proj", "linear1", "linear2")
    for p in model.parameters():  # first freeze everything: embeddings, head, norms, W, b
        p.requires_grad_(False)
    for parent in list(model.modules()):  # a list: the loop does not walk into the new wrappers
        for name in targets:
            child = getattr(parent, name, None)
            if isinstance(child, nn.Linear):
                setattr(parent, name, lora_class(child, r, alpha))  # its A and B are new: trainable
    return model


# %% solution 15.merge_debug
def merge_weight_fixed(W, A, B, scaling):
    # The bug: the ported code came from GPT-2's Conv1D, which stores W as (d_in, d_out), so it
    # transposed ΔW (fan_in_fan_out=True). course_lib's nn.Linear stores W as (d_out, d_in), the
    # layout of B @ A: no transpose (transpose(..., fan_in_fan_out=False) is the same). On square
    # layers the transposed one ran silently; on the others it fails on the shapes.
    return W + (B @ A) * scaling  # (d_out, r) @ (r, d_in) = (d_out, d_in), W's layout


# %% solution 15.adapter_bytes
def predicted_adapter_bytes():
    # float32: 4 bytes a number. The base has 217,344 parameters; LoRA at r = 4 on the six
    # targets trains 4 * (4 * 256 + 640 + 640) = 9,216 numbers per adapter.
    base, adapter, tasks, bytes_per_number = 217_344, 9_216, 10, 4
    copies = tasks * base * bytes_per_number  # ten full fine-tuned models; no base needed beside them
    adapters = (base + tasks * adapter) * bytes_per_number  # one base, shared, plus ten A-B sets
    return copies, adapters
