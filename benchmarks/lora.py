"""Benchmark: LoRA (lesson 15) against full fine-tuning of lesson 09's GPT on Shakespeare's poems.

    python benchmarks/lora.py          (or: make benchmark)

1. The base: lesson 09's GPT trained on the 33 training plays with the course's recipe
   (``course_lib.lm_training.COURSE``: 1 layer, d_model 128, 700 steps of 32 windows of 64
   characters, seed 0), inside this script (about 20 s on 2 quiet cores).
2. The new domain: the 5 poems the plays corpus leaves out (``POEMS``), split by poem, not by line:
   the Sonnets cut into their 154 sonnets, the others whole; sonnets 10, 20, ..., 150 and "A Lover's
   Complaint" are held out for validation (about 11% of the characters). Lines of asterisks (a gap in
   "The Passionate Pilgrim", the only character the plays never use) are dropped.
3. Two fine-tunings from the same base, the same ``--steps`` steps on the same batches (one seeded
   generator each, same seed), the same schedule (10% warm-up, cosine to 0.1 of the peak), AdamW
   with betas (0.9, 0.99) and weight decay 0.1 on the matrices, gradients clipped at 1.0, and the
   same fixed validation windows: **full** fine-tuning (every parameter, peak lr 3e-3) and **LoRA**
   (``course_lib.lora.add_lora``, rank ``--r``, alpha = 2r, on q, k, v, out_proj, linear1 and
   linear2; only A and B train; peak lr 1e-2). The rates: the best of {3e-4, 1e-3, 3e-3} for full
   fine-tuning and of {3e-3, 1e-2, 3e-2} for LoRA, by the poems' validation loss, seed 0, 300 steps.

Reported: the share of parameters LoRA trains, the poems' validation loss of each after the same
steps, the plays' validation loss before and after (forgetting), the bytes of AdamW's state
(``exp_avg``, ``exp_avg_sq``, ``step``) after training, and the median time of a training step
(forward, backward, clip, update; LoRA's backward still runs through the whole network, only the
weight gradients of the frozen matrices are skipped). Losses are seeded and the same on every run
of a float path; step times depend on the machine and its load. Target (issue 51): LoRA trains at
most 5% of the parameters, reaches a poems loss within 10% of full fine-tuning's at equal steps,
with an optimizer state at least 10x smaller. The last line, e.g. (2026-12-07, ``--threads 1``, on a
machine shared with six other jobs, load average 13 on 2 cores: the losses hold, the step-time ratio
is only indicative)

    lora: r=4 trains 4.2% of the parameters; poems loss 1.76 vs full fine-tuning 1.70 after 300 steps; optimizer state 23.6× smaller; step time 1.03× full

On this small model (217,344 parameters, 1 layer) a LoRA step costs about as much as a full one: the
backward pass still goes through every layer, and what it saves (the weight gradients of the frozen
matrices, AdamW's update of 217k numbers) is about what the extra A and B matmuls cost.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import re
import statistics
import tarfile
import configparser
import io
import time

import torch
from torch import nn

from course_lib.attention import set_fused_attention
from course_lib.data.shakespeare import (POEMS, TEXTS, Play, ShakespeareCorpus, shakespeare_archive,
                                         strip_gutenberg)
from course_lib.gpt import GPT, lm_loss
from course_lib.lm_training import COURSE, evaluate_lm, lm_optimizer, train_lm, warmup_cosine
from course_lib.lora import add_lora, lora_parameters, trainable_parameters

ROMAN = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100}
VALIDATION_POEMS = ("A Lover's Complaint",) + tuple(f"Sonnet {n}" for n in range(10, 155, 10))
LR = {"full": 3e-3, "lora": 1e-2}


def roman(numeral: str) -> int:
    """``"CXXVIII"`` -> 128."""
    values = [ROMAN[c] for c in numeral]
    return sum(-v if i + 1 < len(values) and values[i + 1] > v else v for i, v in enumerate(values))


def read_poems() -> list[Play]:
    """The poems as ``Play``s, one per poem: each of the 154 sonnets (``"Sonnet 18"``) and the
    other four whole; lines made only of asterisks and spaces dropped."""
    with tarfile.open(shakespeare_archive(), "r:gz") as tar:
        meta = configparser.ConfigParser(interpolation=None)
        meta.read_file(io.StringIO(tar.extractfile(TEXTS + "metadata.txt").read().decode("utf-8")))
        texts = {meta[k]["title"]: strip_gutenberg(tar.extractfile(TEXTS + k + ".txt").read().decode("utf-8"))
                 for k in meta.sections() if meta[k]["title"] in POEMS}
    texts = {t: re.sub(r"(?m)^[ *]*\*[ *]*\n", "", x) for t, x in texts.items()}
    poems = [Play(t, t, x) for t, x in texts.items() if t != "Sonnets"]
    parts = re.split(r"\n[ \t]*\n([IVXLC]+)[ \t]*\n", texts["Sonnets"])  # title, I, text, II, text...
    numbers = [roman(n) for n in parts[1::2]]
    if len(numbers) != 154 or sum(n != i + 1 for i, n in enumerate(numbers)) > 1:
        raise ValueError("read_poems: the Sonnets did not split into sonnets I-CLIV")
    # numbered by position: the Gutenberg text heads sonnet 128 "CXXXIII"
    sonnets = [Play(f"Sonnet {i + 1}", f"sonnet_{i + 1}", x.strip("\n") + "\n")
               for i, x in enumerate(parts[2::2])]
    return sorted(poems + sonnets, key=lambda p: p.title)


def finetune(model: GPT, corpus: ShakespeareCorpus, params: list[nn.Parameter], lr: float, steps: int,
             seed: int, batch_size: int, block_size: int) -> tuple[torch.optim.Optimizer, list[float]]:
    """``steps`` AdamW steps on ``params``; returns the optimizer and each step's seconds."""
    optimizer = lm_optimizer(model, lr, COURSE.betas, COURSE.weight_decay)
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {id(p) for p in params}
    warmup = max(1, steps // 10)
    gen = torch.Generator().manual_seed(seed)
    set_fused_attention(model, True)
    model.train()
    seconds = []
    for step in range(steps):
        x, y = corpus.train_batch(batch_size, block_size, gen)
        start = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr * warmup_cosine(step, warmup, steps, 0.1)
        loss = lm_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    set_fused_attention(model, False)
    return optimizer, seconds


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The bytes of every tensor in the optimizer's state (AdamW: exp_avg, exp_avg_sq, step)."""
    return sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
               if isinstance(t, torch.Tensor))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--r", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr-full", type=float, default=LR["full"])
    parser.add_argument("--lr-lora", type=float, default=LR["lora"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs, "
          f"{platform.processor() or platform.machine()}, {torch.backends.cpu.get_cpu_capability()}")
    plays = ShakespeareCorpus()
    poems = ShakespeareCorpus(VALIDATION_POEMS, plays=read_poems(), tokenizer=plays.vocab)
    print(f"poems: {len(poems.train_plays)} poems, {len(poems.train_text):,} characters for training; "
          f"{len(poems.val_plays)} held out, {len(poems.val_text):,} characters (A Lover's Complaint, "
          "sonnets 10, 20, ..., 150)")
    base = train_lm(plays, COURSE, seed=args.seed, progress=False).model
    print(f"base: the course recipe on the plays, {COURSE.num_steps} steps")
    block, batch = COURSE.block_size, COURSE.batch_size
    val_poems = poems.fixed_batches("val", 512, block)
    val_plays = plays.fixed_batches("val", 512, block)
    print(f"base: poems loss {evaluate_lm(base, val_poems):.3f}, plays loss {evaluate_lm(base, val_plays):.3f}")
    results = {}
    for kind in ("full", "lora"):
        model = copy.deepcopy(base)
        torch.manual_seed(args.seed)  # LoRA's A
        if kind == "lora":
            add_lora(model, args.r, 2 * args.r)
            params = lora_parameters(model)
        else:
            params = [p for p in model.parameters() if p.requires_grad]
        lr = args.lr_full if kind == "full" else args.lr_lora
        optimizer, seconds = finetune(model, poems, params, lr, args.steps, args.seed, batch, block)
        results[kind] = dict(params=trainable_parameters(model), poems=evaluate_lm(model, val_poems),
                             plays=evaluate_lm(model, val_plays), state=state_bytes(optimizer),
                             step=statistics.median(seconds))
        r = results[kind]
        print(f"{kind}: lr {lr:g}, {r['params']:,} trainable parameters, AdamW state {r['state']:,} bytes; "
              f"after {args.steps} steps poems loss {r['poems']:.3f}, plays loss {r['plays']:.3f}; "
              f"median step {1000 * r['step']:.1f} ms")
    full, lora = results["full"], results["lora"]
    total = sum(p.numel() for p in base.parameters())
    print(f"lora: r={args.r} trains {100 * lora['params'] / total:.1f}% of the parameters; poems loss "
          f"{lora['poems']:.2f} vs full fine-tuning {full['poems']:.2f} after {args.steps} steps; "
          f"optimizer state {full['state'] / lora['state']:.1f}× smaller; step time "
          f"{lora['step'] / full['step']:.2f}× full")


if __name__ == "__main__":
    main()
