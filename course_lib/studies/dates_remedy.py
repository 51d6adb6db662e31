"""Lesson 08's remedy for a format never seen in training, measured over seeds and stored per float
path (``make dates-remedy``): the lesson loads the runs instead of training them live.

    runs = run_remedy(seeds=(0, 1, 2, 3, 4))   # 2 runs of train_dates per seed, ~50 s each (1 thread)
    save_remedy(runs)                          # course_lib/results/dates_remedy.json, this float path
    load_remedy()["paths"]["avx2"]["runs"]     # [{"seed": 0, "formats": 10, "year_first": 0.0, ...}]

For each seed, lesson 08's recipe (``train_dates``, unchanged) trains twice: on the ten training
formats, and on the eleven formats (the ten and the year-first ``numeric y/m/d``). Both are scored by
exact match on the same 2,000 held-out dates, written year first and in the ten formats (greedy
decoding's number, computed in one teacher-forced pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..data.dates import DATE_FORMATS, DatesCorpus
from ..training import dates_exact_match, train_dates
from .stored import RESULTS_DIR, load_runs, save_runs

__all__ = ["NEW_FORMAT", "run_remedy", "save_remedy", "load_remedy"]

NEW_FORMAT = "numeric y/m/d"  # the year-first form: never in lesson 08's training formats
TF = "teacher_forcing"  # greedy decoding's exact match, from one forward pass (dates_exact_match)


def run_remedy(seeds: Sequence[int] = (0, 1, 2, 3, 4), num_steps: int = 600) -> list[dict]:
    """Two ``train_dates`` runs per seed, on 10 and on 11 formats; each run as a dict: ``seed``,
    ``formats`` (10 or 11), ``year_first`` (exact match on the 2,000 held-out dates written year
    first), ``ten_formats`` (on the usual held-out set) and ``final_loss``, rounded to 4 digits."""
    if not seeds:
        raise ValueError("run_remedy: give at least one seed")
    if num_steps < 1:
        raise ValueError(f"run_remedy: num_steps must be at least 1, got {num_steps}")
    corpus = DatesCorpus()
    every_format = DatesCorpus(formats=list(DATE_FORMATS))
    year_first = [(p.source, p.target) for p in every_format.heldout_pairs(NEW_FORMAT)]
    ten_formats = [(p.source, p.target) for p in corpus.heldout]
    runs = []
    for seed in seeds:
        for trained_on in (corpus, every_format):
            run = train_dates(trained_on, num_steps=num_steps, cooldown=min(360, num_steps), seed=seed,
                              progress=False)
            scores = [round(dates_exact_match(run.model, every_format, pairs, TF), 4)
                      for pairs in (year_first, ten_formats)]
            runs.append({"seed": seed, "formats": len(trained_on.formats), "year_first": scores[0],
                         "ten_formats": scores[1], "final_loss": round(run.losses[-1], 4)})
    return runs


def save_remedy(runs: list[dict], folder: Path | str = RESULTS_DIR) -> Path:
    """Store ``runs`` in ``folder/dates_remedy.json`` under this CPU's float path (other paths
    kept)."""
    return save_runs("dates_remedy", runs, folder)


def load_remedy(folder: Path | str = RESULTS_DIR) -> dict:
    """``folder/dates_remedy.json``: ``{"paths": {path: {"runs": [...], ...}}}``."""
    return load_runs("dates_remedy", folder, make="dates-remedy")
