"""What each change of the Llama-style block buys, measured (lesson 11).

Lesson 09's Shakespeare setup (``ShakespeareCorpus()``, the ``COURSE`` recipe of ``lm_training``,
the same steps, batches and seeds for every row). The rows are CUMULATIVE: each adds one change to
the row above (not to GPT-2's block), so what a change buys is its row minus the row above:

    GPT-2's block -> + RMSNorm -> + RoPE -> + SwiGLU -> + GQA (4 heads, 2 KV heads) -> - biases

The last row is the Llama-style block, except that the embeddings stay tied in every row (Llama
unties them), so that only the listed change differs from one row to the next. Every row has
about the parameter count of GPT-2's row: ``matched_d_ff`` picks the feed-forward width that comes
closest. Per row: held-out bits per character (``train_lm``'s final evaluation on fixed windows of
the validation plays) for each seed, and the median time of a training step (evaluation excluded).

``scripts/ablation.py`` (``make ablation``) runs the full table and writes
``course_lib/results/ablation.json`` and ``ablation.md``; ``load_ablation()`` reads them back.
"""

from __future__ import annotations

import datetime
import json
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..data.shakespeare import ShakespeareCorpus
from ..gpt import GPT, GPTConfig
from ..lm_training import COURSE, LMRecipe, bits_per_char, train_lm
from ..model import count_parameters
from .stored import read_results

__all__ = ["ROWS", "BlockRecipe", "row_config", "matched_d_ff", "run_ablation", "ablation_table",
           "save_ablation", "load_ablation", "RESULTS_DIR", "VAL_WINDOWS"]

RESULTS_DIR = Path(__file__).parent.parent / "results"
VAL_WINDOWS = 1024  # validation windows of 64 characters, the same for every row and seed

# (name, the changes from GPT-2's block so far): each row adds one change to the row above.
ROWS: list[tuple[str, dict]] = [
    ("GPT-2 block", {}),
    ("+ RMSNorm", {"norm": "rmsnorm"}),
    ("+ RoPE", {"norm": "rmsnorm", "positional": "rope"}),
    ("+ SwiGLU", {"norm": "rmsnorm", "positional": "rope", "activation": "swiglu"}),
    ("+ GQA (2 KV heads)", {"norm": "rmsnorm", "positional": "rope", "activation": "swiglu",
                            "num_kv_heads": 2}),
    ("- biases (Llama-style, tied)", {"norm": "rmsnorm", "positional": "rope",
                                      "activation": "swiglu", "num_kv_heads": 2, "bias": False}),
]
_ALLOWED = {"norm", "positional", "activation", "num_kv_heads", "bias", "d_ff"}


def row_config(recipe: LMRecipe, vocab_size: int, changes: dict) -> GPTConfig:
    """The recipe's GPT-2 config with ``changes`` applied (tied embeddings in every row)."""
    unknown = set(changes) - _ALLOWED
    if unknown:
        raise ValueError(f"row_config: unknown change(s) {sorted(unknown)}; allowed: {sorted(_ALLOWED)}")
    return replace(recipe.config(vocab_size), **changes, tie_embeddings=True)


def matched_d_ff(config: GPTConfig, target: int) -> int:
    """The ``d_ff`` >= 1 whose ``GPT(config)`` has the parameter count closest to ``target``
    (the smaller one on a tie). The count grows linearly with ``d_ff``: two builds give the line."""
    if isinstance(target, bool) or not isinstance(target, int) or target < 1:
        raise ValueError(f"matched_d_ff: target must be an int >= 1, got {target!r}")

    def count(d_ff: int) -> int:
        return count_parameters(GPT(replace(config, d_ff=d_ff)))

    base, per_unit = count(1), count(2) - count(1)  # parameters at d_ff = 1, per extra unit
    if target < base:
        raise ValueError(f"matched_d_ff: even d_ff=1 gives {base:,} parameters, more than the target "
                         f"{target:,}")
    guess = max(1, round((target - base) / per_unit) + 1)
    return min((d for d in (guess - 1, guess, guess + 1) if d >= 1),
               key=lambda d: (abs(count(d) - target), d))


@dataclass(frozen=True)
class BlockRecipe(LMRecipe):
    """An ``LMRecipe`` whose model is ``row_config(self, vocab_size, changes)``: ``train_lm``
    trains it exactly as it trains lesson 09's GPT. ``changes``: a tuple of ``(field, value)``."""

    changes: tuple = ()

    def config(self, vocab_size: int) -> GPTConfig:
        base = LMRecipe(**{f: getattr(self, f) for f in LMRecipe.__dataclass_fields__})
        return row_config(base, vocab_size, dict(self.changes))


def run_ablation(
    corpus: ShakespeareCorpus,
    rows: list[tuple[str, dict]] = ROWS,
    seeds=(0, 1, 2),
    recipe: LMRecipe = COURSE,
    val_windows: int = VAL_WINDOWS,
    progress: bool = True,
) -> dict:
    """Train every row with every seed; returns the results as ``save_ablation`` writes them.

    The first row sets the parameter target; every other row gets ``matched_d_ff`` (unless its
    changes fix ``d_ff``). ``ms_per_step``: per seed, the median of the times between consecutive
    training steps (the evaluation runs after the last step, off the clock).
    """
    seeds = list(seeds)
    if not rows or not seeds:
        raise ValueError("run_ablation: need at least one row and one seed")
    vocab_size = len(corpus.vocab)
    target = count_parameters(GPT(row_config(recipe, vocab_size, rows[0][1])))
    out_rows = []
    for name, changes in rows:
        changes = dict(changes)
        config = row_config(recipe, vocab_size, changes)
        if "d_ff" not in changes:
            changes["d_ff"] = matched_d_ff(config, target)
        config = row_config(recipe, vocab_size, changes)
        row = {"name": name, "changes": changes, "d_ff": config.d_ff,
               "params": count_parameters(GPT(config)), "bpc": [], "ms_per_step": []}
        for seed in seeds:
            stamps: list[float] = []
            block = BlockRecipe(**asdict(recipe), changes=tuple(sorted(changes.items())))
            run = train_lm(corpus, block, seed=seed, val_windows=val_windows, progress=False,
                           callback=lambda step, m: stamps.append(time.perf_counter()))
            steps_ms = [1000 * (b - a) for a, b in zip(stamps, stamps[1:])]
            row["bpc"].append(bits_per_char(run.curve[-1][2]))
            row["ms_per_step"].append(statistics.median(steps_ms))
            if progress:
                print(f"{name:<30} seed {seed}: {row['bpc'][-1]:.4f} bits/char, "
                      f"{row['ms_per_step'][-1]:.1f} ms/step", flush=True)
        row["bpc_mean"] = statistics.fmean(row["bpc"])
        row["bpc_min"], row["bpc_max"] = min(row["bpc"]), max(row["bpc"])
        row["ms_per_step_median"] = statistics.median(row["ms_per_step"])
        out_rows.append(row)
    return {
        "rows": out_rows,
        "seeds": seeds,
        "recipe": asdict(recipe),
        "val_windows": val_windows,
        "tie_embeddings": True,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "date": datetime.date.today().isoformat(),
    }


def ablation_table(results: dict) -> str:
    """The results as a markdown table (one line per row)."""
    if not results.get("rows"):
        raise ValueError("ablation_table: the results have no rows")
    lines = [
        f"| block | d_ff | parameters | held-out bits/char, mean (min..max) over {len(results['seeds'])}"
        " seeds | ms per training step |",
        "|---|---:|---:|---|---:|",
    ]
    for r in results["rows"]:
        lines.append(f"| {r['name']} | {r['d_ff']} | {r['params']:,} | {r['bpc_mean']:.3f} "
                     f"({r['bpc_min']:.3f}..{r['bpc_max']:.3f}) | {r['ms_per_step_median']:.1f} |")
    return "\n".join(lines)


def save_ablation(results: dict, folder: Path | str = RESULTS_DIR) -> tuple[Path, Path]:
    """Write ``ablation.json`` and ``ablation.md`` into ``folder``; returns both paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path = folder / "ablation.json", folder / "ablation.md"
    json_path.write_text(json.dumps(results, indent=1) + "\n")
    r = results
    md_path.write_text(
        "# Lesson 11: what each change of the block buys (written by `make ablation`)\n\n"
        f"Shakespeare's characters, the COURSE recipe ({r['recipe']['num_layers']} layer, d_model "
        f"{r['recipe']['d_model']}, {r['recipe']['num_steps']} steps of {r['recipe']['batch_size']} x "
        f"{r['recipe']['block_size']}), seeds {r['seeds']}, embeddings tied in every row; "
        f"{r['val_windows']} validation windows. torch {r['torch']}, {r['cpu_capability']}, "
        f"{r['threads']} thread(s), {r['date']}.\n\n" + ablation_table(r) + "\n")
    return json_path, md_path


def load_ablation(path: Path | str | None = None) -> dict:
    """The results ``make ablation`` wrote (default: ``course_lib/results/ablation.json``)."""
    path = RESULTS_DIR / "ablation.json" if path is None else Path(path)
    return read_results(path, "rows", "ablation", "load_ablation")
