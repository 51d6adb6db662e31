"""Lesson 06's measured comparison of Adam's beta1: the recipe's 0.7 against the paper's 0.9.

    runs = run_betas(seeds=(0, 1, 2, 3, 4))       # 10 copy-task runs, about 12 s each on 1 thread
    save_betas(runs)                              # course_lib/results/adam_betas.json, under this
                                                  # CPU's float path (course_lib.studies.stored)
    load_betas()["paths"]["avx2"]["runs"]         # what the lesson reads

Each run is ``train_copy_task`` (lesson 06's recipe) with one setting of ``betas`` and one seed; it
records the held-out exact match every 25 steps, the loss of every step and the size of every update
|Δθ|. The file keeps the runs of each float path it was written on (``course_lib.studies.stored``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from ..data.copy_task import CopyTask
from ..training import ExactMatchTracker, copy_task_model, train_copy_task
from .stored import RESULTS_DIR, load_runs, save_runs

__all__ = ["BETAS", "UpdateSizes", "run_betas", "save_betas", "load_betas", "first_steps"]

BETAS = ((0.7, 0.99), (0.9, 0.99))  # the recipe's, then the paper's beta1 (the recipe's beta2)
EVERY = 25  # steps between two exact-match evaluations


class UpdateSizes:
    """A ``train`` callback: the norm of every update, |θ_after − θ_before| over all parameters;
    then it calls ``then`` (e.g. an ``ExactMatchTracker``)."""

    def __init__(self, model: torch.nn.Module, *then) -> None:
        self.then, self.sizes = then, []
        self.previous = self._flat(model)

    @staticmethod
    def _flat(model: torch.nn.Module) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])  # (num_params,)

    def __call__(self, step: int, model: torch.nn.Module) -> None:
        flat = self._flat(model)
        self.sizes.append((flat - self.previous).norm().item())
        self.previous = flat
        for callback in self.then:
            callback(step, model)


def run_betas(seeds: Sequence[int] = (0, 1, 2, 3, 4), betas: Sequence[tuple[float, float]] = BETAS,
              num_steps: int = 350, cooldown: int = 270) -> list[dict]:
    """One ``train_copy_task`` run per (betas, seed); each as a dict: ``betas``, ``seed``,
    ``first_perfect`` (the first evaluated step at 100%, or None), ``steps`` and ``scores`` (exact
    match every 25 steps), ``losses`` and ``update_sizes`` (one per step, 4 significant digits)."""
    if not seeds or not betas:
        raise ValueError("run_betas: give at least one seed and one setting of betas")
    task = CopyTask()
    runs = []
    for b in betas:
        for seed in seeds:
            tracker = ExactMatchTracker(task, every=EVERY)
            sizes = UpdateSizes(copy_task_model(seed), tracker)  # the weights the run starts from
            _, losses = train_copy_task(task=task, num_steps=num_steps, cooldown=cooldown,
                                        betas=tuple(b), seed=seed, progress=False, callback=sizes)
            runs.append({"betas": list(b), "seed": seed, "first_perfect": tracker.first_perfect(),
                         "steps": tracker.steps, "scores": tracker.scores,
                         "losses": [float(f"{v:.4g}") for v in losses],
                         "update_sizes": [float(f"{v:.4g}") for v in sizes.sizes]})
    return runs


def first_steps(runs: list[dict], betas: Sequence[float]) -> list[int | None]:
    """The first step at 100% of each run with these ``betas``, in seed order."""
    chosen = sorted((r for r in runs if tuple(r["betas"]) == tuple(betas)), key=lambda r: r["seed"])
    return [r["first_perfect"] for r in chosen]


def save_betas(runs: list[dict], folder: Path | str = RESULTS_DIR) -> Path:
    """Store ``runs`` in ``folder/adam_betas.json`` under this CPU's float path (other paths kept)."""
    return save_runs("adam_betas", runs, folder)


def load_betas(folder: Path | str = RESULTS_DIR) -> dict:
    """The runs ``make adam-betas`` stored: ``{"paths": {path: {"runs": [...], ...}}}``."""
    return load_runs("adam_betas", folder, make="adam-betas")
