"""Lesson 10's measured comparison: lesson 09's GPT on characters and on 1,000 BPE tokens, at equal
compute, several seeds (``make tokens-vs-chars`` stores them per float path; the lesson trains seed 0
live and loads the rest).

    runs = run_tokens_vs_chars(seeds=(0, 1, 2, 3, 4))    # 2 runs per seed, ~10-15 s each (1 thread)
    save_tokens_vs_chars(runs)                           # course_lib/results/tokens_vs_chars.json
    load_tokens_vs_chars()["paths"]["avx2"]["runs"]      # [{"seed": 0, "characters": 3.25, ...}, ...]

The BPE vocabulary is the first 744 merges that ``BPETokenizer.train`` learns from the training plays
(256 bytes + 744 = 1,000 tokens). Both models are ``COURSE`` with batches of 16 and a warm-up of 30;
the character model trains ``CHAR_STEPS`` steps, the BPE model as many steps as cost the same
multiply-adds (``equal_compute_steps``: its output layer has 1,000 rows instead of 83). The loss is
compared per character of the validation plays: ``bits_per_char(loss / val_chars_per_token)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..data.shakespeare import ShakespeareCorpus
from ..lm_training import COURSE, bits_per_char, train_lm
from ..tokenization import BPETokenizer
from .stored import RESULTS_DIR, load_runs, save_runs

__all__ = ["CHAR_STEPS", "NUM_MERGES", "multiply_adds_per_token", "equal_compute_steps",
           "run_tokens_vs_chars", "save_tokens_vs_chars", "load_tokens_vs_chars"]

CHAR_STEPS = 300
NUM_MERGES = 744  # 256 bytes + 744 merges = 1,000 tokens
VAL_WINDOWS = 256


def multiply_adds_per_token(vocab_size: int, d: int = 128, layers: int = 1, positions: int = 64) -> int:
    """Per token: projections and feed-forward (12 d² per layer), attention scores and mixing (2 T d
    per layer), the output layer (d V)."""
    return layers * (12 * d * d + 2 * positions * d) + d * vocab_size


def equal_compute_steps(char_steps: int, char_vocab: int = 83, bpe_vocab: int = 1000) -> int:
    """The BPE model's steps that cost what ``char_steps`` character steps cost."""
    return round(char_steps * multiply_adds_per_token(char_vocab) / multiply_adds_per_token(bpe_vocab))


def run_tokens_vs_chars(seeds: Sequence[int] = (0, 1, 2, 3, 4), char_steps: int = CHAR_STEPS,
                        warmup: int = 30, corpus: ShakespeareCorpus | None = None) -> list[dict]:
    """Per seed: ``{"seed", "characters", "bpe", "char_steps", "bpe_steps"}``, the two models' held-out
    bits per character. ``warmup`` (30, the stored runs') is there for tiny budgets in tests."""
    if not seeds:
        raise ValueError("run_tokens_vs_chars: give at least one seed")
    corpus = corpus if corpus is not None else ShakespeareCorpus()
    merges = list(BPETokenizer.train(corpus.train_text, 2000).merges.items())  # as lesson 10
    bpe_corpus = ShakespeareCorpus(tokenizer=BPETokenizer(dict(merges[:NUM_MERGES])))
    bpe_steps = equal_compute_steps(char_steps, len(corpus.vocab), 256 + NUM_MERGES)
    runs = []
    for seed in seeds:
        run = {"seed": seed, "char_steps": char_steps, "bpe_steps": bpe_steps}
        for name, data, steps in (("characters", corpus, char_steps), ("bpe", bpe_corpus, bpe_steps)):
            recipe = replace(COURSE, num_steps=steps, warmup=warmup, batch_size=16)
            lm = train_lm(data, recipe, seed=seed, val_windows=VAL_WINDOWS, progress=False)
            run[name] = round(bits_per_char(lm.curve[-1][2] / data.val_chars_per_token), 5)
        runs.append(run)
    return runs


def save_tokens_vs_chars(runs: list[dict], folder: Path | str = RESULTS_DIR) -> Path:
    """Store ``runs`` under this CPU's float path (``course_lib.studies.stored``; other paths are kept)."""
    return save_runs("tokens_vs_chars", runs, folder)


def load_tokens_vs_chars(folder: Path | str = RESULTS_DIR) -> dict:
    """The runs ``make tokens-vs-chars`` stored: ``{"paths": {path: {"runs": [...], ...}}}``."""
    return load_runs("tokens_vs_chars", folder, make="tokens-vs-chars")
