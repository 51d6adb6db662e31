"""Lesson-12 hook checkers (course_lib/checks/lesson12_hooks.py: the ablation hook, the patching hook's
Debug exercise): right answers pass, each named mistake is caught, no hook is left behind."""

from __future__ import annotations

import pytest
import torch
from _helpers import passes

from course_lib import interp
from course_lib.checks import CheckFailure, check_ablation_hook, check_patching_hook
from course_lib.checks.lesson12_hooks import random_model
from course_lib.induction import repeated_tokens
from course_lib.solutions import solution_source
from course_lib.solutions.lesson12 import PATCHING_HOOK_BUG


def _solution(key: str) -> dict:
    """The names a solution block defines, run with nothing but ``torch`` imported: the notebook
    imports little, and a block is pasted into it as it stands."""
    namespace: dict = {"torch": torch}
    exec(solution_source(key), namespace)  # noqa: S102  (our own solution file)
    return namespace


# ----------------------------------------------------------------------------------------------
# 12.ablation_hook
# ----------------------------------------------------------------------------------------------


def ablation_variant(slicing="contiguous", shift=0, every=False, returns="tensor", in_place=False,
                     ignore_mean=False):
    """A learner's ablation hook, right by default; each option is one way to write it or get it
    wrong."""

    def make(head, num_heads, mean=None):
        def hook(module, args):
            x = args[0] if in_place else args[0].clone()
            B, T, D = x.shape
            hd = D // num_heads
            value = 0.0 if (mean is None or ignore_mean) else mean
            if every:
                x[...] = (x.view(B, T, num_heads, hd) * 0 + value).view(B, T, D)
            elif slicing == "contiguous":
                x.view(B, T, num_heads, hd)[:, :, head + shift] = value
            elif slicing == "interleaved":
                x[..., head::num_heads] = value
            elif slicing == "wrong view":
                x.view(B, T, hd, num_heads)[:, :, head] = 0.0
            if returns == "tensor":
                return x
            if returns == "tuple":
                return (x,)
            return None

        return hook

    return make


def ablation_loops(head, num_heads, mean=None):
    """float64 and a loop over positions, returning a 1-tuple."""

    def hook(module, args):
        x = args[0].double()
        hd = x.size(-1) // num_heads
        for t in range(x.size(1)):
            if mean is None:
                x[:, t, head * hd:(head + 1) * hd] = 0
            else:
                m = mean if mean.dim() == 1 else mean[t]
                x[:, t, head * hd:(head + 1) * hd] = m.double()
        return (x.float(),)

    return hook


@pytest.mark.parametrize("fn", [ablation_variant(), ablation_variant(returns="tuple"),
                                ablation_variant(in_place=True, returns="none"),
                                ablation_variant(in_place=True, returns="tensor"), ablation_loops])
def test_ablation_hook_styles_pass(fn):
    assert passes(check_ablation_hook, fn)


def test_ablation_hook_solution_passes(capsys):
    assert passes(check_ablation_hook, _solution("12.ablation_hook")["my_ablation_hook"])
    out = capsys.readouterr().out
    assert "check_ablation_hook: all 9 cases (4, 2 and 3 heads" in out and "in place" not in out


@pytest.mark.parametrize("returns", ["none", "tensor"])
def test_ablation_hook_in_place_passes_with_a_note(returns, capsys):
    """Changing args[0] in place works in this model: accepted, with a note to clone instead."""
    assert passes(check_ablation_hook, ablation_variant(in_place=True, returns=returns))
    out = capsys.readouterr().out
    assert "all 9 cases" in out and "changes args[0], the tensor PyTorch passed in, in place" in out


def test_ablation_hook_head_dim_written_in_is_named():
    def fixed_32(head, num_heads, mean=None):
        def hook(module, args):
            x = args[0].clone()
            x[..., head * 32:(head + 1) * 32] = 0.0 if mean is None else mean
            return x
        return hook

    with pytest.raises(CheckFailure, match=r"head_dim is written in as 32.*size\(-1\) // num_heads"):
        check_ablation_hook(fixed_32)


@pytest.mark.parametrize("fn, words", [
    (ablation_variant(slicing="interleaved"), "interleaved slicing"),
    (ablation_variant(shift=1), "off by one head: you ablated the next head"),
    (ablation_variant(every=True), "every head is ablated"),
    (ablation_variant(returns="none"), "Your hook changed nothing.*returns the new input"),
    (ablation_variant(ignore_mean=True), "the mean is ignored"),
    (ablation_variant(slicing="wrong view"), "the view has its axes the wrong way round"),
])
def test_ablation_hook_mistakes_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_ablation_hook(fn)


def _raising_hook(head, num_heads, mean=None):
    def hook(module, args):
        raise RuntimeError("boom")
    return hook


@pytest.mark.parametrize("fn, words", [
    (_raising_hook, "Your hook raised RuntimeError inside out_proj"),
    (lambda head, num_heads, mean=None: 1 / 0, "raised ZeroDivisionError"),
    (lambda head, num_heads, mean=None: "hook", "not a hook"),
    (lambda head, num_heads, mean=None: (lambda module, args: "garbage"), "Your hook raised"),
    (lambda head, num_heads, mean=None: (lambda module, args: torch.zeros(2)),
     r"Your hook returned a tensor of shape \(2,\), but out_proj's input has shape \(3, 10, 48\)"),
    (lambda head, num_heads, mean=None: (lambda module, args: args[0] * 2), "differs"),
    (lambda head, num_heads, mean=None: interp.ablation_hook(head, num_heads, mean),
     "calls course_lib's interp.ablation_hook"),
    (interp.ablation_hook, "course_lib's own functions"),
])
def test_ablation_hook_bad_answers_get_a_check_failure(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_ablation_hook(fn)


def test_ablation_hook_leaves_no_hook_behind_when_the_learners_hook_raises(monkeypatch):
    from course_lib.checks import lesson12_hooks as hooks

    made = []
    original = hooks.random_model

    def spy(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(hooks, "random_model", spy)
    with pytest.raises(CheckFailure):
        check_ablation_hook(_raising_hook)
    with pytest.raises(CheckFailure):
        check_ablation_hook(ablation_variant(shift=1))
    assert made and all(hooks.hooks_on(m) == 0 for m in made)


def test_ablation_hook_stub(capsys):
    def my_ablation_hook(head, num_heads, mean=None):
        raise NotImplementedError

    check_ablation_hook(my_ablation_hook)
    assert "not implemented yet" in capsys.readouterr().out


def test_ablation_hook_stub_inside_the_hook(capsys):
    """The lesson's stub raises inside the inner hook, that is inside out_proj's forward."""

    def my_ablation_hook(head, num_heads, mean=None):
        def hook(module, args):
            raise NotImplementedError

        return hook

    check_ablation_hook(my_ablation_hook)
    assert "not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# 12.patching_hook (debug)
# ----------------------------------------------------------------------------------------------


def _bug() -> dict:
    namespace: dict = {}
    exec(PATCHING_HOOK_BUG, namespace)  # noqa: S102  (the lesson's buggy hook)
    return namespace


def patching_variant(head_shift=0, source_shift=0, position_shift=0, all_positions=False,
                     every_head=False, zeros=False, returns="tensor"):
    """A learner's patching hook, right by default; each option is one way to get it wrong."""

    def make(head, num_heads, clean, position=None):
        def hook(module, args):
            x = args[0].clone()
            z = x.view(*x.shape[:2], num_heads, -1)  # (B, T, h, hd)
            where = slice(None) if (position is None or all_positions) else position + position_shift
            which = slice(None) if every_head else head + head_shift
            source = clean[:, where, head + source_shift] if not every_head else clean[:, where]
            z[:, where, which] = 0.0 if zeros else source
            return x if returns == "tensor" else (x,)

        return hook

    return make


def patching_in_place(head, num_heads, clean, position=None):
    """In place on args[0], one position at a time, returning nothing: also right."""

    def hook(module, args):
        z = args[0].view(*args[0].shape[:2], num_heads, -1)
        for t in range(z.size(1)) if position is None else [position]:
            z[:, t, head] = clean[:, t, head]

    return hook


@pytest.mark.parametrize("fn", [patching_variant(), patching_variant(returns="tuple"),
                                patching_in_place])
def test_patching_hook_styles_pass(fn):
    assert passes(check_patching_hook, fn)


def test_patching_hook_solution_passes(capsys):
    assert passes(check_patching_hook, _solution("12.patching_hook")["my_patching_hook"])
    assert "check_patching_hook: all 9 cases (4, 2 and 3 heads)" in capsys.readouterr().out


def _code(text: str) -> list[str]:
    """The lines of ``text`` without comments (whole-line or trailing) and blank lines."""
    lines = [line.split("  #")[0].rstrip() for line in text.splitlines()]
    return [line for line in lines if line.strip() and not line.strip().startswith("#")]


def test_patching_hook_solution_is_the_bug_fixed():
    """The solution is the given code with one line changed: `if position is not None:`."""
    fixed, bug = _code(solution_source("12.patching_hook")), _code(PATCHING_HOOK_BUG)
    assert [line for line in fixed if line not in bug] == ["        if position is not None:"]
    assert [line for line in bug if line not in fixed] == ["        if position:"]


def test_patching_hook_bug_is_observed_not_given_away():
    with pytest.raises(CheckFailure) as failure:
        check_patching_hook(_bug()["my_patching_hook"])
    message = str(failure.value)
    assert "With position=0 your hook changed the corrupted run as if no position were given" in message
    assert "is not None" not in message and "falsy" not in message and "truth" not in message


def test_the_bug_passes_every_case_but_position_zero():
    """The bug is right wherever position is None or positive: only position 0 shows it."""
    from course_lib.checks import lesson12_hooks as hooks

    model = random_model(seed=3)
    x = repeated_tokens(2, 5, model.config.vocab_size, torch.Generator().manual_seed(1))
    z = interp.head_outputs(model, x)[1]
    bug = _bug()["my_patching_hook"]
    for position in (None, 1, 4):
        with interp.hooked(model, 1, bug(2, 4, z, position)):
            got = model(x)
        with interp.hooked(model, 1, interp.patching_hook(2, 4, z, position)):
            expected = model(x)
        torch.testing.assert_close(got, expected)
    assert hooks._POSITION_ZERO


@pytest.mark.parametrize("fn, words", [
    (patching_variant(every_head=True), "every head is patched"),
    (patching_variant(position_shift=1), r"wrong position: you patched position 5, not 4"),
    (patching_variant(all_positions=True), "patched every position, though position=4"),
    (patching_variant(source_shift=1), "patched from the wrong tensor: you wrote head 2's"),
    (patching_variant(zeros=True), "patched from the wrong tensor: you wrote zeros"),
    (patching_variant(head_shift=-1), "off by one head: you wrote head 1's clean output into head 0"),
    (patching_variant(head_shift=1, source_shift=1), "off by one head: you patched head 2, not head 1"),
])
def test_patching_hook_mistakes_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_patching_hook(fn)


@pytest.mark.parametrize("fn, words", [
    (lambda head, num_heads, clean, position=None: None, "not a hook"),
    (lambda head, num_heads, clean, position=None: (lambda m, a: a[0][:, :, :3]),
     r"Your hook returned a tensor of shape \(3, 10, 3\).*return it in the shape it came in"),
    (lambda head, num_heads, clean, position=None: (
        lambda m, a: a[0].clone().view(*a[0].shape[:2], num_heads, -1)),
     r"shape \(3, 10, 4, 12\), but out_proj's input has shape \(3, 10, 48\)"),
    (lambda head, num_heads, clean, position=None: (lambda m, a: 1 / 0), "ZeroDivisionError"),
    (lambda head, num_heads, clean, position=None: interp.patching_hook(head, num_heads, clean,
                                                                        position),
     "calls course_lib's interp.patching_hook"),
])
def test_patching_hook_bad_answers_get_a_check_failure(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_patching_hook(fn)


def test_patching_hook_stub(capsys):
    def my_patching_hook(head, num_heads, clean, position=None):
        raise NotImplementedError

    check_patching_hook(my_patching_hook)
    assert "not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# Issue 39's learner tryout: each finding, fixed
# ----------------------------------------------------------------------------------------------


def _four_heads_written_in(head, num_heads, mean=None):
    def hook(module, args):
        z = args[0].clone().view(*args[0].shape[:2], 4, -1)  # 4 written in
        z[:, :, head] = 0.0 if mean is None else mean
        return z.view(args[0].shape)
    return hook


def _four_heads_patch(head, num_heads, clean, position=None):
    def hook(module, args):
        z = args[0].clone().view(*args[0].shape[:2], 4, -1)  # 4 written in
        where = slice(None) if position is None else position
        z[:, where, head] = clean[:, where, head]
        return z.view(args[0].shape)
    return hook


def test_a_hook_that_ignores_num_heads_fails_both_checkers():
    with pytest.raises(CheckFailure, match=r"right for the lesson's 4 heads but not for 2 heads"
                                           r"|number of heads is written in as 4"):
        check_ablation_hook(_four_heads_written_in)
    with pytest.raises(CheckFailure, match=r"right for the lesson's 4 heads but not for 2 heads"):
        check_patching_hook(_four_heads_patch)


def test_if_mean_on_a_tensor_is_named():
    def truthy(head, num_heads, mean=None):
        def hook(module, args):
            z = args[0].clone().view(*args[0].shape[:2], num_heads, -1)
            z[:, :, head] = mean if mean else 0.0  # the bug: the truth of a tensor
            return z.view(args[0].shape)
        return hook

    with pytest.raises(CheckFailure, match=r"asked for the truth of a tensor.*mean is None"):
        check_ablation_hook(truthy)


def test_subtracting_the_mean_is_named():
    def subtracts(head, num_heads, mean=None):
        def hook(module, args):
            z = args[0].clone().view(*args[0].shape[:2], num_heads, -1)
            if mean is None:
                z[:, :, head] = 0.0
            else:
                z[:, :, head] -= mean
            return z.view(args[0].shape)
        return hook

    with pytest.raises(CheckFailure, match="the mean is subtracted"):
        check_ablation_hook(subtracts)


def test_an_in_place_patching_hook_gets_the_same_note_as_the_ablation_hook(capsys):
    assert passes(check_patching_hook, patching_in_place)
    out = capsys.readouterr().out
    assert "all 9 cases" in out and "changes args[0], the tensor PyTorch passed in, in place" in out
