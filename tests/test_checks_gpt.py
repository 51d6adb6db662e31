"""Lesson-09 checkers: correct answers in several styles pass, each named mistake is caught."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
import torch.nn.functional as F
from _helpers import assert_checkers_keep_random_state, passes
from torch import nn

from course_lib import causal_mask
from course_lib.checks import (
    check_attention_port, check_generate, check_gpt_forward, check_initial_loss, check_lm_loss,
    check_lm_train,
)
from course_lib.checks._common import CheckFailure
from course_lib.gpt import GPT, load_into_hf_gpt2
from course_lib.solutions import predicted_answer, solution_source


def _solution(key: str) -> dict:
    """The names a solution block defines (run with the solution file's header imports)."""
    module = importlib.import_module("course_lib.solutions.lesson09")
    namespace: dict = dict(vars(module))
    exec(solution_source(key), namespace)  # noqa: S102  (our own solution file)
    return namespace


# ----------------------------------------------------------------------------------------------
# predict: the loss at step 0
# ----------------------------------------------------------------------------------------------


def test_initial_loss_solution_passes(capsys):
    assert passes(check_initial_loss, _solution("09.initial_loss")["predicted_initial_loss"])
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
    assert passes(check_gpt_forward, _solution("09.gpt_forward")["my_gpt_forward"])
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
    solution = _solution("09.gpt_forward")["my_gpt_forward"]
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
    solution = _solution("09.gpt_forward")["my_gpt_forward"]
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
# debug: porting attention into GPT-2's Conv1D layout
# ----------------------------------------------------------------------------------------------


def _port(order=("q", "k", "v"), t_attn=(True, True, True), t_proj=True, attn_bias="qkv",
          proj_bias=True, reverse=False):
    """A learner's port with chosen mistakes (the defaults are right)."""

    def port_attention(ours, theirs):
        linears = {"q": ours.q_proj, "k": ours.k_proj, "v": ours.v_proj}
        with torch.no_grad():
            if reverse:  # copies theirs into ours
                ours.out_proj.weight.copy_(theirs.c_proj.weight.t())
                return
            blocks = [linears[n].weight.t() if t else linears[n].weight for n, t in zip(order, t_attn)]
            theirs.c_attn.weight.copy_(torch.cat(blocks, dim=1))
            if attn_bias:
                theirs.c_attn.bias.copy_(torch.cat([linears[n].bias for n in attn_bias]))
            w = ours.out_proj.weight
            theirs.c_proj.weight.copy_(w.t() if t_proj else w)
            if proj_bias:
                theirs.c_proj.bias.copy_(ours.out_proj.bias)

    return port_attention


def test_attention_port_solution_passes(capsys):
    assert passes(check_attention_port, _solution("09.port_attention")["port_attention"])
    assert "check_attention_port: right" in capsys.readouterr().out


def test_attention_port_other_styles_pass():
    def by_parameters(ours, theirs):  # new Parameters instead of copy_
        theirs.c_attn.weight = nn.Parameter(torch.cat(
            [ours.q_proj.weight.t(), ours.k_proj.weight.t(), ours.v_proj.weight.t()], dim=1).detach())
        theirs.c_attn.bias = nn.Parameter(torch.cat(
            [ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]).detach())
        theirs.c_proj.weight = nn.Parameter(ours.out_proj.weight.T.clone().detach())
        theirs.c_proj.bias = nn.Parameter(ours.out_proj.bias.clone().detach())

    assert passes(check_attention_port, by_parameters)
    assert passes(check_attention_port, _port())


def test_attention_port_stub_bug_is_named():
    """The stub's code without its `raise`: no matrix transposed."""
    def port_attention(ours, theirs):
        with torch.no_grad():
            theirs.c_attn.weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight,
                                                  ours.v_proj.weight], dim=1))  # (d, 3d)
            theirs.c_attn.bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
            theirs.c_proj.weight.copy_(ours.out_proj.weight)  # (d, d)
            theirs.c_proj.bias.copy_(ours.out_proj.bias)

    with pytest.raises(CheckFailure, match="c_attn.weight has the shape GPT2Attention expects") as info:
        check_attention_port(port_attention)
    message = str(info.value)
    assert "c_proj.weight has the right shape" in message and "other values" in message
    # a Debug exercise: the first message says what differs, not the fix
    assert ".t()" not in message and "transpose" not in message.lower()


@pytest.mark.parametrize(
    "mistake, words",
    [
        ({"t_attn": (False, False, False)}, "the q, k, v it computes"),
        ({"t_attn": (True, True, False)}, "the v it computes from an input x differ from ours.v_proj"),
        ({"t_proj": False}, "c_proj.weight has the right shape"),
        ({"order": ("k", "q", "v"), "attn_bias": "kqv"}, "order k, q, v"),
        ({"attn_bias": "vkq"}, "c_attn.bias holds the biases in the order v, k, q"),
        ({"attn_bias": ""}, "c_attn.bias was not copied"),
        ({"proj_bias": False}, "c_proj.bias was not copied"),
        ({"reverse": True}, "changed ours"),
    ],
)
def test_attention_port_mistakes(mistake, words):
    with pytest.raises(CheckFailure, match=words):
        check_attention_port(_port(**mistake))


def test_attention_port_nothing_copied_is_caught():
    def port_attention(ours, theirs):
        w = theirs.c_attn.weight
        w = torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]).t()  # noqa: F841

    with pytest.raises(CheckFailure, match="nothing was copied"):
        check_attention_port(port_attention)


def test_attention_port_weights_forgotten_is_caught():
    def port_attention(ours, theirs):
        with torch.no_grad():  # only the biases
            theirs.c_attn.bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
            theirs.c_proj.bias.copy_(ours.out_proj.bias)

    with pytest.raises(CheckFailure, match="c_attn.weight was not copied") as info:
        check_attention_port(port_attention)
    assert "c_proj.weight was not copied" in str(info.value)


def test_attention_port_shape_error_gets_the_layout():
    def port_attention(ours, theirs):
        with torch.no_grad():  # (3d, d) into (d, 3d)
            theirs.c_attn.weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight,
                                                  ours.v_proj.weight], dim=0))

    with pytest.raises(CheckFailure, match="\\(d, 3d\\)"):
        check_attention_port(port_attention)


def test_attention_port_refuses_course_lib():
    with pytest.raises(CheckFailure, match="write the copy"):
        check_attention_port(load_into_hf_gpt2)

    def port_attention(ours, theirs):
        load_into_hf_gpt2(ours, theirs)

    with pytest.raises(CheckFailure, match="load_into_hf_gpt2"):
        check_attention_port(port_attention)


def test_attention_port_stub(capsys):
    def port_attention(ours, theirs):
        raise NotImplementedError

    check_attention_port(port_attention)
    assert "not implemented yet" in capsys.readouterr().out


def test_checkers_leave_the_global_random_state_alone():
    solutions = [(check_initial_loss, _solution("09.initial_loss")["predicted_initial_loss"]),
                 (check_lm_loss, _loss()),
                 (check_generate, _gen()),
                 (check_lm_train, _train()),
                 (check_gpt_forward, _solution("09.gpt_forward")["my_gpt_forward"]),
                 (check_attention_port, _solution("09.port_attention")["port_attention"])]
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
# build (★★): the generation loop, against GPT.generate
# ----------------------------------------------------------------------------------------------


def _gen(crop="last", where=-1, temp="divide", topk="ge", sample="multinomial", use_gen=True,
         steps=0, prompt=True):
    """A learner's sampling loop with one chosen mistake (the defaults are right)."""

    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        out = ids
        L = model.config.max_len
        for _ in range(max_new_tokens + steps):
            context = {"last": out[:, -L:], "first": out[:, :L], "none": out}[crop]
            with torch.no_grad():
                logits = model(context)[:, where]
            if temp == "divide":
                logits = logits / temperature
            elif temp == "multiply":
                logits = logits * temperature
            if top_k is not None and topk != "ignored":
                values = torch.topk(logits, top_k).values
                if topk == "ge":
                    logits = logits.masked_fill(logits < values[:, -1:], float("-inf"))
                elif topk == "gt":
                    logits = logits.masked_fill(logits <= values[:, -1:], float("-inf"))
                elif topk == "zero":
                    logits = logits.masked_fill(logits < values[:, -1:], 0.0)
            probs = logits.softmax(-1)
            if temp == "probs":  # temperature on the probabilities: no effect after normalising
                probs = probs / temperature
            if sample == "greedy":
                nxt = probs.argmax(-1, keepdim=True)
            elif sample == "logits":
                nxt = torch.multinomial(logits, 1, generator=generator)
            else:
                nxt = torch.multinomial(probs, 1, generator=generator if use_gen else None)
            out = torch.cat([out, nxt], dim=1)
        return out if prompt else out[:, ids.size(1):]

    return my_generate


def test_generate_right_answer_passes(capsys):
    assert passes(check_generate, _gen())
    assert "check_generate: all 4 cases match" in capsys.readouterr().out


def test_generate_other_styles_pass():
    """Temperature after top-k (the same tokens: dividing by T > 0 keeps the order), one sequence
    at a time, a Python list of ids, float64 logits; and lesson 07's filter_logits."""
    from course_lib.decoding import filter_logits

    def one_at_a_time(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        rows = []
        for row in ids:
            out = row.tolist()
            for _ in range(max_new_tokens):
                with torch.no_grad():
                    logits = model(torch.tensor([out[-model.config.max_len:]]))[0, -1].double()
                if top_k is not None:
                    kth = logits.sort(descending=True).values[top_k - 1]
                    logits[logits < kth] = -math.inf
                probs = torch.softmax(logits / temperature, dim=-1)
                out.append(int(torch.multinomial(probs.float(), 1, generator=generator)))
            rows.append(out)
        return torch.tensor(rows)

    def with_filter(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        for _ in range(max_new_tokens):
            logits = model(ids[:, -model.config.max_len:])[:, -1].detach()
            probs = filter_logits(logits / temperature, top_k).softmax(-1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)], 1)
        return ids

    for fn in (one_at_a_time, with_filter, _gen()):
        assert passes(check_generate, fn)


@pytest.mark.parametrize(
    "mistake, words",
    [
        ({"crop": "none"}, "feed only the last max_len tokens"),
        ({"crop": "first"}, "cropped to the FIRST max_len"),
        ({"where": 0}, "first position"),
        ({"temp": "multiply"}, "multiplied by the temperature"),
        ({"temp": "ignored"}, "temperature changes nothing"),
        ({"temp": "probs"}, "temperature changes nothing"),
        ({"topk": "ignored"}, "top_k changes nothing"),
        ({"topk": "gt"}, "keeps top_k - 1"),
        ({"topk": "zero"}, "set to 0, not -inf"),
        ({"sample": "greedy"}, "argmax"),
        ({"sample": "logits"}, "not a probability distribution"),
        ({"use_gen": False}, "do not come from `generator`"),
        ({"steps": 1}, "1 too many"),
        ({"steps": -1}, "1 too few"),
        ({"prompt": False}, "only the .* new tokens"),
    ],
)
def test_generate_mistakes(mistake, words):
    with pytest.raises(CheckFailure, match=words):
        check_generate(_gen(**mistake))


def test_generate_a_loop_that_never_ends_is_stopped():
    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        out = ids
        while out.size(1) != ids.size(1) + max_new_tokens + 1000:  # never reached fast
            logits = model(out[:, -model.config.max_len:])[:, -1]
            out = torch.cat([out, logits.argmax(-1, keepdim=True)], 1)
        return out

    with pytest.raises(CheckFailure, match="forward passes"):
        check_generate(my_generate)


def test_generate_refuses_the_reference():
    with pytest.raises(CheckFailure, match="calls model.generate"):
        check_generate(lambda model, ids, n, temperature=1.0, top_k=None, generator=None:
                       model.generate(ids, n, temperature, top_k, generator=generator))


def test_generate_stub(capsys):
    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        raise NotImplementedError

    check_generate(my_generate)
    assert "not implemented yet" in capsys.readouterr().out


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
    assert passes(check_lm_train, _solution("09.lm_train")["my_lm_train"])
    assert "check_lm_train: all 2 cases match" in capsys.readouterr().out


def test_lm_train_checker_mirror_equals_torch_adamw():
    """The checker's hand-written AdamW (the source of its named mistakes), with no mistake, gives
    torch.optim.AdamW's weights in float64 to float rounding: 1e-10, far below the 1e-6 it allows."""
    from course_lib.checks.gpt import _max_diff, _train_case, _train_variant, lm_train_reference

    for seed in (0, 1):
        model, batches, recipe = _train_case(seed)
        mirror = _train_case(seed)[0]
        assert lm_train_reference(model, batches, recipe) == pytest.approx(
            _train_variant(mirror, batches, recipe), rel=1e-12)
        assert _max_diff(model, mirror) < 1e-10


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
    from course_lib.checks.gpt import lm_train_reference
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
# issue 38: correct code in other styles, decorated code, shortcuts refused kindly
# ----------------------------------------------------------------------------------------------


def _topk_gather(temp="divide", crop="last", k_extra=0):
    """Top-k by drawing among the k values only, then mapping back with gather (the issue's
    sampler): other draws than GPT.generate's for the same seed, the same distribution."""

    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        L = model.config.max_len
        for _ in range(max_new_tokens):
            context = {"last": ids[:, -L:], "minus_one": ids[:, -(L - 1):]}[crop]
            with torch.no_grad():
                logits = model(context)[:, -1]
            logits = logits * temperature if temp == "multiply" else logits / temperature
            if top_k is None:
                nxt = torch.multinomial(logits.softmax(-1), 1, generator=generator)
            else:
                v, ix = logits.topk(top_k + k_extra)
                nxt = ix.gather(-1, torch.multinomial(v.softmax(-1), 1, generator=generator))
            ids = torch.cat([ids, nxt], 1)
        return ids

    return my_generate


def _gumbel_max(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    """Sampling by the Gumbel-max trick: argmax of logits + Gumbel noise, one at a time."""
    rows = []
    for row in ids:
        out = row[None]
        for _ in range(max_new_tokens):
            with torch.no_grad():
                logits = model(out[:, -model.config.max_len:])[0, -1].double() / temperature
            if top_k is not None:
                logits[logits < logits.topk(top_k).values[-1]] = -math.inf
            u = torch.rand(logits.shape, generator=generator, dtype=torch.float64)
            out = torch.cat([out, (logits - torch.log(-torch.log(u))).argmax().view(1, 1)], 1)
        rows.append(out)
    return torch.cat(rows)


def test_generate_other_samplers_pass(capsys):
    """Samplers that draw other tokens than GPT.generate for the same seed, but from the right
    distribution, pass: the checker then tests the distribution of 4,000 of their draws."""
    for fn in (_topk_gather(), _gumbel_max):
        assert passes(check_generate, fn)
        out = capsys.readouterr().out
        assert "you sample another way" in out and "follow the model's distribution" in out
        assert "mistake" not in out.lower()


@pytest.mark.parametrize(
    "fn, words",
    [
        (_topk_gather(temp="multiply"), "multiplied by the temperature"),
        (_topk_gather(crop="minus_one"), "last max_len - 1 tokens"),
        (_topk_gather(k_extra=1), "top_k \\+ 1 tokens|probability 0"),
    ],
)
def test_generate_other_samplers_with_a_mistake_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_generate(fn)


def test_generate_crop_to_max_len_minus_one_is_named():
    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        for _ in range(max_new_tokens):
            logits = model(ids[:, -(model.config.max_len - 1):])[:, -1].detach() / temperature
            if top_k is not None:
                logits[logits < logits.topk(top_k).values[:, -1:]] = -math.inf
            ids = torch.cat([ids, torch.multinomial(logits.softmax(-1), 1, generator=generator)], 1)
        return ids

    with pytest.raises(CheckFailure, match="last max_len - 1 tokens"):
        check_generate(my_generate)


@pytest.mark.parametrize("where", ["threshold", "argmax"])
def test_generate_no_keepdim_is_named(where):
    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        for _ in range(max_new_tokens):
            logits = model(ids[:, -model.config.max_len:])[:, -1].detach() / temperature
            if top_k is not None:
                kth = logits.topk(top_k).values[:, -1]  # (B,): no keepdim
                logits = logits.masked_fill(logits < (kth if where == "threshold" else kth[:, None]),
                                            -math.inf)
            probs = logits.softmax(-1)
            nxt = (torch.multinomial(probs, 1, generator=generator) if where == "threshold"
                   else torch.multinomial(probs, 1, generator=generator)[:, 0])  # (B,)
            ids = torch.cat([ids, nxt], 1)
        return ids

    words = "keep its axis: \\(B, 1\\)" if where == "threshold" else "needs the new tokens as \\(B, 1\\)"
    with pytest.raises(CheckFailure, match=words) as info:
        check_generate(my_generate)
    assert "None of the usual" not in str(info.value)


@pytest.mark.parametrize("decorator", [torch.no_grad(), torch.inference_mode()],
                         ids=["no_grad", "inference_mode"])
def test_decorated_solutions_pass(decorator):
    """Every function under @torch.no_grad() shares the decorator's wrapper code; the checkers
    watch course_lib's references by their own bodies (inspect.unwrap), so a decorated solution
    is not taken for a call to GPT.generate or load_into_hf_gpt2."""
    generate = decorator(_gen())
    assert passes(check_generate, generate)
    assert passes(check_generate, decorator(_topk_gather()))
    port = _solution("09.port_attention")["port_attention"]
    assert passes(check_attention_port, decorator(port))
    forward = _solution("09.gpt_forward")["my_gpt_forward"]
    assert passes(check_gpt_forward, torch.no_grad()(forward))


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


def test_attention_port_refuses_the_reference_by_its_name():
    from course_lib.checks.gpt import port_attention_reference

    with pytest.raises(CheckFailure, match="port_attention_reference"):
        check_attention_port(lambda ours, theirs: port_attention_reference(ours, theirs))
    with pytest.raises(CheckFailure, match="course_lib's own functions"):
        check_attention_port(port_attention_reference)


def test_attention_port_cat_dim1_then_t_gets_the_shapes():
    def port_attention(ours, theirs):
        with torch.no_grad():
            theirs.c_attn.weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight,
                                                  ours.v_proj.weight], dim=1).t())
            theirs.c_attn.bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
            theirs.c_proj.weight.copy_(ours.out_proj.weight.t())
            theirs.c_proj.bias.copy_(ours.out_proj.bias)

    with pytest.raises(CheckFailure, match="c_attn.weight is \\(in, out\\) = \\(d, 3d\\) = \\(24, 72\\); "
                                           "yours is \\(72, 24\\)") as info:
        check_attention_port(port_attention)
    assert "Your code raised RuntimeError" not in str(info.value)


def test_attention_port_by_data_passes_with_a_note_on_shared_memory(capsys):
    def port_attention(ours, theirs):
        theirs.c_attn.weight.data = torch.cat([ours.q_proj.weight.data, ours.k_proj.weight.data,
                                               ours.v_proj.weight.data]).t()
        theirs.c_attn.bias.data = torch.cat([ours.q_proj.bias.data, ours.k_proj.bias.data,
                                             ours.v_proj.bias.data])
        theirs.c_proj.weight.data = ours.out_proj.weight.data.t()  # a view: the same memory
        theirs.c_proj.bias.data = ours.out_proj.bias.data  # the same tensor

    assert passes(check_attention_port, port_attention)
    out = capsys.readouterr().out
    assert "check_attention_port: right" in out
    assert "theirs.c_proj.bias and ours.out_proj.bias" in out and "share their memory" in out
    assert "theirs.c_attn" not in out  # torch.cat made new tensors
    assert passes(check_attention_port, _solution("09.port_attention")["port_attention"])
    assert "share their memory" not in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# the notebook: the ★★★ stub states no steps, no working reference in view
# ----------------------------------------------------------------------------------------------


def _lesson_cells():
    import nbformat
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "notebooks" / "09_gpt.ipynb"
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


def _gen_loop(context="last", total=False, ascending=False):
    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        out = ids
        steps = range(max(max_new_tokens - ids.size(1), 0)) if total else range(max_new_tokens)
        for _ in steps:
            source = ids if context == "prompt" else out
            with torch.no_grad():
                logits = model(source[:, -model.config.max_len:])[:, -1] / temperature
            if top_k is not None:
                ordered = logits.sort(-1).values if ascending else logits.sort(-1, descending=True).values
                logits = logits.masked_fill(logits < ordered[:, top_k - 1 : top_k], -math.inf)
            out = torch.cat([out, torch.multinomial(logits.softmax(-1), 1, generator=generator)], 1)
        return out

    return my_generate


@pytest.mark.parametrize(
    "fn, words",
    [
        (_gen_loop(context="prompt"), "reads the prompt at every step"),
        (_gen_loop(total=True), "max_new_tokens counts the NEW tokens"),
        (_gen_loop(ascending=True), "top_k changes nothing.*LARGEST"),
    ],
)
def test_generate_tryout_mistakes_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_generate(fn)


def test_generate_a_wrong_sampler_drawn_otherwise_is_not_given_a_near_miss_name():
    """Top-k by gather with the logits divided by temperature cubed: no named mistake fits its
    draws (the likelihood ratio alone would pick the nearest one); the distribution test refuses
    it and says what it sees."""

    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        for _ in range(max_new_tokens):
            with torch.no_grad():
                logits = model(ids[:, -model.config.max_len:])[:, -1] / temperature**3
            v, ix = logits.topk(top_k or logits.size(-1))
            ids = torch.cat([ids, ix.gather(-1, torch.multinomial(v.softmax(-1), 1, generator=generator))], 1)
        return ids

    with pytest.raises(CheckFailure, match="do not follow the model's distribution.*picks likelier") as info:
        check_generate(my_generate)
    assert "Likely mistake" not in str(info.value)


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
    from course_lib.checks.gpt import _train_variant

    with pytest.raises(CheckFailure, match=words):
        check_lm_train(lambda model, batches, recipe: _train_variant(model, batches, recipe, **knobs))


def test_attention_port_reshape_instead_of_transpose_is_observed():
    def port_attention(ours, theirs):
        with torch.no_grad():
            W = torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight])  # (3d, d)
            theirs.c_attn.weight.copy_(W.reshape(theirs.c_attn.weight.shape))
            theirs.c_attn.bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
            theirs.c_proj.weight.copy_(ours.out_proj.weight.t())
            theirs.c_proj.bias.copy_(ours.out_proj.bias)

    with pytest.raises(CheckFailure, match="reshaped from \\(72, 24\\) to \\(24, 72\\)"):
        check_attention_port(port_attention)


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


def test_generate_logits_averaged_over_positions_are_named():
    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        for _ in range(max_new_tokens):
            with torch.no_grad():
                logits = model(ids[:, -model.config.max_len:]).mean(1) / temperature
            if top_k is not None:
                logits[logits < logits.topk(top_k).values[:, -1:]] = -math.inf
            ids = torch.cat([ids, torch.multinomial(logits.softmax(-1), 1, generator=generator)], 1)
        return ids

    with pytest.raises(CheckFailure, match="averaged over all positions"):
        check_generate(my_generate)


@pytest.mark.parametrize(
    "knobs, words",
    [
        ({"decay_how": "both"}, "decay is applied twice"),
        ({"clip": "one"}, "total norm of 1.0"),
        ({"zero_grad": "after_backward"}, "gradients of 0"),
    ],
)
def test_lm_train_second_tryout_mistakes_are_named(knobs, words):
    from course_lib.checks.gpt import _train_variant

    with pytest.raises(CheckFailure, match=words):
        check_lm_train(lambda model, batches, recipe: _train_variant(model, batches, recipe, **knobs))


def test_attention_port_interleaved_columns_are_observed():
    def port_attention(ours, theirs):
        d = ours.d_model
        with torch.no_grad():
            W = torch.stack([ours.q_proj.weight.T, ours.k_proj.weight.T, ours.v_proj.weight.T], dim=2)
            theirs.c_attn.weight.copy_(W.reshape(d, 3 * d))  # q, k, v interleaved column by column
            theirs.c_attn.bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
            theirs.c_proj.weight.copy_(ours.out_proj.weight.T)
            theirs.c_proj.bias.copy_(ours.out_proj.bias)

    with pytest.raises(CheckFailure, match="right columns in another order"):
        check_attention_port(port_attention)


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
    from course_lib.checks.gpt import _train_variant

    with pytest.raises(CheckFailure, match=words):
        check_lm_train(lambda model, batches, recipe: _train_variant(model, batches, recipe, **knobs))


@pytest.mark.parametrize("mistake, words", [("twice", "divided by the temperature twice"),
                                            ("batch_axis", "softmax runs over the batch axis")])
def test_generate_third_tryout_mistakes_are_named(mistake, words):
    def my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        for _ in range(max_new_tokens):
            with torch.no_grad():
                logits = model(ids[:, -model.config.max_len:])[:, -1] / temperature
            if top_k is not None:
                logits = logits.masked_fill(logits < logits.topk(top_k).values[:, -1:], -math.inf)
                if mistake == "twice":
                    logits = logits / temperature
            probs = F.softmax(logits, dim=0 if mistake == "batch_axis" else -1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)], 1)
        return ids

    with pytest.raises(CheckFailure, match=words):
        check_generate(my_generate)


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
