"""Lesson-09 checkers of the model and its loss (course_lib/checks/lesson09_gpt.py): correct answers in
several styles pass, each named mistake is caught."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _helpers import assert_checkers_keep_random_state, passes, solution_namespace

from course_lib import causal_mask
from course_lib.checks import (
    CheckFailure, check_attention_port, check_generate, check_gpt_forward, check_initial_loss,
    check_lm_loss, check_lm_train,
)
from course_lib.gpt import GPT
from course_lib.solutions import predicted_answer


# ----------------------------------------------------------------------------------------------
# predict: the loss at step 0
# ----------------------------------------------------------------------------------------------


def test_initial_loss_solution_passes(capsys):
    assert passes(check_initial_loss, solution_namespace("09.initial_loss")["predicted_initial_loss"])
    out = capsys.readouterr().out
    assert "check_initial_loss: right" in out and "-ln(1/83)" in out


def test_initial_loss_predicted_answer_is_ln_83():
    assert predicted_answer("09.initial_loss") == pytest.approx(math.log(83))


@pytest.mark.parametrize("answer", [4.45, 4.4, 4.5, torch.tensor(4.42), -math.log(1 / 83)])
def test_initial_loss_close_answers_pass(answer):
    assert passes(check_initial_loss, lambda: answer)


@pytest.mark.parametrize(
    "answer, words",
    [
        (math.log(86), "no <pad>/<sos>/<eos>"),
        (math.log2(83), "that is bits"),
        (math.log10(83), "log10"),
        (83, "number of characters"),
        (1 / 83, "probability 1/83"),
        (math.log(65), "nanoGPT's tiny-Shakespeare"),
        (math.log(256), "bytes"),
        (0, "knows nothing"),
        (-1.0, "never negative"),
        (1.5, "below the uniform guess"),
        (5.0, "too high"),
        (20.0, "worse than uniform"),
    ],
)
def test_initial_loss_mistakes(answer, words):
    with pytest.raises(CheckFailure, match=words):
        check_initial_loss(lambda: answer)


@pytest.mark.parametrize("answer, words", [("4.4", "one number"), (None, "one number"),
                                           (True, "one number"), ((4.4, 4.5), "one number"),
                                           (float("nan"), "finite"), (float("inf"), "finite")])
def test_initial_loss_bad_input(answer, words):
    with pytest.raises(CheckFailure, match=words):
        check_initial_loss(lambda: answer)


def test_initial_loss_stub(capsys):
    def predicted_initial_loss():
        raise NotImplementedError

    check_initial_loss(predicted_initial_loss)
    assert "not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# build: GPT's forward pass from its parts
# ----------------------------------------------------------------------------------------------


def _forward(mask="causal", final_norm=True, scale=False, positions="T", dropout="module",
             chained=True, residual=False, output="logits", switch_mode=None):
    """A learner's forward pass with one chosen mistake (the defaults are right)."""

    def my_gpt_forward(model, ids):
        B, T = ids.shape
        d = model.config.d_model
        if switch_mode == "train":
            model.train()
        tok = model.embed.token(ids) * (d ** 0.5 if scale else 1.0)
        n_pos = {"T": T, "max_len": model.config.max_len, "B": B}.get(positions)
        pos = model.embed.position(n_pos) if n_pos else 0.0
        if dropout == "module":
            x = model.embed.dropout(tok + pos)
        elif dropout == "functional":  # F.dropout's default training=True
            x = F.dropout(tok + pos, model.embed.dropout.p)
        elif dropout == "token_only":
            x = model.embed.dropout(tok) + pos
        else:
            x = tok + pos
        m = {"causal": causal_mask(T), "none": None, "triu": torch.ones(T, T, dtype=torch.bool).triu(),
             "inverted": ~causal_mask(T)}[mask]
        h = x
        for layer in model.blocks.layers:
            out = layer(h if chained else x, m)
            h = h + out if residual else out
        if final_norm:
            h = model.blocks.norm(h)
        if output == "hidden":
            return h
        logits = model.lm_head(h)
        return {"logits": logits, "softmax": logits.softmax(-1),
                "log_softmax": F.log_softmax(logits, -1)}[output]

    return my_gpt_forward


def test_gpt_forward_solution_passes(capsys):
    assert passes(check_gpt_forward, solution_namespace("09.gpt_forward")["my_gpt_forward"])
    assert "check_gpt_forward: all 4 cases match" in capsys.readouterr().out


def test_gpt_forward_other_styles_pass():
    """Tied weights by hand, positions from torch.arange, a hand-made mask, functional dropout
    that follows the mode."""

    def my_gpt_forward(model, ids):
        T = ids.shape[-1]
        positions = torch.arange(T, device=ids.device)  # (T,)
        x = model.embed.token.embedding(ids) + model.embed.position.embedding(positions)[None]
        x = F.dropout(x, model.embed.dropout.p, training=model.training)
        mask = torch.tril(torch.ones(T, T)).bool()
        for i in range(len(model.blocks.layers)):
            x = model.blocks.layers[i](x, mask.expand(ids.size(0), T, T))
        return F.linear(model.blocks.norm(x), model.embed.token.embedding.weight)

    assert passes(check_gpt_forward, my_gpt_forward)
    assert passes(check_gpt_forward, _forward())


@pytest.mark.parametrize(
    "mistake, words",
    [
        ({"mask": "none"}, "no causal mask"),
        ({"mask": "triu"}, "points the wrong way"),
        ({"mask": "inverted"}, "inverted"),
        ({"final_norm": False}, "final LayerNorm is missing"),
        ({"scale": True}, "sqrt\\(d_model\\)"),
        ({"positions": None}, "position vectors are missing"),
        ({"positions": "max_len"}, "builds 16 position vectors \\(max_len\\)"),
        ({"positions": "B"}, "not ids.size\\(0\\)"),
        ({"chained": False}, "not chained"),
        ({"residual": True}, "residual is added twice"),
        ({"output": "softmax"}, "softmax is applied"),
        ({"output": "log_softmax"}, "log_softmax is applied"),
        ({"output": "hidden"}, "the hidden states"),
        ({"dropout": "none"}, "dropout on the embeddings is missing"),
        ({"dropout": "token_only"}, "before the positions"),
        ({"dropout": "functional"}, "dropout is applied in eval mode"),
        ({"switch_mode": "train"}, "switched the model to training mode"),
    ],
)
def test_gpt_forward_mistakes(mistake, words):
    with pytest.raises(CheckFailure, match=words):
        check_gpt_forward(_forward(**mistake))


def _every_layer_normed(model, ids):
    T = ids.size(1)
    x = model.embed.dropout(model.embed.token(ids) + model.embed.position(T))
    for layer in model.blocks.layers:
        x = model.blocks.norm(layer(x, causal_mask(T)))
    return x


def _forward_parts(model, ids, positions=None, mask=None, norm_first=False):
    T = ids.size(1)
    pos = model.embed.position(T) if positions is None else positions
    x = model.embed.dropout(model.embed.token(ids) + pos)
    if norm_first:
        x = model.blocks.norm(x)
    for layer in model.blocks.layers:
        x = layer(x, causal_mask(T) if mask is None else mask)
    return model.lm_head(x if norm_first else model.blocks.norm(x))


@pytest.mark.parametrize(
    "body, words",
    [
        (lambda m, ids: _forward_parts(m, ids, positions=m.embed.position(ids.size(1)).unsqueeze(1)),
         "unsqueezed to \\(T, 1, d_model\\)"),
        (lambda m, ids: _forward_parts(m, ids, positions=m.embed.position(ids.size(1) + 1)[1:]),
         "positions start at|start at 0, not 1"),
        (lambda m, ids: _forward_parts(
            m, ids, mask=torch.ones(ids.size(1), ids.size(1), dtype=torch.bool).tril(-1)),
         "off by one: tril\\(-1\\)"),
        (lambda m, ids: _forward_parts(m, ids, norm_first=True), "applied before the blocks"),
        (lambda m, ids: _forward_parts(m, ids, positions=m.embed.position(64)[: ids.size(1)]
                                       if m.config.max_len >= 64 else m.embed.position(64)),
         "a size is hard-coded"),
        (lambda m, ids: _forward_parts(m, ids, mask=causal_mask(64)),
         "a size is hard-coded"),
        # blind tryouts' (2026-11-27): the final norm after every layer and at the end; the
        # position vectors flipped
        (lambda m, ids: m.lm_head(m.blocks.norm(_every_layer_normed(m, ids))), "after every layer"),
        (lambda m, ids: _forward_parts(m, ids, positions=m.embed.position(ids.size(1)).flip(0)),
         "position vectors are in reverse order"),
    ],
)
def test_gpt_forward_more_named_mistakes(body, words):
    with pytest.raises(CheckFailure, match=words):
        check_gpt_forward(body)


def test_gpt_forward_one_window_at_a_time_passes_in_training_mode():
    """Dropout draws in another order (one sequence at a time) are not a mistake."""

    def my_gpt_forward(model, ids):
        return torch.cat([_forward_parts(model, ids[b : b + 1]) for b in range(ids.size(0))])

    assert passes(check_gpt_forward, my_gpt_forward)


def test_gpt_forward_float64_output_passes():
    solution = solution_namespace("09.gpt_forward")["my_gpt_forward"]
    assert passes(check_gpt_forward, lambda model, ids: solution(model, ids).double())
    with pytest.raises(CheckFailure, match="largest difference"):
        check_gpt_forward(lambda model, ids: solution(model, ids).double() + 0.5)
    with pytest.raises(CheckFailure, match="Your logits are 2 times the right ones"):
        check_gpt_forward(lambda model, ids: solution(model, ids).double() * 2)


def test_gpt_forward_final_norm_in_every_layer_is_caught():
    def my_gpt_forward(model, ids):
        x = model.embed.dropout(model.embed.token(ids) + model.embed.position(ids.size(1)))
        for layer in model.blocks.layers:
            x = model.blocks.norm(layer(x, causal_mask(ids.size(1))))
        return model.lm_head(x)

    with pytest.raises(CheckFailure, match="after every layer"):
        check_gpt_forward(my_gpt_forward)


def test_gpt_forward_unknown_mistake_gets_the_difference():
    solution = solution_namespace("09.gpt_forward")["my_gpt_forward"]
    with pytest.raises(CheckFailure, match="largest difference"):
        check_gpt_forward(lambda model, ids: solution(model, ids) + 0.5)


def test_gpt_forward_unknown_mistake_with_a_future_leak_says_so():
    leaky = _forward(mask="none")
    with pytest.raises(CheckFailure, match="the future leaks in"):
        check_gpt_forward(lambda model, ids: leaky(model, ids) * 2)


def test_gpt_forward_float_mask_gets_a_clear_error():
    def my_gpt_forward(model, ids):
        T = ids.size(1)
        x = model.embed.dropout(model.embed.token(ids) + model.embed.position(T))
        for layer in model.blocks.layers:
            x = layer(x, torch.ones(T, T).tril())  # float, not bool
        return model.lm_head(model.blocks.norm(x))

    with pytest.raises(CheckFailure, match="Your code raised"):
        check_gpt_forward(my_gpt_forward)


@pytest.mark.parametrize(
    "body, words",
    [
        (lambda model, ids: model(ids), "model's own forward pass"),
        (lambda model, ids: GPT.forward(model, ids), "model's own forward pass"),
        (lambda model, ids: model.lm_head(model.blocks(model.embed(ids), causal_mask(ids.size(1)))),
         "model.blocks\\(...\\) as a whole"),
        (lambda model, ids: _blocks_by_hand(model, model.embed(ids)), "model.embed\\(ids\\) as a whole"),
    ],
)
def test_gpt_forward_refuses_the_reference(body, words):
    with pytest.raises(CheckFailure, match=words):
        check_gpt_forward(body)


def _blocks_by_hand(model, x):
    for layer in model.blocks.layers:
        x = layer(x, causal_mask(x.size(1)))
    return model.lm_head(model.blocks.norm(x))


def test_gpt_forward_refuses_course_lib_hand_in():
    with pytest.raises(CheckFailure, match="course_lib's own forward pass"):
        check_gpt_forward(GPT.forward)


def test_gpt_forward_stub(capsys):
    def my_gpt_forward(model, ids):
        raise NotImplementedError

    check_gpt_forward(my_gpt_forward)
    assert "not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# every lesson-09 checker (solutions from course_lib.solutions.lesson09)
# ----------------------------------------------------------------------------------------------


def test_checkers_leave_the_global_random_state_alone():
    solutions = [(check_initial_loss, solution_namespace("09.initial_loss")["predicted_initial_loss"]),
                 (check_lm_loss, _loss()),
                 (check_generate, solution_namespace("09.generate")["my_generate"]),
                 (check_lm_train, solution_namespace("09.lm_train")["my_lm_train"]),
                 (check_gpt_forward, solution_namespace("09.gpt_forward")["my_gpt_forward"]),
                 (check_attention_port, solution_namespace("09.port_attention")["port_attention"])]
    assert_checkers_keep_random_state(solutions)


# ----------------------------------------------------------------------------------------------
# build (★): the shifted targets and the loss over every position
# ----------------------------------------------------------------------------------------------


def _loss(shift="right", reduction="mean", reshape="flat", where="all", prob="logits", bits=False,
          detach=False, as_float=False, whole=False):
    """A learner's loss with one chosen mistake (the defaults are right)."""

    def my_lm_loss(model, window):
        if whole:  # the whole window into the model
            x, y = window, window
        elif shift == "right":
            x, y = window[:, :-1], window[:, 1:]
        elif shift == "none":
            x, y = window[:, :-1], window[:, :-1]
        else:  # the wrong way
            x, y = window[:, 1:], window[:, :-1]
        logits = model(x)
        B, T, V = logits.shape
        if prob == "softmax":
            logits = logits.softmax(-1)
        if where == "last":
            loss = F.cross_entropy(logits[:, -1], y[:, -1])
        elif reshape == "none":
            loss = F.cross_entropy(logits, y)
        elif reshape == "transposed":
            loss = F.cross_entropy(logits.transpose(0, 1).reshape(-1, V), y.reshape(-1))
        elif prob == "nll":
            loss = F.nll_loss(logits.reshape(-1, V), y.reshape(-1))
        elif reduction == "per_sequence":
            loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), reduction="sum") / B
        else:
            loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), reduction=reduction)
        if bits:
            loss = loss / math.log(2)
        if detach:
            loss = loss.detach()
        return loss.item() if as_float else loss

    return my_lm_loss


def test_lm_loss_right_answer_passes(capsys):
    assert passes(check_lm_loss, _loss())
    assert "check_lm_loss: all 3 cases match" in capsys.readouterr().out


def test_lm_loss_other_styles_pass():
    """log_softmax and gather by hand in float64, transpose(1, 2) instead of a reshape, the whole
    window through the model with the last logits dropped, one window at a time."""

    def by_hand(model, window):
        logp = model(window[:, :-1]).double().log_softmax(-1)  # (B, T, V)
        return -logp.gather(-1, window[:, 1:].unsqueeze(-1)).mean()

    def transposed(model, window):
        return F.cross_entropy(model(window[:, :-1]).transpose(1, 2), window[:, 1:])

    def per_window(model, window):
        losses = [F.cross_entropy(model(w[None, :-1])[0], w[1:]) for w in window]
        return torch.stack(losses).mean()  # equal lengths: the mean of means is the mean

    for fn in (by_hand, transposed, per_window, _loss()):
        assert passes(check_lm_loss, fn)


@pytest.mark.parametrize(
    "mistake, words",
    [
        ({"shift": "none"}, "targets are not shifted"),
        ({"shift": "wrong_way"}, "shift goes the wrong way"),
        ({"whole": True}, "whole window goes in"),
        ({"reduction": "per_sequence"}, "loss per sequence"),
        ({"reduction": "sum"}, "summed, not averaged"),
        ({"where": "last"}, "only the last position"),
        ({"prob": "softmax"}, "softmax is applied before"),
        ({"prob": "nll"}, "nll_loss is given the logits"),
        ({"bits": True}, "in bits"),
        ({"reshape": "none"}, "logits are not reshaped"),
        ({"reshape": "transposed"}, "flattened in different orders"),
        ({"detach": True}, "No gradient reaches the model"),
        ({"as_float": True}, "Python number"),
    ],
)
def test_lm_loss_mistakes(mistake, words):
    with pytest.raises(CheckFailure, match=words):
        check_lm_loss(_loss(**mistake))


def test_lm_loss_unknown_mistake_and_bad_returns():
    solution = _loss()
    with pytest.raises(CheckFailure, match="None of the usual mistakes"):
        check_lm_loss(lambda model, window: solution(model, window) * 1.5)
    with pytest.raises(CheckFailure, match="0-dim tensor"):
        check_lm_loss(lambda model, window: F.cross_entropy(
            model(window[:, :-1]).transpose(1, 2), window[:, 1:], reduction="none"))
    with pytest.raises(CheckFailure, match="Your code raised ZeroDivisionError"):
        check_lm_loss(lambda model, window: 1 / 0)


def test_lm_loss_stub(capsys):
    def my_lm_loss(model, window):
        raise NotImplementedError

    check_lm_loss(my_lm_loss)
    assert "not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# issue 38: correct code in other styles, decorated code, shortcuts refused kindly
# ----------------------------------------------------------------------------------------------


def test_lm_loss_rewrapped_value_is_refused_without_inviting_a_rewrap():
    def my_lm_loss(model, window):
        logits = model(window[:, :-1])
        value = F.cross_entropy(logits.reshape(-1, logits.size(-1)), window[:, 1:].reshape(-1))
        return torch.tensor(value.item(), requires_grad=True)

    with pytest.raises(CheckFailure, match="No gradient reaches the model") as info:
        check_lm_loss(my_lm_loss)
    assert "requires_grad" not in str(info.value)

    def half_detached(model, window):  # the right value, half of the gradient
        right = _loss()(model, window)
        return 0.5 * right + 0.5 * right.detach()

    with pytest.raises(CheckFailure, match="right value but not the right gradient"):
        check_lm_loss(half_detached)


def test_lm_loss_refuses_course_lib_lm_loss_inside_kindly():
    from course_lib.gpt import lm_loss

    with pytest.raises(CheckFailure, match="calls course_lib's lm_loss") as info:
        check_lm_loss(lambda model, window: lm_loss(model(window[:, :-1]), window[:, 1:]))
    assert "mistake" not in str(info.value).lower()


# ----------------------------------------------------------------------------------------------
# h09's first tryout (issue 38): the wrong attempts whose messages were generic, raw or wrong
# ----------------------------------------------------------------------------------------------


def _loss_from(targets_of, view=False, **ce):
    def my_lm_loss(model, window):
        x = window[:, :-1]
        logits = model(x)
        y = targets_of(window, x)
        if view:
            return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), **ce)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), **ce)

    return my_lm_loss


@pytest.mark.parametrize(
    "fn, words",
    [
        (_loss_from(lambda w, x: w[:, 1:], view=True), "\\.view cannot flatten it"),
        (_loss_from(lambda w, x: w[:, 1:], label_smoothing=0.1), "label smoothing"),
        (_loss_from(lambda w, x: torch.roll(x, -1, dims=1)), "torch.roll"),
    ],
)
def test_lm_loss_tryout_mistakes_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_lm_loss(fn)


def test_gpt_forward_positions_of_the_ids_are_named():
    def my_gpt_forward(model, ids):
        x = model.embed.dropout(model.embed.token(ids) + model.embed.position(ids))
        for layer in model.blocks.layers:
            x = layer(x, causal_mask(ids.size(1)))
        return model.lm_head(model.blocks.norm(x))

    with pytest.raises(CheckFailure, match="position was given a tensor"):
        check_gpt_forward(my_gpt_forward)


# ----------------------------------------------------------------------------------------------
# h09's second tryout (issue 38): the attempts that got the generic line or a wrong name
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda model, window: F.cross_entropy(model(window[:, :-1]).reshape(-1, 37), window[:, 1:].reshape(-1),
                                               reduction="sum") / (window.size(1) - 1), "divided by T only"),
        (lambda model, window: F.nll_loss(model(window[:, :-1]).log_softmax(1).reshape(-1, 37),
                                          window[:, 1:].reshape(-1)), "log_softmax runs over the wrong axis"),
        (lambda model, window: F.cross_entropy(model(window[:, :-2]).reshape(-1, 37), window[:, 2:].reshape(-1)),
         "two places on"),
        (lambda model, window: F.cross_entropy(model(window[:, :-1])[:, :-1].reshape(-1, 37),
                                               window[:, 1:-1].reshape(-1)), "shift is made twice"),
        # a blind tryout's (2026-11-27): the targets flattened column by column
        (lambda model, window: F.cross_entropy(model(window[:, :-1]).reshape(-1, 37), window[:, 1:].t().reshape(-1)),
         "flattened in another order"),
    ],
)
def test_lm_loss_second_tryout_mistakes_are_named(fn, words):
    """(And the third tryout's: two places on, a shift made twice.)"""
    with pytest.raises(CheckFailure, match=words):
        check_lm_loss(fn)


def test_gpt_forward_dropout_after_the_final_norm_is_not_called_a_hard_coded_size():
    def my_gpt_forward(model, ids):
        T = ids.size(1)
        x = model.embed.dropout(model.embed.token(ids) + model.embed.position(T))
        for layer in model.blocks.layers:
            x = layer(x, causal_mask(T))
        return model.lm_head(model.embed.dropout(model.blocks.norm(x)))

    with pytest.raises(CheckFailure, match="right in eval mode but not in training mode") as info:
        check_gpt_forward(my_gpt_forward)
    assert "hard-coded" not in str(info.value)


# ----------------------------------------------------------------------------------------------
# the third blind tryout (issue 38, tryout3): one position's or one window's loss alone
# ----------------------------------------------------------------------------------------------


def _per_position_loss(model, window):
    logits = model(window[:, :-1])  # (B, T, V)
    return F.cross_entropy(logits.transpose(1, 2), window[:, 1:], reduction="none")  # (B, T)


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda model, window: _per_position_loss(model, window).mean(dim=0)[0],
         "loss of the FIRST position alone"),
        (lambda model, window: _per_position_loss(model, window).mean(dim=1)[0],
         "FIRST window's positions alone"),
    ],
)
def test_lm_loss_one_position_or_one_window_is_named(fn, words):
    """Each message says what was observed (the loss and the one expected) and carries its name."""
    with pytest.raises(CheckFailure, match=words) as info:
        check_lm_loss(fn)
    assert "your loss is" in str(info.value) and "expected" in str(info.value)
    assert info.value.mistake and words in info.value.mistake
