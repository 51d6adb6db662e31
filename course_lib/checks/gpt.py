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
  as ``(in, out)``). The checker compares the copied tensors, then both modules' outputs, and
  notes tensors that the two modules share (a port by ``.data =``).
* ``check_lm_loss(fn)``: ``fn(model, window (B, T+1)) -> scalar``, the shifted loss; its value and
  the gradients it sends to the model (``lm_loss`` itself is refused).
* ``check_generate(fn)``: the sampling loop; the same tokens as ``GPT.generate`` for the same seed,
  or, for another way of sampling, draws that follow the right distribution (``_distribution_check``).
* ``check_lm_train(fn)``: the ★★★, a training loop with the learner's own AdamW and warm-up + cosine
  (no ``torch.optim``), equal in float64 to ``torch.optim.AdamW`` (``lm_train_reference``).

One rule for shortcuts: course_lib's reference and PyTorch's ready-made version of what is being
built are refused with a friendly message; other building blocks are welcome.
"""

from __future__ import annotations

import contextlib
import copy
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
from ..lm_training import LMRecipe, warmup_cosine
from ..masks import causal_mask
from ._common import (CheckFailure, calls_to, checker, expect_shape, is_course_lib, passed, run_learner,
                      one_thread, time_limit)

__all__ = ["check_initial_loss", "check_lm_loss", "check_gpt_forward", "check_lm_train", "check_generate",
           "check_attention_port"]


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
            raise CheckFailure(f"Not quite: {reason}. {why}", mistake=reason)
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
    if positions == "one_based":
        pos = model.embed.position(T + 1)[1:]  # (T, d): positions 1..T
    elif positions == "reversed":
        pos = model.embed.position(T).flip(0)  # (T, d): positions T-1..0
    else:
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
         "inverted": ~causal_mask(T), "strict": causal_mask(T).tril(-1)}[mask]  # (T, T)
    h = model.blocks.norm(x) if final_norm == "start" else x
    for layer in model.blocks.layers:
        out = layer(h if chained else x, m)  # (B, T, d)
        h = h + out if extra_residual else out
        if final_norm in ("every_layer", "every_layer_and_end"):
            h = model.blocks.norm(h)
    if final_norm in ("end", "every_layer_and_end"):
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
    ({"mask": "strict"}, "the mask is off by one: tril(-1) hides the diagonal, so position t cannot "
     "see itself (and position 0 sees nothing). causal_mask(T) keeps the diagonal: row t sees 0..t"),
    ({"final_norm": "start"}, "model.blocks.norm is applied before the blocks: it is the FINAL "
     "LayerNorm (GPT-2's ln_f), after the last layer and before lm_head"),
    ({"positions": "one_based"}, "the positions start at 1: the first character has position 0, "
     "so use model.embed.position(T) (positions 0..T-1)"),
    ({"final_norm": "none"}, "the final LayerNorm is missing: a pre-LN stack ends with "
     "model.blocks.norm (GPT-2's ln_f) after the last layer, before lm_head"),
    ({"final_norm": "every_layer"}, "model.blocks.norm is applied after every layer; it is the "
     "FINAL LayerNorm, applied once after the loop (each layer normalises its own inputs)"),
    ({"final_norm": "every_layer_and_end"}, "model.blocks.norm is applied after every layer (and "
     "once more at the end); it is the FINAL LayerNorm, applied once after the loop (each layer "
     "normalises its own inputs)"),
    ({"scale": True}, "the token vectors are multiplied by sqrt(d_model); that is the 2017 paper's "
     "scaling, GPT-2 has none (model.embed.token has scale 1)"),
    ({"positions": "reversed"}, "the position vectors are in reverse order: the first character "
     "gets position T-1. model.embed.position(T) is already in order, row t for position t"),
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
        if "non-singleton dimension 0" in text and f"({T})" in text and f"({ids.size(0)})" in text:
            raise CheckFailure(
                f"Shapes do not add up ({case}): the position vectors were unsqueezed to "
                f"(T, 1, d_model); model.embed.position(T) is (T, d_model) and adds to the token "
                f"vectors (B, T, d_model) as it is. ({type(error).__name__}: {error})"
            ) from error
        if "Boolean value of Tensor" in text or "only integer tensors of a single element" in text:
            raise CheckFailure(
                f"model.embed.position was given a tensor ({case}): it takes the number of "
                "positions T, an int (T = ids.size(1)), and returns the vectors of positions "
                f"0..T-1. ({type(error).__name__}: {error})"
            ) from error
        if f"sequence length {T + 1} exceeds" in text:
            raise CheckFailure(
                f"Your code asks for {T + 1} positions for a window of T = {T} ({case}): positions "
                "start at 0, not 1. Use model.embed.position(T), positions 0..T-1. "
                f"({type(error).__name__}: {error})"
            ) from error
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
        _hard_coded_probe(fn, case)
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


def _matches(got: Any, expected: torch.Tensor) -> bool:
    return isinstance(got, torch.Tensor) and _close64(got, expected, atol=1e-4, rtol=1e-4)


class _ValueDropout(torch.nn.Module):
    """Dropout whose zeros depend on each value, not on a random stream: a forward pass that runs
    one window at a time, or in another order, gets the same zeros as ``model(ids)``. Follows
    train()/eval() like ``nn.Dropout`` and keeps its ``p``."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        keep = torch.frac((x.detach().float() * 37.0).abs()) >= self.p  # about 1 - p of the values
        return x * keep / (1 - self.p)


def _swap_dropout(model: torch.nn.Module, make: Callable[[float], torch.nn.Module]) -> list:
    """Replace every dropout module of ``model`` by ``make(p)``; return the replaced ones."""
    replaced = []
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, (torch.nn.Dropout, _ValueDropout)):
                replaced.append(child)
                new = make(child.p)
                new.train(child.training)
                setattr(module, name, new)
    return replaced


_LESSON_SIZES = dict(vocab_size=83, max_len=64, d_model=128, num_heads=4, num_layers=4)


def _hard_coded_probe(fn: Callable[..., Any], case: str) -> None:
    """Fail naming hard-coded sizes if ``fn`` is right at the lesson's own sizes (83 characters,
    64 positions, d_model 128, 4 heads) while it failed at the checker's."""
    model = _forward_model(GPTConfig(**_LESSON_SIZES), 7).eval()
    ids = torch.randint(0, 83, (2, 64), generator=torch.Generator().manual_seed(7))
    try:
        with torch.no_grad():
            got = fn(model, ids)
            expected = model(ids)
    except Exception:  # noqa: BLE001 (wrong there too: not a hard-coded size)
        return
    if _matches(got, expected):
        raise CheckFailure(
            f"Your forward pass is right at the lesson's own sizes (83 characters, 64 positions, "
            f"d_model 128, 4 heads) but not here ({case}): a size is hard-coded. Read them from "
            "the input and the model: T = ids.size(1), model.config.d_model, model.config.max_len."
        )


def _forward_reason(
    got: torch.Tensor, model: GPT, ids: torch.Tensor, seed: int, mistakes: list[tuple[dict, str]]
) -> str | None:
    """The first mistake whose output ``got`` matches (each variant after the same seed)."""
    for knobs, message in mistakes:
        torch.manual_seed(seed)
        with torch.no_grad():
            wrong = _gpt_forward_variant(model, ids, **knobs)
        if _matches(got, wrong):
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
        if training:  # dropout that depends on the values, not on the order of random draws
            real = _swap_dropout(model, lambda p: _ValueDropout(p))
        got = _run_forward(fn, model, ids, case, seed=100 + seed)
        torch.manual_seed(100 + seed)
        with torch.no_grad():
            expected = model(ids)  # (B, T, V)
        if training and not _matches(got, expected):
            # functional dropout (random draws): compare with the same draws, in the same order
            _swap_dropout(model, lambda p: real.pop(0))
            got = _run_forward(fn, model, ids, case, seed=100 + seed)
            torch.manual_seed(100 + seed)
            with torch.no_grad():
                expected = model(ids)
        if isinstance(got, torch.Tensor) and B == 1 and got.shape == (T, T, config.vocab_size):
            raise CheckFailure(
                f"Wrong output shape ({case}): {tuple(got.shape)}, one row per position, for a "
                f"single window. The position vectors were unsqueezed to (T, 1, d_model): "
                f"model.embed.position(T) is (T, d_model) and adds to (B, T, d_model) as it is."
            )
        if isinstance(got, torch.Tensor) and got.shape == (B, T, config.d_model):
            raise CheckFailure(
                f"Wrong output shape ({case}): you return {tuple(got.shape)}, the hidden states "
                f"(d_model = {config.d_model} wide). Apply model.lm_head to get logits "
                f"(B, T, V = {config.vocab_size})."
            )
        expect_shape(got, (B, T, config.vocab_size), f"the logits ({case})",
                     "Logits are (B, T, V): one score per vocabulary entry at every position.")
        got = got.detach()
        if _matches(got, expected):
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
        if training:  # the eval-mode cases passed: only what dropout does differs
            diff = (got.double() - expected.double()).abs().max().item()
            raise CheckFailure(
                f"Your forward pass is right in eval mode but not in training mode ({case}; largest "
                f"difference {diff:.3g}): what differs is the dropout. GPT.forward applies "
                "model.embed.dropout once, to the sum of token and position vectors; every layer "
                "has its own dropout inside, and nothing else is dropped."
            )
        _hard_coded_probe(fn, case)
        scale = (got.double() * expected.double()).sum() / expected.double().pow(2).sum()
        if _matches(got, (scale * expected.double()).to(expected.dtype)):
            raise CheckFailure(
                f"Your logits are {scale.item():.3g} times the right ones ({case}): every logit is "
                "scaled by the same factor, after the output layer or inside it; GPT's logits are "
                "model.lm_head(h), unscaled."
            )
        causal = _causal_leak(fn, model, ids, case, seed)
        diff = (got.double() - expected.double()).abs().max().item()
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


@torch.no_grad()
def port_attention_reference(ours: MultiHeadAttention, theirs: Any) -> None:
    """course_lib's port of one attention layer into a ``GPT2Attention`` (what
    ``load_into_hf_gpt2`` does for every layer); the lesson uses it until the learner's passes."""
    d = ours.d_model
    W = torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight], dim=0)  # (3d, d)
    theirs.c_attn.weight.copy_(W.t())  # Conv1D: (in, out) = (d, 3d)
    theirs.c_attn.bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
    theirs.c_proj.weight.copy_(ours.out_proj.weight.t())  # (d, d)
    theirs.c_proj.bias.copy_(ours.out_proj.bias)
    assert theirs.c_attn.weight.shape == (d, 3 * d)


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


# ----------------------------------------------------------------------------------------------
# shared by the new exercises: a time limit, a tiny random GPT
# ----------------------------------------------------------------------------------------------


def _time_limit(seconds: float, what: str) -> contextlib.AbstractContextManager[None]:
    """Stop the learner's code after ``seconds`` (``time_limit``) with a message naming ``what``."""
    return time_limit(seconds, f"Your code ran for more than {seconds:g} s ({what}) and was stopped: "
                               "does your loop end? It should run exactly as many steps as asked.")


def _random_gpt(config: GPTConfig, seed: int, std: float = 0.3) -> GPT:
    """A GPT with random weights far from its init, in eval mode: confident, varied predictions,
    so that each mistake changes the numbers."""
    torch.manual_seed(seed)
    model = GPT(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, std)
    return model.eval()


def _close64(got: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float = 1e-4) -> bool:
    """allclose in float64 (the learner may compute in float32 or float64)."""
    return got.shape == expected.shape and torch.allclose(
        got.detach().to(torch.float64), expected.detach().to(torch.float64), atol=atol, rtol=rtol)


# ----------------------------------------------------------------------------------------------
# check_lm_loss (build, ★): shifted targets, the loss over every position
# ----------------------------------------------------------------------------------------------

_LOSS_CONFIG = dict(vocab_size=37, max_len=16, d_model=24, num_heads=3, num_layers=1, d_ff=40)


def _loss_variants(model: GPT, window: torch.Tensor) -> list[tuple[str, Callable[[], torch.Tensor]]]:
    """(message, value) of the plausible wrong losses for ``window (B, T+1)``."""
    x, y = window[:, :-1], window[:, 1:]  # (B, T) inputs, (B, T) targets: the next characters
    V = model.config.vocab_size
    logits = model(x)  # (B, T, V)
    flat, targets = logits.reshape(-1, V), y.reshape(-1)  # (B*T, V), (B*T,)
    B = window.size(0)
    return [
        ("the targets are not shifted: position t is scored against the character it already "
         "reads. The inputs are window[:, :-1] and the targets window[:, 1:], one place later",
         lambda: F.cross_entropy(flat, x.reshape(-1))),
        ("the targets are not shifted: the whole window goes in and is scored against itself, so "
         "position t sees the character it must predict. Read window[:, :-1], score against "
         "window[:, 1:]", lambda: F.cross_entropy(model(window).reshape(-1, V), window.reshape(-1))),
        ("the shift goes the wrong way: the model reads window[:, 1:] and is scored on "
         "window[:, :-1], the PREVIOUS character. Read window[:, :-1], score against window[:, 1:]",
         lambda: F.cross_entropy(model(y).reshape(-1, V), x.reshape(-1))),
        ("the loss is summed over each window's positions, then averaged over windows: that is a "
         "loss per sequence (T times the loss per token). Average over all B*T positions",
         lambda: F.cross_entropy(flat, targets, reduction="sum") / B),
        ("the loss is summed, not averaged: use the mean over all B*T positions (F.cross_entropy's "
         "default reduction)", lambda: F.cross_entropy(flat, targets, reduction="sum")),
        ("the loss is summed over all B*T positions and divided by T only: that is B times the "
         "mean. Average over all B*T positions",
         lambda: F.cross_entropy(flat, targets, reduction="sum") / x.size(1)),
        ("log_softmax runs over the wrong axis (the positions, dim 1, or the batch): the "
         "probabilities are over the vocabulary, the last axis (dim=-1)",
         lambda: F.nll_loss(logits.log_softmax(1).reshape(-1, V), targets)),
        ("only the last position is scored: every position of the window predicts its next "
         "character, so score logits (B, T, V) against targets (B, T) at all T positions",
         lambda: F.cross_entropy(logits[:, -1], y[:, -1])),
        ("that is the loss of the FIRST position alone, averaged over the windows (the "
         "prediction of window[:, 1] from window[:, 0]): the other positions of each window are "
         "left out, as when the per-position losses (B, T) are averaged over the batch axis and "
         "then one row of the result is taken",
         lambda: F.cross_entropy(logits[:, 0], y[:, 0])),
        ("that is the mean loss over the FIRST window's positions alone: the other windows of "
         "the batch are left out, as when the per-position losses (B, T) are averaged over the "
         "positions and then one window's value is taken",
         lambda: F.cross_entropy(logits[0], y[0]) if y.size(0) > 1 else torch.tensor(float("nan"))),
        ("softmax is applied before the cross-entropy: F.cross_entropy takes logits and applies "
         "log-softmax itself", lambda: F.cross_entropy(flat.softmax(-1), targets)),
        ("F.nll_loss is given the logits: it expects log-probabilities, so apply log_softmax first "
         "(or use F.cross_entropy on the logits)", lambda: F.nll_loss(flat, targets)),
        ("the targets are flattened in another order than the logits (y.T, or reshaped across "
         "windows): logits.reshape(-1, V) runs window by window, so flatten the targets (B, T) the "
         "same way, y.reshape(-1)",
         lambda: F.cross_entropy(flat, y.t().reshape(-1)) if y.size(0) > 1 else torch.tensor(float("nan"))),
        ("the loss uses label smoothing (the translation loss of lessons 06 and 08): a language "
         "model is scored with the plain cross-entropy of the next character",
         lambda: F.cross_entropy(flat, targets, label_smoothing=0.1)),
        ("the targets are the inputs rolled by one (torch.roll): the last position's target wraps "
         "around to the window's first character. The targets are window[:, 1:], which ends with "
         "the window's last id", lambda: F.cross_entropy(flat, x.roll(-1, dims=1).reshape(-1))),
        ("the targets are two places on (window[:, 2:]): position t predicts the NEXT character, "
         "one place on. Read window[:, :-1], score against window[:, 1:]",
         lambda: F.cross_entropy(model(window[:, :-2]).reshape(-1, V), window[:, 2:].reshape(-1))),
        ("the shift is made twice (the inputs window[:, :-1], then logits[:, :-1] against "
         "inputs[:, 1:]): one position is lost. Shift once: score model(window[:, :-1]) against "
         "window[:, 1:]", lambda: F.cross_entropy(logits[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1))),
        ("the loss is in bits (divided by ln 2, or log2): cross-entropy in nats, the natural log",
         lambda: F.cross_entropy(flat, targets) / math.log(2)),
        ("logits and targets are flattened in different orders (one transposed to (T, B, ...) "
         "first): reshape logits (B, T, V) -> (B*T, V) and targets (B, T) -> (B*T,) the same way",
         lambda: F.cross_entropy(logits.transpose(0, 1).reshape(-1, V), targets)),
    ]


@checker
def check_lm_loss(fn: Callable[..., Any]) -> None:
    """Check ``fn(model, window (B, T+1)) -> scalar``: the mean next-token cross-entropy over every
    position, ``lm_loss(model(window[:, :-1]), window[:, 1:])``. The global random state is left as
    it was."""
    with torch.random.fork_rng(devices=[]), one_thread():
        _check_lm_loss(fn)


def _check_lm_loss(fn: Callable[..., Any]) -> None:
    if is_course_lib(fn):
        raise CheckFailure("You handed in one of course_lib's own functions: write the loss yourself.")
    config = GPTConfig(**_LOSS_CONFIG)
    cases = [("B=3 windows of T+1=12 ids", 3, 12, 0), ("B=2 windows of T+1=17 ids (T = max_len)", 2, 17, 1),
             ("B=1 window of T+1=6 ids", 1, 6, 2)]
    for case, B, T1, seed in cases:
        model = _random_gpt(config, seed, std=0.2)
        window = torch.randint(0, config.vocab_size, (B, T1), generator=torch.Generator().manual_seed(seed))
        try:
            with calls_to([lm_loss]) as seen:
                got = fn(model, window.clone())
        except (NotImplementedError, CheckFailure):
            raise
        except Exception as err:
            raise CheckFailure(_loss_error(err, case, B, T1 - 1, config)) from err
        if seen:
            raise CheckFailure(
                "Your function calls course_lib's lm_loss, the reference it is checked against: "
                "write the loss yourself from the logits (F.cross_entropy is welcome)."
            )
        if isinstance(got, numbers.Real) and not isinstance(got, bool):
            raise CheckFailure(
                f"You return a Python number ({case}): return the loss as a tensor, as "
                "F.cross_entropy gives it. A training step calls loss.backward(), which needs the "
                "tensor (.item() cuts it off from the gradients)."
            )
        if not isinstance(got, torch.Tensor) or got.numel() != 1:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise CheckFailure(
                f"Return one number as a 0-dim tensor, the mean loss ({case}); got {shape}. If it "
                "is one loss per position, average them (over all B*T positions)."
            )
        params = list(model.parameters())
        grads = (torch.autograd.grad(got.sum(), params, allow_unused=True) if got.requires_grad
                 else [None] * len(params))
        if all(g is None or not g.any() for g in grads):
            raise CheckFailure(
                f"No gradient reaches the model from your loss ({case}): backward() from it leaves "
                "every weight's gradient empty, so training would never change the model. A loss "
                "trains the model only if it is computed from the logits by tensor operations all "
                "the way; a number taken out of them (.item(), .detach(), torch.no_grad(), a new "
                "torch.tensor(...)) is cut off from the model."
            )
        expected = lm_loss(model(window[:, :-1]), window[:, 1:])
        expected_grads = torch.autograd.grad(expected, params)
        with torch.no_grad():
            expected = expected.detach()
            got = got.detach().reshape(())
            if _close64(got, expected, atol=1e-5):
                if all(g is not None and _close64(g, e, atol=1e-6, rtol=1e-3)
                       for g, e in zip(grads, expected_grads)):
                    continue
                raise CheckFailure(
                    f"Your loss has the right value but not the right gradient ({case}): part of it "
                    "does not come from the logits by tensor operations (a value copied in, "
                    "detached, or built from .item()), so backward() gives the model other "
                    "gradients than the loss's own."
                )
            for message, wrong in _loss_variants(model, window):
                if _close64(got, wrong(), atol=1e-5):
                    raise CheckFailure(f"Likely mistake ({case}): your loss is {got.item():.5f}, "
                                       f"expected {expected.item():.5f}: {message}.", mistake=message)
        raise CheckFailure(
            f"Your loss is {got.item():.5f}, expected {expected.item():.5f} ({case}). None of the "
            "usual mistakes explains it: inputs window[:, :-1], targets window[:, 1:], logits "
            "(B, T, V) -> (B*T, V), targets -> (B*T,), F.cross_entropy's mean."
        )
    passed("check_lm_loss", len(cases))


def _loss_error(err: Exception, case: str, B: int, T: int, config: GPTConfig) -> str:
    """A learner's exception in the loss exercise, with the likely cause when it is known."""
    text = str(err)
    where = f"({case}; {type(err).__name__}: {err})"
    if "positions but the model has" in text:
        return (f"The model got the whole window of T+1 = {T + 1} ids, one more than max_len "
                f"{config.max_len} {where}. The last id has no next character to predict: feed "
                "window[:, :-1] and score it against window[:, 1:].")
    if "view size is not compatible" in text:
        return ("window[:, 1:] (or [:, :-1]) is a slice of the window: its rows are not one block "
                "of memory, so .view cannot flatten it (.view never copies). .reshape copies when "
                f"it must {where}.")
    if "Expected target size" in text or ("target" in text.lower() and "size" in text.lower()):
        return ("The logits are not reshaped: F.cross_entropy reads a 3-D input as (B, V, T), "
                "classes on axis 1. Flatten logits (B, T, V) -> (B*T, V) and targets -> (B*T,) "
                f"(or pass logits.transpose(1, 2)) {where}.")
    if "must match the size" in text or "shape" in text.lower():
        return (f"Shapes do not fit {where}: logits are (B, T, V) = ({B}, {T}, {config.vocab_size}) "
                f"and the targets (B, T) = ({B}, {T}); flatten both the same way.")
    return f"Your code raised {type(err).__name__} ({case}): {err}."


# ----------------------------------------------------------------------------------------------
# check_generate (build, ★★): the sampling loop, checked against GPT.generate
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def _generate_variant(model: GPT, ids: torch.Tensor, n: int, temperature: float, top_k: int | None,
                      generator: torch.Generator, crop: str = "last", temp: str = "divide",
                      topk: str = "keep_k", where: int | str = -1,
                      sample: str = "multinomial") -> torch.Tensor:
    """The sampling loop, with one knob per plausible mistake; the defaults give
    ``model.generate(ids, n, temperature, top_k, generator=generator, use_cache=False)``."""
    out = ids
    L = model.config.max_len
    for _ in range(n):
        context = {"last": out[:, -L:], "first": out[:, :L], "minus_one": out[:, -(L - 1):],
                   "prompt": ids[:, -L:]}[crop]
        scores = model(context)  # (B, <= L, V)
        logits = scores.mean(1) if where == "mean" else scores[:, where]  # (B, V)
        if temp in ("divide", "twice"):
            logits = logits / temperature
        elif temp == "multiply":
            logits = logits * temperature
        if top_k is not None and topk != "ignored":
            k = {"keep_k": top_k, "k_plus_1": top_k + 1, "k_minus_1": max(top_k - 1, 1)}.get(topk, top_k)
            k = min(k, logits.size(-1))
            kth = logits.sort(dim=-1, descending=True, stable=True).values[:, k - 1 : k]  # (B, 1)
            fill = 0.0 if topk == "zero" else float("-inf")
            logits = logits.masked_fill(logits < kth, fill)
            if temp == "twice":  # divided once more after the filter
                logits = logits / temperature
        if sample == "greedy":
            next_id = logits.argmax(-1, keepdim=True)
        else:
            probs = logits.softmax(0) if sample == "batch_axis" else logits.softmax(-1)
            next_id = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
        out = torch.cat([out, next_id], dim=1)
    return out


_GENERATE_MISTAKES: list[tuple[dict[str, Any], str]] = [
    ({"crop": "first"}, "the context is cropped to the FIRST max_len tokens (out[:, :max_len]); "
     "the model must read the LAST max_len tokens, the ones just before the next token"),
    ({"crop": "minus_one"}, "the context is cropped to the last max_len - 1 tokens: the model has "
     "max_len positions (0..max_len-1), so it can read the last max_len tokens"),
    ({"crop": "prompt"}, "the model reads the prompt at every step, never the tokens drawn since: "
     "each step's logits must come from the text so far, prompt and new tokens"),
    ({"where": 0}, "the next token is drawn from the logits of the first position ([:, 0]); the "
     "prediction for the next token is at the LAST position, [:, -1]"),
    ({"where": "mean"}, "the next token's logits are averaged over all positions; the prediction "
     "for the next token is the LAST position's, [:, -1]"),
    ({"temp": "multiply"}, "the logits are multiplied by the temperature; divide them: T < 1 "
     "sharpens, T > 1 flattens"),
    ({"temp": "ignored"}, "the temperature changes nothing in your draws: divide the LOGITS by it "
     "before softmax (dividing the probabilities does nothing, multinomial renormalises them)"),
    ({"topk": "ignored"}, "top_k changes nothing in your draws: only the top_k LARGEST logits may "
     "be drawn (the others set to -inf before softmax); a filter that keeps more, say everything "
     "above the k-th smallest, keeps almost every token"),
    ({"topk": "k_plus_1"}, "top-k keeps top_k + 1 tokens (an off-by-one at the k-th value)"),
    ({"topk": "k_minus_1"}, "top-k keeps top_k - 1 tokens: keep every logit >= the k-th largest "
     "(torch.topk(logits, k).values[:, -1:]); '>' drops the k-th itself"),
    ({"topk": "zero"}, "the logits outside the top k are set to 0, not -inf: softmax still gives "
     "them probability. Fill them with float('-inf')"),
    ({"temp": "twice"}, "the logits are divided by the temperature twice "
     "(before and after the top-k filter): a temperature T acts as T squared"),
    ({"sample": "batch_axis"}, "softmax runs over the batch axis (dim 0): the probabilities of each "
     "row must sum to 1 over the vocabulary, softmax(dim=-1)"),
    ({"sample": "greedy"}, "you take the argmax: this exercise samples, torch.multinomial(probs, 1, "
     "generator=generator)"),
]


@checker
def check_generate(fn: Callable[..., Any]) -> None:
    """Check ``fn(model, ids (B, T), max_new_tokens, temperature=1.0, top_k=None, generator=None)
    -> (B, T + max_new_tokens)``: the same tokens as ``GPT.generate`` with the same seed. The global
    random state is left as it was."""
    with torch.random.fork_rng(devices=[]), one_thread():
        _check_generate(fn)


def _check_generate(fn: Callable[..., Any]) -> None:
    if is_course_lib(fn):
        raise CheckFailure("You handed in one of course_lib's own functions: write the loop yourself.")
    config = GPTConfig(vocab_size=37, max_len=12, d_model=16, num_heads=2, num_layers=1, d_ff=24)
    # (case, B, prompt length, new tokens, temperature, top_k, seed): past max_len in every case
    cases = [
        ("B=1, prompt of 5, 20 new, temperature 1.0", 1, 5, 20, 1.0, None, 0),
        ("B=2, prompt of 3, 16 new, temperature 0.6, top_k=5", 2, 3, 16, 0.6, 5, 1),
        ("B=1, prompt of 12 (= max_len), 8 new, temperature 1.7, top_k=3", 1, 12, 8, 1.7, 3, 2),
        ("B=2, prompt of 4, 0 new", 2, 4, 0, 1.0, None, 3),
    ]
    sampled_otherwise = []
    for case, B, T, n, temperature, top_k, seed in cases:
        model = _random_gpt(config, seed, std=0.5)
        ids = torch.randint(0, config.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))
        got = _run_generate(fn, model, ids, n, temperature, top_k, 100 + seed, case)
        expected = model.generate(ids, n, temperature, top_k,
                                  generator=torch.Generator().manual_seed(100 + seed), use_cache=False)
        _expect_tokens(got, ids, n, case)
        if torch.equal(got, expected):
            continue
        shared = torch.Generator().manual_seed(100 + seed)  # one sequence at a time, one generator
        rows = [model.generate(ids[b : b + 1], n, temperature, top_k, generator=shared, use_cache=False)
                for b in range(B)]
        if torch.equal(got, torch.cat(rows)):
            continue
        if not torch.equal(got[:, :T], ids):
            raise CheckFailure(f"The first {T} tokens of your output are not the prompt ({case}): "
                               "return the prompt followed by the new tokens, torch.cat along dim 1.")
        for knobs, message in _GENERATE_MISTAKES:
            if knobs.get("topk") and top_k is None:
                continue
            try:
                wrong = _generate_variant(model, ids, n, temperature, top_k,
                                          torch.Generator().manual_seed(100 + seed), **knobs)
            except RuntimeError:  # a variant that cannot run here (no distribution) does not match
                continue
            if torch.equal(got, wrong):
                raise CheckFailure(f"Likely mistake ({case}): {message}.", mistake=message)
        again = _run_generate(fn, model, ids, n, temperature, top_k, 100 + seed, case, global_seed=7)
        if not torch.equal(again, got):
            raise CheckFailure(
                f"Your draws do not come from `generator` ({case}): the same generator seed gave "
                "other tokens after a different torch.manual_seed. Pass it on: "
                "torch.multinomial(probs, 1, generator=generator)."
            )
        # Other draws than GPT.generate's for the same seed: another way of sampling (top-k by
        # gather, Gumbel-max, ...) is right if the draws follow the right distribution.
        _distribution_check(fn, model, temperature, top_k, case, seed)
        sampled_otherwise.append(case)
    if not sampled_otherwise:
        passed("check_generate", len(cases))
        return
    print(f"check_generate: all {len(cases)} cases right. Your tokens differ from GPT.generate's for "
          f"the same seed in {len(sampled_otherwise)} of them (you sample another way, which is "
          f"fine), so the checker drew {_DRAW_ROWS * _DRAW_STEPS:,} tokens with your loop in each: "
          "they follow the model's distribution (temperature, top-k, the last max_len tokens). "
          "Well done!")


_DRAW_ROWS, _DRAW_STEPS = 250, 8  # the distribution test: 2,000 draws, past max_len
_FALSE_ALARM = 1e-9  # the chance that the test refuses a right sampler, at most


@torch.no_grad()
def _step_probs(model: GPT, out: torch.Tensor, prompt_len: int, temperature: float,
                top_k: int | None, crop: str = "last", temp: str = "divide", topk: str = "keep_k",
                where: int | str = -1, sample: str = "multinomial") -> torch.Tensor:
    """The probabilities (N, V), float64, from which the next token after ``out (N, t)`` (its
    first ``prompt_len`` tokens the prompt) is drawn: right (the defaults, as ``GPT.generate``) or
    with the named mistake of ``_generate_variant``."""
    L = model.config.max_len
    context = {"last": out[:, -L:], "first": out[:, :L], "minus_one": out[:, -(L - 1):],
               "prompt": out[:, :prompt_len][:, -L:]}[crop]
    scores = model(context).double()  # (N, <= L, V)
    logits = scores.mean(1) if where == "mean" else scores[:, where]  # (N, V)
    if temp in ("divide", "twice"):
        logits = logits / temperature
    elif temp == "multiply":
        logits = logits * temperature
    if top_k is not None and topk != "ignored":
        k = {"keep_k": top_k, "k_plus_1": top_k + 1, "k_minus_1": max(top_k - 1, 1)}.get(topk, top_k)
        kth = logits.sort(dim=-1, descending=True).values[:, min(k, logits.size(-1)) - 1:][:, :1]
        logits = logits.masked_fill(logits < kth, 0.0 if topk == "zero" else float("-inf"))
        if temp == "twice":
            logits = logits / temperature
    if sample == "greedy":
        return F.one_hot(logits.argmax(-1), logits.size(-1)).double()
    return logits.softmax(-1)


def _distribution_check(fn: Callable[..., Any], model: GPT, temperature: float, top_k: int | None,
                        case: str, seed: int) -> None:
    """Pass if the learner's loop draws from the right distribution, else fail naming the mistake.

    The loop continues 250 random prompts of max_len - 2 tokens by 8 tokens each (past max_len).
    For each draw, the right probabilities given the learner's own text so far are computed. Three
    tests, each refusing a right sampler with probability <= 1e-9 whatever the seed:
    * a drawn token of probability 0 (outside the top k) is impossible;
    * likelihood ratios: a named mistake is chosen when its probabilities make the draws more
      than 1e9 times likelier than the right ones (times the number of mistakes tried; Ville's
      inequality bounds the chance of that under the right distribution);
    * the probability integral transform: under the right distribution, F(x-) + U p(x) is
      uniform, and the DKW inequality bounds the Kolmogorov-Smirnov distance of 2,000 of them.
    """
    L, V = model.config.max_len, model.config.vocab_size
    T, n = L - 2, _DRAW_STEPS
    ids = torch.randint(0, V, (_DRAW_ROWS, T), generator=torch.Generator().manual_seed(500 + seed))
    got = _run_generate(fn, model, ids, n, temperature, top_k, 600 + seed, case, seconds=300.0)
    _expect_tokens(got, ids, n, case)
    options = [({}, "")] + [(knobs, message) for knobs, message in _GENERATE_MISTAKES
                            if (top_k is not None or not knobs.get("topk"))
                            and knobs.get("sample") != "batch_axis"]  # that one depends on the batch
    log_lik = torch.zeros(len(options), dtype=torch.float64)
    p_drawn, p_before, p_tied = ([[] for _ in options] for _ in range(3))
    for j in range(n):
        prefix, drawn = got[:, : T + j], got[:, T + j : T + j + 1]  # (N, T + j), (N, 1)
        for i, (knobs, _) in enumerate(options):
            q = _step_probs(model, prefix, T, temperature, top_k, **knobs)  # (N, V)
            px = q.gather(1, drawn)  # (N, 1)
            log_lik[i] += px.log().sum()
            p_drawn[i].append(px[:, 0])
            p_before[i].append((q * (q > px)).sum(-1))  # tokens likelier than the drawn one
            p_tied[i].append((q * (q == px)).sum(-1))
    M = _DRAW_ROWS * n
    jitter = torch.rand(M, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    bound = math.sqrt(math.log(2 / _FALSE_ALARM) / (2 * M))

    def ks_distance(i: int) -> float:  # how far the draws are from option i's distribution
        u = (torch.cat(p_before[i]) + jitter * torch.cat(p_tied[i])).sort().values  # (M,)
        grid = torch.arange(1, M + 1, dtype=torch.float64) / M
        return torch.maximum(grid - u, u - (grid - 1 / M)).max().item()

    margin = math.log(len(options) / _FALSE_ALARM)
    ratios = log_lik - log_lik[0]
    best = int(ratios[1:].argmax()) + 1
    if ratios[best] > margin and ks_distance(best) <= bound:
        raise CheckFailure(f"Likely mistake ({case}; your draws, {M:,} of them, follow this "
                           f"mistake's probabilities): {options[best][1]}.")
    p_drawn = torch.cat(p_drawn[0])
    outside = int((p_drawn == 0).sum())
    if outside:
        raise CheckFailure(
            f"Your loop drew {outside} tokens of probability 0 ({case}, {_DRAW_ROWS * n:,} draws): "
            f"tokens outside the top {top_k}, which may never be drawn. Only the top_k "
            "highest-scoring tokens of each step may be drawn.")
    distance = ks_distance(0)  # F(x-) + U p(x) is uniform on [0, 1] if the draws are right
    if distance > bound:
        u_mean = (torch.cat(p_before[0]) + jitter * torch.cat(p_tied[0])).mean().item()
        likely = "likelier" if u_mean < 0.5 else "less likely"
        raise CheckFailure(
            f"Your draws do not follow the model's distribution ({case}): over {M:,} draws, your "
            f"loop picks {likely} tokens than the model's distribution gives (Kolmogorov-Smirnov "
            f"distance {distance:.3f}; right samplers stay below {bound:.3f}). None of the usual "
            "mistakes explains "
            "it. Each step: the logits of the last position of the last max_len tokens, divided "
            "by the temperature, only the top_k highest may be drawn, one draw per row."
        )


def _run_generate(fn: Callable[..., Any], model: GPT, ids: torch.Tensor, n: int, temperature: float,
                  top_k: int | None, seed: int, case: str, global_seed: int = 0,
                  seconds: float = 60.0) -> Any:
    """The learner's loop, with a step limit (forward passes), a time limit, and named errors."""
    calls = {"n": 0}
    limit = ids.size(0) * 3 * (n + ids.size(1)) + 10  # one sequence at a time is welcome

    def count(module: Any, inputs: Any) -> None:  # noqa: ARG001
        calls["n"] += 1
        if calls["n"] > limit:
            raise CheckFailure(
                f"Your loop ran more than {limit} forward passes for {n} new tokens ({case}) and "
                "was stopped: it should run exactly max_new_tokens steps."
            )

    handle = model.register_forward_pre_hook(count)
    torch.manual_seed(global_seed)
    try:
        with calls_to([GPT.generate]) as seen, _time_limit(seconds, case):
            got = fn(model, ids.clone(), n, temperature=temperature, top_k=top_k,
                     generator=torch.Generator().manual_seed(seed))
    except (NotImplementedError, CheckFailure):
        raise
    except Exception as err:
        raise CheckFailure(_generate_error(err, case, model.config.max_len, ids.size(0))) from err
    finally:
        handle.remove()
    if seen:
        raise CheckFailure("Your function calls model.generate, the reference it is checked "
                           "against: write the loop yourself (model(...) gives the logits).")
    return got


def _generate_error(err: Exception, case: str, max_len: int, B: int) -> str:
    text = str(err)
    where = f"({case}; {type(err).__name__}: {err})"
    if "must have same number of dimensions" in text:
        return (f"The new tokens and the text have different numbers of axes {where}: the text is "
                f"(B, T) and torch.cat along dim 1 needs the new tokens as (B, 1); yours lost that "
                "axis (an argmax, max or squeeze without keepdim).")
    if B > 1 and "must match the size" in text and (f"size of tensor b ({B})" in text
                                                    or f"size of tensor a ({B})" in text):
        return (f"A value per row has shape (B,) = ({B},) and met the logits (B, V) {where}: "
                "broadcasting lines up the LAST axes, so (B,) is read as one value per vocabulary "
                "entry. A per-row threshold (the k-th largest logit) must keep its axis: (B, 1).")
    if "positions but the model has" in text:
        return (f"The text grew past max_len = {max_len} and went to the model whole {where}: "
                f"learned positions stop at max_len, so feed only the last max_len tokens, "
                f"out[:, -max_len:], at every step.")
    if "probability tensor" in text or "invalid multinomial distribution" in text:
        return (f"torch.multinomial was given something that is not a probability distribution "
                f"{where}: apply softmax to the (divided, filtered) logits first.")
    if "unexpected keyword" in text or "positional argument" in text:
        return (f"Your function's arguments differ from the exercise's {where}: "
                "my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None).")
    return f"Your code raised {type(err).__name__} ({case}): {err}."


def _expect_tokens(got: Any, ids: torch.Tensor, n: int, case: str) -> None:
    B, T = ids.shape
    if not isinstance(got, torch.Tensor):
        raise CheckFailure(f"Return a tensor of token ids (B, T + max_new_tokens), got "
                           f"{type(got).__name__} ({case}).")
    if (got.dim() == 2 and got.size(0) == B and got.size(1) == n and n > T
            and torch.equal(got[:, :T], ids)):
        raise CheckFailure(f"Your output has max_new_tokens = {n} tokens in all, the prompt "
                           f"included ({case}): max_new_tokens counts the NEW tokens, so return "
                           f"(B, T + max_new_tokens) = {(B, T + n)}.")
    if got.dim() == 2 and got.size(0) == B and got.size(1) == n and n != T + n:
        raise CheckFailure(f"You return only the {n} new tokens ({case}): return the prompt "
                           f"followed by them, (B, T + max_new_tokens) = {(B, T + n)}.")
    if got.dim() == 2 and got.size(0) == B and got.size(1) != T + n:
        extra = got.size(1) - (T + n)
        raise CheckFailure(
            f"Your output has {got.size(1)} tokens, expected T + max_new_tokens = {T + n} ({case}): "
            f"{abs(extra)} too {'many' if extra > 0 else 'few'}; the loop runs max_new_tokens times."
        )
    expect_shape(got, (B, T + n), f"the generated ids ({case})", "(B, T + max_new_tokens).")
    if got.dtype != torch.long:
        raise CheckFailure(f"The ids have dtype {got.dtype}, expected torch.long ({case}).")


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


def _train_variant(model: GPT, batches: list[tuple[torch.Tensor, torch.Tensor]], recipe: LMRecipe,
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


def lm_train_reference(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]],
                       recipe: LMRecipe) -> list[float]:
    """course_lib's training loop for lesson 09's ★★★, what the lesson uses until the learner's
    passes: ``torch.optim.AdamW`` (decay on the matrices only, eps 1e-8), the rate of step s set to
    ``recipe.lr * warmup_cosine(s, ...)`` before the update, gradients clipped to a total norm of
    ``recipe.max_grad_norm``. One step per ``(x (B, T), y (B, T))``; returns the losses."""
    params = [p for p in model.parameters() if p.requires_grad]  # the tied matrix once
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": recipe.weight_decay},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=recipe.lr, betas=recipe.betas, eps=EPS, foreach=False)
    losses = []
    model.train()
    for step, (x, y) in enumerate(batches):
        for group in optimizer.param_groups:
            group["lr"] = recipe.lr * warmup_cosine(step, recipe.warmup, recipe.num_steps,
                                                    recipe.min_lr / recipe.lr)
        loss = lm_loss(model(x), y)  # (B, T, V) against (B, T)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if recipe.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, recipe.max_grad_norm)
        optimizer.step()
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


def _train_case(seed: int) -> tuple[GPT, list[tuple[torch.Tensor, torch.Tensor]], LMRecipe]:
    """A tiny GPT in float64, fixed batches and a recipe under which every mistake moves the
    weights by far more than float rounding: a high peak rate, strong decay, a clipping norm below
    every gradient's norm (so that eps and clipping both matter)."""
    config = GPTConfig(vocab_size=37, max_len=12, d_model=16, num_heads=2, num_layers=1, d_ff=24)
    model = _random_gpt(config, seed, std=0.2).double().train()
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
        with calls_to([f for f, _ in refused]) as seen, _time_limit(120.0, case):
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


def _max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max((p.detach().double() - q.detach().double()).abs().max().item()
               for p, q in zip(a.parameters(), b.parameters()))


def _check_lm_train(fn: Callable[..., Any]) -> None:
    if is_course_lib(fn):
        raise CheckFailure("You handed in one of course_lib's own functions: write the loop, the "
                           "update and the schedule yourself.")
    cases = ["12 steps, warm-up 4, a 1-layer GPT in float64",
             "10 steps, warm-up 3, other betas, decay, clipping, weights and batches"]
    for seed, case in enumerate(cases):
        model, batches, recipe = _train_case(seed)
        start = copy.deepcopy(model.state_dict())
        got = _learner_train(fn, model, batches, recipe, case)
        expected_model = _train_case(seed)[0]
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
        if _max_diff(model, expected_model) <= TRAIN_ATOL:
            if not all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for a, b in zip(got_losses, expected)):
                raise CheckFailure(f"The weights are right, but the losses you return are not the "
                                   f"per-step training losses ({case}): one loss.item() per step, "
                                   "computed before that step's update.")
            continue
        for knobs, message in _TRAIN_MISTAKES:
            variant_model = _train_case(seed)[0]
            try:
                _train_variant(variant_model, batches, recipe, **knobs)
            except RuntimeError:  # a variant that cannot run on this case does not match
                continue
            if _max_diff(model, variant_model) <= 10 * TRAIN_ATOL:
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
            f"{_max_diff(model, expected_model):.3g} ({case}), and none of the usual mistakes explains "
            f"it. {where} Print the rate of each step, and compare one update of one parameter with "
            "the algorithm in torch.optim.AdamW's documentation."
        )
    passed("check_lm_train", len(cases))
