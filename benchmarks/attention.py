"""Benchmark: course_lib's readable MultiHeadAttention against PyTorch's fused implementation.

    python benchmarks/attention.py

For a few sequence lengths, times forward + backward of self-attention on the CPU (median of
several runs after a warm-up) and reports the memory the attention weights alone occupy
(B x heads x L x L floats). course_lib materialises those weights on purpose, so that lessons can
look at them; ``torch.nn.MultiheadAttention(need_weights=False)`` uses a fused kernel that never
stores them, which is why it scales better with L. The numbers are for reading, not for tests.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from course_lib import MultiHeadAttention

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
    theirs = nn.MultiheadAttention(D_MODEL, NUM_HEADS, batch_first=True)
    print(f"B={B}, d_model={D_MODEL}, heads={NUM_HEADS}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'L':>5} | {'course_lib fwd+bwd':>18} | {'nn.MultiheadAttention':>21} | {'attention weights':>17}")
    for length in (64, 256, 1024):
        x = torch.randn(B, length, D_MODEL, requires_grad=True)

        def run_ours() -> None:
            ours(x, x, x).sum().backward()

        def run_theirs() -> None:
            theirs(x, x, x, need_weights=False)[0].sum().backward()

        weights_mb = B * NUM_HEADS * length * length * 4 / 2**20
        print(f"{length:>5} | {_median_ms(run_ours):>15.1f} ms | {_median_ms(run_theirs):>18.1f} ms | "
              f"{weights_mb:>14.1f} MB")


if __name__ == "__main__":
    main()
