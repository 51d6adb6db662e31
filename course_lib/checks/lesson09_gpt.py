"""Checkers for lesson 09's exercises on the model and its loss (GPT: a decoder-only language model).

* ``check_initial_loss(fn)``: ``fn() -> float``, the predicted loss (cross-entropy, nats per
  character) of a freshly initialised ``GPT(GPTConfig(vocab_size=83))`` (a "predict, then run"
  question). The checker measures it on fresh models; it is ln(83) plus a small excess.
* ``check_lm_loss(fn)``: ``fn(model, window (B, T+1)) -> scalar``, the shifted loss; its value and
  the gradients it sends to the model (``lm_loss`` itself is refused).
* ``check_gpt_forward(fn)``: ``fn(model, ids (B, T)) -> logits (B, T, V)``, GPT's forward pass
  written from the model's parts (embeddings, the loop over ``model.blocks.layers`` with a causal
  mask, the final LayerNorm, ``lm_head``). Reference: ``model(ids)``, in eval mode and in
  training mode with dropout (same seed before both calls).

The lesson's other exercises: ``lesson09_recipe`` (``check_lm_train``), ``lesson09_generate``
(``check_generate``), ``lesson09_port`` (``check_attention_port``); they share this module's
``learner_time_limit`` and ``random_gpt``. One rule for shortcuts: course_lib's reference and
PyTorch's ready-made version of what is being built are refused with a friendly message; other
building blocks are welcome.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..embeddings import TransformerEmbedding
from ..gpt import GPT, GPTConfig, lm_loss
from ..layers import Encoder
from ..masks import causal_mask
from .common import (CheckFailure, calls_to, checker, expect_shape, is_course_lib, one_thread, passed,
                     run_learner, time_limit)

__all__ = ["check_initial_loss", "check_lm_loss", "check_gpt_forward"]


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
# shared with lesson09_generate and lesson09_recipe: a time limit, a tiny random GPT
# ----------------------------------------------------------------------------------------------


def learner_time_limit(seconds: float, what: str) -> contextlib.AbstractContextManager[None]:
    """Stop the learner's code after ``seconds`` (``time_limit``) with a message naming ``what``."""
    return time_limit(seconds, f"Your code ran for more than {seconds:g} s ({what}) and was stopped: "
                               "does your loop end? It should run exactly as many steps as asked.")


def random_gpt(config: GPTConfig, seed: int, std: float = 0.3) -> GPT:
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
        model = random_gpt(config, seed, std=0.2)
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
