"""Benchmark: lesson 08's recipe on the date-normalisation corpus, on the CPU.

    python benchmarks/dates.py                  (or: make benchmark)
    python benchmarks/dates.py --seeds 0 1 2 3 4

The corpus (`course_lib.data.dates.DatesCorpus`) writes dates from 1900 to 2099 in ten training formats
("3rd of March 2024", "Sonntag, 3. März 2024", "3/3/2024", ...) and asks for ISO 8601
("2024-03-03").
2,000 dates are held out: no held-out date appears in training in any format. The recipe is
`course_lib.training.train_dates` with its defaults (1+1 pre-LN layers, d_model 64, label smoothing
0.1, the Noam schedule with a linear cool-down over the last 360 steps, 600 batches of 128, fused
attention while training), with 2 threads by default (lesson 08 trains with 1).

Only the training steps are timed; the held-out exact match every 50 steps (one teacher-forced pass,
the same number as greedy decoding) is not. The final score is greedy decoding of the 2,000 held-out
dates. The last line is the worst of the seeds run, e.g.

    dates: 100.0% exact match on 2000 held-out dates after 21.8 s of training
"""

from __future__ import annotations

import argparse
import os
import platform

import torch

from course_lib import count_parameters
from course_lib.data.dates import DatesCorpus
from course_lib.training import dates_exact_match, train_dates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs, "
        f"{platform.processor() or platform.machine()}"
    )
    corpus = DatesCorpus()
    print(
        f"corpus: {len(corpus.formats)} training formats, {len(corpus.heldout)} held-out dates, "
        "source "
        f"vocabulary {len(corpus.src_vocab)}, target vocabulary {len(corpus.tgt_vocab)}"
    )
    results = []
    for seed in args.seeds:
        run = train_dates(corpus, seed=seed, eval_every=50, progress=False)
        if seed == args.seeds[0]:
            c = run.model.config
            print(
                f"model: {c.num_encoder_layers}+{c.num_decoder_layers} layers "
                f"({'pre' if c.norm_first else 'post'}-LN), d_model {c.d_model}, {c.num_heads} "
                f"heads, "
                f"d_ff {c.d_ff}, {count_parameters(run.model):,} parameters; {len(run.losses)} "
                f"steps"
            )
        curve = " ".join(f"{share:.1%}" for _, share in run.curve)
        greedy = dates_exact_match(run.model, corpus)
        print(f"seed {seed}: exact match every 50 steps: {curve}")
        print(
            f"seed {seed}: greedy {greedy:.2%} on {len(corpus.heldout)} held-out dates, "
            f"{run.train_seconds:.1f} s of training"
        )
        results.append((greedy, run.train_seconds))
    greedy, seconds = min(results, key=lambda r: (r[0], -r[1]))
    print(
        f"dates: {greedy:.1%} exact match on {len(corpus.heldout)} held-out dates after "
        f"{seconds:.1f} s "
        "of training"
    )


if __name__ == "__main__":
    main()
