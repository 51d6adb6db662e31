"""Benchmark: lesson 13's FlashAttention (course_lib.flash) against lesson 01's attention and SDPA, and
the paged KV cache (course_lib.paged) on a mixed batch.

    python benchmarks/flash.py             # L0 = 16k; about 3 min on 2 cores (the naive pass is 2 of them)
    python benchmarks/flash.py --L0 8192   # a smaller L0

Peak memory of one forward and one backward pass (one head of 64, float32, no mask, one thread), each
version in a fresh process (``scripts/flash_memory.py``'s ``measure_one``: the process's peak resident
memory after the passes minus before them); the tiled pass also at L0 / 2, to show that its memory
grows linearly. Times are the same runs' forward and backward, against SDPA's. The naive pass needs
about 12 L0² bytes (3 GiB at 16k); it is skipped, and says so, when the machine has less free.

The paged cache: lesson 09's Llama-style GPT (2 layers, 2 KV heads) generates 8 requests of mixed
lengths (6 to 60 tokens) into pages of 16 positions; a contiguous cache per request must reserve
``max_len`` = 64 positions. Bytes of the blocks held against bytes reserved.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch

from course_lib.gpt import GPT, GPTConfig
from course_lib.paged import PagedKVCache, contiguous_cache_bytes, generate_paged

ROOT = Path(__file__).resolve().parent.parent
MIXED_LENGTHS = [6, 60, 13, 31, 9, 45, 22, 17]


def _measurements():
    spec = importlib.util.spec_from_file_location("flash_memory", ROOT / "scripts" / "flash_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def paged_saving(lengths: list[int] = MIXED_LENGTHS, block_size: int = 16) -> tuple[int, int, int]:
    """(bytes a contiguous max_len cache per request reserves, bytes the pages hold, bytes written)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.llama_style(vocab_size=83, max_len=64, d_model=64, num_heads=4,
                                      num_kv_heads=2, num_layers=2)).eval()
    pages = PagedKVCache.for_model(model, num_blocks=64, block_size=block_size)
    for seq, length in enumerate(lengths):  # a 4-token prompt, then length - 4 + 1 new tokens
        prompt = torch.randint(0, 83, (1, 4), generator=torch.Generator().manual_seed(seq))
        out = generate_paged(model, prompt, length - 3, pages, [seq], greedy=True)
        assert torch.equal(out, model.generate(prompt, length - 3, greedy=True))
        assert pages.length(seq) == length
    attn = model.blocks.layers[0].self_attn
    layers = len(model.blocks.layers)
    reserved = contiguous_cache_bytes(len(lengths), model.config.max_len, layers, attn.num_kv_heads,
                                      attn.head_dim)
    written = contiguous_cache_bytes(1, sum(lengths), layers, attn.num_kv_heads, attn.head_dim)
    return reserved, pages.bytes_in_use(), written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--L0", type=int, default=16384)
    args = parser.parse_args()
    measure = _measurements()
    L0 = args.L0
    runs = {}
    for version, L in (("tiled", L0 // 2), ("tiled", L0), ("sdpa", L0), ("naive", L0)):
        if version == "naive" and 13 * L * L + 2**30 > measure.available_bytes():
            print(f"flash: the naive pass at L={L} needs about {13 * L * L / 2**30:.1f} GiB; only "
                  f"{measure.available_bytes() / 2**30:.1f} GiB free now: not run")
            continue
        runs[version, L] = measure.run_fresh(version, L)
    tiled, sdpa = runs["tiled", L0], runs["sdpa", L0]
    mb = 1e6  # the line says MB: 10^6 bytes
    forward = tiled["forward_s"] / sdpa["forward_s"]
    backward = tiled["backward_s"] / sdpa["backward_s"]
    if ("naive", L0) in runs:
        naive = runs["naive", L0]["peak_bytes"]
        print(f"flash: L={L0} peak memory tiled {tiled['peak_bytes'] / mb:.0f} MB vs naive "
              f"{naive / mb:.0f} MB ({naive / tiled['peak_bytes']:.0f}× less); forward {forward:.1f}× "
              f"and backward {backward:.1f}× SDPA's time")
    else:
        print(f"flash: L={L0} peak memory tiled {tiled['peak_bytes'] / mb:.0f} MB (naive not run); "
              f"forward {forward:.1f}× and backward {backward:.1f}× SDPA's time")
    reserved, held, written = paged_saving()
    print(f"paged KV cache: {len(MIXED_LENGTHS)} requests of {min(MIXED_LENGTHS)}-{max(MIXED_LENGTHS)} "
          f"tokens hold {held / 1024:.0f} KiB in pages of 16 vs {reserved / 1024:.0f} KiB contiguous at "
          f"max_len 64 ({reserved / held:.1f}× less; {1 - written / held:.0%} vs "
          f"{1 - written / reserved:.0%} never written)")
    half = runs["tiled", L0 // 2]["peak_bytes"]
    print(f"flash: tiled peak memory L={L0 // 2} -> {L0}: ×{tiled['peak_bytes'] / half:.2f} (linear: ×2)")


if __name__ == "__main__":
    main()
