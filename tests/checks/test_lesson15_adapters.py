"""Lesson 15's other checkers (course_lib/checks/lesson15_adapters.py): LoRA's count (Predict), wrapping
a model's targets (Build), the ported merge (Debug: its first message says what is observed, never the
fix) and the bytes of adapters against copies (Predict). Right answers in every style pass; each
named mistake is named."""

from __future__ import annotations

import pytest
import torch
from _helpers import assert_checkers_keep_random_state, passes, solution_namespace
from torch import nn

from course_lib.checks import (
    CheckFailure, check_adapter_bytes, check_add_lora, check_lora_params, check_merge_fix,
)
from course_lib.checks.lesson15_adapters import adapter_bytes_answer, lora_params_answer
from course_lib.lora import add_lora

TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "linear1", "linear2")


def test_solutions_pass_and_keep_the_random_state():
    pairs = [(check_lora_params, solution_namespace("15.lora_params")["predicted_lora_params"]),
             (check_adapter_bytes, solution_namespace("15.adapter_bytes")["predicted_adapter_bytes"]),
             (check_add_lora, solution_namespace("15.add_lora")["add_lora_to"]),
             (check_merge_fix, solution_namespace("15.merge_debug")["merge_weight_fixed"])]
    for check, solution in pairs:
        assert passes(check, solution)
    assert_checkers_keep_random_state(pairs)


def test_the_answers_are_counted_from_the_model():
    from course_lib.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=83, max_len=64, d_model=128, num_heads=4, num_layers=1))
    total = sum(p.numel() for p in model.parameters())
    add_lora(model, 8, 16)
    assert lora_params_answer(8) == sum(p.numel() for p in model.parameters() if p.requires_grad) == 18432
    assert adapter_bytes_answer() == (10 * total * 4, (total + 10 * lora_params_answer(4)) * 4)


# ----------------------------------------------------------------------------------------------
# check_lora_params
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, message", [
    (18432 - 2048, "one of q_proj"),
    (18432 - 5120, "linear1 or linear2 is missing"),
    (9216, "only A"),
    (196608, "frozen matrices W"),
    (18432 + 1152, "biases are counted"),
    (18432 + 217344, "base's parameters are counted"),
    (4 * 18432, "4 blocks"),
    (12288, "every target counted as 128 -> 128"),
    (18431, "too small"),
])
def test_lora_params_miscounts_are_named(value, message):
    with pytest.raises(CheckFailure, match=message):
        check_lora_params(lambda: value)


@pytest.mark.parametrize("answer", [lambda: 18432.0, lambda: torch.tensor(18432), lambda: 2 * 9216])
def test_lora_params_any_form_of_the_number(answer):
    assert passes(check_lora_params, answer)


@pytest.mark.parametrize("answer", [lambda: "many", lambda: 18432.5, lambda: None, lambda: 1 / 0])
def test_lora_params_bad_answers(answer):
    with pytest.raises(CheckFailure):
        check_lora_params(answer)


def test_lora_params_refuses_measuring_with_course_lib():
    def measured():
        from course_lib.gpt import GPT, GPTConfig
        from course_lib.lora import trainable_parameters

        model = add_lora(GPT(GPTConfig(num_layers=1)), 8, 16)
        return trainable_parameters(model)

    with pytest.raises(CheckFailure, match="predict it"):
        check_lora_params(measured)


# ----------------------------------------------------------------------------------------------
# check_adapter_bytes
# ----------------------------------------------------------------------------------------------

RIGHT = adapter_bytes_answer()


@pytest.mark.parametrize("answer, message", [
    ((RIGHT[0] // 4, RIGHT[1]), "in parameters, not bytes"),
    ((RIGHT[0], 10 * 9216 * 4), "only the adapters"),
    ((RIGHT[0], 10 * (217344 + 9216) * 4), "once per adapter"),
    ((RIGHT[0] + 217344 * 4, RIGHT[1]), "beside the 10 copies"),
    ((RIGHT[1], RIGHT[0]), "other order"),
    ((RIGHT[0], RIGHT[1] // 4), "in parameters, not bytes"),
    ((RIGHT[0], RIGHT[1] + 1), "plus each adapter"),
])
def test_adapter_bytes_mistakes_are_named(answer, message):
    with pytest.raises(CheckFailure, match=message):
        check_adapter_bytes(lambda: answer)


@pytest.mark.parametrize("answer", [lambda: 5, lambda: (1, 2, 3), lambda: ("a", "b")])
def test_adapter_bytes_bad_answers(answer):
    with pytest.raises(CheckFailure):
        check_adapter_bytes(answer)


def test_adapter_bytes_accepts_a_list():
    assert passes(check_adapter_bytes, lambda: list(RIGHT))


# ----------------------------------------------------------------------------------------------
# check_add_lora
# ----------------------------------------------------------------------------------------------


def by_named_modules(model, r, alpha, lora_class):
    """Another right style: a list of (name, module) first, targets by the last part of the name;
    freeze everything after wrapping, then unfreeze the adapters by name."""
    for name, module in list(model.named_modules()):
        if name.rsplit(".", 1)[-1] in TARGETS and isinstance(module, nn.Linear):
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, lora_class(module, r, alpha))
    for name, p in model.named_parameters():
        p.requires_grad = "lora_" in name
    return model


def recursive(model, r, alpha, lora_class):
    """A third: recursion over children."""
    for p in model.parameters():
        p.requires_grad_(False)

    def walk(module):
        for name, child in list(module.named_children()):
            if name in TARGETS and isinstance(child, nn.Linear):
                setattr(module, name, lora_class(child, r, alpha))
            else:
                walk(child)

    walk(model)
    return model


@pytest.mark.parametrize("fn", [by_named_modules, recursive])
def test_add_lora_right_styles_pass(fn):
    assert passes(check_add_lora, fn)


def missing_ff(model, r, alpha, lora_class):
    for p in model.parameters():
        p.requires_grad_(False)
    for module in list(model.modules()):
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            if isinstance(getattr(module, name, None), nn.Linear):
                setattr(module, name, lora_class(getattr(module, name), r, alpha))
    return model


def every_linear(model, r, alpha, lora_class):
    for p in model.parameters():
        p.requires_grad_(False)
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and name:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, lora_class(module, r, alpha))
    return model


def no_freeze(model, r, alpha, lora_class):
    for name, module in list(model.named_modules()):
        if name.rsplit(".", 1)[-1] in TARGETS:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, lora_class(module, r, alpha))
            module.requires_grad_(False)  # the wrapped W and b only
    return model


def norms_left(model, r, alpha, lora_class):
    for name, p in model.named_parameters():
        if "norm" not in name:
            p.requires_grad_(False)
    for name, module in list(model.named_modules()):
        if name.rsplit(".", 1)[-1] in TARGETS:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, lora_class(module, r, alpha))
    return model


def substring_live(model, r, alpha, lora_class):
    """Targets matched by substring in a walk that goes on into each new wrapper: its base_layer's
    name ("...q_proj.base_layer") matches again."""
    for p in model.parameters():
        p.requires_grad_(False)

    def walk(module, prefix):
        for name, child in list(module.named_children()):
            full = f"{prefix}.{name}" if prefix else name
            if any(t in full for t in TARGETS) and isinstance(child, nn.Linear):
                child = lora_class(child, r, alpha)
                setattr(module, name, child)
            walk(child, full)

    walk(model, "")
    return model


def frozen_after(model, r, alpha, lora_class):
    by_named_modules(model, r, alpha, lora_class)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def returns_none(model, r, alpha, lora_class):
    recursive(model, r, alpha, lora_class)


@pytest.mark.parametrize("fn, message", [
    (missing_ff, "a target missed: linear1, linear2"),
    (every_linear, "also wraps .*lm_head"),
    (no_freeze, "embeddings"),
    (norms_left, "the norms"),
    (substring_live, "wrapping twice"),
    (frozen_after, "A and B are frozen"),
    (returns_none, "returns None"),
])
def test_add_lora_mistakes_are_named(fn, message):
    with pytest.raises(CheckFailure, match=message):
        check_add_lora(fn)


def test_add_lora_refuses_course_lib():
    with pytest.raises(CheckFailure, match="add_lora"):
        check_add_lora(lambda model, r, alpha, lora_class: add_lora(model, r, alpha))
    with pytest.raises(CheckFailure, match="a library's function"):
        check_add_lora(add_lora)


# ----------------------------------------------------------------------------------------------
# check_merge_fix (Debug): observed first, never the fix
# ----------------------------------------------------------------------------------------------


def ported(W, A, B, scaling):
    return W + (B @ A).T * scaling


FIX_WORDS = ("transpose", ".T", "fan_in_fan_out", "B @ A", "Conv1D", "remove", "instead")


@pytest.mark.parametrize("fn, mistake", [
    (ported, "same as merge_weight_ported"),
    (lambda W, A, B, s: W + B @ A, "the scaling not applied"),
    (lambda W, A, B, s: W + B @ A * s * s, "the scaling applied twice"),
    (lambda W, A, B, s: W, "W returned unchanged"),
    (lambda W, A, B, s: B @ A * s, "only B A returned, without W"),
])
def test_merge_fix_says_what_is_observed_never_the_fix(fn, mistake):
    with pytest.raises(CheckFailure) as info:
        check_merge_fix(fn)
    message = str(info.value)
    assert info.value.mistake == mistake
    assert "differ by up to" in message
    assert not any(word in message for word in FIX_WORDS), message


def test_merge_fix_shape_error_is_observed():
    with pytest.raises(CheckFailure, match="raised RuntimeError"):
        check_merge_fix(lambda W, A, B, s: (W + B @ A * s if W.shape[0] == W.shape[1]
                                            else ported(W, A, B, s)))


@pytest.mark.parametrize("fn", [
    lambda W, A, B, s: torch.einsum("or,ri->oi", B, A) * s + W,
    lambda W, A, B, s: (W.double() + B.double() @ A.double() * s).to(W.dtype),
    lambda W, A, B, s: W.clone().add_(B @ A, alpha=s),
    torch.no_grad()(lambda W, A, B, s: W + B.mm(A).mul(s)),
])
def test_merge_fix_right_styles_pass(fn):
    assert passes(check_merge_fix, fn)


@pytest.mark.parametrize("fn", [lambda W, A, B, s: "W", lambda W, A, B, s: W.T, lambda W, A, B: W])
def test_merge_fix_bad_answers(fn):
    with pytest.raises(CheckFailure):
        check_merge_fix(fn)
