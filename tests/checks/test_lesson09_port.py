"""Lesson-09 Debug checker, the attention port to GPT-2 (course_lib/checks/lesson09_port.py): correct
answers in several styles pass, each named mistake is caught."""

from __future__ import annotations


import pytest
import torch
from _helpers import passes, solution_namespace
from torch import nn

from course_lib.checks import CheckFailure, check_attention_port
from course_lib.gpt import load_into_hf_gpt2


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
    assert passes(check_attention_port, solution_namespace("09.port_attention")["port_attention"])
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


# ----------------------------------------------------------------------------------------------
# issue 38: correct code in other styles, decorated code, shortcuts refused kindly
# ----------------------------------------------------------------------------------------------


def test_attention_port_refuses_the_reference_by_its_name():
    from course_lib.gpt import port_attention_reference

    with pytest.raises(CheckFailure, match="port_attention_reference"):
        check_attention_port(lambda ours, theirs: port_attention_reference(ours, theirs))
    with pytest.raises(CheckFailure, match="course_lib's own functions"):
        check_attention_port(port_attention_reference)
    # older notebooks import it from its former place, kept as a deprecated re-export
    from course_lib.checks.gpt import port_attention_reference as former

    assert former is port_attention_reference


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
    assert passes(check_attention_port, solution_namespace("09.port_attention")["port_attention"])
    assert "share their memory" not in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# h09's first tryout (issue 38): the wrong attempts whose messages were generic, raw or wrong
# ----------------------------------------------------------------------------------------------


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
