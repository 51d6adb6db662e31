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
from course_lib.checks import check_attention_port, check_gpt_forward, check_initial_loss
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
        check_gpt_forward(lambda model, ids: solution(model, ids) * 2)


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

    with pytest.raises(CheckFailure, match="c_attn.weight is not transposed") as info:
        check_attention_port(port_attention)
    assert "c_proj.weight is not transposed" in str(info.value)


@pytest.mark.parametrize(
    "mistake, words",
    [
        ({"t_attn": (False, False, False)}, "c_attn.weight is not transposed"),
        ({"t_attn": (True, True, False)}, "block of v is not transposed"),
        ({"t_proj": False}, "c_proj.weight is not transposed"),
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

    with pytest.raises(CheckFailure, match="Conv1D's \\(in, out\\)"):
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
                 (check_gpt_forward, _solution("09.gpt_forward")["my_gpt_forward"]),
                 (check_attention_port, _solution("09.port_attention")["port_attention"])]
    assert_checkers_keep_random_state(solutions)
