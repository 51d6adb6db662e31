"""Length generalisation (lesson 11): train a GPT to copy sequences of 1..20 symbols, test 1..40.

The task is lesson 07's ``VariableLengthTask`` (copy, ids ``0 = <pad>``, ``1 = <sos>``,
``2 = <eos>``, ``3 .. 12`` the ten symbols), written as ONE sequence for a decoder-only model:

    <sos> s_1 .. s_L <eos> s_1 .. s_L <eos>
    `------ prompt -----' `--- the copy ---'

The model reads the sequence moved on by one (``ids`` = all but the last token, ``targets`` = all
but the first), and the loss counts only the copy: the targets of the prompt are ``IGNORE``
(-100, ``F.cross_entropy``'s ``ignore_index``, so ``lm_loss`` skips them), because the symbols of
the source are random and cannot be predicted. Rows are padded on the right (``<pad>`` in
``ids``, ``IGNORE`` in ``targets``); the causal mask means padding never changes an earlier
position.

Every model is lesson 09's GPT-2 block (pre-LN LayerNorm, GELU, biases, tied embeddings) with the
same sizes, seed, batches and recipe; only ``GPTConfig.positional`` changes: ``"learned"``,
``"sinusoidal"``, ``"rope"`` or ``"none"`` (no position information at all: the causal mask is the
only clue to order).

Like with like: the vectors added to the tokens start at one scale. GPT-2 draws token vectors and
learned positions from N(0, 0.02^2), so each has a root mean square (RMS) of about 0.02; a row of
the sinusoidal table has an RMS of 1 / sqrt(2) = 0.71, about 35 times more, which drowns the
tokens (trained so, the copy model copied at most 10% at length 1). ``train_copy_model``
scales the sinusoidal table by ``SINUSOID_RMS * sqrt(2)``: every position's vector then has an RMS of exactly
``SINUSOID_RMS = 0.02``, the init scale of the learned table it is compared with
(``sinusoid_rms=None`` keeps lesson 03's unscaled table). The table stays fixed, as in lesson 03.

``max_len`` is 83 (= 2 * 40 + 3) for every model, so that length 40 fits; a
learned table's rows past position 41 are never trained.

Exact match at each length: greedy ``generate`` (with the KV cache) from the prompt, batched per
length; a row is right if the L + 1 generated tokens are the source and ``<eos>``. Lengths 4..20
use the task's held-out sequences (never trained on); lengths 1..3 use random sequences (every
one of them is trained on: there are only 10, 100 and 1,000); lengths above 20 use random
sequences, which training cannot have seen.
"""

from __future__ import annotations

import datetime
import json
import math
import time
from pathlib import Path

import torch

from ..attention import set_fused_attention
from ..data.variable_length import VariableLengthTask
from ..gpt import GPT, POSITIONAL, GPTConfig, lm_loss
from ..lm_training import lm_optimizer, warmup_cosine
from ..training import train
from .stored import RESULTS_DIR, load_runs, save_runs

__all__ = ["IGNORE", "SINUSOID_RMS", "scale_sinusoids", "TRAIN_MAX_LEN", "TEST_MAX_LEN",
           "COPY_MAX_LEN", "copy_task", "make_copy_batch",
           "copy_prompt", "copy_config", "train_copy_model", "exact_match_by_length",
           "length_generalisation", "save_length_generalisation", "load_length_generalisation",
           "RESULTS_PATH", "run_rope_lengths", "save_rope_lengths", "load_rope_lengths"]

IGNORE = -100  # F.cross_entropy's default ignore_index: no loss at this position
TRAIN_MAX_LEN = 20  # training lengths 1..20
TEST_MAX_LEN = 40  # test lengths 1..40
COPY_MAX_LEN = 2 * TEST_MAX_LEN + 3  # <sos> src <eos> src <eos> at length 40: 83 positions
SINUSOID_RMS = 0.02  # the RMS of a vector from GPT-2's init N(0, 0.02^2): tokens, learned positions


def copy_task(seed: int = 1234, num_heldout: int = 2720) -> VariableLengthTask:
    """Lesson 07's copy task (10 symbols, lengths 1..20) with a larger held-out set: 2,720
    sequences of lengths 4..20, about 160 per length, so that each length has >= 100 unseen
    sequences to test on."""
    return VariableLengthTask(vocab_size=13, min_len=1, max_len=TRAIN_MAX_LEN, num_heldout=num_heldout,
                              seed=seed)


def make_copy_batch(task: VariableLengthTask, seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids (B, T), targets (B, T))`` for 1-D sources ``seqs``, T = 2 * longest + 2.

    Row b: the sequence ``<sos> src <eos> src <eos>`` without its last token as ``ids`` and without
    its first as ``targets``; the targets of the prompt (``src`` and the first ``<eos>``) are
    ``IGNORE``, so the loss counts the copy and its ``<eos>`` only. Padding: ``<pad>`` / ``IGNORE``.
    """
    if not seqs:
        raise ValueError("make_copy_batch: no sequences")
    for seq in seqs:
        if seq.dim() != 1 or seq.numel() == 0:
            raise ValueError(f"make_copy_batch: every source must be a non-empty 1-D tensor, got shape "
                             f"{tuple(seq.shape)}")
        if seq.min() < 3 or seq.max() >= task.vocab_size:
            raise ValueError(f"make_copy_batch: sources hold data symbols 3..{task.vocab_size - 1}, got "
                             f"{seq.tolist()}")
    longest = max(len(s) for s in seqs)
    B, T = len(seqs), 2 * longest + 2
    ids = torch.full((B, T), task.pad_id, dtype=torch.long)
    targets = torch.full((B, T), IGNORE, dtype=torch.long)
    sos, eos = torch.tensor([task.sos_id]), torch.tensor([task.eos_id])
    for b, seq in enumerate(seqs):
        n = len(seq)
        full = torch.cat([sos, seq, eos, task.target(seq), eos])  # (2n + 3,)
        ids[b, : 2 * n + 2] = full[:-1]
        targets[b, n + 1 : 2 * n + 2] = full[n + 2 :]  # the copy and its <eos>; the prompt: IGNORE
    return ids, targets


def copy_prompt(task: VariableLengthTask, seqs: list[torch.Tensor]) -> torch.Tensor:
    """``<sos> src <eos>`` for sources of ONE length: ``(B, L + 2)``."""
    lengths = {len(s) for s in seqs}
    if len(lengths) != 1:
        raise ValueError(f"copy_prompt: all sources must have one length, got lengths {sorted(lengths)}")
    src = torch.stack(seqs)  # (B, L)
    B = src.size(0)
    sos = torch.full((B, 1), task.sos_id, dtype=torch.long)
    eos = torch.full((B, 1), task.eos_id, dtype=torch.long)
    return torch.cat([sos, src, eos], dim=1)  # (B, L + 2)


def copy_config(positional: str, vocab_size: int = 13, max_len: int = COPY_MAX_LEN) -> GPTConfig:
    """The copy model: GPT-2's block, 2 layers, d_model 64, 4 heads, d_ff 128, no dropout; only
    ``positional`` differs between the models compared."""
    if positional not in POSITIONAL:
        raise ValueError(f"copy_config: positional must be one of {POSITIONAL}, got {positional!r}")
    return GPTConfig(vocab_size=vocab_size, max_len=max_len, d_model=64, num_heads=4, num_layers=2,
                     d_ff=128, dropout=0.0, positional=positional, fused_attention=True)


@torch.no_grad()
def scale_sinusoids(model: GPT, rms: float = SINUSOID_RMS) -> GPT:
    """Scale the fixed sinusoidal table of ``model`` (``positional="sinusoidal"``) so that every
    position's vector ``(d_model,)`` has root mean square ``rms``; returns the model.

    A row of sines and cosines has ``d_model / 2`` pairs with ``sin^2 + cos^2 = 1``: its RMS is
    ``1 / sqrt(2)`` at every position (even ``d_model``), so the table is multiplied by
    ``rms * sqrt(2)``. The table is a non-persistent buffer: a ``state_dict`` does not keep the scale.
    """
    if model.config.positional != "sinusoidal":
        raise ValueError(f"scale_sinusoids: the model's positions are {model.config.positional!r}, "
                         "not 'sinusoidal'; only a sinusoidal table can be scaled")
    if model.config.d_model % 2 != 0:
        raise ValueError(f"scale_sinusoids: needs an even d_model (pairs of sine and cosine), got "
                         f"{model.config.d_model}")
    if isinstance(rms, bool) or not isinstance(rms, (int, float)) or not math.isfinite(rms) or rms <= 0:
        raise ValueError(f"scale_sinusoids: rms must be a finite number > 0, got {rms!r}")
    table = model.embed.position.pe  # (max_len, d_model)
    table.mul_(rms / table.pow(2).mean(dim=-1, keepdim=True).sqrt())  # each row's RMS -> rms
    return model


def train_copy_model(
    positional: str,
    seed: int = 0,
    steps: int = 1500,
    task: VariableLengthTask | None = None,
    batch_size: int = 32,
    lr: float = 3e-3,
    warmup: int = 50,
    progress: bool = False,
    sinusoid_rms: float | None = SINUSOID_RMS,
) -> GPT:
    """Train ``GPT(copy_config(positional))`` to copy sequences of the task's lengths (1..20).

    For ``"sinusoidal"``, the fixed table is first scaled to an RMS of ``sinusoid_rms`` per position
    (``scale_sinusoids``; default 0.02, the init scale of the token vectors and of the learned
    table; ``None``: lesson 03's unscaled table, RMS 0.71).

    AdamW (betas 0.9, 0.99, weight decay 0.1 on matrices), ``warmup`` steps, cosine decay to
    ``lr / 10``, gradients clipped at 1.0; ``batch_size`` fresh training sequences per step (none
    held out), drawn with ``torch.Generator().manual_seed(seed)``; weights from
    ``torch.manual_seed(seed)``. Returns the model in eval mode, with the readable attention path.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= warmup:
        raise ValueError(f"train_copy_model: steps must be an int > warmup={warmup}, got {steps!r}")
    task = copy_task() if task is None else task
    torch.manual_seed(seed)
    model = GPT(copy_config(positional, task.vocab_size))
    if positional == "sinusoidal" and sinusoid_rms is not None:
        scale_sinusoids(model, sinusoid_rms)
    optimizer = lm_optimizer(model, lr, (0.9, 0.99), 0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, warmup, steps, 0.1))
    gen = torch.Generator().manual_seed(seed)

    def next_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return make_copy_batch(task, task.sample(batch_size, gen))

    train(model, next_batch, steps, optimizer, lm_loss, scheduler, progress=progress, max_grad_norm=1.0)
    set_fused_attention(model, False)  # the readable path: attention weights can be looked at
    return model.eval()


def _test_sequences(task: VariableLengthTask, length: int, per_length: int,
                    gen: torch.Generator) -> list[torch.Tensor]:
    """``per_length`` sources of ``length``: held-out ones where the task holds some out."""
    if task.heldout_min_len <= length <= task.max_len:
        held = [s for s in task.heldout if len(s) == length]
        if len(held) < per_length:
            raise ValueError(
                f"exact_match_by_length: the task holds out only {len(held)} sequences of length "
                f"{length}, fewer than per_length={per_length}; build it with a larger num_heldout "
                "(copy_task() holds out about 160 per length) or ask for fewer"
            )
        return held[:per_length]
    # lengths 1..3 (all trained on) or longer than training (never seen): random draws
    return list(torch.randint(3, task.vocab_size, (per_length, length), generator=gen))


@torch.no_grad()
def exact_match_by_length(
    model: GPT, task: VariableLengthTask, lengths, per_length: int = 128, seed: int = 0
) -> dict[int, float]:
    """Fraction of ``per_length`` sequences of each length that greedy ``generate`` copies exactly
    (the source, then ``<eos>``), one batch per length. Held-out sequences for the task's held-out
    lengths, random ones (drawn with ``seed``) otherwise. Returns ``{length: fraction}``."""
    lengths = list(lengths)
    if isinstance(per_length, bool) or not isinstance(per_length, int) or per_length < 1:
        raise ValueError(f"exact_match_by_length: per_length must be an int >= 1, got {per_length!r}")
    for n in lengths:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"exact_match_by_length: lengths must be ints >= 1, got {n!r}")
        if 2 * n + 2 > model.config.max_len:
            raise ValueError(
                f"exact_match_by_length: length {n} needs {2 * n + 2} positions (<sos> src <eos> src), "
                f"the model has max_len={model.config.max_len}"
            )
    gen = torch.Generator().manual_seed(seed)
    result = {}
    for n in lengths:
        seqs = _test_sequences(task, n, per_length, gen)
        prompt = copy_prompt(task, seqs)  # (B, n + 2)
        out = model.generate(prompt, n + 1, greedy=True)[:, n + 2 :]  # (B, n + 1)
        expected = torch.cat([torch.stack([task.target(s) for s in seqs]),
                              torch.full((len(seqs), 1), task.eos_id)], dim=1)  # (B, n + 1)
        result[n] = (out == expected).all(dim=1).float().mean().item()
    return result


def length_generalisation(
    positionals=POSITIONAL,
    seeds=(0, 1, 2),
    steps: int = 1500,
    lengths=range(1, TEST_MAX_LEN + 1),
    per_length: int = 128,
    task: VariableLengthTask | None = None,
    progress: bool = True,
    sinusoid_rms: float | None = SINUSOID_RMS,
) -> dict[str, dict[int, dict[int, float]]]:
    """Train one copy model per positional and seed, and measure exact match per length:
    ``{positional: {seed: {length: fraction}}}``. ``progress`` prints one line per run;
    ``sinusoid_rms``: see ``train_copy_model``."""
    task = copy_task() if task is None else task
    results: dict[str, dict[int, dict[int, float]]] = {}
    for positional in positionals:
        results[positional] = {}
        for seed in seeds:
            t0 = time.perf_counter()
            model = train_copy_model(positional, seed, steps, task, sinusoid_rms=sinusoid_rms)
            t1 = time.perf_counter()
            results[positional][seed] = exact_match_by_length(model, task, lengths, per_length, seed)
            if progress:
                acc = results[positional][seed]
                inside = min(v for n, v in acc.items() if n <= task.max_len)
                print(f"{positional:>10} seed {seed}: train {t1 - t0:.1f} s, test "
                      f"{time.perf_counter() - t1:.1f} s; min exact match at lengths <= {task.max_len}: "
                      f"{inside:.3f}", flush=True)
    return results


RESULTS_PATH = Path(__file__).parent.parent / "results" / "length_generalisation.json"


def save_length_generalisation(results: dict[str, dict[int, dict[int, float]]], steps: int,
                               path: Path | str = RESULTS_PATH,
                               sinusoid_rms: float | None = SINUSOID_RMS,
                               runs: dict[str, dict] | None = None) -> Path:
    """Write ``length_generalisation``'s results as JSON, with the number of training steps, the
    sinusoidal table's RMS, and per positional (``"runs"``) the torch version, CPU capability,
    thread count and date it was run with (``runs`` keeps the records of kinds run earlier;
    kinds without one get this run's)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    now = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "threads": torch.get_num_threads(), "date": datetime.date.today().isoformat()}
    runs = dict(runs or {})
    payload = {
        "results": {p: {str(s): {str(n): v for n, v in acc.items()} for s, acc in by_seed.items()}
                    for p, by_seed in results.items()},
        "train_lengths": [1, TRAIN_MAX_LEN], "steps": steps, "sinusoid_rms": sinusoid_rms,
        "runs": {p: runs.get(p, now) for p in results},
        **now,
    }
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def load_length_generalisation(path: Path | str | None = None) -> dict:
    """The saved results, with int keys again: ``{"results": {positional: {seed: {length:
    fraction}}}, "steps": ..., ...}`` (default: ``course_lib/results/length_generalisation.json``)."""
    path = RESULTS_PATH if path is None else Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"load_length_generalisation: no results at {path}; run `make ablation` to write them")
    payload = json.loads(path.read_text())
    payload["results"] = {p: {int(s): {int(n): v for n, v in acc.items()} for s, acc in by_seed.items()}
                          for p, by_seed in payload["results"].items()}
    return payload


def run_rope_lengths(seeds=(0, 1, 2), steps: int = 1500, per_length: int = 128) -> list[dict]:
    """The RoPE copy model of ``length_generalisation``, per seed, for storing per float path
    (``make length-rope``; lesson 11 loads these instead of training one live). Each run is a dict:
    ``seed``, ``steps`` and ``exact_match``, the fraction copied at lengths 1..40 (a list, length
    ``n`` at index ``n - 1``), rounded to 4 digits."""
    seeds = list(seeds)
    if not seeds:
        raise ValueError("run_rope_lengths: give at least one seed")
    task = copy_task()
    runs = []
    for seed in seeds:
        model = train_copy_model("rope", seed, steps, task)
        match = exact_match_by_length(model, task, range(1, TEST_MAX_LEN + 1), per_length, seed)
        runs.append({"seed": seed, "steps": steps,
                     "exact_match": [round(match[n], 4) for n in range(1, TEST_MAX_LEN + 1)]})
    return runs


def save_rope_lengths(runs: list[dict], folder: Path | str = RESULTS_DIR) -> Path:
    """Store ``runs`` in ``folder/rope_lengths.json`` under this CPU's float path (other paths
    kept)."""
    return save_runs("rope_lengths", runs, folder)


def load_rope_lengths(folder: Path | str = RESULTS_DIR) -> dict:
    """``folder/rope_lengths.json``: ``{"paths": {path: {"runs": [...], "torch": ..., ...}}}``."""
    return load_runs("rope_lengths", folder, make="length-rope")
