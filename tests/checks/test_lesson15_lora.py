"""Lesson 15's ★★★ checker, check_lora_linear (course_lib/checks/lesson15_lora.py): every correct style
passes (parameters or PEFT-style nn.Linear, F.linear or einsum, float64 inside, a merge that raises
when merged, an unmerge that restores a saved copy), each named mistake is named, course_lib's and
PEFT's layers are refused kindly, and no raw error or endless loop leaves the checker."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _helpers import assert_checkers_keep_random_state, passes, solution_namespace
from torch import nn

from course_lib.checks import CheckFailure, check_lora_linear
from course_lib.checks import lesson15_lora
from course_lib.lora import LoRALinear

SOLUTION = solution_namespace("15.lora_linear")["MyLoRALinear"]


def lora_class(init_A=None, init_B=torch.zeros, scale=lambda r, alpha: alpha / r, forward=None,
               merge=None, unmerge=None, freeze=True, guard=True):
    """A learner's LoRA layer with one knob per mistake (the defaults are right)."""

    class MyLoRALinear(nn.Module):
        def __init__(self, base, r, alpha):
            super().__init__()
            self.base_layer = base
            self.in_features, self.out_features = base.in_features, base.out_features
            if freeze:
                base.requires_grad_(False)
            w = base.weight
            self.lora_A = nn.Parameter(torch.empty(r, base.in_features, dtype=w.dtype))
            if init_A is None:
                nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            else:
                with torch.no_grad():
                    self.lora_A.copy_(init_A(self.lora_A))
            self.lora_B = nn.Parameter(init_B(base.out_features, r, dtype=w.dtype))
            self.scaling, self.merged, self.r, self.alpha = scale(r, alpha), False, r, alpha

        def delta(self):
            return self.lora_B @ self.lora_A * self.scaling

        def forward(self, x):
            if forward is not None:
                return forward(self, x)
            out = self.base_layer(x)
            return out if self.merged else out + x @ self.delta().T

        @torch.no_grad()
        def merge(self):
            if guard and self.merged:
                return
            if merge is not None:
                merge(self)
            else:
                self.base_layer.weight += self.delta()
            self.merged = True

        @torch.no_grad()
        def unmerge(self):
            if guard and not self.merged:
                return
            if unmerge is not None:
                unmerge(self)
            else:
                self.base_layer.weight -= self.delta()
            self.merged = False

    return MyLoRALinear


def failure(cls) -> CheckFailure:
    with pytest.raises(CheckFailure) as info:
        check_lora_linear(cls)
    return info.value


# ----------------------------------------------------------------------------------------------
# right answers, in every style
# ----------------------------------------------------------------------------------------------


class PeftStyle(nn.Module):
    """lora_A and lora_B as nn.Linear without bias (PEFT's own layout), einsum, float64 inside,
    a merge that raises when merged, an unmerge that restores a saved copy of W."""

    def __init__(self, base, r, alpha):
        super().__init__()
        self.base_layer = base
        self.in_features, self.out_features = base.in_features, base.out_features
        for p in base.parameters():
            p.requires_grad = False
        self.lora_A = nn.Linear(base.in_features, r, bias=False).to(base.weight.dtype)
        self.lora_B = nn.Linear(r, base.out_features, bias=False).to(base.weight.dtype)
        nn.init.zeros_(self.lora_B.weight)
        self.scaling = alpha / r
        self.saved = None

    def forward(self, x):
        out = self.base_layer(x)
        if self.saved is not None:
            return out
        low = torch.einsum("...i,ri->...r", x.double(), self.lora_A.weight.double())
        return out + (torch.einsum("...r,or->...o", low, self.lora_B.weight.double())
                      * self.scaling).to(out.dtype)

    def merge(self):
        if self.saved is not None:
            raise RuntimeError("already merged")
        self.saved = self.base_layer.weight.detach().clone()
        with torch.no_grad():
            self.base_layer.weight.data = self.saved + self.lora_B.weight @ self.lora_A.weight * self.scaling

    def unmerge(self):
        if self.saved is None:
            raise RuntimeError("not merged")
        with torch.no_grad():
            self.base_layer.weight.copy_(self.saved)
        self.saved = None


@pytest.mark.parametrize("cls", [
    SOLUTION, lora_class(), PeftStyle,
    lora_class(forward=lambda s, x: F.linear(x, s.base_layer.weight + (0 if s.merged else s.delta()),
                                             s.base_layer.bias)),
], ids=["solution", "matmul", "peft-style-einsum-float64-raising", "one-F.linear"])
def test_right_answers_pass(cls):
    assert passes(check_lora_linear, cls)


def test_the_solution_passes_and_keeps_the_random_state():
    assert passes(check_lora_linear, SOLUTION)
    assert_checkers_keep_random_state([(check_lora_linear, SOLUTION)])


# ----------------------------------------------------------------------------------------------
# named mistakes
# ----------------------------------------------------------------------------------------------

def path(s, x, transposed=False):
    """The LoRA path of a learner's layer, 0 once merged."""
    return 0 if s.merged else x @ (s.delta() if transposed else s.delta().T)


MISTAKES = {
    "B random at start": (lora_class(init_B=lambda o, r, dtype: torch.randn(o, r, dtype=dtype)),
                          "lora_B does not start at zero"),
    "A zero": (lora_class(init_A=torch.zeros_like), "lora_A starts at zero"),
    "A N(0, 1)": (lora_class(init_A=torch.randn_like), "as large as N\\(0, 1\\)"),
    "A kaiming a=0": (lora_class(init_A=lambda a: nn.init.kaiming_uniform_(torch.empty_like(a))),
                      "default a = 0"),
    "scaling r / alpha": (lora_class(scale=lambda r, a: r / a), "r / alpha, upside down"),
    "scaling twice": (lora_class(scale=lambda r, a: (a / r) ** 2), "applied twice"),
    "no scaling": (lora_class(scale=lambda r, a: 1.0), "scaling is missing"),
    "rsLoRA": (lora_class(scale=lambda r, a: a / math.sqrt(r)), "rsLoRA"),
    "bias dropped": (lora_class(forward=lambda s, x: x @ s.base_layer.weight.T + path(s, x)),
                     "bias is dropped"),
    "bias twice": (lora_class(forward=lambda s, x: s.base_layer(x) + path(s, x) + (
        0 if s.base_layer.bias is None else s.base_layer.bias)), "bias is added twice"),
    "ΔW transposed": (lora_class(forward=lambda s, x: s.base_layer(x) + path(s, x, transposed=True)),
                      "B A transposed"),
    "base trainable": (lora_class(freeze=False), "still requires grad"),
    "merge without scaling": (lora_class(merge=lambda s: s.base_layer.weight.add_(s.lora_B @ s.lora_A)),
                              "merge\\(\\) adds B A without the scaling"),
    "merge transposed": (lora_class(merge=lambda s: s.base_layer.weight.add_(s.delta().T)),
                         "transpose of B A"),
    "merged forward adds LoRA": (lora_class(forward=lambda s, x: s.base_layer(x) + x @ s.delta().T),
                                 "still adds the LoRA path"),
    "merge twice": (lora_class(guard=False), "adds B A again"),
    "unmerge does nothing": (lora_class(unmerge=lambda s: None), "unmerge\\(\\) did not change W"),
    "unmerge without scaling": (lora_class(unmerge=lambda s: s.base_layer.weight.sub_(s.lora_B @ s.lora_A)),
                                "subtracts B A without the scaling"),
}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_each_mistake_is_named(name):
    cls, message = MISTAKES[name]
    with pytest.raises(CheckFailure, match=message):
        check_lora_linear(cls)


def test_swapped_shapes_are_named_as_a_transpose():
    class Swapped(nn.Module):
        def __init__(self, base, r, alpha):
            super().__init__()
            self.base_layer = base.requires_grad_(False)
            self.in_features, self.out_features = base.in_features, base.out_features
            self.lora_A = nn.Parameter(torch.zeros(base.in_features, r, dtype=base.weight.dtype))
            self.lora_B = nn.Parameter(torch.zeros(r, base.out_features, dtype=base.weight.dtype))

        def forward(self, x):
            return self.base_layer(x)

    with pytest.raises(CheckFailure, match="That is the transpose"):
        check_lora_linear(Swapped)


# ----------------------------------------------------------------------------------------------
# refused, bad input, no raw error, no endless loop
# ----------------------------------------------------------------------------------------------


def test_course_lib_and_peft_are_refused_kindly():
    with pytest.raises(CheckFailure, match="a library's LoRA layer"):
        check_lora_linear(LoRALinear)

    class Sub(LoRALinear):
        pass

    with pytest.raises(CheckFailure, match="a library's LoRA layer"):
        check_lora_linear(Sub)
    from peft.tuners.lora import Linear as PeftLinear

    with pytest.raises(CheckFailure, match="a library's LoRA layer"):
        check_lora_linear(PeftLinear)

    class Inside(nn.Module):
        def __init__(self, base, r, alpha):
            super().__init__()
            self.inner = LoRALinear(base, r, alpha)

        def forward(self, x):
            return self.inner(x)

    with pytest.raises(CheckFailure, match="holds, a library's LoRA layer"):
        check_lora_linear(Inside)


@pytest.mark.parametrize("answer", [
    lambda base, r, alpha: 5,
    lambda base, r, alpha: nn.Identity(),
    lambda base, r, alpha: (_ for _ in ()).throw(ValueError("boom")),
])
def test_bad_answers_get_a_check_failure(answer):
    with pytest.raises(CheckFailure):
        check_lora_linear(answer)


def test_not_implemented_prints_a_reminder(capsys):
    class Stub(nn.Module):
        def __init__(self, base, r, alpha):
            super().__init__()
            raise NotImplementedError

    check_lora_linear(Stub)
    assert "not implemented yet" in capsys.readouterr().out


def test_an_endless_forward_is_stopped(monkeypatch):
    monkeypatch.setattr(lesson15_lora, "LIMIT_SECONDS", 1)

    def forever(self, x):
        while True:
            pass

    with pytest.raises(CheckFailure, match="more than 1 s"):
        check_lora_linear(lora_class(forward=forever))


def test_a_forward_cut_from_the_graph_is_named():
    with pytest.raises(CheckFailure, match="autograd graph"):
        check_lora_linear(lora_class(forward=lambda s, x: (s.base_layer(x) + x @ s.delta().T).detach()))
