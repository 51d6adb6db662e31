"""Checkers for lesson 16's DPO exercises: the loss at step 0, the loss itself (★★★), a training loop
whose reference model moves (Debug).

* ``check_dpo_at_start(fn)`` (Predict): ``fn() -> float``, DPO's loss (β = 0.1) at the first step, when
  the policy is a copy of the reference: ``-log σ(0) = log 2``. Each usual slip is named.
* ``check_dpo_loss(fn)`` (Build ★★★): ``fn(policy_chosen_logps, policy_rejected_logps,
  ref_chosen_logps, ref_rejected_logps, beta) -> (losses (B,), chosen_rewards (B,), rejected_rewards
  (B,))``: ``losses = -log σ(β ((pc - rc) - (pr - rr)))``, the rewards ``β (p - r)`` detached. The test:
  B of 1, 3 and 8, β of 0.05, 0.1, 0.5 and 2, float32 and float64, margins up to ±1000 (finite losses
  and gradients there), the gradients of the policy's log-probabilities in float64. course_lib's
  ``dpo_loss`` and TRL are refused; ``F.logsigmoid``, ``F.softplus`` and every other building block
  are welcome.
* ``check_dpo_fix(fn)`` (Debug): ``fn(sft_model, input_ids, labels, beta, lr, steps) -> (policy,
  reference)``, DPO from a copy of ``sft_model`` against a frozen copy; checked on a tiny GPT in
  float64 against a run whose reference is frozen. Its first message says what is observed (the
  reference's logits moved by so much), never the fix.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .common import CheckFailure, calls_to, checker, is_course_lib, plain, run_learner, time_limit
from .lesson11_modern import f64, no_raw_errors
from .lesson16_sft import LIMIT_SECONDS, is_trl

__all__ = ["check_dpo_at_start", "check_dpo_loss", "check_dpo_fix", "DPO_START_BETA", "dpo_start_answer"]

DPO_START_BETA = 0.1


def dpo_start_answer() -> float:
    """``-log σ(β · 0)`` = log 2: the policy equals the reference, every log-ratio is 0."""
    return math.log(2.0)


def _number(raw: Any, what: str) -> float:
    value = plain(raw, what)
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckFailure(f"Return one number, got {type(raw).__name__}: {raw!r}.")
    return float(value)


@checker
@no_raw_errors
def check_dpo_at_start(fn: Callable[[], Any]) -> None:
    """Check ``fn() -> float``: the DPO loss (β = 0.1) when the policy is the reference."""
    if is_course_lib(fn) or is_trl(fn):
        raise CheckFailure("You handed in a library's function: return the number you predict.")
    from .. import dpo

    with calls_to([dpo.dpo_loss]) as seen, time_limit(LIMIT_SECONDS, "Your function ran for more than "
                                                      f"{LIMIT_SECONDS} s: return a number."):
        raw = run_learner(fn, hint="Return your prediction, one number.")
    if seen:
        raise CheckFailure("Your function measures the loss with course_lib's dpo_loss; predict it (the "
                           "cell after the checker measures it).")
    got = _number(raw, "your prediction")
    right, beta = dpo_start_answer(), DPO_START_BETA
    if math.isfinite(got) and abs(got - right) < 2e-3:
        print(f"check_dpo_at_start: right, log 2 = {right:.4f}: the policy is the reference, so both "
              "log-ratios are 0, the margin is 0 whatever β, and -log σ(0) = -log(1/2).")
        return
    mistakes = [
        (0.0, "0", "the log-ratios are 0, but the loss is -log σ(β · 0), and σ(0) is not 1"),
        (0.5, "σ(0) = 0.5 itself", "that is the probability the model gives the chosen answer's "
         "preference; the loss is its negative log"),
        (-0.5, "-σ(0)", "the loss takes the log of σ"),
        (1.0, "1", "σ(0) is 1/2 and the loss is -log σ(0): with the natural log (log₂ 2 = 1, but the loss "
         "uses ln), that is not 1"),
        (-right, "log 2 with the sign flipped", "the loss is -log σ(...), a positive number"),
        (beta * right, "log 2 times β", "β multiplies the margin inside σ, not the loss; the margin is "
         "0, so β does not matter at step 0"),
        (right / beta, "log 2 divided by β", "β multiplies the margin inside σ; at margin 0 it does not "
         "matter"),
        (-math.log(1 / (1 + math.exp(-beta))), "-log σ(β)", "the margin is 0, not 1: the policy equals "
         "the reference, so every log-ratio is 0"),
        (2 * right, "2 log 2", "one loss per pair, -log σ(margin), not one per answer"),
        (math.log(1 + math.e), "-log σ(-1)", "the margin is 0"),
        (math.log(1 + math.exp(-1)), "-log σ(1)", "the margin is 0, not 1: the policy equals the reference, so "
         "every log-ratio is 0"),
        (0.25, "σ'(0) = 0.25", "that is the slope of σ at 0, not the loss"),
        (right / 2, "log 2 / 2", "each pair has one loss, -log σ(margin), and the batch's loss is their "
         "mean over the pairs; the chosen and rejected answers are not averaged as rows of their own"),
        (math.log(1 + beta), "log(1 + β)", "the margin is 0 and the loss is -log σ(β · 0): β does not "
         "matter at step 0"),
        (-math.log(1 / (1 + math.exp(beta))), "-log σ(-β)", "the margin is 0, not -1: the policy equals "
         "the reference, so every log-ratio is 0"),
        (math.log10(2), "log₁₀ 2", "the loss uses the natural log: -ln σ(0)"),
    ]
    for value, name, reason in mistakes:
        if math.isfinite(got) and abs(got - value) < 2e-3:
            raise CheckFailure(f"Not quite: {name}. {reason}.", mistake=name)
    k = got / right if math.isfinite(got) else 0.0
    if 2.5 < k < 1000.5 and abs(k - round(k)) < 2e-3:
        name = "log 2 summed over the pairs"
        raise CheckFailure(f"Not quite: {got:g} is {round(k)} × log 2. Every pair's loss is log 2 at step 0, "
                           "and the training loop takes their mean over the batch, not their sum.",
                           mistake=name)
    n = math.exp(got) if math.isfinite(got) and 1 < got < 20 else 0.0
    if n >= 3 and abs(n - round(n)) < 1e-3 * n:
        raise CheckFailure(f"Not quite: {got:g} is ln {round(n)}, the cross-entropy of a uniform guess among "
                           f"{round(n)} tokens, a language model's loss. DPO's loss is about a pair of "
                           "answers: -log σ of a margin.", mistake="ln of a vocabulary size")
    if math.isfinite(got) and abs(got - right) < 0.06:
        raise CheckFailure(f"Close: {got:g} is not quite the value, {abs(got - right):.2g} away; the text "
                           "asks for 4 decimals. Which exact number is it?", mistake="rounded too far")
    raise CheckFailure("Not quite. At step 0 the policy is a copy of the reference: what are the two "
                       "log-ratios, the margin, and -log σ of that margin?")


# --------------------------------------------------------------------------------------------------
# Exercise 5 (★★★): dpo_loss
# --------------------------------------------------------------------------------------------------

# (case, B, beta, dtype, scale of the margins)
_LOSS_CASES = [
    ("B=3, beta=0.1, float64", 3, 0.1, torch.float64, 3.0),
    ("B=8, beta=0.5, float32", 8, 0.5, torch.float32, 2.0),
    ("B=1, beta=2.0, float64", 1, 2.0, torch.float64, 1.0),
    ("B=8, beta=0.05, float64, margins of +-40", 8, 0.05, torch.float64, 40.0),
    ("B=4, beta=1.0, float64, margins of +-1000", 4, 1.0, torch.float64, 1000.0),
    ("B=4, beta=0.5, float32, margins of +-1000", 4, 0.5, torch.float32, 1000.0),
]


def _loss_inputs(n: int, B: int, dtype: torch.dtype, scale: float) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(700 + n)
    rc = -torch.rand(B, generator=gen, dtype=torch.float64) * 60 - 5  # sums of tens of tokens' log p
    rr = -torch.rand(B, generator=gen, dtype=torch.float64) * 60 - 5
    if scale >= 1000:  # half the pairs far preferred, half far dispreferred
        sign = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(B)], dtype=torch.float64)
        pc, pr = rc + sign * scale / 2, rr - sign * scale / 2
    else:
        pc = rc + torch.randn(B, generator=gen, dtype=torch.float64) * scale
        pr = rr + torch.randn(B, generator=gen, dtype=torch.float64) * scale
    return [t.to(dtype) for t in (pc, pr, rc, rr)]


def _reference(pc, pr, rc, rr, beta):
    c, r = pc - rc, pr - rr
    return -F.logsigmoid(beta * (c - r)), beta * c, beta * r


def _loss_variants(pc, pr, rc, rr, beta) -> list[tuple[str, str, Callable[[], Any]]]:
    c, r = pc - rc, pr - rr
    d = c - r
    fix = "The loss is -log σ(β ((log π_c - log π_ref,c) - (log π_r - log π_ref,r)))"
    return [
        ("the loss's sign flipped (log σ, not -log σ)", f"the loss is the NEGATIVE log-likelihood. {fix}",
         lambda: F.logsigmoid(beta * d)),
        ("the margin's sign flipped", "your losses are -log σ(-β·Δ) (= softplus(+β·Δ)): those of the "
         "chosen and rejected answers swapped, or softplus given the margin with the wrong sign. "
         f"{fix} = softplus(-β·Δ)", lambda: -F.logsigmoid(-beta * d)),
        ("β missing", f"β multiplies the whole margin. {fix}", lambda: -F.logsigmoid(d)),
        ("β on the chosen side only", f"β multiplies the whole margin. {fix}",
         lambda: -F.logsigmoid(beta * c - r)),
        ("β on the rejected side only", f"β multiplies the whole margin. {fix}",
         lambda: -F.logsigmoid(c - beta * r)),
        ("β dividing, not multiplying", fix, lambda: -F.logsigmoid(d / beta)),
        ("σ without the log", f"the loss is -log σ, the negative log-likelihood of the preference. {fix}",
         lambda: -torch.sigmoid(beta * d)),
        ("1 - σ, without the log", f"the loss is -log σ. {fix}", lambda: 1 - torch.sigmoid(beta * d)),
        ("the reference not subtracted", f"each answer's term is log π - log π_ref, a log-ratio. {fix}",
         lambda: -F.logsigmoid(beta * (pc - pr))),
        ("the reference added, not subtracted", fix, lambda: -F.logsigmoid(beta * ((pc + rc) - (pr + rr)))),
        ("log σ of each answer's ratio apart", fix,
         lambda: -F.logsigmoid(beta * c) - F.logsigmoid(-beta * r)),
        ("β applied twice (β² multiplies the margin)", f"β multiplies the margin once. {fix}",
         lambda: -F.logsigmoid(beta * beta * d)),
        ("no log σ: the loss is -β·Δ itself", "your losses are minus the margin, linear in it (negative "
         f"where the margin is positive); -log σ turns the margin into a positive loss. {fix}",
         lambda: -beta * d),
    ] + _sign_variants(pc, pr, rc, rr, beta, fix)


def _sign_variants(pc, pr, rc, rr, beta, fix) -> list[tuple[str, str, Callable[[], Any]]]:
    """The margin with one or two of its four terms' signs slipped, e.g. ``+ log π_ref,r``."""
    import itertools

    names = ("log π_c", "log π_ref,c", "log π_r", "log π_ref,r")
    right = (1, -1, -1, 1)
    out = []
    for signs in itertools.product((1, -1), repeat=4):
        flipped = [n for n, s, r in zip(names, signs, right) if s != r]
        if not 1 <= len(flipped) <= 3:
            continue  # the right margin, and the swap (all four flipped), named above
        terms = " ".join(f"{'+' if s > 0 else '-'} {n}" for s, n in zip(signs, names)).lstrip("+ ")
        margin = signs[0] * pc + signs[1] * rc + signs[2] * pr + signs[3] * rr
        out.append((f"a sign slipped in the margin ({', '.join(flipped)})",
                    f"your losses are -log σ(β ({terms})). {fix}",
                    lambda m=margin: -F.logsigmoid(beta * m)))
    return out


def _reward_variants(p, ref, beta, other_p, other_ref) -> list[tuple[str, str, Callable[[], Any]]]:
    return [
        ("the rewards without β", "the implicit reward is β (log π - log π_ref)", lambda: p - ref),
        ("the rewards without the reference", "the implicit reward is β (log π - log π_ref)",
         lambda: beta * p),
        ("the rewards' sign flipped", "the implicit reward is β (log π - log π_ref)",
         lambda: beta * (ref - p)),
        ("the chosen and rejected rewards swapped",
         "return (losses, chosen_rewards, rejected_rewards), in that order",
         lambda: beta * (other_p - other_ref)),
    ]


def _matches(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    if got.shape != want.shape:
        return False
    atol = 1e-9 if dtype == torch.float64 else 2e-5
    finite = torch.isfinite(want)
    if not torch.equal(torch.isfinite(f64(got)), finite):
        return False
    return bool(torch.allclose(f64(got)[finite], f64(want)[finite], atol=atol * max(1.0, float(
        f64(want)[finite].abs().max()) if finite.any() else 1.0), rtol=1e-10 if dtype == torch.float64 else 1e-5))


def _name(got: torch.Tensor, variants, dtype, case: str, what: str, want: torch.Tensor) -> None:
    for name, hint, compute in variants:
        try:
            wrong = f64(compute())
        except Exception:  # noqa: BLE001 (a variant that cannot exist for this case)
            continue
        if _matches(got, wrong, dtype) and not _matches(want, wrong, dtype):
            raise CheckFailure(f"Likely mistake ({case}): {name}. {hint}.", mistake=name)
    gap = float((f64(got) - want).abs().max()) if got.shape == want.shape else float("nan")
    raise CheckFailure(f"Your {what} differ from DPO's ({case}): largest difference {gap:.3g}. None of "
                       "the usual mistakes explains it; print both for one pair.")


@checker
@no_raw_errors
def check_dpo_loss(fn: Callable[..., Any]) -> None:
    """Check ``fn(pc, pr, rc, rr, beta) -> (losses (B,), chosen_rewards (B,), rejected_rewards (B,))``."""
    from .. import dpo

    if is_course_lib(fn) or is_trl(fn):
        raise CheckFailure("You handed in a library's DPO loss (course_lib's dpo_loss or TRL's), the very "
                           "thing this exercise builds: right, and the lesson uses it once yours has "
                           "passed. Here, write it yourself; F.logsigmoid and torch's other building "
                           "blocks are welcome.")
    for n, (case, B, beta, dtype, scale) in enumerate(_LOSS_CASES):
        inputs = _loss_inputs(n, B, dtype, scale)
        leaves = [t.clone().requires_grad_(i < 2) for i, t in enumerate(inputs)]  # the policy's carry grads
        with calls_to([dpo.dpo_loss, dpo.reward_metrics]) as seen, time_limit(
                LIMIT_SECONDS, f"Your function ran for more than {LIMIT_SECONDS} s ({case}): a loop that "
                               "never ends? One call on these few numbers takes microseconds."):
            out = run_learner(fn, *leaves, beta, case=case,
                              hint=f"It was given four tensors of shape ({B},) ({dtype}), the policy's "
                                   f"two with requires_grad, and beta={beta}.")
        if seen:
            raise CheckFailure("Your code calls course_lib's dpo_loss, the very thing this exercise builds: "
                               "write the loss yourself (F.logsigmoid is welcome).")
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            if isinstance(out, torch.Tensor):
                raise CheckFailure(f"Your function returns one tensor of shape {tuple(out.shape)} ({case}); "
                                   "return three: (losses (B,), chosen_rewards (B,), rejected_rewards (B,)).")
            raise CheckFailure(f"Return three tensors, (losses, chosen_rewards, rejected_rewards), got "
                               f"{type(out).__name__} ({case}).")
        if all(isinstance(t, torch.Tensor) and t.shape == (B,) for t in out) and \
                not _matches(f64(plain(out[0].detach(), "your losses")), _reference(*[f64(t) for t in inputs], beta)[0],
                             dtype):
            want = _reference(*[f64(t) for t in inputs], beta)
            got = [f64(plain(t.detach(), "your result")) for t in out]
            order = []
            for g in got:
                order.append(next((name for name, w in zip(("losses", "chosen_rewards", "rejected_rewards"), want)
                                   if _matches(g, w, dtype)), None))
            if None not in order and len(set(order)) == 3 and order != ["losses", "chosen_rewards",
                                                                        "rejected_rewards"]:
                name = "the three results returned in another order"
                raise CheckFailure(f"Likely mistake ({case}): {name}. Your function returns ({', '.join(order)}); "
                                   "the exercise asks for (losses, chosen_rewards, rejected_rewards).",
                                   mistake=name)
        losses, chosen_r, rejected_r = out
        for what, t in (("losses", losses), ("chosen_rewards", chosen_r), ("rejected_rewards", rejected_r)):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                kind = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
                raise CheckFailure(f"Your {what} is a {kind} ({case}): return a float tensor of shape ({B},).")
            if t.shape != (B,):
                more = (" That is one number for the batch: return the loss of every pair, (B,); the "
                        "training loop takes the mean." if what == "losses" and t.dim() == 0 else "")
                raise CheckFailure(f"Your {what} has shape {tuple(t.shape)}, expected ({B},) ({case}).{more}",
                                   mistake="the mean returned instead of (B,)" if more else None)
            if dtype == torch.float64 and t.dtype != torch.float64:
                name = "float64 inputs computed in a lower precision"
                raise CheckFailure(f"Likely mistake ({case}): {name}. Your {what} are {t.dtype} for float64 "
                                   "inputs: return them in float64, at float64 precision (the lesson compares "
                                   "your loss with TRL's to 1e-12).", mistake=name)
        ref = [f64(t) for t in inputs]
        want = _reference(*ref, beta)
        got_losses = plain(losses, "your losses")
        if not torch.isfinite(got_losses).all():
            parts = [_reference(*[r[i:i + 1] for r in ref], beta)[0] for i in range(B)]
            finite = torch.isfinite(got_losses)
            ok_elsewhere = _matches(got_losses[finite], torch.cat(parts)[finite], dtype) if finite.any() else False
            raise CheckFailure(
                f"Your losses hold {'NaN' if torch.isnan(got_losses).any() else 'inf'} ({case}), where the "
                f"margins β·Δ reach {float((beta * ((ref[0] - ref[2]) - (ref[1] - ref[3]))).abs().max()):.0f}"
                + (", and are right everywhere else" if ok_elsewhere else "") + ": log(σ(x)) computed "
                "as two steps overflows there (σ(x) rounds to 0, or exp(-x) to inf). A constraint: finite "
                "for margins of ±1000. Compute log σ in one numerically stable step.",
                mistake="log(sigmoid(x)) overflowing")
        if not _matches(got_losses, want[0], dtype) and scale >= 1000:
            margins = beta * ((ref[0] - ref[2]) - (ref[1] - ref[3]))
            wrong = [i for i in range(B) if not _matches(got_losses[i:i + 1], want[0][i:i + 1], dtype)]
            i = wrong[0] if wrong else 0
            raise CheckFailure(f"Your losses are wrong at margins β·Δ of ±1000 ({case}), right in the "
                               f"earlier cases: at β·Δ = {float(margins[i]):.0f} you give "
                               f"{float(got_losses[i]):.6g}, DPO {float(want[0][i]):.6g}. A clamp or a "
                               "cut-off of the margin changes the loss there; the constraint asks for the "
                               "loss itself, finite, at these margins.", mistake="the margin clamped")
        if not _matches(got_losses, want[0], dtype):
            backwards = [beta * (ref[2] - ref[0]), beta * (ref[3] - ref[1])]  # β (log π_ref - log π)
            if _matches(got_losses, -F.logsigmoid(-beta * ((ref[0] - ref[2]) - (ref[1] - ref[3]))), dtype) \
                    and all(isinstance(g, torch.Tensor) and _matches(plain(g.detach(), "your rewards"), b, dtype)
                            for g, b in zip((chosen_r, rejected_r), backwards)):
                name = "the log-ratios taken the other way round (log π_ref - log π)"
                raise CheckFailure(f"Likely mistake ({case}): {name}. Your rewards are β (log π_ref - log π), "
                                   "the opposite sign of each answer's implicit reward, and your losses are "
                                   "those of the chosen and the rejected answers swapped.", mistake=name)
            _name(got_losses, _loss_variants(*ref, beta), dtype, case, "losses", want[0])
        for what, got, expected, (p, r, op, orr) in (
                ("chosen_rewards", chosen_r, want[1], (ref[0], ref[2], ref[1], ref[3])),
                ("rejected_rewards", rejected_r, want[2], (ref[1], ref[3], ref[0], ref[2]))):
            if got.requires_grad:
                raise CheckFailure(f"Your {what} carry a gradient ({case}): the rewards are metrics to "
                                   "log, not part of the loss; return them detached, as TRL does.",
                                   mistake="rewards not detached")
            value = plain(got, f"your {what}")
            if not _matches(value, expected, dtype):
                _name(value, _reward_variants(p, r, beta, op, orr), dtype, case, what, expected)
        weights = torch.linspace(0.5, 1.5, B, dtype=losses.dtype)
        try:
            (losses * weights).sum().backward()
        except RuntimeError as err:
            raise CheckFailure(f"Your losses carry no gradient to the policy's log-probabilities ({case}): "
                               f"{err}. DPO trains through the loss: keep it in the autograd graph.") from err
        ref_leaves = [t.clone().requires_grad_(True) for t in ref[:2]]
        (_reference(ref_leaves[0], ref_leaves[1], ref[2], ref[3], beta)[0] * weights.double()).sum().backward()
        for i, name in enumerate(("policy_chosen_logps", "policy_rejected_logps")):
            g = leaves[i].grad
            if g is None or not torch.isfinite(g).all() or not torch.allclose(
                    f64(g), ref_leaves[i].grad, atol=1e-9 if dtype == torch.float64 else 1e-5, rtol=1e-4):
                raise CheckFailure(f"Your losses are right but their gradient with respect to {name} is "
                                   f"{'not finite' if g is not None and not torch.isfinite(g).all() else 'not'} "
                                   f"the loss's ({case}): is part of it computed outside autograd, or "
                                   "clamped?")
    print(f"check_dpo_loss: right on all {len(_LOSS_CASES)} cases (B of 1 to 8, β from 0.05 to 2, float32 "
          "and float64, margins of ±1000): losses, rewards (detached) and gradients. Well done!")


# --------------------------------------------------------------------------------------------------
# Exercise 6 (Debug): the reference model trained along
# --------------------------------------------------------------------------------------------------

# (case, beta, lr, steps)
_FIX_CASES = [("beta=0.1, lr=1e-2, 3 steps", 0.1, 1e-2, 3), ("beta=0.5, lr=3e-3, 2 steps", 0.5, 3e-3, 2)]


def _tiny_model_and_batch(n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    from ..gpt import GPT, GPTConfig

    torch.manual_seed(900 + n)
    model = GPT(GPTConfig(vocab_size=43, max_len=32, d_model=32, num_heads=2, num_layers=1)).double().eval()
    gen = torch.Generator().manual_seed(950 + n)
    B, T = 3, 20
    ids = torch.randint(0, 40, (2 * B, T), generator=gen)
    labels = torch.full((2 * B, T), -100, dtype=torch.long)
    for row in range(2 * B):  # prompts of 4, 6 or 8 ids, answers of 5 to 10, right padding after them
        p, a = 4 + 2 * (row % B), 5 + (row * 7) % 6
        ids[row, p - 1] = 41  # <|assistant|>
        ids[row, p + a - 1] = 42  # <|end|>
        ids[row, p + a:] = 42  # padding
        labels[row, p:p + a] = ids[row, p:p + a]
    return model, ids, labels


def _dpo_right(sft_model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, beta: float, lr: float,
               steps: int, slip: str = "") -> nn.Module:
    """DPO with a frozen reference, or with one of the slips the checker names: ``reference_is_policy``
    (the reference's log-probabilities taken from the policy itself, detached), ``reference_swapped``
    (the reference's chosen and rejected log-probabilities trade places), ``optimizer_each_step``
    (AdamW made anew at every step), ``sgd`` (plain SGD at ``lr``), ``reference_first`` (the
    reference's log-probabilities given to the loss in the policy's places, and the policy's in the
    reference's)."""
    from ..dpo import chosen_rejected_log_probs, dpo_loss

    policy, reference = copy.deepcopy(sft_model), copy.deepcopy(sft_model)
    optimizer = (torch.optim.SGD if slip == "sgd" else torch.optim.AdamW)(policy.parameters(), lr=lr)
    for _ in range(steps):
        if slip == "optimizer_each_step":
            optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
        chosen, rejected = chosen_rejected_log_probs(policy, ids, labels)
        with torch.no_grad():
            ref_chosen, ref_rejected = chosen_rejected_log_probs(
                policy if slip == "reference_is_policy" else reference, ids, labels)
        if slip == "reference_swapped":
            ref_chosen, ref_rejected = ref_rejected, ref_chosen
        if slip == "reference_first":
            chosen, rejected, ref_chosen, ref_rejected = ref_chosen, ref_rejected, chosen, rejected
        loss = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta).losses.mean()
        if slip != "no_zero_grad":
            optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return policy


@checker
@no_raw_errors
def check_dpo_fix(fn: Callable[..., Any]) -> None:
    """Check ``fn(sft_model, input_ids, labels, beta, lr, steps) -> (policy, reference)``."""
    if is_course_lib(fn) or is_trl(fn):
        raise CheckFailure("You handed in a library's function: fix the training function of the "
                           "exercise.")
    for n, (case, beta, lr, steps) in enumerate(_FIX_CASES):
        sft_model, ids, labels = _tiny_model_and_batch(n)
        before = copy.deepcopy(sft_model)
        with torch.no_grad():
            logits0 = before(ids)
        with time_limit(LIMIT_SECONDS * 2, f"Your function ran for more than {2 * LIMIT_SECONDS} s "
                                           f"({case}): {steps} steps on a tiny model take well under a second."):
            try:
                out = run_learner(fn, sft_model, ids.clone(), labels.clone(), beta, lr, steps, case=case,
                                  hint="It was given a tiny GPT (float64), input_ids and labels (6, 20), "
                                       f"beta={beta}, lr={lr}, steps={steps}.")
            except CheckFailure as err:
                if "does not require grad" not in str(err):
                    raise
                raise CheckFailure(f"Your function stopped at the first backward() ({case}): the loss it "
                                   "computed carries no gradient at all, so nothing of the policy's log-"
                                   f"probabilities was in autograd's graph. ({err})",
                                   mistake="the policy's log-probabilities outside autograd") from None
        if not isinstance(out, (tuple, list)) or len(out) != 2 or not all(isinstance(m, nn.Module) for m in out):
            raise CheckFailure(f"Return (policy, reference), two models, as the function of the exercise "
                               f"does; got {type(out).__name__} ({case}).")
        policy, reference = out
        if policy is reference:
            raise CheckFailure(f"After your function ran ({case}), the two models it returns are one and the "
                               "same object: whatever trains the policy changes the reference too.",
                               mistake="policy and reference one object")
        with torch.no_grad():
            given = sft_model(ids)
            ref_logits, policy_logits = reference(ids), policy(ids)
        moved_given = float((given - logits0).abs().max())
        if moved_given > 0:
            raise CheckFailure(f"After your function ran ({case}), the SFT model it was given computes "
                               f"other logits than before (by up to {moved_given:.3g}).")
        moved = float((ref_logits - logits0).abs().max())
        still = float((policy_logits - logits0).abs().max())
        expected = _dpo_right(before, ids, labels, beta, lr, steps)
        with torch.no_grad():
            want = expected(ids)
        if still == 0 and moved > 0 and torch.allclose(ref_logits, want, atol=1e-7, rtol=1e-6):
            raise CheckFailure(f"After your function ran ({case}), the first model it returns computes the SFT "
                               "model's logits, unchanged, and the second computes what DPO's policy gives. "
                               "The function returns (policy, reference), in that order.",
                               mistake="the two models returned in the other order")
        if moved > 1e-12:
            weights = max(float((a - b).abs().max()) for a, b in zip(reference.state_dict().values(),
                                                                      before.state_dict().values())
                          if a.is_floating_point())
            policy_too = (" The policy's logits are still the SFT model's: the policy did not change."
                          if still == 0 else "")
            raise CheckFailure(
                f"After your function ran ({case}), the reference model's logits moved by up to "
                f"{moved:.3g} (its weights by up to {weights:.3g}) from the SFT model's.{policy_too}",
                mistake="the reference trained" + (", the policy not" if still == 0 else ""))
        gap = float((policy_logits - want).abs().max())
        if not torch.allclose(policy_logits, want, atol=1e-7, rtol=1e-6):
            if still == 0:
                raise CheckFailure(f"After your function ran ({case}), the reference is unchanged, and so is "
                                   "the policy: its logits are the SFT model's. It did not train.",
                                   mistake="the policy did not train")
            for other in (steps - 1, steps + 1, 2 * steps):
                if other > 0:
                    alt_model = _dpo_right(before, ids, labels, beta, lr, other)
                    with torch.no_grad():
                        alt = alt_model(ids)
                    if torch.allclose(policy_logits, alt, atol=1e-7, rtol=1e-6):
                        raise CheckFailure(f"After your function ran ({case}), the reference is unchanged, "
                                           f"and the policy is what DPO gives after {other} steps, not "
                                           f"{steps}.", mistake="another number of steps")
            slips = {
                "reference_is_policy": ("the reference never used", "the policy trained as if the reference's "
                                        "log-probabilities were the policy's own at every step: every "
                                        "log-ratio 0, the loss log 2 at every step, whatever the policy learns"),
                "reference_swapped": ("the reference's chosen and rejected swapped", "the policy trained as "
                                      "if the reference's log-probabilities of the chosen and the rejected "
                                      "answers had traded places"),
                "optimizer_each_step": ("AdamW's state reset every step", "the policy is what DPO gives when "
                                        "AdamW starts afresh at every step, its running averages of the "
                                        "gradients forgotten each time"),
                "sgd": ("another optimizer than AdamW", "the policy is what plain SGD steps at this lr give, "
                        "not the AdamW steps of the function you fixed"),
                "reference_first": ("the policy's and the reference's log-probabilities traded places",
                                    "the policy trained to prefer the REJECTED answers: as if the loss had "
                                    "been given the reference's log-probabilities where the policy's go"),
            }
            slips["no_zero_grad"] = ("the gradients never zeroed", "the policy is what DPO gives when each "
                                     "step's gradients are added to all the earlier steps' before AdamW "
                                     "uses them")
            for slip, (name, observed) in slips.items():
                alt_model = _dpo_right(before, ids, labels, beta, lr, steps, slip)
                with torch.no_grad():
                    alt = alt_model(ids)
                if torch.allclose(policy_logits, alt, atol=1e-7, rtol=1e-6):
                    raise CheckFailure(f"After your function ran ({case}), the reference model is unchanged, "
                                       f"but {observed}.", mistake=name)
            from ..dpo import chosen_rejected_log_probs

            with torch.no_grad():
                ref_c, ref_r = chosen_rejected_log_probs(before, ids, labels)
                margins = []
                for model in (policy, expected):
                    c, r = chosen_rejected_log_probs(model, ids, labels)
                    margins.append(float(((c - ref_c) - (r - ref_r)).mean()))
            raise CheckFailure(f"After your function ran ({case}), the reference is unchanged, but the "
                               f"policy's logits differ from those of DPO with a frozen reference by up to "
                               f"{gap:.3g}; its mean log-ratio margin (chosen minus rejected) on the batch is "
                               f"{margins[0]:.3g}, DPO's {margins[1]:.3g}.")
    print(f"check_dpo_fix: right on {len(_FIX_CASES)} runs: the reference stays the SFT model, and the "
          "policy trains as DPO with a frozen reference does. Well done!")
