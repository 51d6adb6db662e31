"""Lesson-12 checkers: correct answers in several styles pass, each named mistake is named, a stub
gets the reminder, and a broken answer gets a CheckFailure, never a raw error."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _helpers import assert_checkers_keep_random_state, passes

from course_lib import interp
from course_lib.checks import (
    check_ablation_hook, check_induction_score, check_ov_circuit, check_patching_hook,
    check_patching_table, check_predict_ablation,
)
from course_lib.checks._common import CheckFailure
from course_lib.checks.inside import _random_model, measure_ablation_losses
from course_lib.induction import load_checkpoint, repeated_tokens
from course_lib.solutions import predicted_answer, solution_source
from course_lib.solutions.lesson12 import PATCHING_HOOK_BUG


def _solution(key: str) -> dict:
    """The names a solution block defines, run with nothing but ``torch`` imported: the notebook
    imports little, and a block is pasted into it as it stands."""
    namespace: dict = {"torch": torch}
    exec(solution_source(key), namespace)  # noqa: S102  (our own solution file)
    return namespace


def test_the_solution_file_imports_and_defines_every_block():
    module = importlib.import_module("course_lib.solutions.lesson12")
    for name in ("my_induction_score", "predicted_ablation_losses", "my_ablation_hook", "my_patching_hook",
                 "my_patching_table", "my_full_ov_circuit"):
        assert callable(getattr(module, name))


def _stub(*args, **kwargs):
    raise NotImplementedError


# ----------------------------------------------------------------------------------------------
# 12.induction_score
# ----------------------------------------------------------------------------------------------


def score_loops(pattern, length):
    """One sequence, one head, one position at a time, in float64."""
    B, h, T, _ = pattern.shape
    out = torch.zeros(h, dtype=torch.float64)
    for b in range(B):
        for head in range(h):
            for i in range(length, 2 * length):
                out[head] += pattern[b, head, i, i - length + 1].double()
    return out / (B * length)


def score_einsum(pattern, length):
    T = pattern.size(-1)
    pick = torch.zeros(T, T, dtype=pattern.dtype)
    for i in range(length, 2 * length):
        pick[i, i - length + 1] = 1.0 / length  # the induction stripe, averaged
    return torch.einsum("bhij,ij->h", pattern, pick) / pattern.size(0)


@pytest.mark.parametrize("fn", [score_loops, score_einsum,
                                lambda p, n: score_einsum(p.double(), n),
                                lambda p, n: torch.stack([score_loops(p[b:b + 1], n)
                                                          for b in range(p.size(0))]).mean(0)],
                         ids=["loops", "einsum", "einsum float64", "one sequence at a time"])
def test_induction_score_styles_pass(fn):
    assert passes(check_induction_score, fn)


def test_induction_score_solution_passes(capsys):
    assert passes(check_induction_score, _solution("12.induction_score")["my_induction_score"])
    assert "check_induction_score: all 5 cases" in capsys.readouterr().out


def _diag(p, n):
    return p.diagonal(offset=-(n - 1), dim1=-2, dim2=-1)  # (B, h, n + 1): queries n-1 .. 2n-1


@pytest.mark.parametrize("fn, words", [
    (lambda p, n: p.diagonal(offset=-n, dim1=-2, dim2=-1).mean(dim=(0, 2)), "duplicate-token"),
    (lambda p, n: _diag(p, n).mean(dim=(0, 2)), "whole sequence"),
    (lambda p, n: torch.stack([p[:, :, i, i - n + 1] if i >= n - 1 else torch.zeros(p.shape[:2])
                               for i in range(2 * n)], -1).mean(dim=(0, 2)), "every query"),
    (lambda p, n: _diag(p.transpose(-1, -2), n)[..., 1:].mean(dim=(0, 2)), "swapped"),
    (lambda p, n: _diag(p, n)[..., 1:].mean(), "not over the heads"),
    (lambda p, n: _diag(p, n)[..., 1:].mean(dim=-1), r"average over the batch too"),
    (lambda p, n: _diag(p, n)[..., :n].mean(dim=(0, 2)), "shifted by one"),
    (lambda p, n: _diag(p, n)[..., 1:n].mean(dim=(0, 2)), "last query is missing"),
    (lambda p, n: _diag(p, n)[..., 2:].mean(dim=(0, 2)), r"first query .* is missing"),
    (lambda p, n: _diag(p, n)[..., 1:].sum(dim=-1).mean(0), "summed over the positions"),
    (lambda p, n: _diag(p, 5)[..., 1:].mean(dim=(0, 2)), r"Only works for one length: right with "
                                                         r"length n = \[5\]"),
    (lambda p, n: _diag(p, n)[..., 1:].mean(dim=(0, 2)) + 0.01, "largest difference 0.01"),
    (lambda p, n: _diag(p, n)[..., 1:].sum(dim=-1).mean(0) / (2 * n), "divided by all 2n query"),
    (lambda p, n: _diag(p, 20)[..., 1:].mean(dim=(0, 2)), r"Only works for one length: right with "
                                                          r"length n = \[20\], wrong with n = 5"),
    (lambda p, n: p[:, :, torch.arange(20, 40), torch.arange(1, 21)].mean(dim=(0, 2)),
     r"Only works for one length: right with length n = \[20\]"),
    # right on random patterns up to 1e-3 of rounding, wrong on exact 1/0 heads: the exact case
    (lambda p, n: _diag(p, n)[..., 1:].clamp(max=0.999).mean(dim=(0, 2)), "exactly 1"),
])
def test_induction_score_mistakes_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_induction_score(fn)


@pytest.mark.parametrize("fn, words", [
    (lambda p, n: 1 / 0, "raised ZeroDivisionError"),
    (lambda p, n: "0.5", "should be a torch.Tensor"),
    (lambda p, n: torch.zeros(p.size(1), dtype=torch.long), "float tensor"),
    (lambda p, n: torch.full((p.size(1),), float("nan")), "NaN"),
    (lambda p, n: None, "should be a torch.Tensor"),
    (interp.induction_score, "course_lib's own functions"),
    (lambda p, n: interp.induction_score(p, n), "calls course_lib's interp.induction_score"),
])
def test_induction_score_bad_answers_get_a_check_failure(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_induction_score(fn)


# ----------------------------------------------------------------------------------------------
# 12.predict_ablation
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ablation():
    return measure_ablation_losses()


def test_predict_ablation_solution_passes(capsys):
    assert passes(check_predict_ablation, _solution("12.predict_ablation")["predicted_ablation_losses"])
    out = capsys.readouterr().out
    assert "check_predict_ablation: right" in out and "all four read it through their keys" in out


def test_predict_ablation_measures_what_the_lesson_measures(ablation):
    """The checker's truth is the lesson's ablation cell: its 64 rows, zero ablation, the repeated
    copy's loss with the copy's first token kept; head 0.3 is the checkpoint's previous-token head."""
    model, _ = load_checkpoint()
    n = 20
    ids = repeated_tokens(64, n, 64, torch.Generator().manual_seed(0))
    scores = interp.head_scores(model, ids)
    assert int(scores["previous_token"].argmax()) == 3  # layer 0, head 3
    assert scores["induction"][1].min() > 0.8
    with interp.hooked(model, 0, interp.ablation_hook(3, 4)):
        head_0_3 = F.cross_entropy(model(ids[:, :-1])[:, n - 1:].transpose(1, 2), ids[:, n:]).item()
    assert ablation["head_0_3"] == pytest.approx(head_0_3, abs=1e-5)
    assert ablation["clean"] < 0.5 and 2 * ablation["clean"] < min(ablation["induction_heads"])
    assert max(ablation["induction_heads"]) < ablation["head_0_3"] < ablation["first_copy"]


def test_predict_ablation_answer_and_bands_hold_with_margin(ablation):
    """The solution's reasoned estimate is inside each band with room to spare, and every single
    induction head's loss (not only their mean) is inside the second band, so a learner who thinks
    of one particular head passes."""
    from course_lib.checks.inside import ABLATION_BANDS

    head_0_3, one_head = predicted_answer("12.predict_ablation")
    assert abs(head_0_3 - ablation["head_0_3"]) < 0.5 * ABLATION_BANDS["head_0_3"]
    assert abs(one_head - ablation["induction_head"]) < 0.5 * ABLATION_BANDS["induction_head"]
    assert all(abs(v - ablation["induction_head"]) < ABLATION_BANDS["induction_head"] - 0.2
               for v in ablation["induction_heads"])


@pytest.mark.parametrize("answer", [
    (3.0, 1.2), [2.5, 1.0], (3, 1), (2.9, 1.78), (2.9, 1.04),
    torch.tensor([3.0, 1.2]), torch.tensor([3.0, 1.2], dtype=torch.float64), torch.tensor([[3.0], [1.2]]),
    np.array([3.0, 1.2]), (np.float32(3.0), torch.tensor(1.2)), (torch.tensor([3.0]), np.array([1.2])),
    (np.int64(3), 1),
], ids=lambda a: type(a).__name__)
def test_predict_ablation_any_form_of_two_numbers_passes(answer):
    assert passes(check_predict_ablation, answer)
    assert passes(check_predict_ablation, lambda: answer)


@pytest.mark.parametrize("answer, mistake, words", [
    ((0.38, 0.38), "removing a head changes nothing", "about the clean loss.*for both"),
    ((0.4, 1.4), "head 0.3 does not matter", "as if the head did not matter.*through others"),
    ((1.2, 0.9), "head 0.3 too low", "1.20 is too low.*weakens all four at once"),
    ((4.4, 1.4), "head 0.3: all of the copy lost", "about the first copy's loss.*heads 0.0 and 0.1"),
    ((math.log(64), 1.4), "head 0.3: all of the copy lost", "that is ln 64.*not all of the copy"),
    ((5.0, 1.4), "head 0.3: all of the copy lost", "5.00 is too high"),
    ((3.0, 0.4), "one induction head: no change", "as if three heads could carry the copy alone"),
    ((3.0, 0.6), "one induction head too low", "0.60 is too low.*share the push"),
    ((3.8, 3.0), "one induction head: copy lost", "3.00 is too high.*Three induction heads are left"),
    ((5.0, 4.4), "head 0.3: all of the copy lost, one induction head: copy lost",
     "5.00 is too high.*4.40 is too high"),
    ((1.0, 3.0), "one induction head above head 0.3", r"at least as much.*Swapped\?"),
    ((1.4, 2.9), "one induction head above head 0.3", r"Swapped\?"),
    ((2.0, 2.0), "one induction head above head 0.3", "at least as much as removing head 0.3"),
    ((0.8, 4.0), "one induction head above head 0.3", "three still copy"),
    ((75, 25), "not in nats", "more than three times.*not in percent"),
    ((0.4, 4.0), "head 0.3 does not matter, one induction head: copy lost",
     "did not matter.*4.00 is too high"),
])
def test_predict_ablation_likely_wrong_answers_are_named(answer, mistake, words):
    with pytest.raises(CheckFailure, match=words) as failure:
        check_predict_ablation(lambda: answer)
    assert failure.value.mistake == mistake
    if "Swapped" not in words:
        assert "Swapped" not in str(failure.value)


@pytest.mark.parametrize("answer, words", [
    ("3.0, 1.2", "got str"),
    (None, "got NoneType"),
    (2.5, "Return two numbers"),
    (True, "got bool"),
    (float("nan"), "Return two numbers"),
    (torch.tensor(2.0), "exactly two numbers.*got 1"),
    (torch.tensor([1.0, 2.0, 3.0]), "exactly two numbers.*got 3"),
    ((3.0,), "exactly two numbers.*got 1"),
    ((float("nan"), 1.0), "is nan: return a finite number"),
    ((3.0, float("inf")), "is inf: return a finite number"),
    ((-1.0, 1.0), "never negative"),
    ((3.0, "1.2"), "second number.*got str"),
    ((True, 1.0), "first number.*got bool"),
    ((3.0, None), "second number.*got NoneType"),
    ((3.0, torch.tensor([1.0, 2.0])), "one number: the mean"),
    ((2.9, [1.8, 1.7, 1.1, 1.0]), "one number: the mean"),
    ({"head 0.3": 3.0, "induction": 1.2}, "not a dict"),
    ({3.0, 1.2}, "a set has no order"),
    (object(), "got object"),
    (lambda: {}["x"], "raised KeyError"),
])
def test_predict_ablation_bad_input_gets_a_message_not_a_raw_error(answer, words):
    with pytest.raises(CheckFailure, match=words):
        check_predict_ablation(answer if callable(answer) else (lambda: answer))


def test_predict_ablation_refuses_course_lib_and_accepts_a_value():
    with pytest.raises(CheckFailure, match="course_lib's own functions"):
        check_predict_ablation(interp.loss_per_position)
    assert passes(check_predict_ablation, (3.0, 1.2))


def test_predict_ablation_stub(capsys):
    def predicted_ablation_losses():
        raise NotImplementedError

    check_predict_ablation(predicted_ablation_losses)
    assert "not implemented yet" in capsys.readouterr().out


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
    from course_lib.checks import inside

    made = []
    original = inside._random_model

    def spy(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(inside, "_random_model", spy)
    with pytest.raises(CheckFailure):
        check_ablation_hook(_raising_hook)
    with pytest.raises(CheckFailure):
        check_ablation_hook(ablation_variant(shift=1))
    assert made and all(inside._hooks_on(m) == 0 for m in made)


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
    from course_lib.checks import inside

    model = _random_model(seed=3)
    x = repeated_tokens(2, 5, model.config.vocab_size, torch.Generator().manual_seed(1))
    z = interp.head_outputs(model, x)[1]
    bug = _bug()["my_patching_hook"]
    for position in (None, 1, 4):
        with interp.hooked(model, 1, bug(2, 4, z, position)):
            got = model(x)
        with interp.hooked(model, 1, interp.patching_hook(2, 4, z, position)):
            expected = model(x)
        torch.testing.assert_close(got, expected)
    assert inside._POSITION_ZERO


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
# 12.patching_table (★★★)
# ----------------------------------------------------------------------------------------------


def table_variant(normalise=True, reverse=False, negate=False, swap=False, whole=False,
                  own_targets=False, whole_layer=False, leave_hooks=False, per_row=False,
                  late=False, no_grad=True, float64=False):
    """A learner's patching table written with interp's tools; right by default, each option one
    way to get it wrong (or, for no_grad and float64, another right way)."""

    def loss_rows(model, ids, targets, n):
        logits = model(ids[:, :-1])
        if float64:
            logits = logits.double()
        if whole:
            return F.cross_entropy(logits.transpose(1, 2), targets[:, 1:], reduction="none")
        if late:
            return F.cross_entropy(logits[:, n:].transpose(1, 2), targets[:, n + 1:], reduction="none")
        return F.cross_entropy(logits[:, n - 1:].transpose(1, 2), targets[:, n:], reduction="none")

    def table(model, clean, corrupted):
        c = model.config
        n = clean.size(1) // 2
        base, source = (clean, corrupted) if swap else (corrupted, clean)
        src_z = interp.head_outputs(model, source[:, :-1])
        base_targets = corrupted if own_targets else clean

        def loss(ids, targets):
            rows = loss_rows(model, ids, targets, n).mean(dim=1)  # (B,)
            return rows if per_row else rows.mean()

        low, high = loss(corrupted, base_targets), loss(clean, clean)
        out = torch.zeros(c.num_layers, c.num_heads, dtype=torch.float64 if float64 else torch.float32)
        for layer in range(c.num_layers):
            for head in range(c.num_heads):
                if whole_layer:
                    def hook(m, a, z=src_z[layer]):
                        return z.reshape(a[0].shape)
                else:
                    hook = interp.patching_hook(head, c.num_heads, src_z[layer])
                if leave_hooks:
                    model.blocks.layers[layer].self_attn.out_proj.register_forward_pre_hook(hook)
                    patched = loss(base, base_targets if not swap else clean)
                else:
                    with interp.hooked(model, layer, hook):
                        patched = loss(base, base_targets if not swap else clean)
                value = (low - patched) if not normalise else (low - patched) / (low - high)
                if swap:
                    value = (low - patched) / (low - high)
                if reverse:
                    value = 1 - value
                if negate:
                    value = -value
                out[layer, head] = value.mean().detach()
        return out

    if no_grad:
        return torch.no_grad()(table)
    return table


def test_patching_table_solution_passes(capsys):
    assert passes(check_patching_table, _solution("12.patching_table")["my_patching_table"])
    assert "check_patching_table: both models" in capsys.readouterr().out


@torch.no_grad()
def table_full_runs(model, clean, corrupted):
    """Whole sequences through the model (the last position's logits dropped), the learner's own
    hooks, one row at a time for the losses, summed: also right."""
    L, h = model.config.num_layers, model.config.num_heads
    n = clean.size(1) // 2
    projections = [block.self_attn.out_proj for block in model.blocks.layers]
    kept = [None] * L

    def second_half_sum(ids):
        logits = model(ids)[:, n - 1:-1]  # (B, n, V): the predictions of tokens n .. 2n-1
        return sum(F.cross_entropy(logits[b], clean[b, n:], reduction="sum") for b in range(len(ids)))

    handles = [p.register_forward_pre_hook(lambda m, a, i=i: kept.__setitem__(i, a[0].clone()))
               for i, p in enumerate(projections)]
    high = second_half_sum(clean)
    for handle in handles:
        handle.remove()
    low = second_half_sum(corrupted)
    table = torch.empty(L, h)
    for layer in range(L):
        hd = kept[layer].size(-1) // h
        for head in range(h):
            def patch(m, a, layer=layer, head=head):
                a[0][..., head * hd:(head + 1) * hd] = kept[layer][..., head * hd:(head + 1) * hd]

            handle = projections[layer].register_forward_pre_hook(patch)
            table[layer, head] = (low - second_half_sum(corrupted)) / (low - high)
            handle.remove()
    return table


@pytest.mark.parametrize("fn", [table_variant(), table_variant(no_grad=False, float64=True),
                                table_full_runs],
                         ids=["interp's tools", "float64, no no_grad", "whole runs, own hooks"])
def test_patching_table_styles_pass(fn):
    assert passes(check_patching_table, fn)


@pytest.mark.parametrize("fn, words", [
    (table_variant(normalise=False), "not normalised"),
    (table_variant(reverse=True), r"sign is reversed \(you computed 1 - fraction"),
    (table_variant(negate=True), "sign is reversed"),
    (table_variant(swap=True), "direction is swapped"),
    (table_variant(whole=True), "scored over the whole sequence"),
    (table_variant(whole=True, own_targets=True), "against the corrupted run's own tokens"),
    (table_variant(late=True), "scored one position late"),
    (table_variant(whole_layer=True), "patched the whole layer"),
    (table_variant(per_row=True), "averaged over rows"),
    (table_variant(leave_hooks=True), r"left \d+ hook\(s\) registered"),
], ids=["raw drop", "1 - x", "-x", "clean<->corrupted", "whole sequence", "corrupted tokens",
        "one late", "whole layer", "per row", "hooks left"])
def test_patching_table_mistakes_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_patching_table(fn)


@pytest.mark.parametrize("fn, words", [
    (lambda model, clean, corrupted: torch.zeros(3, 2), r"Wrong output shape.*\(3, 2\), expected "
                                                        r"\(num_layers, num_heads\) = \(2, 4\)"),
    (lambda model, clean, corrupted: (table_variant()(model, clean, corrupted)
                                      if model.config.num_heads == 4 else torch.zeros(2, 4)),
     r"Wrong output shape \(a random attention-only model with 3 layers of 2 heads.*\(2, 4\), "
     r"expected \(num_layers, num_heads\) = \(3, 2\): read both from model.config"),
    (lambda model, clean, corrupted: [[0.0] * 4] * 2, "should be a torch.Tensor"),
    (lambda model, clean, corrupted: model(clean), "Wrong output shape"),
    (lambda model, clean, corrupted: 1 / 0, "raised ZeroDivisionError"),
    (lambda model, clean, corrupted: interp.patching_table(model, clean, corrupted),
     "calls course_lib's interp.patching_table"),
    (interp.patching_table, "course_lib's own functions"),
])
def test_patching_table_bad_answers_get_a_check_failure(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_patching_table(fn)


def test_patching_table_stub(capsys):
    def my_patching_table(model, clean, corrupted):
        raise NotImplementedError

    check_patching_table(my_patching_table)
    assert "not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# all checkers
# ----------------------------------------------------------------------------------------------


def test_checkers_leave_the_global_random_state_alone():
    pairs = [(check_induction_score, _solution("12.induction_score")["my_induction_score"]),
             (check_ablation_hook, _solution("12.ablation_hook")["my_ablation_hook"]),
             (check_patching_hook, _solution("12.patching_hook")["my_patching_hook"]),
             (check_predict_ablation, _solution("12.predict_ablation")["predicted_ablation_losses"])]
    assert_checkers_keep_random_state(pairs)


@pytest.mark.parametrize("check, answer", [
    (check_induction_score, lambda p, n: [None for _ in iter(int, 1)]),
    (check_ablation_hook, lambda head, num_heads, mean=None: (lambda m, a: [0 for _ in iter(int, 1)])),
    (check_patching_table, lambda model, clean, corrupted: [0 for _ in iter(int, 1)]),
    (check_ov_circuit, lambda model, layer, head: [0 for _ in iter(int, 1)]),
    (check_predict_ablation, lambda: [0 for _ in iter(int, 1)]),
])
def test_a_loop_that_never_ends_is_stopped(monkeypatch, check, answer):
    from course_lib.checks import inside

    monkeypatch.setattr(inside, "TIME_LIMITS", {k: 0.5 for k in inside.TIME_LIMITS})
    with pytest.raises(CheckFailure, match="ran for more than 0.5 s and was stopped"):
        check(answer)


def test_every_exercise_has_a_solution_to_show(capsys):
    from course_lib.solutions import show_solution, solution_keys

    keys = ["12.ablation_hook", "12.induction_score", "12.ov_circuit", "12.patching_hook",
            "12.patching_table", "12.predict_ablation"]
    assert solution_keys("12") == keys
    for key in keys:
        show_solution(key)
        assert f"# Solution {key}" in capsys.readouterr().out


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


def _table_with(patch_from=None, crop_clean=True, formula=None):
    """The solution's table, with one tryout mistake: patch only from position ``patch_from`` on,
    read the clean run on the uncropped input, or another ``formula(low, high, patched)``."""

    def table(model, clean, corrupted):
        num_layers, h = model.config.num_layers, model.config.num_heads
        n = clean.size(1) // 2

        def loss(ids, layer=None, hook=None):
            if hook is None:
                logits = model(ids[:, :-1])
            else:
                with interp.hooked(model, layer, hook):
                    logits = model(ids[:, :-1])
            return F.cross_entropy(logits[:, n - 1:].transpose(1, 2), clean[:, n:]).item()

        zs = interp.head_outputs(model, clean[:, :-1] if crop_clean else clean)
        low, high = loss(corrupted), loss(clean)
        out = torch.zeros(num_layers, h)
        for layer in range(num_layers):
            for head in range(h):
                def hook(module, args, layer=layer, head=head):
                    z = args[0].clone().view(*args[0].shape[:2], h, -1)
                    where = slice(None) if patch_from is None else slice(patch_from(n), None)
                    z[:, where, head] = zs[layer][:, where, head]
                    return z.view(args[0].shape)
                x = loss(corrupted, layer, hook)
                out[layer, head] = (formula or (lambda lo, hi, p: (lo - p) / (lo - hi)))(low, high, x)
        return out

    return table


@pytest.mark.parametrize("fn, words", [
    (_table_with(), None),
    (_table_with(patch_from=lambda n: n - 1), r"only positions n-1 \.\. 2n-2 are patched"),
    (_table_with(formula=lambda lo, hi, p: 1 - p / lo), r"1 - patched / corrupted"),
    (_table_with(crop_clean=False), r"two lengths meet: 2n = 24 positions .* and 2n-1 = 23"),
])
def test_patching_table_tryout_mistakes_are_named(fn, words):
    if words is None:
        assert passes(check_patching_table, fn)
        return
    with pytest.raises(CheckFailure, match=words):
        check_patching_table(fn)


def test_patching_table_uncropped_logits_are_named():
    def uncropped(model, clean, corrupted):
        n = clean.size(1) // 2
        logits = model(corrupted)  # (B, 2n, V): one too many
        return F.cross_entropy(logits[:, n - 1:].transpose(1, 2), clean[:, n:])

    with pytest.raises(CheckFailure, match=r"n \+ 1 = 13 predictions met n = 12 targets"):
        check_patching_table(uncropped)


# ----------------------------------------------------------------------------------------------
# 12.ov_circuit (★★★)
# ----------------------------------------------------------------------------------------------


def ov_variant(center=True, gain=True, final_gain=True, transpose=False, kv_rule=True, einsum=False):
    """A learner's full OV circuit, right by default; each option is one way to get it wrong."""

    def make(model, layer, head):
        block = model.blocks.layers[layer]
        attn = block.self_attn
        hd = attn.head_dim
        kv = head // (attn.num_heads // attn.num_kv_heads) if kv_rule else head
        w_e = model.embed.token.embedding.weight.detach().double()
        x = w_e - w_e.mean(-1, keepdim=True) if center else w_e
        if gain:
            x = x * block.norm1.weight.detach().double()
        w_v = attn.v_proj.weight.detach().double()[kv * hd:(kv + 1) * hd]  # (hd, d)
        w_o = attn.out_proj.weight.detach().double()[:, head * hd:(head + 1) * hd]  # (d, hd)
        w_u = model.lm_head.weight.detach().double()
        if final_gain:
            w_u = w_u * model.blocks.norm.weight.detach().double()
        if einsum:
            out = torch.einsum("ad,kd,ek,ve->av", x, w_v, w_o, w_u)
        else:
            out = x @ w_v.T @ w_o.T @ w_u.T
        return out.T if transpose else out

    return make


def ov_loops(model, layer, head):
    """One token at a time, float32."""
    rows = [ov_variant()(model, layer, head)[a] for a in range(model.config.vocab_size)]
    return torch.stack(rows).float()


@pytest.mark.parametrize("fn", [ov_variant(), ov_variant(einsum=True), ov_loops,
                                lambda m, l, h: ov_variant()(m, l, h).float()])
def test_ov_circuit_styles_pass(fn):
    assert passes(check_ov_circuit, fn)


def test_ov_circuit_solution_passes(capsys):
    assert passes(check_ov_circuit, _solution("12.ov_circuit")["my_full_ov_circuit"])
    assert "check_ov_circuit: all 7 heads" in capsys.readouterr().out


@pytest.mark.parametrize("fn, words", [
    (ov_variant(center=False), "not centred"),
    (ov_variant(gain=False), "layer's LayerNorm gain"),
    (ov_variant(final_gain=False), "final LayerNorm's gain"),
    (ov_variant(gain=False, final_gain=False), "both LayerNorm gains are missing"),
    (ov_variant(transpose=True), "rows and columns are swapped"),
    (ov_variant(kv_rule=False), "grouped-query attention"),
    (lambda m, l, h: -ov_variant()(m, l, h), "sign is reversed"),
    (lambda m, l, h: ov_variant()(m, l, h) * 1.01, "differs from course_lib's reference"),
])
def test_ov_circuit_mistakes_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_ov_circuit(fn)


@pytest.mark.parametrize("fn, words", [
    (lambda m, l, h: torch.zeros(3, 3), "Wrong output shape"),
    (lambda m, l, h: 1 / 0, "raised ZeroDivisionError"),
    (lambda m, l, h: interp.full_ov_circuit(m, l, h), "calls course_lib's interp.full_ov_circuit"),
    (interp.full_ov_circuit, "course_lib's own functions"),
])
def test_ov_circuit_bad_answers_get_a_check_failure(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_ov_circuit(fn)


def test_ov_circuit_stub(capsys):
    def my_full_ov_circuit(model, layer, head):
        raise NotImplementedError

    check_ov_circuit(my_full_ov_circuit)
    assert "not implemented yet" in capsys.readouterr().out
