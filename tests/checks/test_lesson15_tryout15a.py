"""Lesson 15's checkers against what blind tryout 15a found (issue #51, fix round 1): the one wrong
verdict (a merge() that puts a new Parameter in W's place was accepted) and every attempt whose
message was generic, partly right or misleading. Each now gets a message that names what it did; a
Debug message says what is observed, never the fix; every right style still passes."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from _helpers import failure, passes
from torch import nn

from course_lib.checks import (
    CheckFailure, check_adapter_bytes, check_add_lora, check_lora_linear, check_lora_params,
    check_merge_fix,
)
from course_lib.checks.lesson15_adapters import adapter_bytes_answer

TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "linear1", "linear2")


# ----------------------------------------------------------------------------------------------
# Exercise 2 (★★★): merge() and unmerge() change the given W in place; the base itself is wrapped
# ----------------------------------------------------------------------------------------------


def lora(merge, unmerge=None, init="right", keep=lambda base: base):
    """A LoRA layer, right except for the given merge/unmerge, inits or kept base."""

    class MyLoRALinear(nn.Module):
        def __init__(self, base, r, alpha):
            super().__init__()
            self.base_layer = keep(base)
            self.base_layer.requires_grad_(False)
            self.in_features, self.out_features = base.in_features, base.out_features
            self.scaling = alpha / r
            w = base.weight
            self.lora_A = nn.Parameter(torch.empty(r, base.in_features, dtype=w.dtype))
            self.lora_B = nn.Parameter(torch.zeros(base.out_features, r, dtype=w.dtype))
            if init == "right":
                nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            else:  # swapped: A zero, B random
                nn.init.zeros_(self.lora_A)
                nn.init.kaiming_uniform_(self.lora_B, a=math.sqrt(5))
            self.merged = False

        def delta(self):
            return self.scaling * (self.lora_B @ self.lora_A)  # (d_out, d_in)

        def forward(self, x):
            out = self.base_layer(x)
            return out if self.merged else out + self.scaling * F.linear(F.linear(x, self.lora_A),
                                                                         self.lora_B)

        def merge(self):
            if not self.merged:
                merge(self)
                self.merged = True

        def unmerge(self):
            if self.merged:
                (unmerge or (lambda s: _sub(s)))(self)
                self.merged = False

    return MyLoRALinear


def _sub(s):
    with torch.no_grad():
        s.base_layer.weight -= s.delta()


def _new_parameter(s):  # tryout 15a, lora_linear/26
    s.base_layer.weight = nn.Parameter((s.base_layer.weight + s.delta()).detach())


def _add_with(how):
    def merge(s):
        W = s.base_layer.weight
        with torch.no_grad():
            if how == "+=":
                W += s.delta()
            elif how == "data+=":
                W.data += s.delta()
            elif how == "add_":
                W.add_(s.delta())
            elif how == "copy_":
                W.copy_(W + s.delta())
            elif how == "float64":
                W.copy_((W.double() + s.delta().double()).to(W.dtype))
            elif how == "data=":  # PEFT's safe_merge: the same Parameter, a new storage
                W.data = W.data.clone() + s.delta()
    return merge


@pytest.mark.parametrize("how", ["+=", "data+=", "add_", "copy_", "float64", "data="])
def test_every_in_place_merge_passes(how):
    assert passes(check_lora_linear, lora(_add_with(how)))


def test_a_merge_that_puts_a_new_parameter_in_W_place_is_named():
    err = failure(check_lora_linear, lora(_new_parameter))
    assert "After merge(), the given layer's weight is a new Parameter (requires_grad=True)" in str(err)
    assert err.mistake == "merge replaces W"


def test_an_unmerge_that_puts_a_new_frozen_parameter_in_W_place_is_named():
    def unmerge(s):
        s.base_layer.weight = nn.Parameter((s.base_layer.weight - s.delta()).detach(),
                                           requires_grad=False)

    err = failure(check_lora_linear, lora(_add_with("+="), unmerge))
    assert "After unmerge(), the given layer's weight is a new Parameter (requires_grad=False)" in str(err)


def test_a_merge_that_unfreezes_W_is_named():
    def merge(s):
        _add_with("+=")(s)
        s.base_layer.weight.requires_grad_(True)

    assert "After merge(), the given layer's weight W requires grad" in str(
        failure(check_lora_linear, lora(merge)))


def test_a_copied_base_is_named_as_not_the_one_passed_in():  # tryout 15a, lora_linear/21
    err = failure(check_lora_linear, lora(_add_with("+="), keep=copy.deepcopy))
    message = str(err)
    assert "The nn.Linear your layer wraps is not the one passed in" in message
    assert "base passed in still requires grad" in message
    assert err.mistake == "base copied"


def test_a_layer_holding_W_itself_without_the_module_passes():
    class WeightOnly(nn.Module):
        """Holds base's W and b themselves (not the nn.Linear), computes F.linear with them."""

        def __init__(self, base, r, alpha):
            super().__init__()
            base.requires_grad_(False)
            self.weight, self.bias = base.weight, base.bias
            self.in_features, self.out_features = base.in_features, base.out_features
            self.scaling = alpha / r
            self.lora_A = nn.Parameter(torch.empty(r, base.in_features, dtype=base.weight.dtype))
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            self.lora_B = nn.Parameter(torch.zeros(base.out_features, r, dtype=base.weight.dtype))
            self.merged = False

        def forward(self, x):
            delta = 0 if self.merged else self.scaling * (self.lora_B @ self.lora_A)
            return F.linear(x, self.weight + delta, self.bias)

        @torch.no_grad()
        def merge(self):
            if not self.merged:
                self.weight += self.scaling * (self.lora_B @ self.lora_A)
                self.merged = True

        @torch.no_grad()
        def unmerge(self):
            if self.merged:
                self.weight -= self.scaling * (self.lora_B @ self.lora_A)
                self.merged = False

    assert passes(check_lora_linear, WeightOnly)


def test_swapped_inits_name_both():  # tryout 15a, lora_linear/24
    err = failure(check_lora_linear, lora(_add_with("+="), init="swapped"))
    assert "lora_A starts at zero and lora_B does not" in str(err)
    assert err.mistake == "A zero and B random at start"


# ----------------------------------------------------------------------------------------------
# Exercise 4 (Debug): what is observed, on which layers; never the fix
# ----------------------------------------------------------------------------------------------

FIX_WORDS = ("transpose", ".T", "fan_in_fan_out", "B @ A", "Conv1D", "remove", "instead")


def fan_in_fan_out_transpose(weight, fan_in_fan_out=True):
    return weight.T if fan_in_fan_out else weight


@pytest.mark.parametrize("fn, seen, mistake", [
    (lambda W, A, B, s: W.clone(), "Your merged weight equals W: the merge changes nothing",
     "W returned unchanged"),
    (lambda W, A, B, s: (B @ A) * s, "equals what the LoRA path adds, scaling · B A, alone",
     "only B A returned, without W"),
    (lambda W, A, B, s: W - (B @ A) * s, "with the opposite sign", "W - B A"),
    (lambda W, A, B, s: W + B @ A, "is 0.5x what the LoRA path adds", "the scaling not applied"),
    (lambda W, A, B, s: W + (B @ A) / s, "is 0.25x what the LoRA path adds",
     "the change scaled by 0.25"),
    (lambda W, A, B, s: W + (B @ A) * (s / A.shape[0]), "is 0.25x what the LoRA path adds",
     "the change scaled by 0.25"),
    (lambda W, A, B, s: W + (B @ A) * s * s, "is 2x what the LoRA path adds",
     "the scaling applied twice"),
], ids=["W unchanged", "update only", "subtract", "no scaling", "divide", "scaling over r", "squared"])
def test_merge_fix_observes_the_change_in_W(fn, seen, mistake):  # tryout 15a, merge_debug/11-13, 16, 17, 19, 20
    err = failure(check_merge_fix, fn)
    message = str(err)
    assert message.startswith("A layer merged with your function computes other outputs")
    assert seen in message
    assert err.mistake == mistake
    assert "And on W (48, 32)" in message and "And on W (16, 40)" in message  # every layer named
    assert not any(word in message for word in FIX_WORDS), message


def test_merge_fix_ratio_is_given_on_every_layer():
    message = str(failure(check_merge_fix, lambda W, A, B, s: W + B @ A))
    # 1 / scaling on the three layers (scaling 2, 1.5, 0.5)
    assert "0.5x" in message and "0.667x" in message and "2x" in message


def test_merge_fix_W_swapped_square_silent_others_raise():  # tryout 15a, merge_debug/08
    err = failure(check_merge_fix, lambda W, A, B, s: fan_in_fan_out_transpose(W) + (B @ A) * s)
    message = str(err)
    assert "(a square layer, W (24, 24)" in message
    assert "it is W with its rows and columns swapped" in message
    assert "And on W (48, 32), your function raised RuntimeError" in message
    assert err.mistake == "W transposed"


def test_merge_fix_result_swapped_square_then_shapes():  # tryout 15a, merge_debug/15
    err = failure(check_merge_fix, lambda W, A, B, s: (W + (B @ A) * s).T)
    message = str(err)
    assert "with its rows and columns swapped" in message
    assert "And on W (48, 32), your merged weight has shape (32, 48)" in message
    assert err.mistake == "the merged weight transposed"


def test_merge_fix_says_which_layers_are_right():  # tryout 15a, merge_debug/10
    def transpose_if_square(W, A, B, s):
        return W + fan_in_fan_out_transpose(B @ A, W.shape[0] == W.shape[1]) * s

    message = str(failure(check_merge_fix, transpose_if_square))
    assert "It returns what merge_weight_ported returns." in message
    assert "On W (48, 32) and W (16, 40) a layer merged with it computes what the unmerged one" in message


def test_merge_fix_update_moved_elsewhere_is_observed():  # tryout 15a, merge_debug/09
    message = str(failure(check_merge_fix,
                          lambda W, A, B, s: W + (B @ A).T.reshape(W.shape) * s))
    assert "holds the numbers the LoRA path adds, at other places" in message


@pytest.mark.parametrize("fn", [
    lambda W, A, B, s: torch.addmm(W, B, A, alpha=s),
    lambda W, A, B, s: W + fan_in_fan_out_transpose(B @ A, False) * s,
    lambda W, A, B, s: sum((s * torch.outer(B[:, k], A[k]) for k in range(A.shape[0])), W.clone()),
])
def test_merge_fix_more_right_styles_pass(fn):
    assert passes(check_merge_fix, fn)


def test_merge_fix_a_function_that_never_ends_is_stopped(monkeypatch):
    from course_lib.checks import lesson15_adapters

    monkeypatch.setattr(lesson15_adapters, "LIMIT_SECONDS", 1)

    def forever(W, A, B, s):
        while True:
            pass

    with pytest.raises(CheckFailure, match="more than 1 s"):
        check_merge_fix(forever)


# ----------------------------------------------------------------------------------------------
# Exercise 1 (Predict): LoRA's parameters
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, message", [
    (4 * 256 + 2 * 640, "r is missing"),  # tryout 15a, lora_params/16
    (18432 + 3 * 2 * 128, "the norms are counted too"),  # lora_params/18
    (18432 + 3 * 128, "the norms' weights are counted too"),
    (2 * 18432, "2 blocks"),  # lora_params/14
    (4 * 18432, "4 blocks (GPTConfig's default"),  # lora_params/17: blocks or bytes
    (3 * 18432, "that counts 3 blocks"),
])
def test_lora_params_more_miscounts_are_named(value, message):
    err = failure(check_lora_params, lambda: value)
    assert message in str(err)
    assert "too small" not in str(err) and "too large" not in str(err)


def test_lora_params_4x_names_both_readings():
    message = str(failure(check_lora_params, lambda: 73_728))
    assert "4 blocks" in message and "float32 bytes" in message


# ----------------------------------------------------------------------------------------------
# Exercise 5 (Predict): bytes
# ----------------------------------------------------------------------------------------------

COPIES, ADAPTERS = adapter_bytes_answer()
BASE = 217_344


@pytest.mark.parametrize("answer, message", [
    ((COPIES, (BASE + 10 * 4 * (4 * 128 + 128 + 512)) * 4), "A alone"),  # tryout 15a, adapter_bytes/14
    ((COPIES, (BASE + 10 * (4 * 128 * 128 + 2 * 128 * 512)) * 4), "full update ΔW"),  # /15
    ((COPIES, (BASE + 10 * (9_216 + 1_152)) * 4), "with the targets' biases"),  # /20
    ((COPIES / 2 ** 20, ADAPTERS / 2 ** 20), "is the size in MiB"),  # /18
    ((COPIES / 1e6, ADAPTERS / 1e6), "is the size in MB"),  # /19
    ((round(COPIES / 2 ** 20, 2), round(ADAPTERS / 2 ** 20, 2)), "is the size in MiB"),
    ((COPIES, ADAPTERS / 1024), "the base with adapters: 1209 is the size in KiB"),
])
def test_adapter_bytes_more_mistakes_are_named(answer, message):
    err = failure(check_adapter_bytes, lambda: answer)
    assert message in str(err)
    assert err.mistake is not None


@pytest.mark.parametrize("answer", [(COPIES, ADAPTERS), (float(COPIES), float(ADAPTERS)),
                                    [torch.tensor(COPIES), torch.tensor(ADAPTERS)]])
def test_adapter_bytes_right_in_every_form(answer):
    assert passes(check_adapter_bytes, lambda: answer)


# ----------------------------------------------------------------------------------------------
# Exercise 3 (Build): wrapping a model
# ----------------------------------------------------------------------------------------------


def wrap(model, r, alpha, lora_class, freeze=lambda name, p: True):
    for name, p in model.named_parameters():
        if freeze(name, p):
            p.requires_grad = False
    found = [name for name, m in model.named_modules()
             if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in TARGETS]
    for name in found:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, lora_class(getattr(parent, child), r, alpha))
    return model


def test_add_lora_a_copy_of_the_model_is_named():  # tryout 15a, add_lora/16
    err = failure(check_add_lora, lambda model, r, alpha, cls: wrap(copy.deepcopy(model), r, alpha, cls))
    message = str(err)
    assert "The model your function returns is not the model passed in" in message
    assert "has 0 of its 12 targets wrapped, the one returned 12" in message
    assert err.mistake == "a copy of the model wrapped"


def test_add_lora_biases_left_trainable_are_named():  # tryout 15a, add_lora/18
    err = failure(check_add_lora, lambda model, r, alpha, cls: wrap(
        model, r, alpha, cls, freeze=lambda name, p: name.endswith("weight")))
    message = str(err)
    assert "the biases still train" in message
    assert "the norms and the wrapped layers (their base b)" in message
    assert err.mistake == "biases trainable"


def test_add_lora_right_style_still_passes():
    assert passes(check_add_lora, wrap)
