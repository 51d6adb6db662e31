"""The training runs that lessons load instead of repeating them live, stored per float path.

    python scripts/stored_runs.py adam-betas        (make adam-betas: lesson 06, Adam's beta1 0.7
                                                    against 0.9, seeds 0-4; about 2.5 min on AVX2)
    python scripts/stored_runs.py tokens-vs-chars   (make tokens-vs-chars: lesson 10, characters
                                                    against 1,000 BPE tokens, seeds 0-4; about 3 min)
    python scripts/stored_runs.py dates-remedy      (make dates-remedy: lesson 08, 10 formats against
                                                    11, seeds 0-4; about 9 min)
    python scripts/stored_runs.py length-rope       (make length-rope: lesson 11, the RoPE copy
                                                    model on lengths 1-40, seeds 0-4; about 5 min)
    ATEN_CPU_CAPABILITY=default python scripts/stored_runs.py adam-betas    (another float path)

One thread, as the lessons. Each writes ``course_lib/results/<name>.json`` under the float path it
ran on (``course_lib.studies.stored``); the other paths' runs stay in the file. Run it alone on a quiet
machine, on every path you want the lesson to show (this CPU's own, and ``ATEN_CPU_CAPABILITY=``
``default`` or ``avx2`` below it).
"""

from __future__ import annotations

import argparse
import time

import torch

from course_lib.studies.adam_betas import BETAS, first_steps, run_betas, save_betas
from course_lib.studies.dates_remedy import run_remedy, save_remedy
from course_lib.studies.extrapolation import TRAIN_MAX_LEN, run_rope_lengths, save_rope_lengths
from course_lib.studies.tokens_vs_chars import run_tokens_vs_chars, save_tokens_vs_chars


def adam_betas(seeds: list[int]) -> None:
    runs = run_betas(seeds)
    print(f"-> {save_betas(runs)}")
    for betas in BETAS:
        print(f"  betas {betas}: first 100% at steps {first_steps(runs, betas)} (seeds {seeds})")


def tokens_vs_chars(seeds: list[int]) -> None:
    runs = run_tokens_vs_chars(seeds)
    print(f"-> {save_tokens_vs_chars(runs)}")
    for run in runs:
        print(f"  seed {run['seed']}: characters {run['characters']:.3f}, BPE {run['bpe']:.3f} "
              "bits per character")


def dates_remedy(seeds: list[int]) -> None:
    runs = run_remedy(seeds)
    print(f"-> {save_remedy(runs)}")
    for run in runs:
        print(f"  seed {run['seed']}, {run['formats']} formats: year first {run['year_first']:.1%}, "
              f"the ten formats {run['ten_formats']:.1%}")


def length_rope(seeds: list[int]) -> None:
    runs = run_rope_lengths(seeds)
    print(f"-> {save_rope_lengths(runs)}")
    for run in runs:
        match = run["exact_match"]  # lengths 1..40
        print(f"  seed {run['seed']}: lowest at lengths 1-{TRAIN_MAX_LEN} {min(match[:TRAIN_MAX_LEN]):.1%}, "
              f"length 21 {match[20]:.1%}, highest from length 22 {max(match[21:]):.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["adam-betas", "tokens-vs-chars", "dates-remedy", "length-rope"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args()
    torch.set_num_threads(1)  # the lessons' setting: a run repeats exactly on this machine
    start = time.perf_counter()
    {"adam-betas": adam_betas, "tokens-vs-chars": tokens_vs_chars,
     "dates-remedy": dates_remedy, "length-rope": length_rope}[args.what](args.seeds)
    print(f"{args.what} on {torch.backends.cpu.get_cpu_capability()}: "
          f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
