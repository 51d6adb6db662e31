"""Lesson 16's DPO checkers (course_lib/checks/lesson16_dpo.py): check_dpo_at_start (Predict),
check_dpo_loss (★★★) and check_dpo_fix (Debug). Every correct style passes (F.logsigmoid,
softplus, a stable log σ by hand, one pair at a time, float64 inside; the reference frozen by
no_grad, by requires_grad_(False) or by an optimizer over the policy alone), each named mistake is
named, course_lib's and TRL's versions are refused, and no Debug message gives the fix."""

from __future__ import annotations

import contextlib
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from _helpers import assert_checkers_keep_random_state, failure, passes, solution_namespace
from torch import nn

from course_lib.checks import check_dpo_at_start, check_dpo_fix, check_dpo_loss
from course_lib.dpo import chosen_rejected_log_probs, dpo_loss

START = solution_namespace("16.dpo_at_start")["predicted_dpo_at_start"]
LOSS = solution_namespace("16.dpo_loss")["my_dpo_loss"]
FIX = solution_namespace("16.dpo_fix")["dpo_train_fixed"]


# ---- check_dpo_at_start ---------------------------------------------------------------------------

def test_dpo_at_start_right_answers_pass():
    for fn in (START, lambda: math.log(2), lambda: torch.tensor(0.693), lambda: -math.log(0.5)):
        assert passes(check_dpo_at_start, fn)


@pytest.mark.parametrize("value, name", [
    (0.0, "0"), (0.5, "σ(0) = 0.5 itself"), (1.0, "1"), (-0.6931, "log 2 with the sign flipped"),
    (0.06931, "log 2 times β"), (6.931, "log 2 divided by β"), (0.6444, "-log σ(β)"),
    (1.3863, "2 log 2"), (0.25, "σ'(0) = 0.25"), (0.3466, "log 2 / 2"), (0.0953, "log(1 + β)"),
    (0.7444, "-log σ(-β)"), (0.3133, "-log σ(1)"), (0.30103, "log₁₀ 2"), (16 * math.log(2), "log 2 summed over the pairs"),
    (11.09, "log 2 summed over the pairs"), (0.7, "rounded too far"), (0.69, "rounded too far"),
    (math.log(86), "ln of a vocabulary size"), (math.log(1000), "ln of a vocabulary size")])
def test_dpo_at_start_mistakes_named(value, name):
    assert failure(check_dpo_at_start, lambda: value).mistake == name


def test_dpo_at_start_bad_input_and_refusal():
    assert "one number" in str(failure(check_dpo_at_start, lambda: "log 2"))
    assert "Not quite" in str(failure(check_dpo_at_start, lambda: 3.0))
    z = torch.zeros(1)
    assert "predict it" in str(failure(check_dpo_at_start, lambda: dpo_loss(z, z, z, z, 0.1).losses.item()))


# ---- check_dpo_loss -------------------------------------------------------------------------------

def loss_softplus(pc, pr, rc, rr, beta):
    logits = beta * ((pc - rc) - (pr - rr))
    return F.softplus(-logits), (beta * (pc - rc)).detach(), (beta * (pr - rr)).detach()


def loss_by_hand_rows(pc, pr, rc, rr, beta):
    losses, chosen, rejected = [], [], []
    for i in range(pc.shape[0]):  # one pair at a time, float64 inside, a stable -log σ(x) by hand
        x = beta * ((pc[i].double() - rc[i].double()) - (pr[i].double() - rr[i].double()))
        losses.append(torch.clamp(-x, min=0) + torch.log1p(torch.exp(-x.abs())))
        with torch.no_grad():
            chosen.append(beta * (pc[i] - rc[i]))
            rejected.append(beta * (pr[i] - rr[i]))
    return torch.stack(losses).to(pc.dtype), torch.stack(chosen), torch.stack(rejected)


def loss_named_tuple(pc, pr, rc, rr, beta):
    from collections import namedtuple

    Out = namedtuple("Out", "losses chosen_rewards rejected_rewards")
    return Out(*LOSS(pc, pr, rc, rr, beta))


def test_dpo_loss_correct_styles_pass():
    for fn in (LOSS, loss_softplus, loss_by_hand_rows, loss_named_tuple):
        assert passes(check_dpo_loss, fn)


def _with_loss(loss_of):
    def fn(pc, pr, rc, rr, beta):
        c, r = pc - rc, pr - rr
        return loss_of(pc, pr, rc, rr, c, r, beta), (beta * c).detach(), (beta * r).detach()
    return fn


def _with_rewards(chosen_of, rejected_of):
    def fn(pc, pr, rc, rr, beta):
        losses = LOSS(pc, pr, rc, rr, beta)[0]
        return losses, chosen_of(pc, pr, rc, rr, beta).detach(), rejected_of(pc, pr, rc, rr, beta).detach()
    return fn


@pytest.mark.parametrize("fn, name", [
    (_with_loss(lambda pc, pr, rc, rr, c, r, b: F.logsigmoid(b * (c - r))), "the loss's sign flipped"),
    (_with_loss(lambda pc, pr, rc, rr, c, r, b: -F.logsigmoid(b * (r - c))), "the margin's sign flipped"),
    (_with_loss(lambda pc, pr, rc, rr, c, r, b: F.softplus(b * (c - r))), "the margin's sign flipped"),
    (_with_loss(lambda pc, pr, rc, rr, c, r, b: -F.logsigmoid((b * (c - r)).clamp(-50, 50))), "the margin clamped"),
    (_with_loss(lambda pc, pr, rc, rr, c, r, b: -F.logsigmoid(c - r)), "β missing"),
    (_with_loss(lambda pc, pr, rc, rr, c, r, b: -F.logsigmoid(b * c - r)), "β on the chosen side only"),
    (_with_loss(lambda pc, pr, rc, rr, c, r, b: -F.logsigmoid(c - b * r)), "β on the rejected side only"),
    (_with_loss(lambda pc, pr, rc, rr, c, r, b: -torch.sigmoid(b * (c - r))), "σ without the log"),
    (_with_loss(lambda pc, pr, rc, rr, c, r, b: -torch.log(torch.sigmoid(b * (c - r)))),
     "log(sigmoid(x)) overflowing"),
    (_with_loss(lambda pc, pr, rc, rr, c, r, b: torch.log(1 + torch.exp(-b * (c - r)))),
     "log(sigmoid(x)) overflowing"),
    (_with_loss(lambda pc, pr, rc, rr, c, r, b: -F.logsigmoid(b * (pc - pr))), "the reference not subtracted"),
    (_with_loss(lambda pc, pr, rc, rr, c, r, b: -F.logsigmoid(b * (c - r)).mean()),
     "the mean returned instead of (B,)"),
    (lambda pc, pr, rc, rr, b: (LOSS(pc, pr, rc, rr, b)[0], b * (pc - rc), b * (pr - rr)), "rewards not detached"),
    (_with_rewards(lambda pc, pr, rc, rr, b: pc - rc, lambda pc, pr, rc, rr, b: pr - rr), "the rewards without β"),
    (_with_rewards(lambda pc, pr, rc, rr, b: b * pc, lambda pc, pr, rc, rr, b: b * pr),
     "the rewards without the reference"),
    (_with_rewards(lambda pc, pr, rc, rr, b: b * (pr - rr), lambda pc, pr, rc, rr, b: b * (pc - rc)),
     "the chosen and rejected rewards swapped"),
    (_with_loss(lambda pc, pr, rc, rr, c, r, b: -F.logsigmoid(b * b * (c - r))), "β applied twice"),
    (_with_loss(lambda pc, pr, rc, rr, c, r, b: -b * (c - r)), "no log σ"),
    (_with_loss(lambda pc, pr, rc, rr, c, r, b: -F.logsigmoid(b * ((pc - rc) - (pr + rr)))),
     "a sign slipped in the margin (log π_ref,r)"),
    (_with_loss(lambda pc, pr, rc, rr, c, r, b: -F.logsigmoid(b * ((pc + rc) - pr + rr))),
     "a sign slipped in the margin (log π_ref,c)"),
    (lambda pc, pr, rc, rr, b: (lambda o: (o[1], o[2], o[0]))(LOSS(pc, pr, rc, rr, b)),
     "the three results returned in another order"),
    (lambda pc, pr, rc, rr, b: (-F.logsigmoid(b * ((rc - pc) - (rr - pr))), (b * (rc - pc)).detach(),
                                (b * (rr - pr)).detach()), "the log-ratios taken the other way round"),
])
def test_dpo_loss_mistakes_named(fn, name):
    assert failure(check_dpo_loss, fn).mistake.startswith(name)


def test_dpo_loss_float64_inputs_need_float64_results():
    def in_float32(pc, pr, rc, rr, b):
        return tuple(t.float() for t in LOSS(*(t.float() for t in (pc, pr, rc, rr)), b))

    assert failure(check_dpo_loss, in_float32).mistake == "float64 inputs computed in a lower precision"

    def float64_inside(pc, pr, rc, rr, b):  # float32 in, float64 out: right
        return LOSS(*(t.double() for t in (pc, pr, rc, rr)), b)

    assert passes(check_dpo_loss, float64_inside)


def test_dpo_loss_bad_input_and_refusal():
    assert "return three" in str(failure(check_dpo_loss, lambda pc, pr, rc, rr, b: -F.logsigmoid(b * (pc - pr))))
    assert "very thing" in str(failure(check_dpo_loss, dpo_loss))
    assert "very thing" in str(failure(check_dpo_loss, lambda *args: tuple(dpo_loss(*args))))
    assert "raised" in str(failure(check_dpo_loss, lambda *args: args[9]))
    assert "no gradient" in str(failure(
        check_dpo_loss, lambda pc, pr, rc, rr, b: tuple(t.detach() for t in LOSS(pc, pr, rc, rr, b))))


# ---- check_dpo_fix --------------------------------------------------------------------------------

def train(sft_model, input_ids, labels, beta, lr, steps, freeze="no_grad", optimize="policy", slip=""):
    """DPO as the learner might write it: the reference frozen one way or another (or not), and
    ``slip`` one of the tryouts' mistakes: "optimizer" (AdamW made anew every step), "swapped" (the
    reference's chosen and rejected traded), "reference_is_policy", "sgd", "no_zero_grad",
    "reference_first", "all_no_grad" (the policy's pass under no_grad too)."""
    policy, reference = copy.deepcopy(sft_model), copy.deepcopy(sft_model)
    if freeze == "requires_grad":
        reference.requires_grad_(False)
    both = nn.ModuleDict({"policy": policy, "reference": reference})
    optimizer = torch.optim.AdamW((both if optimize == "both" else policy).parameters(), lr=lr)
    for _ in range(steps):
        if slip == "no_zero_grad":
            optimizer.zero_grad = lambda *a, **k: None
        if slip in ("optimizer", "sgd"):  # (SGD: made anew each step, as it keeps no state)
            optimizer = (torch.optim.SGD if slip == "sgd" else torch.optim.AdamW)(policy.parameters(), lr=lr)
        with torch.no_grad() if slip == "all_no_grad" else contextlib.nullcontext():
            chosen, rejected = chosen_rejected_log_probs(policy, input_ids, labels)
        if freeze == "no_grad":
            with torch.no_grad():
                ref_chosen, ref_rejected = chosen_rejected_log_probs(
                    policy if slip == "reference_is_policy" else reference, input_ids, labels)
        elif freeze == "detach":
            ref_chosen, ref_rejected = (t.detach() for t in chosen_rejected_log_probs(reference, input_ids, labels))
        else:
            ref_chosen, ref_rejected = chosen_rejected_log_probs(reference, input_ids, labels)
        if slip == "swapped":
            ref_chosen, ref_rejected = ref_rejected, ref_chosen
        if slip == "reference_first":
            chosen, rejected, ref_chosen, ref_rejected = ref_chosen, ref_rejected, chosen, rejected
        loss = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta).losses.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return policy, reference


def test_dpo_fix_correct_styles_pass():
    assert passes(check_dpo_fix, FIX)
    for freeze, optimize in (("no_grad", "both"), ("requires_grad", "both"), ("detach", "policy"),
                             ("none", "policy")):
        fn = lambda *a, f=freeze, o=optimize: train(*a, freeze=f, optimize=o)  # noqa: E731
        assert passes(check_dpo_fix, fn), (freeze, optimize)


def test_dpo_fix_the_bug_is_observed_not_fixed():
    err = failure(check_dpo_fix, lambda *a: train(*a, freeze="none", optimize="both"))
    assert err.mistake == "the reference trained"
    message = str(err)
    assert "reference model's logits moved by up to" in message
    for fix in ("no_grad", "requires_grad", "freeze", "optimizer", "detach"):
        assert fix not in message


def test_dpo_fix_other_failures():
    def no_training(sft_model, input_ids, labels, beta, lr, steps):
        return copy.deepcopy(sft_model), copy.deepcopy(sft_model)

    assert failure(check_dpo_fix, no_training).mistake == "the policy did not train"

    def in_place(sft_model, input_ids, labels, beta, lr, steps):
        policy, reference = train(sft_model, input_ids, labels, beta, lr, steps)
        sft_model.load_state_dict(policy.state_dict())
        return policy, reference

    assert "SFT model it was given" in str(failure(check_dpo_fix, in_place))
    assert "two models" in str(failure(check_dpo_fix, lambda *a: train(*a)[0]))
    err = failure(check_dpo_fix, lambda m, i, l, b, lr, s: train(m, i, l, b, lr, s + 1))
    assert err.mistake == "another number of steps" and "after 4 steps, not 3" in str(err)
    err = failure(check_dpo_fix, lambda m, i, l, b, lr, s: train(m, i, l, b, lr, max(s - 1, 1)))
    assert err.mistake == "another number of steps" and "after 2 steps, not 3" in str(err)
    err = failure(check_dpo_fix, lambda m, i, l, b, lr, s: train(m, i, l, 2 * b, lr, s))
    assert err.mistake is None and "frozen reference by up to" in str(err)


def test_dpo_fix_a_reference_taken_from_the_policy_and_a_policy_that_stands_still_are_observed():
    err = failure(check_dpo_fix, lambda *a: train(*a, slip="reference_is_policy"))
    assert err.mistake == "the reference never used" and "log 2 at every step" in str(err)

    def reference_trained_policy_not(sft_model, input_ids, labels, beta, lr, steps):
        policy, reference = train(sft_model, input_ids, labels, beta, lr, steps, freeze="none", optimize="both")
        return copy.deepcopy(sft_model), reference

    err = failure(check_dpo_fix, lambda *a: train(*a)[::-1])
    assert err.mistake == "the two models returned in the other order"

    def slipped(slip):
        return lambda *a: train(*a, slip=slip)

    assert failure(check_dpo_fix, slipped("optimizer")).mistake == "AdamW's state reset every step"
    assert failure(check_dpo_fix, slipped("swapped")).mistake == "the reference's chosen and rejected swapped"
    assert failure(check_dpo_fix, slipped("sgd")).mistake == "another optimizer than AdamW"
    assert failure(check_dpo_fix, slipped("no_zero_grad")).mistake == "the gradients never zeroed"

    def one_object(sft_model, input_ids, labels, beta, lr, steps):
        policy, _ = train(sft_model, input_ids, labels, beta, lr, steps)
        return policy, policy

    assert failure(check_dpo_fix, one_object).mistake == "policy and reference one object"

    err = failure(check_dpo_fix, slipped("all_no_grad"))
    assert err.mistake == "the policy's log-probabilities outside autograd" and "no_grad" not in str(err)
    err = failure(check_dpo_fix, slipped("reference_first"))
    assert err.mistake == "the policy's and the reference's log-probabilities traded places" and "REJECTED" in str(err)
    assert passes(check_dpo_fix, slipped(""))
    err = failure(check_dpo_fix, lambda m, i, l, b, lr, s: train(m, i, l, 3 * b, lr, s))
    assert "mean log-ratio margin" in str(err)

    err = failure(check_dpo_fix, reference_trained_policy_not)
    assert err.mistake == "the reference trained, the policy not" and "did not change" in str(err)
    for fix in ("no_grad", "requires_grad", "freeze", "optimizer", "detach"):
        assert fix not in str(err)


def test_dpo_checkers_keep_random_state():
    assert_checkers_keep_random_state([(check_dpo_at_start, START), (check_dpo_loss, LOSS),
                                       (check_dpo_fix, FIX)])
