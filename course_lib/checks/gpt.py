"""Checkers for the exercises of lesson 09 (GPT: a decoder-only language model, GPT-2 exactly).

* ``check_initial_loss(fn)``: ``fn() -> float``, the predicted loss (cross-entropy, nats per
  character) of a freshly initialised ``GPT(GPTConfig(vocab_size=83))`` (a "predict, then run"
  question). The checker measures it on fresh models; it is ln(83) plus a small excess.
* ``check_gpt_forward(fn)``: ``fn(model, ids (B, T)) -> logits (B, T, V)``, GPT's forward pass
  written from the model's parts (embeddings, the loop over ``model.blocks.layers`` with a causal
  mask, the final LayerNorm, ``lm_head``). Reference: ``model(ids)``, in eval mode and in
  training mode with dropout (same seed before both calls).
* ``check_attention_port(fn)``: ``fn(ours, theirs)`` copies a course_lib ``MultiHeadAttention``
  into a Hugging Face ``GPT2Attention`` (the lesson's debug exercise: ``Conv1D`` stores its weight
  as ``(in, out)``). The checker compares the copied tensors, then both modules' outputs.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..attention import MultiHeadAttention
from ..embeddings import TransformerEmbedding
from ..gpt import GPT, GPTConfig, from_hf_gpt2, hf_gpt2_config, lm_loss, load_into_hf_gpt2
from ..layers import Encoder
from ..masks import causal_mask
from ._common import CheckFailure, calls_to, checker, expect_shape, is_course_lib, passed, run_learner

__all__ = ["check_initial_loss", "check_gpt_forward", "check_attention_port"]


# ----------------------------------------------------------------------------------------------
# check_initial_loss (predict)
# ----------------------------------------------------------------------------------------------

VOCAB = 83  # lesson 09's corpus: 83 characters, no special tokens


@functools.lru_cache(maxsize=None)
@torch.no_grad()
def measure_initial_loss(seeds: int = 4, batch_size: int = 4, vocab_size: int = VOCAB) -> float:
    """Mean loss (nats per token) of fresh ``GPT(GPTConfig(vocab_size))`` models, one per seed, on
    random windows of ``max_len`` uniformly drawn ids. Fresh models predict nearly uniformly
    whatever the text, so the loss hardly depends on it. The global random state is left as it was."""
    losses = []
    with torch.random.fork_rng(devices=[]):
        for seed in range(seeds):
            torch.manual_seed(seed)
            model = GPT(GPTConfig(vocab_size=vocab_size)).eval()
            gen = torch.Generator().manual_seed(1000 + seed)
            ids = torch.randint(0, vocab_size, (batch_size, model.config.max_len + 1), generator=gen)
            losses.append(lm_loss(model(ids[:, :-1]), ids[:, 1:]).item())  # (B, T, V), (B, T)
    return sum(losses) / len(losses)


def _as_number(got: Any) -> float:
    """The learner's prediction as a float, or a ``CheckFailure`` saying what came instead."""
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        raise CheckFailure(
            f"Return one number (a float such as 2.5), got {type(got).__name__} {got!r}."
        )
    value = float(got)
    if not math.isfinite(value):
        raise CheckFailure(
            f"Your prediction is {value}; return a finite number: the average loss in nats per "
            "character."
        )
    return value


@checker
def check_initial_loss(fn: Callable[[], Any]) -> None:
    """Check ``fn() -> float``: the loss of a freshly initialised GPT on 83 characters."""
    got = _as_number(run_learner(fn, case="your prediction", hint="Return one number."))
    measured = measure_initial_loss()
    ln_v = math.log(VOCAB)
    why = (
        f"A fresh GPT's weights are drawn from N(0, 0.02), so its logits are all close to 0 and "
        f"softmax gives every one of the V = {VOCAB} characters about the same probability 1/{VOCAB}. "
        f"The loss of each prediction is -ln(1/{VOCAB}) = ln({VOCAB}) = {ln_v:.3f} nats; fresh models "
        f"measure {measured:.2f}, a little more, as their logits are not exactly 0."
    )

    def close(value: float, tol: float = 5e-4) -> bool:  # the prediction is this value
        return abs(got - value) <= tol

    if close(math.log(86)):
        raise CheckFailure(
            f"Not quite: {got:.3f} is ln(86), a vocabulary with three special tokens. This "
            f"vocabulary has no <pad>/<sos>/<eos>: a language model on raw text needs none, so "
            f"V = {VOCAB}. {why}"
        )
    if abs(got - measured) <= 0.1:
        print(f"check_initial_loss: right, you said {got:.2f} nats per character. {why}")
        return
    named = [
        (math.log2(VOCAB), 0.01, f"{got:.2f} is log2({VOCAB}): that is bits, the loss is in nats "
         "(natural log): cross_entropy uses ln"),
        (math.log10(VOCAB), 0.01, f"{got:.2f} is log10({VOCAB}); the loss uses the natural log"),
        (VOCAB, 0.5, f"{got:g} is the number of characters, not a loss: the loss is minus the log of "
         "a probability"),
        (1 / VOCAB, 1e-3, f"{got:.4f} is the probability 1/{VOCAB} of each character: the loss is "
         "minus the log of a probability"),
        (math.log(65), 0.01, f"{got:.2f} is ln(65): 65 is nanoGPT's tiny-Shakespeare vocabulary; this "
         f"corpus has {VOCAB} characters"),
        (math.log(256), 0.01, f"{got:.2f} is ln(256), a vocabulary of bytes; this model reads "
         f"{VOCAB} characters"),
        (0.0, 1e-9, "an untrained model knows nothing about the text, so it cannot predict the next "
         "character with certainty: a loss of 0 means probability 1 on every right answer"),
    ]
    for value, tol, reason in named:
        if close(value, tol):
            raise CheckFailure(f"Not quite: {reason}. {why}")
    if got < 0:
        reason = "a cross-entropy is never negative: it is minus the log of a probability <= 1"
    elif got < measured:
        reason = (f"{got:.2f} is below the uniform guess ln({VOCAB}) = {ln_v:.2f}: doing better "
                  "needs knowing which characters are common, which only training teaches")
    elif got <= 2 * ln_v:
        reason = (f"{got:.2f} is too high: above ln({VOCAB}) = {ln_v:.2f} by more than a little; "
                  "with weights of std 0.02 the logits are near 0 and the distribution is nearly "
                  "uniform")
    else:
        reason = (f"{got:.2f} is far above ln(V): worse than uniform would need confident wrong "
                  "logits; with weights of std 0.02 the logits are near 0")
    raise CheckFailure(f"Not quite: {reason}. {why}")


# ----------------------------------------------------------------------------------------------
# check_gpt_forward (build)
# ----------------------------------------------------------------------------------------------


def _gpt_forward_variant(
    model: GPT,
    ids: torch.Tensor,
    mask: str = "causal",
    final_norm: str = "end",
    scale: bool = False,
    positions: bool = True,
    embed_dropout: str = "module",
    chained: bool = True,
    extra_residual: bool = False,
    output: str = "logits",
) -> torch.Tensor:
    """GPT's forward pass written out, with one knob per plausible mistake; the defaults give
    ``model(ids)`` exactly (the same dropout draws, in the same order, after the same seed).

    ``mask``: "causal", "none", "triu" (the future and itself), "inverted" (~causal: strictly the
    future). ``final_norm``: "end", "none", "every_layer". ``embed_dropout``: "module" (follows
    train/eval), "none", "always" (also in eval mode: ``F.dropout``'s default), "token_only"
    (before adding the positions). ``output``: "logits", "softmax", "log_softmax".
    """
    B, T = ids.shape
    d = model.config.d_model
    tok = model.embed.token.embedding(ids) * (math.sqrt(d) if scale else 1.0)  # (B, T, d)
    pos = model.embed.position(T) if positions else torch.zeros(T, d)  # (T, d)
    p = model.embed.dropout.p
    if embed_dropout == "module":
        x = model.embed.dropout(tok + pos)
    elif embed_dropout == "always":
        x = F.dropout(tok + pos, p)
    elif embed_dropout == "token_only":
        x = model.embed.dropout(tok) + pos
    else:
        x = tok + pos
    m = {"causal": causal_mask(T), "none": None, "triu": causal_mask(T).T,
         "inverted": ~causal_mask(T)}[mask]  # (T, T)
    h = x
    for layer in model.blocks.layers:
        out = layer(h if chained else x, m)  # (B, T, d)
        h = h + out if extra_residual else out
        if final_norm == "every_layer":
            h = model.blocks.norm(h)
    if final_norm == "end":
        h = model.blocks.norm(h)
    logits = model.lm_head(h)  # (B, T, V)
    if output == "softmax":
        return logits.softmax(-1)
    if output == "log_softmax":
        return logits.log_softmax(-1)
    return logits


_FORWARD_MISTAKES: list[tuple[dict[str, Any], str]] = [
    ({"mask": "none"}, "no causal mask: every position sees the whole window, the future included, "
     "so the model can read the character it must predict. Pass causal_mask(T) to every layer"),
    ({"mask": "triu"}, "the mask points the wrong way: causal_mask(T).T (triu) lets position t see "
     "t..T-1, the future. causal_mask(T) is lower-triangular: row t may see 0..t"),
    ({"mask": "inverted"}, "the mask is inverted (~causal_mask): True means MAY attend, so pass "
     "causal_mask(T) itself; yours hides the past and shows the future"),
    ({"final_norm": "none"}, "the final LayerNorm is missing: a pre-LN stack ends with "
     "model.blocks.norm (GPT-2's ln_f) after the last layer, before lm_head"),
    ({"final_norm": "every_layer"}, "model.blocks.norm is applied after every layer; it is the "
     "FINAL LayerNorm, applied once after the loop (each layer normalises its own inputs)"),
    ({"scale": True}, "the token vectors are multiplied by sqrt(d_model); that is the 2017 paper's "
     "scaling, GPT-2 has none (model.embed.token has scale 1)"),
    ({"positions": False}, "the position vectors are missing: add model.embed.position(T), "
     "(T, d_model), to the token vectors; without them the model cannot tell order"),
    ({"chained": False}, "the layers are not chained: each layer must take the previous layer's "
     "output (x = layer(x, mask)), not the embeddings"),
    ({"extra_residual": True}, "the residual is added twice: each EncoderLayer already adds its "
     "input back (x + attention, x + feed-forward); write x = layer(x, mask), not x + layer(x, mask)"),
    ({"output": "softmax"}, "softmax is applied: return the logits, not probabilities (the loss, "
     "F.cross_entropy, applies log-softmax itself)"),
    ({"output": "log_softmax"}, "log_softmax is applied: these are log-probabilities, equal to the "
     "logits only up to a constant per position; return the logits from model.lm_head"),
]

_DROPOUT_MISTAKES: list[tuple[dict[str, Any], str]] = [
    ({"embed_dropout": "none"}, "in training mode, dropout on the embeddings is missing: apply "
     "model.embed.dropout to token + position vectors, as GPT.forward does (the layers have their "
     "own dropout inside)"),
    ({"embed_dropout": "token_only"}, "dropout is applied to the token vectors before the positions "
     "are added; apply model.embed.dropout to their sum"),
]


def _forward_model(config: GPTConfig, seed: int) -> GPT:
    """A random GPT whose parameters all differ from their init (LayerNorms, biases included)."""
    torch.manual_seed(seed)
    model = GPT(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.2)
            elif "norm" in name:  # LayerNorm weights: not all ones
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.3)  # larger than 0.02, so mistakes change the output a lot
    return model


def _run_forward(fn: Callable[..., Any], model: GPT, ids: torch.Tensor, case: str, seed: int) -> Any:
    """``fn(model, ids)`` after ``torch.manual_seed(seed)``, refusing the reference's own forward
    passes and naming the shape errors of positions of the wrong length."""
    T, max_len = ids.size(1), model.config.max_len
    mode = model.training
    torch.manual_seed(seed)
    refused = [GPT.forward, Encoder.forward, TransformerEmbedding.forward]
    got, error = None, None
    with calls_to(refused) as seen:
        try:
            got = fn(model, ids)
        except (NotImplementedError, CheckFailure):
            raise
        except Exception as err:  # named below, once we know which parts the code called
            error = err
    if GPT.forward in seen:
        raise CheckFailure(
            "Your function calls the model's own forward pass (model(ids) or GPT.forward), the "
            "reference it is checked against: build it from the parts yourself."
        )
    if Encoder.forward in seen:
        raise CheckFailure(
            "Your function calls model.blocks(...) as a whole: loop over model.blocks.layers "
            "yourself (x = layer(x, mask)), then apply model.blocks.norm."
        )
    if TransformerEmbedding.forward in seen:
        raise CheckFailure(
            "Your function calls model.embed(ids) as a whole: add the token vectors "
            "model.embed.token(ids) and the position vectors model.embed.position(T) yourself, then "
            "apply model.embed.dropout."
        )
    if error is not None:
        text = str(error)
        if f"({max_len})" in text and f"({T})" in text:
            raise CheckFailure(
                f"Positions of the wrong length ({case}): your code builds {max_len} position "
                f"vectors (max_len) for a window of T = {T}; use model.embed.position(T) with "
                f"T = ids.size(1). ({type(error).__name__}: {error})"
            ) from error
        if f"({ids.size(0)})" in text and f"({T})" in text:
            raise CheckFailure(
                f"Positions of the wrong length ({case}): ids is (B, T) = {tuple(ids.shape)}; the "
                f"number of positions is ids.size(1), not ids.size(0). ({type(error).__name__}: "
                f"{error})"
            ) from error
        raise CheckFailure(
            f"Your code raised {type(error).__name__} ({case}): {error}. Print the shape after each "
            "line: ids (B, T) -> token + position vectors (B, T, d_model) -> each layer "
            "(B, T, d_model) -> model.blocks.norm -> model.lm_head (B, T, V)."
        ) from error
    if model.training != mode:
        raise CheckFailure(
            f"Your function switched the model to {'training' if model.training else 'eval'} mode "
            f"({case}); leave model.train() / model.eval() to the caller (dropout follows the "
            "mode the model is in)."
        )
    return got


def _forward_reason(
    got: torch.Tensor, model: GPT, ids: torch.Tensor, seed: int, mistakes: list[tuple[dict, str]]
) -> str | None:
    """The first mistake whose output ``got`` matches (each variant after the same seed)."""
    for knobs, message in mistakes:
        torch.manual_seed(seed)
        with torch.no_grad():
            wrong = _gpt_forward_variant(model, ids, **knobs)
        if torch.allclose(got, wrong, atol=1e-4, rtol=1e-4):
            return message
    return None


@checker
def check_gpt_forward(fn: Callable[..., Any]) -> None:
    """Check ``fn(model, ids (B, T)) -> (B, T, V)`` against ``model(ids)``, eval and training mode.
    The checker seeds its own draws; the global random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        _check_gpt_forward(fn)


def _check_gpt_forward(fn: Callable[..., Any]) -> None:
    if fn is GPT.forward or is_course_lib(fn):
        raise CheckFailure(
            "You handed in course_lib's own forward pass, not yours: the exercise is to write it "
            "from the model's parts (the lesson uses GPT.forward until yours passes)."
        )
    # Sizes all different, so that mistakes give different shapes and numbers: V=23, d_model=24,
    # 3 heads, 2 layers, d_ff 40, max_len 16; windows shorter than max_len first.
    config = GPTConfig(vocab_size=23, max_len=16, d_model=24, num_heads=3, num_layers=2, d_ff=40,
                       dropout=0.1)
    cases = [
        ("eval mode, B=2, T=11", False, 2, 11, 0),
        ("eval mode, B=1, T=16 (a full window)", False, 1, 16, 1),
        ("training mode with dropout 0.1, B=2, T=9", True, 2, 9, 2),
        ("training mode with dropout 0.1, B=3, T=5", True, 3, 5, 3),
    ]
    for case, training, B, T, seed in cases:
        model = _forward_model(config, seed)
        model.train(training)
        ids = torch.randint(0, config.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))
        got = _run_forward(fn, model, ids, case, seed=100 + seed)
        torch.manual_seed(100 + seed)
        with torch.no_grad():
            expected = model(ids)  # (B, T, V): the same dropout draws as the learner's, if right
        if isinstance(got, torch.Tensor) and got.shape == (B, T, config.d_model):
            raise CheckFailure(
                f"Wrong output shape ({case}): you return {tuple(got.shape)}, the hidden states "
                f"(d_model = {config.d_model} wide). Apply model.lm_head to get logits "
                f"(B, T, V = {config.vocab_size})."
            )
        expect_shape(got, (B, T, config.vocab_size), f"the logits ({case})",
                     "Logits are (B, T, V): one score per vocabulary entry at every position.")
        got = got.detach()
        if torch.allclose(got, expected, atol=1e-4, rtol=1e-4):
            continue
        mistakes = list(_FORWARD_MISTAKES)
        if training:
            mistakes += _DROPOUT_MISTAKES
        reason = _forward_reason(got, model, ids, 100 + seed, mistakes)
        if reason is None and not training:  # dropout in eval mode (F.dropout's default training=True)
            reason = _forward_reason(got, model, ids, 100 + seed, [(
                {"embed_dropout": "always"},
                "dropout is applied in eval mode: F.dropout(x, p) defaults to training=True; use "
                "the module model.embed.dropout, which follows model.train() / model.eval()")])
        if reason is not None:
            raise CheckFailure(f"Likely mistake ({case}): {reason}.")
        causal = _causal_leak(fn, model, ids, case, seed)
        diff = (got - expected).abs().max().item()
        raise CheckFailure(
            f"Output differs from model(ids) ({case}): largest difference {diff:.3g}.{causal} None "
            "of the usual mistakes explains it; compare your hidden states with the reference's "
            "after the embeddings and after each layer."
        )
    passed("check_gpt_forward", len(cases))


def _causal_leak(fn: Callable[..., Any], model: GPT, ids: torch.Tensor, case: str, seed: int) -> str:
    """A sentence if changing the last token changes earlier logits (a future leak), else ''."""
    if ids.size(1) < 2 or model.training:
        return ""
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % model.config.vocab_size
    a = _run_forward(fn, model, ids, case, seed).detach()
    b = _run_forward(fn, model, changed, case, seed).detach()
    if not torch.allclose(a[:, :-1], b[:, :-1], atol=1e-5):
        return (" Changing the LAST token changes the logits of earlier positions: the future "
                "leaks in; check the causal mask.")
    return ""


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
            elif all(plain):
                findings.append("c_attn.weight is not transposed: Conv1D stores (in, out), "
                                "nn.Linear (out, in). Concatenate the three (d, d) weights along "
                                "dim=0 into (3d, d) and transpose: torch.cat([...], dim=0).t()")
            elif any(plain):
                which = ", ".join(n for n, p in zip(names, plain) if p)
                findings.append(f"in c_attn, the block of {which} is not transposed: every "
                                "nn.Linear weight (out, in) becomes (in, out) in a Conv1D")
            else:
                findings.append("c_attn.weight holds other numbers than q_proj, k_proj, v_proj's "
                                "weights, transposed and side by side (d, 3d)")
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
            findings.append("c_proj.weight is not transposed: Conv1D stores (in, out), so copy "
                            "out_proj.weight.t(); the square shape hides the mistake")
        else:
            findings.append("c_proj.weight is not out_proj.weight.t()")
    if unchanged["c_proj.bias"]:
        findings.append("c_proj.bias was not copied (it still holds theirs)")
    elif not _same(pb, o.bias.detach()):
        findings.append("c_proj.bias is not out_proj.bias")
    return findings


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
        with calls_to([load_into_hf_gpt2, from_hf_gpt2]) as seen:
            try:
                run_learner(
                    fn, ours, theirs, case=case,
                    hint="theirs.c_attn.weight is (d, 3d) and theirs.c_proj.weight (d, d), "
                         "Conv1D's (in, out); ours.q_proj.weight etc. are nn.Linear's (out, in). "
                         "Copy inside torch.no_grad().",
                )
            except CheckFailure as failure:  # raised below, unless a course_lib port explains it
                crash = failure
        if seen:
            raise CheckFailure(
                "Your function calls course_lib's load_into_hf_gpt2 / from_hf_gpt2, which port a "
                "whole model: write the copy of one attention yourself (c_attn, c_proj)."
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
            raise CheckFailure(f"Likely mistake ({case}): " + "; ".join(findings) + ".")
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
    print(f"check_attention_port: right, GPT2Attention gives course_lib's attention output on all "
          f"{len(cases)} cases (every Conv1D matrix transposed, q, k, v in order).")
