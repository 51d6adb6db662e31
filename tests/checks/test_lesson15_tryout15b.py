"""Lesson 15's checkers against what blind tryout 15b found (issue #51, fix round 2): three wrong
verdicts (a merge that changes the W passed in, a merge that returns float32 for a float64 W, a LoRA
layer whose base(x) runs under torch.no_grad()) and seven attempts whose message was generic, partly
right or misleading. Each now gets a message that names what it did; right styles still pass."""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import failure, passes
from torch import nn

from course_lib.checks import (
    check_adapter_bytes, check_add_lora, check_lora_linear, check_lora_params,
    check_merge_fix,
)
from course_lib.checks.lesson15_adapters import adapter_bytes_answer

TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "linear1", "linear2")


# ----------------------------------------------------------------------------------------------
# the merge Debug: inputs unchanged, W's dtype kept
# ----------------------------------------------------------------------------------------------


def test_merge_in_place_is_observed():
    def merge_weight_fixed(W, A, B, scaling):
        W += (B @ A) * scaling
        return W

    err = failure(check_merge_fix, merge_weight_fixed)
    assert "the W passed in holds other numbers than before" in str(err)
    assert err.mistake == "input changed in place"


def test_merge_float32_for_float64_is_observed():
    def merge_weight_fixed(W, A, B, scaling):
        return (W + (B @ A) * scaling).float()

    err = failure(check_merge_fix, merge_weight_fixed)
    assert "torch.float32 where W is torch.float64" in str(err)
    assert "W (48, 32)" in str(err) or "computes what the unmerged one" in str(err)


@pytest.mark.parametrize("style", ["plain", "float64_inside", "addmm", "clone_then_add"])
def test_merge_right_styles_pass(style):
    def merge_weight_fixed(W, A, B, scaling):
        if style == "plain":
            return W + (B @ A) * scaling
        if style == "float64_inside":
            return (W.double() + B.double() @ A.double() * scaling).to(W.dtype)
        if style == "addmm":
            return torch.addmm(W, B, A, alpha=scaling)
        out = W.clone()
        out += scaling * B @ A
        return out

    assert passes(check_merge_fix, merge_weight_fixed)


# ----------------------------------------------------------------------------------------------
# the LoRA layer: x's gradient, alpha // r
# ----------------------------------------------------------------------------------------------


def lora(no_grad_base=False, scaling=lambda alpha, r: alpha / r):
    class MyLoRALinear(nn.Module):
        def __init__(self, base, r, alpha):
            super().__init__()
            self.base = base
            self.base.requires_grad_(False)
            self.in_features, self.out_features = base.in_features, base.out_features
            self.scaling = scaling(alpha, r)
            w = base.weight
            self.lora_A = nn.Parameter(torch.empty(r, self.in_features, dtype=w.dtype))
            self.lora_B = nn.Parameter(torch.zeros(self.out_features, r, dtype=w.dtype))
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            self.merged = False

        def forward(self, x):
            if no_grad_base:
                with torch.no_grad():
                    out = self.base(x)
            else:
                out = self.base(x)
            if not self.merged:
                out = out + self.scaling * ((x @ self.lora_A.T) @ self.lora_B.T)
            return out

        @torch.no_grad()
        def merge(self):
            if not self.merged:
                self.base.weight += self.scaling * (self.lora_B @ self.lora_A)
                self.merged = True

        @torch.no_grad()
        def unmerge(self):
            if self.merged:
                self.base.weight -= self.scaling * (self.lora_B @ self.lora_A)
                self.merged = False

    return MyLoRALinear


def test_lora_right_passes():
    assert passes(check_lora_linear, lora())


def test_lora_base_under_no_grad_is_named():
    err = failure(check_lora_linear, lora(no_grad_base=True))
    assert "x's gradient holds only the LoRA path's part" in str(err)
    assert err.mistake == "base(x) outside autograd"


def test_lora_integer_division_is_named():
    err = failure(check_lora_linear, lora(scaling=lambda alpha, r: alpha // r))
    assert "scaling is 0 where alpha / r = 0.5" in str(err) and "integer division" in str(err)


# ----------------------------------------------------------------------------------------------
# the count: d_ff both sides, A and B with biases, r = alpha
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, words", [
    (24_576, "d_ff -> d_ff"), (19_632, "counted with biases"), (36_864, "r = 16, which is the lesson's alpha"),
])
def test_lora_params_named(value, words):
    err = failure(check_lora_params, lambda: value)
    assert words in str(err) and err.mistake


# ----------------------------------------------------------------------------------------------
# add_lora: fixed paths on the Llama-style model, course_lib's LoRALinear in place of lora_class
# ----------------------------------------------------------------------------------------------


def test_add_lora_fixed_paths_named():
    def add_lora_to(model, r, alpha, lora_class):
        model.requires_grad_(False)
        for block in model.blocks.layers:
            for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
                setattr(block.self_attn, name, lora_class(getattr(block.self_attn, name), r, alpha))
            ff = block.feed_forward
            ff.linear1 = lora_class(ff.linear1, r, alpha)
            ff.linear2 = lora_class(ff.linear2, r, alpha)
        return model

    err = failure(check_add_lora, add_lora_to)
    assert "raised AttributeError on a Llama-style GPT" in str(err) and "other names" in str(err)


def test_add_lora_course_lib_layer_refused_kindly():
    from course_lib.lora import LoRALinear

    def add_lora_to(model, r, alpha, lora_class):
        model.requires_grad_(False)
        found = [(n, m) for n, m in model.named_modules()
                 if n.rsplit(".", 1)[-1] in TARGETS and isinstance(m, nn.Linear)]
        for name, linear in found:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, LoRALinear(linear, r, alpha))
        return model

    err = failure(check_add_lora, add_lora_to)
    assert "course_lib's LoRALinear, not with the lora_class" in str(err) and "is right" in str(err)


# ----------------------------------------------------------------------------------------------
# adapter bytes: the head counted apart from the tied token table
# ----------------------------------------------------------------------------------------------


def test_adapter_bytes_untied_head_named():
    copies, adapters = adapter_bytes_answer()
    head = 83 * 128 * 4
    err = failure(check_adapter_bytes, lambda: (copies + 10 * head, adapters + head))
    assert str(err).count("the head is tied") == 2
