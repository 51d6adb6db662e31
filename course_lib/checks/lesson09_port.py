"""Checker for lesson 09's Debug exercise: porting one attention layer to Hugging Face's GPT-2.

* ``check_attention_port(fn)``: ``fn(ours, theirs)`` copies a course_lib ``MultiHeadAttention``
  into a Hugging Face ``GPT2Attention`` (``Conv1D`` stores its weight as ``(in, out)``). The checker
  compares the copied tensors, then both modules' outputs, and notes tensors that the two modules
  share (a port by ``.data =``). The reference is ``course_lib.gpt.port_attention_reference``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..attention import MultiHeadAttention
from ..gpt import GPTConfig, from_hf_gpt2, hf_gpt2_config, load_into_hf_gpt2, port_attention_reference
from ..masks import causal_mask
from .common import CheckFailure, calls_to, checker, is_course_lib

__all__ = ["check_attention_port"]


# ----------------------------------------------------------------------------------------------
# check_attention_port (debug)
# ----------------------------------------------------------------------------------------------


def _hf_attention(d_model: int, num_heads: int, seed: int):
    """A Hugging Face ``GPT2Attention`` (eager attention, eval mode) with random weights."""
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    config = hf_gpt2_config(GPTConfig(vocab_size=11, max_len=16, d_model=d_model,
                                      num_heads=num_heads, num_layers=1))
    config._attn_implementation = "eager"  # plain softmax attention with an additive mask
    torch.manual_seed(seed)
    theirs = GPT2Attention(config, layer_idx=0).eval()
    with torch.no_grad():  # not HF's init (zero biases): a forgotten copy must show
        for param in theirs.parameters():
            param.normal_(0.0, 0.5)
    return theirs


def _our_attention(d_model: int, num_heads: int, seed: int) -> MultiHeadAttention:
    torch.manual_seed(seed)
    ours = MultiHeadAttention(d_model, num_heads).eval()
    with torch.no_grad():
        for param in ours.parameters():
            param.normal_(0.0, 0.3)
    return ours


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, atol=1e-6)


def _port_findings(ours: MultiHeadAttention, theirs: Any, before: dict[str, torch.Tensor]) -> list[str]:
    """What is wrong with the copied tensors, one sentence per problem (empty if all right)."""
    d = ours.d_model
    q, k, v, o = ours.q_proj, ours.k_proj, ours.v_proj, ours.out_proj
    W = theirs.c_attn.weight.detach()  # (d, 3d) if right
    bias = theirs.c_attn.bias.detach()  # (3d,)
    P, pb = theirs.c_proj.weight.detach(), theirs.c_proj.bias.detach()  # (d, d), (d,)
    findings: list[str] = []
    names = ("q", "k", "v")
    weights = {"q": q.weight.detach(), "k": k.weight.detach(), "v": v.weight.detach()}
    biases = {"q": q.bias.detach(), "k": k.bias.detach(), "v": v.bias.detach()}
    unchanged = {name: _same(t, before[name]) for name, t in (
        ("c_attn.weight", W), ("c_attn.bias", bias), ("c_proj.weight", P), ("c_proj.bias", pb))}
    if all(unchanged.values()):
        return ["nothing was copied: theirs still holds its own weights. Write into its tensors "
                "in place, theirs.c_attn.weight.copy_(...) inside torch.no_grad() (assigning to a "
                "local variable changes nothing)"]
    # c_attn.weight: three (d, d) blocks along dim=1, the transposes of q, k, v in that order
    if unchanged["c_attn.weight"]:
        findings.append("c_attn.weight was not copied")
    elif W.shape == (d, 3 * d):
        blocks = [W[:, j * d:(j + 1) * d] for j in range(3)]  # (d, d) each
        if not all(_same(blocks[j], weights[n].t()) for j, n in enumerate(names)):
            plain = [_same(blocks[j], weights[n]) for j, n in enumerate(names)]
            order = [next((n for n in names if _same(blocks[j], weights[n].t())
                           or _same(blocks[j], weights[n])), "?") for j in range(3)]
            if "?" not in order and order != list(names):
                findings.append(f"c_attn holds the projections in the order {', '.join(order)}; "
                                "GPT-2 splits c_attn's output into q, k, v in that order")
            elif any(plain):
                which = [n for n, p in zip(names, plain) if p]
                findings.append(f"c_attn.weight has the shape GPT2Attention expects, ({d}, {3 * d}), "
                                f"but other values: the {', '.join(which)} it computes from an input "
                                "x differ from " + ", ".join(f"ours.{n}_proj(x)" for n in which))
            elif _same(W, torch.cat([weights[n] for n in names]).reshape(d, 3 * d)):
                findings.append(f"c_attn.weight holds ours' q, k, v weights reshaped from ({3 * d}, "
                                f"{d}) to ({d}, {3 * d}): a reshape keeps the numbers in memory order, "
                                "so each row of c_attn.weight mixes pieces of several rows of ours")
            elif _columns_permuted(W, torch.cat([weights[n].t() for n in names], dim=1)):
                findings.append("c_attn.weight holds the right columns in another order: column j "
                                "of c_attn makes output j, and GPT2Attention splits the output into "
                                "q, k, v as three consecutive blocks of d columns")
            else:
                findings.append("c_attn.weight holds other numbers than ours' q_proj, k_proj and "
                                "v_proj weights, in any layout")
    # c_attn.bias: q, k, v biases one after the other
    expected_bias = torch.cat([biases[n] for n in names])
    if unchanged["c_attn.bias"]:
        findings.append("c_attn.bias was not copied (it still holds theirs)")
    elif not _same(bias, expected_bias):
        parts = [bias[j * d:(j + 1) * d] for j in range(3)]
        order = [next((n for n in names if _same(parts[j], biases[n])), "?") for j in range(3)]
        if "?" not in order:
            findings.append(f"c_attn.bias holds the biases in the order {', '.join(order)}; it must "
                            "be q, k, v, like the weights")
        else:
            findings.append("c_attn.bias is not torch.cat([q_proj.bias, k_proj.bias, v_proj.bias])")
    # c_proj
    if unchanged["c_proj.weight"]:
        findings.append("c_proj.weight was not copied")
    elif not _same(P, o.weight.detach().t()):
        if _same(P, o.weight.detach()):
            findings.append(f"c_proj.weight has the right shape ({d}, {d}) but other values: "
                            "theirs.c_proj(h) differs from ours.out_proj(h) for the same h")
        else:
            findings.append("c_proj.weight is not out_proj.weight.t()")
    if unchanged["c_proj.bias"]:
        findings.append("c_proj.bias was not copied (it still holds theirs)")
    elif not _same(pb, o.bias.detach()):
        findings.append("c_proj.bias is not out_proj.bias")
    return findings


def _columns_permuted(got: torch.Tensor, right: torch.Tensor) -> bool:
    """True if ``got`` (d, 3d) holds the columns of ``right`` (d, 3d), each once, in another order."""
    distances = torch.cdist(got.t().double(), right.t().double())  # (3d, 3d): column to column
    match = distances.argmin(1)  # the right column nearest each of got's
    return bool(distances.min(1).values.max() < 1e-6) and match.unique().numel() == right.size(1)


@checker
def check_attention_port(fn: Callable[..., Any]) -> None:
    """Check ``fn(ours, theirs)``: after it, GPT2Attention ``theirs`` computes what ``ours`` does.
    The global random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        _check_attention_port(fn)


def _check_attention_port(fn: Callable[..., Any]) -> None:
    if is_course_lib(fn):
        raise CheckFailure(
            "You handed in one of course_lib's own functions: write the copy yourself (four "
            "copy_ calls into theirs.c_attn and theirs.c_proj)."
        )
    cases = [("d_model=24, 3 heads, B=2, T=7", 24, 3, 2, 7, 0),
             ("d_model=16, 4 heads, B=1, T=5", 16, 4, 1, 5, 1)]
    for case, d, h, B, T, seed in cases:
        ours, theirs = _our_attention(d, h, seed), _hf_attention(d, h, seed + 10)
        ours_before = {n: p.detach().clone() for n, p in ours.state_dict().items()}
        before = {n: p.detach().clone() for n, p in theirs.state_dict().items()}
        crash = None
        with calls_to([load_into_hf_gpt2, from_hf_gpt2, port_attention_reference]) as seen:
            try:
                fn(ours, theirs)
            except (NotImplementedError, CheckFailure):
                raise
            except Exception as err:  # raised below, unless a course_lib port explains it
                crash = CheckFailure(_port_error(err, case, d))
                crash.__cause__ = err
        if port_attention_reference in seen:
            raise CheckFailure(
                "Your function calls course_lib's port_attention_reference, the port the lesson "
                "uses until yours passes: write the copy of one attention yourself (c_attn, c_proj)."
            )
        if seen:
            raise CheckFailure(
                f"Your function calls course_lib's {seen[0].__name__}, which ports a whole model: "
                "write the copy of one attention yourself (c_attn, c_proj)."
            )
        if any(not torch.equal(p, ours_before[n]) for n, p in ours.state_dict().items()):
            raise CheckFailure(
                f"Your function changed ours ({case}): the copy goes the other way, from ours "
                "(course_lib's MultiHeadAttention) into theirs (GPT2Attention): "
                "theirs.c_attn.weight.copy_(...)."
            )
        if crash is not None:
            raise crash
        shapes = {"c_attn.weight": (d, 3 * d), "c_attn.bias": (3 * d,),
                  "c_proj.weight": (d, d), "c_proj.bias": (d,)}
        for name, shape in shapes.items():
            tensor = theirs.get_parameter(name)
            if tuple(tensor.shape) != shape:
                raise CheckFailure(
                    f"theirs.{name} now has shape {tuple(tensor.shape)}, expected {shape} ({case}): "
                    "copy into the existing tensors (copy_), Conv1D keeps (in, out)."
                )
        findings = _port_findings(ours, theirs, before)
        if findings:
            raise CheckFailure(
                f"The port runs, but the copied tensors are wrong ({case}): " + "; ".join(findings)
                + ". Compare what each layer computes from its weight: Hugging Face's Conv1D "
                "(print(inspect.getsource(type(theirs.c_attn).forward))) and nn.Linear."
            )
        x = torch.randn(B, T, d, generator=torch.Generator().manual_seed(seed))
        mask = causal_mask(T)  # (T, T)
        additive = torch.zeros(T, T).masked_fill(~mask, float("-inf"))[None, None]  # HF's form
        theirs.eval()
        with torch.no_grad():
            expected = ours(x, x, x, mask)  # (B, T, d)
            got = theirs(x, attention_mask=additive)[0]  # (B, T, d)
        if not torch.allclose(got, expected, atol=1e-5):
            diff = (got - expected).abs().max().item()
            raise CheckFailure(
                f"The copied tensors look right but the outputs differ ({case}): largest "
                f"difference {diff:.3g}. Did your function change anything else in theirs?"
            )
        shared = sorted({f"theirs.{n} and ours.{m}" for n, p in theirs.named_parameters()
                         for m, q in ours.named_parameters()
                         if p.untyped_storage().data_ptr() == q.untyped_storage().data_ptr()})
    print(f"check_attention_port: right, GPT2Attention gives course_lib's attention output on all "
          f"{len(cases)} cases (every Conv1D matrix transposed, q, k, v in order).")
    if shared:
        print(f"Note: {'; '.join(shared)} share their memory (`.data =`, or a Parameter made from a "
              "view of ours): the two models are not independent, and changing one, by training or "
              "by hand, changes the other. copy_ into theirs (or .clone()) gives theirs its own "
              "tensors.")


def _port_error(err: Exception, case: str, d: int) -> str:
    """A learner's exception in the port, with what the shapes say when they explain it."""
    text = str(err)
    where = f"({case}; {type(err).__name__}: {err})"
    if f"({3 * d})" in text and f"({d})" in text:
        return (f"A tensor of the wrong shape was copied into theirs.c_attn.weight {where}. "
                f"c_attn.weight is (in, out) = (d, 3d) = ({d}, {3 * d}); yours is ({3 * d}, {d}). "
                "Print the shape of what you copy at each step: torch.cat of three (d, d) "
                "matrices along dim=1 is (d, 3d) already, along dim=0 (3d, d); .t() swaps the two.")
    return (f"Your code raised {type(err).__name__} ({case}): {err}. theirs.c_attn.weight is "
            f"(d, 3d) = ({d}, {3 * d}) and theirs.c_proj.weight (d, d); copy into them in place, "
            "inside torch.no_grad().")
