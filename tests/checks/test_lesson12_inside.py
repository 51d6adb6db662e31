"""Lesson-12 checkers of the induction score and the ablation prediction, and what every lesson-12
checker promises (course_lib/checks/lesson12_inside.py: the random state kept, a time limit, a solution
to show): right answers pass, each named mistake is caught."""

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
    CheckFailure, check_ablation_hook, check_induction_score, check_ov_circuit, check_patching_hook,
    check_patching_table, check_predict_ablation,
)
from course_lib.checks.lesson12_inside import measure_ablation_losses
from course_lib.induction import load_checkpoint, repeated_tokens
from course_lib.solutions import predicted_answer, solution_source


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
    from course_lib.checks.lesson12_inside import ABLATION_BANDS

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
    from course_lib.checks import lesson12_inside as inside

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
