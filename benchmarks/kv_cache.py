"""Benchmark: greedy decoding with and without the KV cache, on the paper's base model.

    python benchmarks/kv_cache.py          # about a minute on 2 cores
    python benchmarks/kv_cache.py --full   # also times batch 32 x 256 tokens without a cache

``TransformerConfig.paper_base()`` with random weights (eval mode, fused attention in both runs),
source length 32, batch 1 and 32, 64 and 256 new tokens (no end symbol, so every run generates
them all). "Recomputing" is ``greedy_decode(..., use_cache=False)``: at step t the decoder runs
on all t positions again (and recomputes the cross-attention keys and values of the memory).

Why the two batch sizes differ: at batch 1 one decoder step reads ~176 MB of weights for a few
MFLOPs, so it is bound by memory bandwidth and recomputing a short prefix costs little extra; at
batch 32 the step is bound by compute, which grows with the prefix. The per-step table shows it.
Batch 32 x 256 without a cache takes minutes; by default it is estimated from timed single steps
at a few prefix lengths (time per step is close to linear in the prefix length), and says so.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from course_lib import Transformer, TransformerConfig, greedy_decode, set_fused_attention

SRC_LEN, START_ID = 32, 1


def _seconds(fn, repeats: int = 1) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def step_ms(
    model: Transformer, batch: int, prefix: int, use_cache: bool, repeats: int = 3
) -> float:
    """Time of ONE decoder step that produces the token after a prefix of ``prefix`` positions."""
    src = torch.randint(3, model.config.src_vocab_size, (batch, SRC_LEN))
    memory = model.encode(src)
    tgt = torch.randint(3, model.config.tgt_vocab_size, (batch, prefix))
    if use_cache:  # fill the cache with prefix-1 positions, then time the step for the last one
        cache = model.start_cache(memory, None)  # the sources have no padding
        for t in range(prefix - 1):
            model.decode_step(tgt[:, t], cache)

        def one_step() -> None:
            model.decode_step(tgt[:, -1], cache)
            for layer in cache.layers:  # undo the append, so every repeat sees the same length
                layer.self_k, layer.self_v = layer.self_k[:, :, :-1], layer.self_v[:, :, :-1]
            cache.tgt_keep = cache.tgt_keep[:, :-1]

    else:

        def one_step() -> None:
            model.generator(model.decode(tgt, memory, None)[:, -1])

    one_step()  # warm-up
    return 1000 * _seconds(one_step, repeats)


@torch.no_grad()
def decode_seconds(model: Transformer, batch: int, new_tokens: int, use_cache: bool) -> float:
    src = torch.randint(3, model.config.src_vocab_size, (batch, SRC_LEN))
    greedy_decode(model, src, 2, START_ID, use_cache=use_cache)  # warm-up
    return _seconds(lambda: greedy_decode(model, src, new_tokens, START_ID, use_cache=use_cache))


def estimated_recompute_seconds(model: Transformer, batch: int, new_tokens: int) -> float:
    """Sum over steps of the time per step, interpolated linearly between timed prefix lengths."""
    points = sorted(
        {1, new_tokens // 8, new_tokens // 4, new_tokens // 2, 3 * new_tokens // 4, new_tokens}
    )
    ms = [step_ms(model, batch, p, use_cache=False, repeats=1) for p in points]
    total = 0.0
    for t in range(1, new_tokens + 1):
        i = next(j for j, p in enumerate(points) if p >= t)
        if points[i] == t or i == 0:
            total += ms[i]
        else:
            w = (t - points[i - 1]) / (points[i] - points[i - 1])
            total += (1 - w) * ms[i - 1] + w * ms[i]
    return total / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--full", action="store_true", help="time batch 32 x 256 without a cache in full"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Transformer(TransformerConfig.paper_base()).eval()
    model = model.requires_grad_(False)
    set_fused_attention(model, True)  # for both runs: no attention weights are looked at here
    print(
        f"paper_base (random weights), source length {SRC_LEN}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )

    print(
        "\none decoder step (ms): recompute = all positions again, cache = the newest position only"
    )
    print(
        f"{'batch':>5} | {'recompute, 1 pos':>16} | {'recompute, 64 pos':>17} | "
        f"{'cache, at pos 64':>16}"
    )
    for batch in (1, 32):
        print(
            f"{batch:>5} | {step_ms(model, batch, 1, False):>16.1f} | "
            f"{step_ms(model, batch, 64, False):>17.1f} | "
            f"{step_ms(model, batch, 64, True):>16.1f}"
        )

    print("\ngreedy decoding, whole run (s)")
    print(
        f"{'batch':>5} | {'new tokens':>10} | {'recompute':>10} | {'KV cache':>9} | {'speed-up':>8}"
    )
    ratios = {}
    for batch in (1, 32):
        for new_tokens in (64, 256):
            cached = decode_seconds(model, batch, new_tokens, use_cache=True)
            if batch == 32 and new_tokens == 256 and not args.full:
                recompute = estimated_recompute_seconds(model, batch, new_tokens)
                note = "  (recompute estimated from 6 timed steps; --full times it)"
            else:
                recompute = decode_seconds(model, batch, new_tokens, use_cache=False)
                note = ""
            ratios[batch, new_tokens] = recompute / cached
            print(
                f"{batch:>5} | {new_tokens:>10} | {recompute:>10.2f} | {cached:>9.2f} | "
                f"{ratios[batch, new_tokens]:>7.1f}x{note}"
            )
    print()
    for batch, new_tokens in ((1, 64), (1, 256), (32, 256), (32, 64)):  # the headline figure last
        print(
            f"kv cache: {ratios[batch, new_tokens]:.1f}x faster than recomputing for {new_tokens} "
            "new tokens "
            f"(batch {batch})"
        )


if __name__ == "__main__":
    main()
