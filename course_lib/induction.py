"""A model small enough to read: a 2-layer attention-only GPT that grows induction heads (lesson 12).

The recipe, found by a search (the runs are listed in ``scripts/induction.py``'s docstring):

- the model: ``GPTConfig(attn_only=True)`` with 2 layers, 4 heads of 32 dimensions (d_model 128),
  RoPE positions, LayerNorm before each layer and at the end, tied embeddings; 64 random tokens;
- the data: every row is a random block of 8..24 tokens repeated until the row is full (a new block
  length per row), so that the only way to predict a token is to find where the current token
  occurred before and copy the token that followed it: an induction head;
- AdamW at lr 1e-3 (100 warm-up steps, then constant, no weight decay), batch 32, 48 positions,
  gradients clipped at 1.0; 600 steps.

The loss sits on a plateau, then falls within about 100 steps (the phase change): on 1 thread,
seeds 0, 1 and 2 formed the circuit (layer 1's best induction score > 0.8) between steps 250 and
350, about 20 s, and PyTorch's portable ``default`` kernels give the same curve to 2 decimals.
What failed: d_model 64 (heads of 16 dimensions; formed in 1 of 5 runs within 1,000 steps);
learned positions (no previous-token head within 1,500 steps: the model learns offsets instead).

``train_induction`` trains it; ``save_checkpoint`` / ``load_checkpoint`` keep the trained weights
in ``course_lib/results/induction.pt`` (``make induction``), which the lesson loads.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .gpt import GPT, GPTConfig, lm_loss

__all__ = ["induction_config", "repeated_tokens", "tiled_batch", "InductionRun", "train_induction",
           "CHECKPOINT", "save_checkpoint", "load_checkpoint", "repeated_half_losses"]

CHECKPOINT = Path(__file__).parent / "results" / "induction.pt"


def induction_config(**changes: object) -> GPTConfig:
    """Lesson 12's model: 2 attention-only layers, 4 heads, d_model 128, RoPE, 64 tokens, 48 positions."""
    sizes = dict(vocab_size=64, max_len=48, d_model=128, num_heads=4, num_layers=2, positional="rope",
                 attn_only=True, fused_attention=True)  # fused trains faster
    return GPTConfig(**{**sizes, **changes})


def _check_count(value: object, name: str, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where}: {name} must be an int >= {minimum}, got {value!r}")
    return value


def repeated_tokens(batch_size: int, length: int, vocab_size: int,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """``batch_size`` rows of ``length`` uniform random tokens, each repeated once:
    ``(B, 2 * length)`` with ``ids[:, length + i] == ids[:, i]``."""
    for name, value in (("batch_size", batch_size), ("length", length), ("vocab_size", vocab_size)):
        _check_count(value, name, "repeated_tokens")
    first = torch.randint(0, vocab_size, (batch_size, length), generator=generator)  # (B, n)
    return torch.cat([first, first], dim=1)  # (B, 2n)


def tiled_batch(batch_size: int, seq_len: int, vocab_size: int, min_period: int = 8,
                max_period: int = 24, generator: torch.Generator | None = None) -> torch.Tensor:
    """Training rows ``(B, seq_len)``: per row a random block of ``min_period..max_period`` tokens
    (length drawn per row), repeated until the row is full."""
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len), ("vocab_size", vocab_size),
                        ("min_period", min_period), ("max_period", max_period)):
        _check_count(value, name, "tiled_batch")
    if min_period > max_period:
        raise ValueError(f"tiled_batch: min_period={min_period} > max_period={max_period}")
    periods = torch.randint(min_period, max_period + 1, (batch_size,), generator=generator)  # (B,)
    blocks = torch.randint(0, vocab_size, (batch_size, max_period), generator=generator)  # (B, P)
    positions = torch.arange(seq_len)[None, :] % periods[:, None]  # (B, T): index into the block
    return blocks.gather(1, positions)  # (B, T)


@dataclass
class InductionRun:
    """What ``train_induction`` measured: per evaluation step, the loss on the first and on the
    repeated half of fixed ``repeated_tokens`` rows and layer 1's best induction score."""

    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    first_half: list[float] = field(default_factory=list)
    second_half: list[float] = field(default_factory=list)
    induction: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def formed(self, score: float = 0.3) -> tuple[int, float] | None:
        """(step, seconds) of the first evaluation where layer 1's best induction score is above
        ``score`` and the repeated half's loss is below half the first half's; None if never."""
        for s, t, ind, a, b in zip(self.steps, self.seconds, self.induction, self.first_half,
                                   self.second_half):
            if ind > score and b < 0.5 * a:
                return s, t
        return None


def repeated_half_losses(model: GPT, ids: torch.Tensor) -> tuple[float, float]:
    """Mean next-token loss (nats) on ``ids = [r, r]`` ``(B, 2n)``: over the predictions of the
    first half's tokens 1..n-1 (unpredictable: about ln V) and of the second half's tokens."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        raise ValueError(f"repeated_half_losses: ids must be token ids (B, 2n), got "
                         f"{tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__}")
    T, n = ids.size(1), ids.size(1) // 2
    if T % 2 or n < 2 or not torch.equal(ids[:, :n], ids[:, n:]):
        raise ValueError(f"repeated_half_losses: ids {tuple(ids.shape)} is not two copies [r, r] of a "
                         "block r of at least 2 tokens; build it with repeated_tokens")
    with torch.no_grad():
        logits = model(ids[:, :-1])  # (B, 2n-1, V): position t predicts token t+1
        losses = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # (B, 2n-1)
    return losses[:, : n - 1].mean().item(), losses[:, n - 1 :].mean().item()


def train_induction(steps: int = 600, seed: int = 0, lr: float = 1e-3, batch_size: int = 32,
                    warmup: int = 100, eval_every: int = 50, config: GPTConfig | None = None,
                    model: GPT | None = None, threads: int | None = 1,
                    stop_at_formation: bool = False) -> tuple[GPT, InductionRun]:
    """Train lesson 12's model on ``tiled_batch`` rows; returns ``(model in eval mode, run)``.

    Every ``eval_every`` steps: the two half losses on 64 fixed ``repeated_tokens`` rows of 20 tokens
    and layer 1's best induction score. ``model``: continue a model instead of a fresh one;
    ``stop_at_formation``: stop at the first evaluation where ``run.formed()``."""
    from .interp import attention_patterns, induction_score  # interp imports this module

    _check_count(steps, "steps", "train_induction", 0)
    if threads is not None:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    config = config or induction_config()
    model = model if model is not None else GPT(config)
    config = model.config
    data = torch.Generator().manual_seed(seed + 1)
    probe = repeated_tokens(64, 20, config.vocab_size, torch.Generator().manual_seed(12345))  # (64, 40)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    run, start = InductionRun(), time.perf_counter()
    for step in range(1, steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, step / warmup)
        model.train()
        x = tiled_batch(batch_size, config.max_len + 1, config.vocab_size, generator=data)  # (B, T+1)
        loss = lm_loss(model(x[:, :-1]), x[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % eval_every == 0 or step == steps:
            model.eval()
            first, second = repeated_half_losses(model, probe)
            pattern = attention_patterns(model, probe)[1]  # (B, h, 2n, 2n)
            run.steps.append(step)
            run.train_loss.append(loss.item())
            run.first_half.append(first)
            run.second_half.append(second)
            run.induction.append(induction_score(pattern, 20).max().item())
            run.seconds.append(time.perf_counter() - start)
            if stop_at_formation and run.formed():
                break
    return model.eval(), run


def save_checkpoint(model: GPT, run: InductionRun, path: Path | str = CHECKPOINT) -> Path:
    """Write the weights, the config and the run's curves to ``path`` (a few hundred kB)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"config": asdict(model.config), "state_dict": model.state_dict(), "run": asdict(run)},
               path)
    return path


def load_checkpoint(path: Path | str = CHECKPOINT) -> tuple[GPT, InductionRun]:
    """The trained model (eval mode) and its ``InductionRun``, from ``save_checkpoint``'s file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"load_checkpoint: {path} is missing; `make induction` writes it")
    saved = torch.load(path, map_location="cpu", weights_only=True)
    model = GPT(GPTConfig(**saved["config"]))
    model.load_state_dict(saved["state_dict"])
    return model.eval(), InductionRun(**saved["run"])

