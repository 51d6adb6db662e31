"""Benchmark: course_lib's readable MultiHeadAttention against PyTorch's fused implementation.

    python benchmarks/attention.py

For a few sequence lengths, times forward + backward of self-attention on the CPU (median of
several runs after a warm-up) and reports the memory the attention weights alone occupy
(B x heads x L x L floats). course_lib's readable path materialises those weights on purpose, so
that lessons can look at them; ``torch.nn.MultiheadAttention(need_weights=False)`` uses a fused
kernel that never stores them, which is why it scales better with L. course_lib's fused path
(``MultiHeadAttention(..., fused=True)``, ``F.scaled_dot_product_attention``) does the same; the
last
line compares it with PyTorch at L=1024 (target: at most 1.15x).
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from course_lib import MultiHeadAttention, set_fused_attention

B, D_MODEL, NUM_HEADS = 8, 256, 8


def _median_ms(fn, repeats: int = 7) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    torch.manual_seed(0)
    ours = MultiHeadAttention(D_MODEL, NUM_HEADS)
    fused = set_fused_attention(MultiHeadAttention(D_MODEL, NUM_HEADS), True)
    theirs = nn.MultiheadAttention(D_MODEL, NUM_HEADS, batch_first=True)
    print(
        f"B={B}, d_model={D_MODEL}, heads={NUM_HEADS}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    print("forward + backward of self-attention, median ms")
    print(
        f"{'L':>5} | {'course_lib readable':>19} | {'course_lib fused':>16} | "
        f"{'nn.MultiheadAttention':>21} | "
        f"{'attention weights':>17}"
    )
    ratio = float("nan")
    for length in (64, 256, 1024):
        x = torch.randn(B, length, D_MODEL, requires_grad=True)

        def run_ours() -> None:
            ours(x, x, x).sum().backward()

        def run_fused() -> None:
            fused(x, x, x).sum().backward()

        def run_theirs() -> None:
            theirs(x, x, x, need_weights=False)[0].sum().backward()

        weights_mb = B * NUM_HEADS * length * length * 4 / 2**20
        # fused and PyTorch alternate, so a change in machine load hits both alike
        ms_fused, ms_theirs = [], []
        for _ in range(3):
            ms_fused.append(_median_ms(run_fused, repeats=3))
            ms_theirs.append(_median_ms(run_theirs, repeats=3))
        fused_ms, theirs_ms = statistics.median(ms_fused), statistics.median(ms_theirs)
        print(
            f"{length:>5} | {_median_ms(run_ours):>16.1f} ms | {fused_ms:>13.1f} ms | "
            f"{theirs_ms:>18.1f} ms | "
            f"{weights_mb:>14.1f} MB"
        )
        ratio = fused_ms / theirs_ms
    print(f"attention: fused path {ratio:.2f}x PyTorch at L=1024")


if __name__ == "__main__":
    main()
