"""Lesson-09 ★★★ checker, the training recipe by hand (course_lib/checks/lesson09_recipe.py): correct
answers in several styles pass, each named mistake is caught."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _helpers import passes, solution_namespace
from torch import nn

from course_lib.checks import CheckFailure, check_lm_train


# ----------------------------------------------------------------------------------------------
# build (★★★): the training loop, with the learner's own AdamW and schedule
# ----------------------------------------------------------------------------------------------


def _train(decay="matrices", decay_how="decoupled", warmup="course", cosine="course", clip="norm",
           zero_grad=True, betas="recipe", correction="both", eps="outside", rate_when="before",
           ret="losses", states="zeros_like", t_from=1):
    """A learner's training loop with a hand-written AdamW and one chosen mistake (the defaults
    are right): per-parameter loops, the state in a dict keyed by the parameter."""

    def my_lm_train(model, batches, recipe):
        named = list(model.named_parameters())
        if decay == "by_name":
            wd_of = {n: recipe.weight_decay if "bias" not in n else 0.0 for n, _ in named}
        elif decay == "all":
            wd_of = {n: recipe.weight_decay for n, _ in named}
        else:
            wd_of = {n: recipe.weight_decay if p.dim() >= 2 else 0.0 for n, p in named}
        b1, b2 = (0.9, 0.999) if betas == "default" else recipe.betas
        state = {}

        def factor(s):
            w, n, low = recipe.warmup, recipe.num_steps, recipe.min_lr / recipe.lr
            if s < w:
                return {"course": (s + 1) / (w + 1), "s_over_w": s / w}[warmup]
            p = min(1.0, s / n) if cosine == "from_0" else min(1.0, (s - w) / (n - w))
            return low + 0.5 * (1 + math.cos(math.pi * p)) * (1 - low)

        lr = recipe.lr  # the rate before the loop: the peak
        losses = []
        for step, (x, y) in enumerate(batches):
            if rate_when == "before":
                lr = recipe.lr * factor(step)
            loss = F.cross_entropy(model(x).transpose(1, 2), y)
            if zero_grad:
                model.zero_grad()
            loss.backward()
            if clip == "norm":
                nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
            elif clip == "value":
                nn.utils.clip_grad_value_(model.parameters(), recipe.max_grad_norm)
            t = step + t_from
            with torch.no_grad():
                for n, p in named:
                    g = p.grad
                    if decay_how == "l2":
                        g = g + wd_of[n] * p
                    if p not in state:
                        zeros = (torch.zeros_like(p) if states == "zeros_like"
                                 else torch.zeros(p.shape))  # float32 states
                        state[p] = [zeros, zeros.clone()]
                    m, v = state[p]
                    m.mul_(b1).add_((1 - b1) * g)
                    v.mul_(b2).add_((1 - b2) * g * g)
                    m_hat = m / (1 - b1**t) if correction == "both" else m
                    v_hat = v / (1 - b2**t) if correction == "both" else v
                    if eps == "inside":
                        step_ = m_hat / torch.sqrt(v_hat + 1e-8)
                    else:
                        step_ = m_hat / (torch.sqrt(v_hat) + 1e-8)
                    if decay_how == "decoupled":
                        p -= lr * wd_of[n] * p
                    p -= lr * step_
            if rate_when == "after":
                lr = recipe.lr * factor(step)
            losses.append(loss.item())
        return {"losses": losses, "none": None, "short": losses[:-1]}[ret]

    return my_lm_train


def test_lm_train_solution_passes(capsys):
    assert passes(check_lm_train, solution_namespace("09.lm_train")["my_lm_train"])
    assert "check_lm_train: all 2 cases match" in capsys.readouterr().out


def test_lm_train_checker_mirror_equals_torch_adamw():
    """The checker's hand-written AdamW (the source of its named mistakes), with no mistake, gives
    torch.optim.AdamW's weights in float64 to float rounding: 1e-10, far below the 1e-6 it allows."""
    from course_lib.checks.lesson09_recipe import max_diff, train_case, train_variant
    from course_lib.lm_training import lm_train_reference

    for seed in (0, 1):
        model, batches, recipe = train_case(seed)
        mirror = train_case(seed)[0]
        assert lm_train_reference(model, batches, recipe) == pytest.approx(
            train_variant(mirror, batches, recipe), rel=1e-12)
        assert max_diff(model, mirror) < 1e-10
    # older notebooks import the reference from its former place, kept as a deprecated re-export
    from course_lib.checks.gpt import lm_train_reference as former

    assert former is lm_train_reference


def test_lm_train_other_styles_pass():
    """Per-parameter loops with a dict of states, float32 states, the update on p.data, the rate
    from a list computed ahead, the clipping by hand, torch.autograd.grad instead of backward."""

    def vectorised(model, batches, recipe):
        params = list(model.parameters())
        flat = lambda ts: torch.cat([t.reshape(-1) for t in ts])  # noqa: E731
        wd = flat([torch.full_like(p, recipe.weight_decay if p.ndim > 1 else 0.0) for p in params])
        m, v = torch.zeros_like(wd), torch.zeros_like(wd)
        (b1, b2), w, n = recipe.betas, recipe.warmup, recipe.num_steps
        rates = [recipe.lr * (s + 1) / (w + 1) if s < w else recipe.min_lr + (recipe.lr - recipe.min_lr)
                 * (1 + math.cos(math.pi * min(1, (s - w) / (n - w)))) / 2 for s in range(len(batches))]
        losses = []
        for t, ((x, y), lr) in enumerate(zip(batches, rates), start=1):
            loss = lm_loss_fn(model(x), y)
            grads = torch.autograd.grad(loss, params)
            g = flat(grads)
            g = g * min(1.0, recipe.max_grad_norm / (g.norm() + 1e-6))  # clip_grad_norm_'s formula
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g**2
            p = flat([q.data for q in params])
            p = p * (1 - lr * wd) - lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + 1e-8)
            offset = 0
            for q in params:
                q.data.copy_(p[offset:offset + q.numel()].view_as(q))
                offset += q.numel()
            losses.append(loss.item())
        return losses

    from course_lib.gpt import lm_loss as lm_loss_fn

    for fn in (vectorised, _train(), _train(states="float32")):
        assert passes(check_lm_train, fn)


@pytest.mark.parametrize(
    "mistake, words",
    [
        ({"decay": "all"}, "decay is applied to every parameter"),
        ({"decay": "by_name"}, "chosen by name"),
        ({"decay_how": "l2"}, "added to the gradient \\(L2"),
        ({"decay_how": "none"}, "no weight decay at all"),
        ({"betas": "default"}, "AdamW's defaults \\(0.9, 0.999\\)"),
        ({"correction": "none"}, "bias correction is missing"),
        ({"eps": "inside"}, "eps is inside the square root"),
        ({"warmup": "s_over_w"}, "warm-up is off by one: a rate of 0 at step 0"),
        ({"cosine": "from_0"}, "cosine is counted from step 0"),
        ({"rate_when": "after"}, "set one step late"),
        ({"clip": "value"}, "clip_grad_value_"),
        ({"clip": "none"}, "not clipped"),
        ({"zero_grad": False}, "never zeroed"),
        ({"t_from": 0}, "NaN or inf.*t counted from 0"),
        ({"ret": "none"}, "list of the 12 training losses"),
        ({"ret": "short"}, "11 losses for 12 batches"),
    ],
)
def test_lm_train_mistakes(mistake, words):
    with pytest.raises(CheckFailure, match=words):
        check_lm_train(_train(**mistake))


def _torch_adamw_loop(model, batches, recipe, scheduler=False):
    """The former exercise's answer: torch.optim.AdamW (and LambdaLR), no longer allowed."""
    params = list(model.parameters())
    optimizer = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2]},
                                   {"params": [p for p in params if p.dim() < 2], "weight_decay": 0}],
                                  lr=recipe.lr, betas=recipe.betas, weight_decay=recipe.weight_decay)
    if scheduler:
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    for x, y in batches:
        loss = F.cross_entropy(model(x).transpose(1, 2), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return [0.0] * len(batches)


def test_lm_train_refuses_torch_optim_and_course_lib_kindly():
    from course_lib.lm_training import lm_train_reference
    from course_lib.lm_training import lm_optimizer, warmup_cosine
    from course_lib.training import train

    def with_pieces(model, batches, recipe):
        optimizer = lm_optimizer(model, recipe.lr, recipe.betas, recipe.weight_decay)
        ratio = recipe.min_lr / recipe.lr
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: warmup_cosine(s, recipe.warmup, recipe.num_steps, ratio))
        return train(model, lambda step: batches[step], recipe.num_steps, optimizer, lm_loss_fn,
                     scheduler, progress=False, max_grad_norm=recipe.max_grad_norm)

    from course_lib.gpt import lm_loss as lm_loss_fn

    right = _train()

    def with_warmup_cosine(model, batches, recipe):
        warmup_cosine(0, recipe.warmup, recipe.num_steps, 0.1)
        return right(model, batches, recipe)

    for fn, words in [(_torch_adamw_loop, "builds a torch.optim optimizer"),
                      (with_pieces, "course_lib's `lm_optimizer`"),
                      (lambda m, b, r: lm_train_reference(m, b, r), "course_lib's `lm_train_reference`"),
                      (with_warmup_cosine, "course_lib's `warmup_cosine`")]:
        with pytest.raises(CheckFailure, match=words) as info:
            check_lm_train(fn)
        assert "Likely mistake" not in str(info.value)
    with pytest.raises(CheckFailure, match="course_lib's own functions"):
        check_lm_train(lm_train_reference)


def test_lm_train_unknown_mistake_and_no_update():
    right = _train()

    def doubled_lr(model, batches, recipe):
        from dataclasses import replace

        return right(model, batches, replace(recipe, lr=2 * recipe.lr, min_lr=2 * recipe.min_lr))

    with pytest.raises(CheckFailure, match="none of the usual mistakes.*differ from step 1 on"):
        check_lm_train(doubled_lr)
    with pytest.raises(CheckFailure, match="did not change"):
        check_lm_train(lambda model, batches, recipe: [0.0] * len(batches))


def test_lm_train_stub(capsys):
    def my_lm_train(model, batches, recipe):
        raise NotImplementedError

    check_lm_train(my_lm_train)
    assert "not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# the notebook: the ★★★ stub states no steps, no working reference in view
# ----------------------------------------------------------------------------------------------


def _lesson_cells():
    import nbformat
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "notebooks" / "09_gpt.ipynb"
    return nbformat.read(path, as_version=4).cells


def test_lm_train_stub_states_no_steps():
    """The hook's rule for a ★★★ stub (/work/shared/hooks/before-stop): no numbered steps, at
    most three commas or semicolons after TODO, fewer than 10 comment lines."""
    import re

    stub = next(c.source for c in _lesson_cells() if c.get("metadata", {}).get("exercise") == "09.lm_train")
    todo = " ".join(line for line in stub.splitlines() if line.strip().startswith("#"))
    assert len(re.findall(r"^\s*#\s*(?:\d+[.)]|step\b|then\b|first\b)", stub, re.M | re.I)) < 3
    assert len(re.findall(r"[,;]", todo.split("TODO", 1)[1])) < 4 and todo.count("#") < 10


def test_no_working_training_loop_in_view():
    """Below the ★★★, the lesson uses lm_train_reference from course_lib until the learner's loop
    passes; no cell shows an optimizer, a scheduler or course_lib's training pieces put together."""
    code = "\n".join(c.source for c in _lesson_cells() if c.cell_type == "code")
    for shortcut in ("torch.optim", "lm_optimizer", "warmup_cosine", "course_lib_lm_train",
                     "from course_lib.training import"):
        assert shortcut not in code, shortcut
    assert "yours_or_reference(my_lm_train, lm_train_reference)" in code


# ----------------------------------------------------------------------------------------------
# h09's first tryout (issue 38): the wrong attempts whose messages were generic, raw or wrong
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "knobs, words",
    [
        ({"decay": "no_embeddings"}, "embedding tables get no decay"),
        ({"schedule": "min_lr_as_ratio"}, "min_lr is a rate, not a fraction"),
        ({"clip": "per_group"}, "clipped group by group"),
        ({"decay_how": "grows"}, "wrong sign"),
        ({"decay": "vectors"}, "decay is on the wrong parameters"),
    ],
)
def test_lm_train_tryout_mistakes_are_named(knobs, words):
    """Each written as a learner would, through the checker's own mirror of AdamW (whose
    defaults equal torch.optim.AdamW, see test_lm_train_checker_mirror_equals_torch_adamw)."""
    from course_lib.checks.lesson09_recipe import train_variant

    with pytest.raises(CheckFailure, match=words):
        check_lm_train(lambda model, batches, recipe: train_variant(model, batches, recipe, **knobs))


# ----------------------------------------------------------------------------------------------
# h09's second tryout (issue 38): the attempts that got the generic line or a wrong name
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "knobs, words",
    [
        ({"decay_how": "both"}, "decay is applied twice"),
        ({"clip": "one"}, "total norm of 1.0"),
        ({"zero_grad": "after_backward"}, "gradients of 0"),
    ],
)
def test_lm_train_second_tryout_mistakes_are_named(knobs, words):
    from course_lib.checks.lesson09_recipe import train_variant

    with pytest.raises(CheckFailure, match=words):
        check_lm_train(lambda model, batches, recipe: train_variant(model, batches, recipe, **knobs))


# ----------------------------------------------------------------------------------------------
# h09's third tryout (issue 38): the attempts that got the generic line
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "knobs, words",
    [
        ({"schedule": "warmup_s_over_w1"}, "s / \\(warmup \\+ 1\\)"),
        ({"correction": "v_with_beta1"}, "correction uses beta1"),
        ({"decay_how": "lr_squared"}, "learning rate twice"),
        ({"correction": "t_plus_1"}, "counts the steps from 2"),  # a blind tryout's (2026-11-27)
    ],
)
def test_lm_train_third_tryout_mistakes_are_named(knobs, words):
    from course_lib.checks.lesson09_recipe import train_variant

    with pytest.raises(CheckFailure, match=words):
        check_lm_train(lambda model, batches, recipe: train_variant(model, batches, recipe, **knobs))
