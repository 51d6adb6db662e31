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
        ({"detach": True}, "carries no gradient"),
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
        ({"topk": "ignored"}, "top_k is ignored"),
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
# build (★★★): the training loop of lm_training's recipe
# ----------------------------------------------------------------------------------------------


def _train(decay="matrices", warmup="course", cosine="course", clip="before", zero_grad=True,
           opt="adamw", groups_by="dim", ret="losses", sched="manual"):
    """A learner's training loop with one chosen mistake (the defaults are right)."""

    def my_lm_train(model, batches, recipe):
        named = list(model.named_parameters())
        if groups_by == "name":  # decay unless a bias or a norm (a correct style)
            matrices = [p for n, p in named if not n.endswith("bias") and "norm" not in n]
            vectors = [p for n, p in named if n.endswith("bias") or "norm" in n]
        elif groups_by == "split_tied":  # Linear weights decay, the embedding does not: one matrix
            matrices = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
            vectors = [p for n, p in named if "embed" in n or p.dim() < 2]
        elif groups_by == "modules":  # the tied matrix twice
            matrices = [m.weight for m in model.modules() if isinstance(m, (nn.Linear, nn.Embedding))]
            vectors = [p for p in model.parameters() if p.dim() < 2]
        else:
            matrices = [p for p in model.parameters() if p.dim() >= 2]
            vectors = [p for p in model.parameters() if p.dim() < 2]
        wd = recipe.weight_decay
        if decay == "all":
            groups = [{"params": matrices + vectors, "weight_decay": wd}]
        elif decay == "default":
            groups = list(model.parameters())
        else:
            groups = [{"params": matrices, "weight_decay": wd}, {"params": vectors, "weight_decay": 0.0}]
        cls = torch.optim.Adam if opt == "adam" else torch.optim.AdamW
        optimizer = cls(groups, lr=recipe.lr, betas=recipe.betas)

        def factor(s):
            w, n, low = recipe.warmup, recipe.num_steps, recipe.min_lr / recipe.lr
            if s < w and warmup != "none":
                return {"course": (s + 1) / (w + 1), "s_over_w": s / w}[warmup]
            if cosine == "none":
                return 1.0
            p = min(1.0, (s - w) / (n - w))
            if cosine == "to_zero":
                low = 0.0
            return low + 0.5 * (1 + math.cos(math.pi * p)) * (1 - low)

        scheduler = None
        if sched != "manual":
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        losses = []
        for step, (x, y) in enumerate(batches):
            if sched == "manual":
                for group in optimizer.param_groups:
                    group["lr"] = recipe.lr * factor(step)
            elif sched == "ahead":
                scheduler.step()
            loss = F.cross_entropy(model(x).transpose(1, 2), y)
            if zero_grad:
                optimizer.zero_grad()
            loss.backward()
            if clip == "before":
                nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
            optimizer.step()
            if clip == "after":
                nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
            if sched == "lambda":
                scheduler.step()
            losses.append(loss.item())
        return {"losses": losses, "none": None, "short": losses[:-1]}[ret]

    return my_lm_train


def test_lm_train_right_answer_passes(capsys):
    assert passes(check_lm_train, _train())
    assert "check_lm_train: all 2 cases match" in capsys.readouterr().out


def test_lm_train_other_styles_pass():
    """Groups by name, LambdaLR with lm_training's warmup_cosine, fused AdamW; and course_lib's
    own pieces (lm_optimizer, train) put together."""
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

    for fn in (with_pieces, _train(groups_by="name"), _train(sched="lambda")):
        assert passes(check_lm_train, fn)


@pytest.mark.parametrize(
    "mistake, words",
    [
        ({"decay": "all"}, "decay is applied to every parameter"),
        ({"decay": "default"}, "default weight_decay=0.01"),
        ({"opt": "adam"}, "Adam with weight_decay adds L2"),
        ({"warmup": "s_over_w"}, "warm-up is off by one: step / warmup"),
        ({"warmup": "none"}, "there is no warm-up"),
        ({"cosine": "none"}, "stays at its peak after the warm-up"),
        ({"cosine": "to_zero"}, "goes down to 0"),
        ({"sched": "ahead"}, "one step ahead"),
        ({"clip": "none"}, "not clipped"),
        ({"clip": "after"}, "not clipped"),
        ({"zero_grad": False}, "never zeroed"),
        ({"groups_by": "modules"}, "tied matrix is in your parameter list twice"),
        ({"groups_by": "split_tied"}, "TIED to the token table"),
        ({"ret": "none"}, "list of the 12 training losses"),
        ({"ret": "short"}, "11 losses for 12 batches"),
    ],
)
def test_lm_train_mistakes(mistake, words):
    with pytest.raises(CheckFailure, match=words):
        check_lm_train(_train(**mistake))


def test_lm_train_unknown_mistake_and_no_update():
    right = _train()

    def doubled_lr(model, batches, recipe):
        from dataclasses import replace

        return right(model, batches, replace(recipe, lr=2 * recipe.lr, min_lr=2 * recipe.min_lr))

    with pytest.raises(CheckFailure, match="none of the usual mistakes"):
        check_lm_train(doubled_lr)
    with pytest.raises(CheckFailure, match="did not change"):
        check_lm_train(lambda model, batches, recipe: [0.0] * len(batches))


def test_lm_train_stub(capsys):
    def my_lm_train(model, batches, recipe):
        raise NotImplementedError

    check_lm_train(my_lm_train)
    assert "not implemented yet" in capsys.readouterr().out
