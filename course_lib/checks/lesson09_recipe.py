"""Checker for lesson 09's ★★★: the training recipe written by hand.

* ``check_lm_train(fn)``: a training loop with the learner's own AdamW and warm-up + cosine (no
  ``torch.optim``), equal in float64 to ``torch.optim.AdamW``
  (``course_lib.lm_training.lm_train_reference``).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from typing import Any

import torch

from ..gpt import GPT, GPTConfig, lm_loss
from ..lm_training import LMRecipe, lm_train_reference, warmup_cosine
from .common import CheckFailure, calls_to, checker, is_course_lib, one_thread, passed
from .lesson09_gpt import learner_time_limit, random_gpt

__all__ = ["check_lm_train"]


# ----------------------------------------------------------------------------------------------
# check_lm_train (build, ★★★): the learner's own AdamW and warm-up + cosine, against torch.optim
# ----------------------------------------------------------------------------------------------

EPS = 1e-8  # torch.optim.AdamW's default eps, which the exercise states
TRAIN_ATOL = 1e-6  # float64: a right update differs from torch.optim.AdamW's by float rounding only


def _lr_factor(step: int, recipe: LMRecipe, schedule: str = "course") -> float:
    """The learning-rate multiplier at ``step`` (0-based), right or with one named mistake."""
    w, n, low = recipe.warmup, recipe.num_steps, recipe.min_lr / recipe.lr
    if schedule == "ahead":  # the scheduler stepped before the optimizer: always one step ahead
        step, schedule = step + 1, "course"
    if schedule == "late":  # the rate set after the update: step s uses the rate of step s - 1
        if step == 0:
            return 1.0  # the peak rate, set before the loop
        step, schedule = step - 1, "course"
    if schedule == "late_from_0":  # the same, with the rate of step 0 set before the loop
        step, schedule = max(step - 1, 0), "course"
    if schedule == "constant":
        return 1.0
    if schedule == "no_warmup_branch":  # the warm-up branch left out, the same progress formula
        progress = min(1.0, (step - w) / (n - w))
        return low + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - low)
    if step < w and schedule not in ("no_warmup",):
        if schedule == "warmup_s_over_w":
            return step / w
        if schedule == "warmup_s1_over_w":
            return (step + 1) / w
        if schedule == "warmup_s_over_w1":
            return step / (w + 1)
        return (step + 1) / (w + 1)
    if schedule == "warmup_only":
        return 1.0
    progress = min(1.0, (step - w) / (n - w)) if schedule != "no_warmup" else min(1.0, step / n)
    if schedule == "cosine_from_0":
        progress = min(1.0, step / n)
    if schedule == "progress_n1":
        progress = min(1.0, (step - w) / (n - 1 - w))
    if schedule == "to_zero":
        low = 0.0
    if schedule == "min_lr_as_ratio":  # recipe.min_lr taken for the ratio min_lr / lr
        low = recipe.min_lr
    if schedule == "linear":
        return low + (1.0 - progress) * (1.0 - low)
    return low + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - low)


def _decay_groups(model: GPT, weight_decay: float, decay: str) -> list[tuple[torch.nn.Parameter, float]]:
    """``(parameter, its weight decay)`` for every parameter the update touches, right
    ("matrices": dim >= 2) or with one named mistake."""
    named = list(model.named_parameters())  # the tied matrix once
    if decay == "tied_twice":  # every Linear and Embedding weight: the tied matrix twice
        matrices = [m.weight for m in model.modules()
                    if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))]
        return [(p, weight_decay) for p in matrices] + [(p, 0.0) for _, p in named if p.dim() < 2]
    rule = {"matrices": lambda n, p: p.dim() >= 2, "all": lambda n, p: True, "none": lambda n, p: False,
            "vectors": lambda n, p: p.dim() < 2, "by_name": lambda n, p: "bias" not in n,
            "no_embeddings": lambda n, p: p.dim() >= 2 and "embed" not in n}[decay]
    return [(p, weight_decay if rule(n, p) else 0.0) for n, p in named]


def train_variant(model: GPT, batches: list[tuple[torch.Tensor, torch.Tensor]], recipe: LMRecipe,
                  decay: str = "matrices", decay_how: str = "decoupled", schedule: str = "course",
                  clip: str = "norm", zero_grad: bool | str = True, betas: str = "recipe",
                  correction: str = "both", eps: str = "outside", moments: str = "ema") -> list[float]:
    """AdamW, warm-up + cosine and clipping written out, with one knob per plausible mistake; the
    defaults give ``lm_train_reference`` (``torch.optim.AdamW``), up to float rounding."""
    b1, b2 = {"recipe": recipe.betas, "default": (0.9, 0.999),
              "swapped": recipe.betas[::-1]}[betas]
    params = _decay_groups(model, recipe.weight_decay, decay)
    state = [(torch.zeros_like(p), torch.zeros_like(p)) for p, _ in params]
    unique = list(model.parameters())
    losses = []
    model.train()
    for step, (x, y) in enumerate(batches):
        lr = recipe.lr * _lr_factor(step, recipe, schedule)
        loss = lm_loss(model(x), y)
        if zero_grad:
            model.zero_grad(set_to_none=True)
        loss.backward()
        if clip == "norm":
            torch.nn.utils.clip_grad_norm_(unique, recipe.max_grad_norm)
        elif clip == "one":  # the lesson's recipe's 1.0, written in
            torch.nn.utils.clip_grad_norm_(unique, 1.0)
        elif clip == "value":
            torch.nn.utils.clip_grad_value_(unique, recipe.max_grad_norm)
        elif clip == "per_tensor":
            for p in unique:
                torch.nn.utils.clip_grad_norm_([p], recipe.max_grad_norm)
        elif clip == "per_group":  # matrices and vectors clipped apart
            torch.nn.utils.clip_grad_norm_([p for p in unique if p.dim() >= 2], recipe.max_grad_norm)
            torch.nn.utils.clip_grad_norm_([p for p in unique if p.dim() < 2], recipe.max_grad_norm)
        if zero_grad == "after_backward":
            model.zero_grad(set_to_none=False)
        t = step + 1
        with torch.no_grad():
            for (p, wd), (m, v) in zip(params, state):
                g = p.grad.clone()
                if decay_how in ("l2", "both"):
                    g = g + wd * p
                if moments == "ema":
                    m.mul_(b1).add_(g, alpha=1 - b1)
                    v.mul_(b2).add_(g * g, alpha=1 - b2)
                else:  # "no_one_minus": the new gradient not weighted by 1 - beta
                    m.mul_(b1).add_(g)
                    v.mul_(b2).add_(g * g)
                tc = t + 1 if correction == "t_plus_1" else t  # the step count the correction uses
                bc1 = 1 - b1 ** tc if correction in ("both", "m_only", "t_plus_1") else 1.0
                bc2 = 1 - b2 ** tc if correction in ("both", "v_only", "t_plus_1") else 1.0
                if correction == "v_with_beta1":
                    bc1, bc2 = 1 - b1 ** t, 1 - b1 ** t
                m_hat, v_hat = m / bc1, v / bc2
                if eps == "none":
                    update = m_hat / v_hat.sqrt()
                elif eps == "inside":
                    update = m_hat / (v_hat + EPS).sqrt()
                elif eps == "before_correction":  # the Adam paper's "efficient" form
                    update = (m / bc1) * math.sqrt(bc2) / (v.sqrt() + EPS)
                else:
                    update = m_hat / (v_hat.sqrt() + EPS)
                if decay_how in ("decoupled", "both"):
                    p.mul_(1 - lr * wd)
                elif decay_how == "grows":
                    p.mul_(1 + lr * wd)
                elif decay_how == "lr_squared":
                    p.mul_(1 - lr * lr * wd)
                elif decay_how == "no_lr":
                    p.mul_(1 - wd)
                elif decay_how == "peak_lr":
                    p.mul_(1 - recipe.lr * wd)
                p.sub_(lr * update)
                if decay_how == "after":
                    p.mul_(1 - lr * wd)
        losses.append(loss.item())
    return losses


_TRAIN_MISTAKES: list[tuple[dict[str, Any], str]] = [
    # weight decay: where
    ({"decay": "all"}, "weight decay is applied to every parameter, biases and LayerNorm gains "
     "included; the exercise decays the matrices (p.dim() >= 2) only"),
    ({"decay": "by_name"}, "the parameters to decay are chosen by name ('bias' not in the name): that "
     "also decays the LayerNorm gains (…norm.weight), which are vectors. The rule is p.dim() >= 2"),
    ({"decay": "no_embeddings"}, "the embedding tables get no decay (the token table, which IS "
     "lm_head's matrix, and the positions): the rule is p.dim() >= 2, and they are matrices"),
    ({"decay": "none"}, "there is no weight decay at all: the matrices (p.dim() >= 2) decay with "
     "recipe.weight_decay"),
    ({"decay": "vectors"}, "the decay is on the wrong parameters: it belongs on the matrices "
     "(dim >= 2), not on biases and LayerNorm gains"),
    ({"decay": "tied_twice"}, "the tied matrix is updated twice per step: lm_head.weight IS the token "
     "table (one tensor), and your list of parameters holds it twice. model.parameters() lists it "
     "once"),
    # weight decay: how
    ({"decay_how": "l2"}, "the decay is added to the gradient (L2 regularisation, g + wd * p, as "
     "Adam's weight_decay does), so it passes through the moments and is rescaled by them. AdamW's "
     "decay is decoupled: it shrinks the weights directly, outside the moments"),
    ({"decay_how": "both"}, "the decay is applied twice: added to the gradient (L2, which then "
     "passes through the moments) and decoupled on the weights; AdamW's decay is only the "
     "decoupled one"),
    ({"decay_how": "after"}, "the decay shrinks the weights after the Adam update; AdamW shrinks the "
     "weights of the previous step (both terms use the same p), so the order matters"),
    ({"decay_how": "grows"}, "the decay has the wrong sign: it grows the weights by lr * "
     "weight_decay * p each step instead of shrinking them"),
    ({"decay_how": "lr_squared"}, "the decay is scaled by the learning rate twice (lr * lr * "
     "weight_decay * p); AdamW shrinks p by lr * weight_decay * p"),
    ({"decay_how": "no_lr"}, "the decay is not scaled by the learning rate: AdamW shrinks p by "
     "lr * weight_decay * p at each step, with that step's rate"),
    ({"decay_how": "peak_lr"}, "the decay uses the peak rate recipe.lr at every step; AdamW scales "
     "it by the scheduled rate of that step, like the update"),
    # Adam's moments
    ({"betas": "default"}, "the betas are AdamW's defaults (0.9, 0.999); the recipe says "
     "recipe.betas"),
    ({"betas": "swapped"}, "beta1 and beta2 are swapped: beta1 (recipe.betas[0]) averages the "
     "gradients, beta2 their squares"),
    ({"moments": "no_one_minus"}, "the moments add the new gradient with weight 1, not 1 - beta: "
     "they are then no average, and the bias correction does not undo it"),
    ({"correction": "none"}, "the bias correction is missing: m and v start at 0, so the first "
     "steps need m / (1 - beta1^t) and v / (1 - beta2^t), t counted from 1"),
    ({"correction": "m_only"}, "the bias correction of v is missing (v / (1 - beta2^t))"),
    ({"correction": "v_only"}, "the bias correction of m is missing (m / (1 - beta1^t))"),
    ({"correction": "t_plus_1"}, "the bias correction counts the steps from 2: the first update "
     "divides by 1 - beta^1, so t is 1 at the first step (step index s = 0 gives t = s + 1)"),
    ({"correction": "v_with_beta1"}, "v's bias correction uses beta1: v / (1 - beta2^t), with "
     "beta2, the beta of v's own average"),
    ({"eps": "inside"}, "eps is inside the square root: AdamW divides by sqrt(v_hat) + eps"),
    ({"eps": "none"}, "eps is missing: AdamW divides by sqrt(v_hat) + eps, eps = 1e-8, so a "
     "gradient near 0 cannot give a huge step"),
    ({"eps": "before_correction"}, "eps is added to sqrt(v) before the bias correction (the Adam "
     "paper's 'efficient' form); torch.optim.AdamW adds eps to sqrt(v_hat), after correcting v"),
    # the schedule
    ({"schedule": "warmup_s_over_w"}, "the warm-up is off by one: a rate of 0 at step 0 (s / warmup). "
     "The exercise's first rate is lr / (warmup + 1)"),
    ({"schedule": "warmup_s_over_w1"}, "the warm-up is off by one: a rate of 0 at step 0 "
     "(s / (warmup + 1)); the exercise's first rate is lr / (warmup + 1), at step 0"),
    ({"schedule": "warmup_s1_over_w"}, "the warm-up is off by one: it reaches the peak one step "
     "early ((s + 1) / warmup); the exercise's rates are lr * 1/(warmup+1), ..., then lr at step "
     "warmup"),
    ({"schedule": "ahead"}, "the rate runs one step ahead: step s uses the rate of step s + 1 (a "
     "scheduler stepped before the update)"),
    ({"schedule": "late"}, "the rate is set one step late (after the update): step s uses the rate "
     "of step s - 1, and step 0 the peak rate"),
    ({"schedule": "late_from_0"}, "the rate is set one step late (after the update): step s uses "
     "the rate of step s - 1"),
    ({"schedule": "no_warmup"}, "there is no warm-up: the first recipe.warmup steps rise linearly "
     "to the peak rate"),
    ({"schedule": "no_warmup_branch"}, "there is no warm-up: the first recipe.warmup steps rise "
     "linearly to the peak rate"),
    ({"schedule": "cosine_from_0"}, "the cosine is counted from step 0: it starts at step warmup, "
     "where the rate is still at its peak, and ends at num_steps"),
    ({"schedule": "constant"}, "the learning rate never changes: it follows the schedule, step by "
     "step"),
    ({"schedule": "warmup_only"}, "the rate stays at its peak after the warm-up: it should follow "
     "half a cosine down to recipe.min_lr at step num_steps"),
    ({"schedule": "to_zero"}, "the cosine goes down to 0; it ends at recipe.min_lr"),
    ({"schedule": "min_lr_as_ratio"}, "the cosine ends at lr * min_lr: min_lr is a rate, not a "
     "fraction of lr; the rate at step num_steps is recipe.min_lr itself"),
    ({"schedule": "progress_n1"}, "the cosine reaches min_lr one step early: at step num_steps - 1 "
     "instead of num_steps"),
    ({"schedule": "linear"}, "the rate falls linearly after the warm-up; the recipe uses a cosine"),
    # clipping, zeroing
    ({"clip": "none"}, "the update sees gradients that were not clipped (no clipping, or clipping "
     "after the update, where it changes nothing): their total norm is clipped to "
     "recipe.max_grad_norm before each update"),
    ({"clip": "value"}, "each gradient VALUE is clipped to ±max_grad_norm (clip_grad_value_); the "
     "recipe clips the total NORM of all gradients together (clip_grad_norm_)"),
    ({"clip": "per_tensor"}, "each parameter's gradient is clipped to the norm on its own; the "
     "recipe clips the total norm of all the gradients together (one factor for all)"),
    ({"clip": "one"}, "the gradients are clipped to a total norm of 1.0, not to "
     "recipe.max_grad_norm (the checker's recipes use other values)"),
    ({"clip": "per_group"}, "the gradients are clipped group by group (the matrices, then the "
     "vectors), each to max_grad_norm; the recipe clips the total norm of all the gradients "
     "together (one factor for all)"),
    ({"zero_grad": False}, "the gradients are never zeroed, so they add up from step to step"),
    ({"zero_grad": "after_backward"}, "the update sees gradients of 0: they are zeroed between "
     "backward() and the update, so only the decay moves the weights"),
]


def _refused_in_lm_train() -> list[tuple[Callable[..., Any], str]]:
    """What ``my_lm_train`` may not call: torch.optim (the thing being built) and course_lib's
    training code (the reference); each with its friendly message."""
    from torch.optim.adam import adam as functional_adam
    from torch.optim.adamw import adamw as functional_adamw

    from ..lm_training import lm_optimizer, train_lm
    from ..training import train

    build = ("in this exercise the update is yours: write AdamW with tensor operations on each "
             "parameter and its gradient (torch.optim.AdamW is what the checker compares with)")
    refused: list[tuple[Callable[..., Any], str]] = [
        (torch.optim.Optimizer.__init__, f"Your function builds a torch.optim optimizer: {build}."),
        (torch.optim.lr_scheduler.LRScheduler.__init__,
         "Your function uses a torch.optim.lr_scheduler: the learning-rate schedule is yours to "
         "write too (the rate of each step, set before its update)."),
        (functional_adamw, f"Your function calls torch.optim's functional adamw: {build}."),
        (functional_adam, f"Your function calls torch.optim's functional adam: {build}."),
    ]
    for fn in (train, train_lm, lm_optimizer, lm_train_reference):
        refused.append((fn, f"Your function calls course_lib's `{fn.__name__}`, the lesson's own "
                            "training code: write the loop, the update and the schedule yourself."))
    refused.append((warmup_cosine, "Your function calls course_lib's `warmup_cosine`, the lesson's "
                                   "own schedule: the schedule is part of the exercise."))
    return refused


def train_case(seed: int) -> tuple[GPT, list[tuple[torch.Tensor, torch.Tensor]], LMRecipe]:
    """A tiny GPT in float64, fixed batches and a recipe under which every mistake moves the
    weights by far more than float rounding: a high peak rate, strong decay, a clipping norm below
    every gradient's norm (so that eps and clipping both matter)."""
    config = GPTConfig(vocab_size=37, max_len=12, d_model=16, num_heads=2, num_layers=1, d_ff=24)
    model = random_gpt(config, seed, std=0.2).double().train()
    recipe = [
        LMRecipe(num_layers=1, num_heads=2, d_model=16, block_size=12, batch_size=4, num_steps=12,
                 lr=0.03, min_lr=0.003, warmup=4, betas=(0.9, 0.95), weight_decay=0.5,
                 max_grad_norm=0.05),
        LMRecipe(num_layers=1, num_heads=2, d_model=16, block_size=12, batch_size=3, num_steps=10,
                 lr=0.02, min_lr=0.004, warmup=3, betas=(0.8, 0.9), weight_decay=0.3,
                 max_grad_norm=0.08),
    ][seed]
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(recipe.num_steps):
        window = torch.randint(0, config.vocab_size, (recipe.batch_size, 13), generator=gen)  # (B, T+1)
        batches.append((window[:, :-1], window[:, 1:]))  # (B, T) inputs, (B, T) next ids
    return model, batches, recipe


@checker
def check_lm_train(fn: Callable[..., Any]) -> None:
    """Check ``fn(model, batches, recipe) -> list of per-step losses``: the learner's AdamW (no
    torch.optim), warm-up + cosine and clipping give, in float64, every step's loss and the final
    weights of ``torch.optim.AdamW`` with the same schedule (to ``TRAIN_ATOL``). The global random
    state is left as it was."""
    with torch.random.fork_rng(devices=[]), one_thread():
        _check_lm_train(fn)


def _learner_train(fn: Callable[..., Any], model: GPT, batches: list, recipe: LMRecipe, case: str) -> Any:
    """``fn(model, batches, recipe)`` with a time limit, refusing torch.optim and course_lib's
    training code, naming the known errors."""
    refused = _refused_in_lm_train()
    try:
        with calls_to([f for f, _ in refused]) as seen, learner_time_limit(120.0, case):
            got = fn(model, batches, recipe)
    except (NotImplementedError, CheckFailure):
        raise
    except Exception as err:
        text = str(err)
        if "more than one parameter group" in text:
            raise CheckFailure(
                f"A parameter sits in two groups ({case}; {type(err).__name__}: {err}). The output "
                "layer is TIED to the token table (one matrix): model.parameters() lists it once."
            ) from err
        if "does not require grad and does not have a grad_fn" in text:
            raise CheckFailure(
                f"backward() found no graph ({case}; {type(err).__name__}: {err}): the loss was "
                "computed under torch.no_grad() (or from detached values). Only the update itself "
                "goes under torch.no_grad()."
            ) from err
        if "leaf Variable that requires grad" in text:
            raise CheckFailure(
                f"An in-place change of a parameter outside torch.no_grad() ({case}; "
                f"{type(err).__name__}: {err}): autograd forbids it on a leaf. Change the weights "
                "inside `with torch.no_grad():`."
            ) from err
        raise CheckFailure(f"Your code raised {type(err).__name__} ({case}): {err}.") from err
    if seen:
        raise CheckFailure(next(message for f, message in refused if f is seen[0]))
    return got


def max_diff(a: torch.nn.Module, b: torch.nn.Module | tuple[torch.Tensor, ...]) -> float:
    """The largest difference between two models' parameters (float64); ``b`` may also be the
    tuple of a model's parameters."""
    theirs = b if isinstance(b, tuple) else tuple(b.parameters())
    return max((p.detach().double() - q.detach().double()).abs().max().item()
               for p, q in zip(a.parameters(), theirs))


@functools.lru_cache(maxsize=None)
def _variant_weights(seed: int, index: int) -> tuple[torch.Tensor, ...] | None:
    """The parameters after ``train_case(seed)`` trained with mistake ``index`` of
    ``_TRAIN_MISTAKES``, or None where that variant cannot run on the case. Computed once per
    process: the case and the variant are fixed, and the 45 variants of both cases cost seconds
    (a second wrong answer is named at once)."""
    model, batches, recipe = train_case(seed)
    try:
        with torch.random.fork_rng(devices=[]), one_thread():
            train_variant(model, batches, recipe, **_TRAIN_MISTAKES[index][0])
    except RuntimeError:  # a variant that cannot run on this case does not match
        return None
    return tuple(p.detach().clone() for p in model.parameters())


def _check_lm_train(fn: Callable[..., Any]) -> None:
    if is_course_lib(fn):
        raise CheckFailure("You handed in one of course_lib's own functions: write the loop, the "
                           "update and the schedule yourself.")
    cases = ["12 steps, warm-up 4, a 1-layer GPT in float64",
             "10 steps, warm-up 3, other betas, decay, clipping, weights and batches"]
    for seed, case in enumerate(cases):
        model, batches, recipe = train_case(seed)
        start = copy.deepcopy(model.state_dict())
        got = _learner_train(fn, model, batches, recipe, case)
        expected_model = train_case(seed)[0]
        expected = lm_train_reference(expected_model, batches, recipe)
        if isinstance(got, torch.Tensor):
            got = got.tolist()
        try:
            got_losses = [float(v) for v in got]
        except (TypeError, ValueError) as err:
            raise CheckFailure(f"Return the list of the {recipe.num_steps} training losses, one per "
                               f"step (loss.item()), got {type(got).__name__} ({case}).") from err
        if len(got_losses) != recipe.num_steps:
            raise CheckFailure(f"You return {len(got_losses)} losses for {recipe.num_steps} batches "
                               f"({case}): one training step per batch, one loss per step.")
        if any(p.dtype != torch.float64 for p in model.parameters()):
            raise CheckFailure(f"Your function changed the model's dtype ({case}): it came in float64 "
                               "and must stay so; update the parameters in place.")
        if all(torch.equal(p, start[n]) for n, p in model.state_dict().items()):
            raise CheckFailure(f"The model's weights did not change ({case}): your update must "
                               "change model.parameters() in place (p.sub_(...), p -= ..., inside "
                               "torch.no_grad()).")
        if not all(torch.isfinite(p).all() for p in model.parameters()):
            raise CheckFailure(
                f"After training, your weights hold NaN or inf ({case}). A division by 0 somewhere "
                "in the update: bias correction with t counted from 0 (1 - beta**0 = 0), or the "
                "square root of v without eps where a gradient is 0.")
        if max_diff(model, expected_model) <= TRAIN_ATOL:
            if not all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for a, b in zip(got_losses, expected)):
                raise CheckFailure(f"The weights are right, but the losses you return are not the "
                                   f"per-step training losses ({case}): one loss.item() per step, "
                                   "computed before that step's update.")
            continue
        for index, (_, message) in enumerate(_TRAIN_MISTAKES):
            variant = _variant_weights(seed, index)
            if variant is not None and max_diff(model, variant) <= 10 * TRAIN_ATOL:
                raise CheckFailure(f"Likely mistake ({case}): {message}.", mistake=message)
        same = next((s for s, (a, b) in enumerate(zip(got_losses, expected))
                     if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)), None)
        if same is None:
            where = "Your losses equal the reference's at every step: only the last update differs."
        elif same == 0:
            where = "Your loss differs at step 0 already: the model changed before its first loss."
        else:
            where = (f"Your losses equal the reference's up to step {same - 1} and differ from step "
                     f"{same} on: the update of step {same - 1} is the first that differs.")
        raise CheckFailure(
            f"After {recipe.num_steps} steps your weights differ from torch.optim.AdamW's by up to "
            f"{max_diff(model, expected_model):.3g} ({case}), and none of the usual mistakes explains "
            f"it. {where} Print the rate of each step, and compare one update of one parameter with "
            "the algorithm in torch.optim.AdamW's documentation."
        )
    passed("check_lm_train", len(cases))
