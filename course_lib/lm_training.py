"""Training a GPT on characters (lesson 09): schedule, optimizer, evaluation and two recipes.

``train_lm`` is a thin wrapper around lesson 06's ``training.train`` loop: the same steps (forward,
loss, zero_grad, backward, clip, step, schedule), with batches ``(x, y)`` of text windows.

Two recipes (``LMRecipe``) train the same architecture on the same corpus and split:
- ``NANOGPT_CPU``: nanoGPT's documented CPU run for Shakespeare characters (its README and
  ``config/train_shakespeare_char.py``/``train.py``): 4 layers, 4 heads, d_model 128, block 64,
  batch 12, 2,000 steps, no dropout, AdamW(lr 1e-3, betas (0.9, 0.99), weight decay 0.1 on the
  matrices), 100 warm-up steps, cosine decay to 1e-4 at the last step, gradients clipped at 1.0.
- ``COURSE``: the course's faster recipe (see its comment), measured by ``benchmarks/gpt.py``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .attention import set_fused_attention
from .data.shakespeare import ShakespeareCorpus
from .data.translation import CharVocab
from .gpt import GPT, GPTConfig, lm_loss
from .training import train
from .validation import check_size

__all__ = ["warmup_cosine", "lm_optimizer", "evaluate_lm", "LMRecipe", "NANOGPT_CPU", "COURSE",
           "LMRun", "train_lm", "bits_per_char", "sample_text", "lm_train_reference"]


def warmup_cosine(step: int, warmup: int, num_steps: int, min_ratio: float) -> float:
    """Learning-rate multiplier: linear warm-up over ``warmup`` steps, then a cosine from 1 down to
    ``min_ratio`` at ``num_steps`` (nanoGPT's ``get_lr`` divided by the peak rate)."""
    if warmup < 0 or num_steps <= warmup:
        raise ValueError(f"warmup_cosine: need 0 <= warmup < num_steps, got {warmup}, {num_steps}")
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = min(1.0, (step - warmup) / (num_steps - warmup))
    return min_ratio + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - min_ratio)


def lm_optimizer(model: nn.Module, lr: float, betas: tuple[float, float], weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices (projections, embeddings) only, never on biases and
    LayerNorm gains (nanoGPT's and GPT-2's choice); one fused kernel updates every parameter."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)


@torch.no_grad()
def evaluate_lm(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Mean next-character loss (nats) over ``batches`` of ``(x, y)``, in eval mode (the model's
    mode is restored afterwards)."""
    if not batches:
        raise ValueError("evaluate_lm: no batches to evaluate")
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for x, y in batches:
        total += lm_loss(model(x), y).item() * y.numel()
        count += y.numel()
    model.train(was_training)
    return total / count


def bits_per_char(loss: float) -> float:
    """A loss in nats per character, in bits per character: ``loss / ln 2``."""
    return loss / math.log(2)


def _is_number(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)


@dataclass(frozen=True)
class LMRecipe:
    """Everything ``train_lm`` needs besides the corpus and the seed."""

    num_layers: int = 4
    num_heads: int = 4
    d_model: int = 128
    block_size: int = 64
    batch_size: int = 12
    num_steps: int = 2000
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int = 100
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.1
    max_grad_norm: float | None = 1.0
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_heads", "d_model", "block_size", "batch_size", "num_steps"):
            object.__setattr__(self, name, check_size(getattr(self, name), name, "LMRecipe"))
        object.__setattr__(self, "warmup", check_size(self.warmup, "warmup", "LMRecipe", minimum=0))
        if self.warmup >= self.num_steps:
            raise ValueError(f"LMRecipe: warmup={self.warmup} must be below num_steps={self.num_steps}")
        if not (_is_number(self.lr) and self.lr > 0):
            raise ValueError(f"LMRecipe: lr must be a finite number > 0, got {self.lr!r}")
        if not (_is_number(self.min_lr) and 0 <= self.min_lr <= self.lr):
            raise ValueError(f"LMRecipe: min_lr must lie in [0, lr={self.lr}], got {self.min_lr!r}")
        if len(self.betas) != 2 or not all(_is_number(b) and 0 <= b < 1 for b in self.betas):
            raise ValueError(f"LMRecipe: betas must be two numbers in [0, 1), got {self.betas!r}")
        if not (_is_number(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"LMRecipe: weight_decay must be a number >= 0, got {self.weight_decay!r}")
        if self.max_grad_norm is not None and not (_is_number(self.max_grad_norm) and self.max_grad_norm > 0):
            raise ValueError(f"LMRecipe: max_grad_norm must be None or a number > 0, got {self.max_grad_norm!r}")

    def config(self, vocab_size: int) -> GPTConfig:
        return GPTConfig(vocab_size=vocab_size, max_len=self.block_size, d_model=self.d_model,
                         num_heads=self.num_heads, num_layers=self.num_layers, dropout=self.dropout)


NANOGPT_CPU = LMRecipe()
# The course's recipe: the same architecture with ONE layer, batches of 32, a 5x higher peak rate,
# 700 steps. On 2 cores a 1-layer step of 32 windows costs about as much as a 4-layer step of 12,
# and at this budget depth buys little per step (seed 0, 1,100 steps of 16 at 3e-3: 1 layer 1.878,
# 2 layers 1.888 validation loss); the larger batch and rate do the rest. See benchmarks/gpt.py.
COURSE = LMRecipe(num_layers=1, batch_size=32, num_steps=700, lr=5e-3, min_lr=5e-4, warmup=50)


@dataclass
class LMRun:
    """``train_lm``'s result: the model (eval mode), every step's training loss, and the
    evaluations ``(step, training seconds so far, validation loss)``; ``samples``: step -> text
    generated at that evaluation (if asked for)."""

    model: GPT
    losses: list[float] = field(default_factory=list)
    curve: list[tuple[int, float, float]] = field(default_factory=list)
    train_curve: list[tuple[int, float]] = field(default_factory=list)
    samples: dict[int, str] = field(default_factory=dict)
    train_seconds: float = 0.0

    def first_reaching(self, loss: float) -> tuple[int, float] | None:
        """``(step, seconds)`` of the first evaluation with validation loss <= ``loss``, or None."""
        return next(((s, t) for s, t, v in self.curve if v <= loss), None)


def train_lm(
    corpus: ShakespeareCorpus,
    recipe: LMRecipe = COURSE,
    seed: int = 0,
    eval_every: int = 0,
    val_windows: int = 256,
    train_windows: int = 0,
    sample_prompt: str | None = None,
    sample_length: int = 200,
    fused: bool = True,
    progress: bool = True,
    callback: Callable[[int, nn.Module], None] | None = None,
) -> LMRun:
    """Train a ``GPT`` on ``corpus`` with ``recipe``; returns an ``LMRun``.

    Every ``eval_every`` steps (and at the end; 0 = only at the end) it measures the validation
    loss on ``val_windows`` fixed windows of the held-out plays (and, with ``train_windows``, on
    fixed training windows), and with ``sample_prompt`` generates ``sample_length`` characters
    (seeded). The time spent evaluating is not counted in ``train_seconds`` or the curve's seconds.
    ``fused`` trains with PyTorch's fused attention kernel (same results up to float rounding) and
    switches it off at the end, so the returned model stores its attention weights.
    """
    for name, value, minimum in (("eval_every", eval_every, 0), ("val_windows", val_windows, 1),
                                 ("train_windows", train_windows, 0), ("sample_length", sample_length, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"train_lm: {name} must be an int >= {minimum}, got {value!r}")
    torch.manual_seed(seed)
    model = GPT(recipe.config(len(corpus.vocab)))
    set_fused_attention(model, fused)
    optimizer = lm_optimizer(model, recipe.lr, recipe.betas, recipe.weight_decay)
    min_ratio = recipe.min_lr / recipe.lr
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, recipe.warmup, recipe.num_steps, min_ratio))
    gen = torch.Generator().manual_seed(seed)
    val = corpus.fixed_batches("val", val_windows, recipe.block_size)
    train_fixed = corpus.fixed_batches("train", train_windows, recipe.block_size) if train_windows else []
    run = LMRun(model)
    eval_seconds = 0.0
    start = time.perf_counter()

    def next_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return corpus.train_batch(recipe.batch_size, recipe.block_size, gen)

    def evaluate(step: int, m: nn.Module) -> None:
        nonlocal eval_seconds
        if callback is not None:
            callback(step, m)
        if not (step == recipe.num_steps or (eval_every and step % eval_every == 0)):
            return
        t0 = time.perf_counter()
        seconds = t0 - start - eval_seconds
        run.curve.append((step, seconds, evaluate_lm(m, val)))
        if train_fixed:
            run.train_curve.append((step, evaluate_lm(m, train_fixed)))
        if sample_prompt is not None:
            run.samples[step] = sample_text(m, corpus, sample_prompt, sample_length, seed)
        eval_seconds += time.perf_counter() - t0

    if eval_every or sample_prompt is not None:
        run.curve.append((0, 0.0, evaluate_lm(model, val)))
        if train_fixed:
            run.train_curve.append((0, evaluate_lm(model, train_fixed)))
        if sample_prompt is not None:
            run.samples[0] = sample_text(model, corpus, sample_prompt, sample_length, seed)
        start = time.perf_counter()
    run.losses = train(model, next_batch, recipe.num_steps, optimizer, lm_loss, scheduler,
                       progress=progress, callback=evaluate, max_grad_norm=recipe.max_grad_norm)
    run.train_seconds = time.perf_counter() - start - eval_seconds
    set_fused_attention(model, False)
    model.eval()
    return run


def sample_text(model: GPT, corpus: ShakespeareCorpus, prompt: str, length: int, seed: int = 0,
                temperature: float = 0.8, top_k: int | None = None) -> str:
    """``length`` characters that ``model`` writes after ``prompt`` (seeded draws, temperature 0.8)."""
    vocab = corpus.vocab
    ids = vocab.encode(prompt, "the prompt") if isinstance(vocab, CharVocab) else vocab.encode(prompt)
    ids = torch.tensor([ids])  # (1, prompt tokens)
    gen = torch.Generator().manual_seed(seed)
    out = model.generate(ids, length, temperature=temperature, top_k=top_k, generator=gen)
    return corpus.vocab.decode(out[0, ids.size(1):].tolist())


def lm_train_reference(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]],
                       recipe: LMRecipe) -> list[float]:
    """course_lib's training loop for lesson 09's ★★★, what the lesson uses until the learner's
    passes ``check_lm_train``: ``torch.optim.AdamW`` (decay on the matrices only, eps 1e-8), the
    rate of step s set to ``recipe.lr * warmup_cosine(s, ...)`` before the update, gradients
    clipped to a total norm of ``recipe.max_grad_norm``. One step per ``(x (B, T), y (B, T))``;
    returns the losses."""
    params = [p for p in model.parameters() if p.requires_grad]  # the tied matrix once
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": recipe.weight_decay},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=recipe.lr, betas=recipe.betas, eps=1e-8, foreach=False)  # eps: torch's default
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
