"""Lesson 13's measurements: peak memory and time of attention's forward and backward pass at long
lengths, each size in a fresh process, stored per float path in
course_lib/results/flash_memory.json.

    python scripts/flash_memory.py                 (make flash-memory: L = 1k..16k, 32k without
                                                    the naive version; about 10 min on 2 cores)
    python scripts/flash_memory.py --extras        (only the profile and FlexAttention's timings)
    python scripts/flash_memory.py --one tiled 4096 [5]   (one measurement, printed as JSON; times
                                                    the fastest of 5 passes)

Three versions of the same attention (one sequence, one head, head_dim 64, float32, no mask):
``naive`` (lesson 01's, the whole L x L score matrix), ``tiled`` (course_lib.flash, FlashAttention-2
in PyTorch, blocks of 256) and ``sdpa`` (PyTorch's ``F.scaled_dot_product_attention``, its C++
kernel), on one thread. Peak memory is measured, not computed: the process's peak resident memory
(``ru_maxrss``) after the forward and backward pass, minus its peak before them (with the inputs
already made and every kernel already run once on a small input). The naive version at 32k would
need about 12 GiB (12.0 bytes per L^2 measured at 16k) and is not run, as the machine is shared;
any other run that would leave less than about 1 GiB of memory available is skipped.

It also profiles the tiled pass at L = 4096 (``torch.profiler``) and stores the share of the time of
each kind of operation, for the lesson's "where the time goes"; and times FlexAttention with a
document mask at L = 1024 in a fresh process: eager, its first compiled call (the compile) and the
compiled kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from course_lib.flash import flash_attention, naive_attention  # noqa: E402
from course_lib.studies.stored import save_runs  # noqa: E402

LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768]
NAIVE_MAX = 16384  # 32k: the naive pass would hold about 12 GiB (12.0 L^2 bytes measured at 16k)
HEAD_DIM, BLOCK = 64, 256
VERSIONS = ["naive", "tiled", "sdpa"]


def attention(version: str):  # noqa: ANN201
    if version == "naive":
        return naive_attention
    if version == "tiled":
        return lambda q, k, v: flash_attention(q, k, v, block_q=BLOCK, block_k=BLOCK)
    return F.scaled_dot_product_attention


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def measure_one(version: str, L: int, repeats: int = 1) -> dict:
    """Peak memory (bytes above the level before) of the first forward and backward pass, and the
    seconds of the fastest of ``repeats`` forward and backward passes."""
    attend = attention(version)
    small = [torch.randn(1, 1, 2 * BLOCK, HEAD_DIM, requires_grad=True) for _ in range(3)]
    warm = attend(*small)
    warm.backward(torch.randn_like(warm))  # every kernel loaded and run once, as measured below
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, L, HEAD_DIM, generator=gen).requires_grad_() for _ in range(3))
    d_out = torch.randn(1, 1, L, HEAD_DIM, generator=gen)
    before = _peak_bytes()
    forward = backward = float("inf")
    for repeat in range(repeats):
        start = time.perf_counter()
        out = attend(q, k, v)
        forward = min(forward, time.perf_counter() - start)
        start = time.perf_counter()
        out.backward(d_out)
        backward = min(backward, time.perf_counter() - start)
        if repeat == 0:
            peak = _peak_bytes() - before
        del out
        q.grad = k.grad = v.grad = None
    return {"version": version, "L": L, "peak_bytes": peak,
            "forward_s": round(forward, 4), "backward_s": round(backward, 4)}


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), or a large number elsewhere."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 50


def run_fresh(version: str, L: int, fixed_heap: bool = False, repeats: int = 1) -> dict:
    """``measure_one`` in a new Python process, so that no earlier size's peak hides this one's.

    FlexAttention's run gets an empty inductor cache: otherwise a compile cached on disk by an
    earlier run (of this script or a lesson) is read back in about 2 s, and the stored "first
    compiled call" would not be the compile a learner's first run pays.

    glibc keeps freed blocks below its (dynamic) mmap threshold in the heap, where the peak resident
    size counts them: the tiled pass's many short-lived tile temporaries then showed a peak that
    moved by a few MiB from run to run (8k: 12.8, 16.1 and 17.2 MiB in three runs). With the
    threshold fixed at 64 KiB, blocks that large go back to the system when freed (8k: 10.0 MiB, 16k:
    18.7 MiB); other C libraries ignore the variable. That threshold also makes every tile's
    allocation a system call and a page fault, which slowed the tiled pass 2.3-2.5x at 8k-16k (16k forward:
    6.4 s instead of 2.8 s); so ``fixed_heap=False`` (the times) runs with the allocator a learner's
    process has, and only the peak memory is read from a process with the fixed threshold."""
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    if fixed_heap:
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    with tempfile.TemporaryDirectory() as cache:
        if version == "flex":
            env["TORCHINDUCTOR_CACHE_DIR"] = cache
        result = subprocess.run([sys.executable, __file__, "--one", version, str(L), str(repeats)],
                                capture_output=True, text=True, check=True, env=env)
    return json.loads(result.stdout.strip().splitlines()[-1])


def profile_tiled(L: int = 4096) -> dict:
    """Shares of the tiled pass's time at length ``L`` (forward and backward): each kind of PyTorch
    operation's own time over the pass's wall time, both under the profiler; the rest is Python
    and dispatch."""
    from torch.profiler import ProfilerActivity, profile

    q, k, v = (torch.randn(1, 1, L, HEAD_DIM, requires_grad=True) for _ in range(3))
    flash_attention(q, k, v, block_q=BLOCK, block_k=BLOCK).sum().backward()  # warm
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()  # inside: the profiler's own start and stop are not counted
        flash_attention(q, k, v, block_q=BLOCK, block_k=BLOCK).sum().backward()
        wall = time.perf_counter() - start
    groups = {"matmul": ("aten::mm", "aten::bmm", "aten::matmul"), "exp": ("aten::exp",),
              "max and sum": ("aten::amax", "aten::max", "aten::maximum", "aten::sum"),
              "mul, add, sub, where": ("aten::mul", "aten::add", "aten::add_", "aten::sub",
                                       "aten::where", "aten::div", "aten::masked_fill")}
    totals = {name: 0.0 for name in groups}
    kernel = 0.0
    for event in prof.key_averages():
        if not event.key.startswith("aten::"):
            continue  # autograd nodes and Python functions: their own time is the Python around
        seconds = event.self_cpu_time_total / 1e6
        kernel += seconds
        for name, ops in groups.items():
            if event.key in ops:
                totals[name] += seconds
    totals["other operations"] = kernel - sum(totals.values())
    totals = {name: round(seconds / wall, 4) for name, seconds in totals.items()}
    totals["Python and dispatch (the rest)"] = round(max(0.0, 1 - sum(totals.values())), 4)
    return {"kind": "profile", "profile_L": L, "shares": totals}


def measure_flex(L: int = 1024, heads: int = 4) -> dict:
    """FlexAttention with a document mask: eager, the first compiled call (the compile), then the
    compiled kernel; the fastest of 3 calls each (one process, after the eager warm-up)."""
    import warnings

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from course_lib.flex import document

    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
    doc_ids = (torch.arange(L) // (L // 4))[None]  # 4 documents packed in one sequence
    block_mask = create_block_mask(document(doc_ids), 1, heads, L, L, device="cpu")
    q, k, v = (torch.randn(1, heads, L, HEAD_DIM) for _ in range(3))

    def fastest(fn, n: int = 3) -> float:
        times = []
        for _ in range(n):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    flex_attention(q, k, v, block_mask=block_mask)  # warm
    eager = fastest(lambda: flex_attention(q, k, v, block_mask=block_mask))
    compiled = torch.compile(flex_attention)
    compile_s = fastest(lambda: compiled(q, k, v, block_mask=block_mask), n=1)
    compiled_s = fastest(lambda: compiled(q, k, v, block_mask=block_mask))
    return {"kind": "flex", "flex": {"L": L, "heads": heads, "eager_s": round(eager, 4),
                                     "compile_s": round(compile_s, 2), "compiled_s": round(compiled_s, 4)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs="+", metavar="VERSION L [REPEATS]")
    parser.add_argument("--lengths", type=int, nargs="+", default=LENGTHS)
    parser.add_argument("--extras", action="store_true",
                        help="only the profile and FlexAttention's compile time (the memory runs stay)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the lessons and the other stored runs; passed on to each process
    if args.one:
        if args.one[0] == "flex":
            print(json.dumps(measure_flex(int(args.one[1]))))
        else:
            repeats = int(args.one[2]) if len(args.one) > 2 else 1
            print(json.dumps(measure_one(args.one[0], int(args.one[1]), repeats)))
        return
    runs = []
    for L in [] if args.extras else args.lengths:
        for version in VERSIONS:
            if version == "naive" and L > NAIVE_MAX:
                continue
            need = 13 * L * L if version == "naive" else 64 * L * HEAD_DIM * 4  # measured: 12.1 L^2
            if need + 2**30 > available_bytes():  # the machine is shared: never push it into swap
                print(f"  L={L:6d} {version:6s} skipped: needs about {need / 2**30:.1f} GiB, "
                      f"{available_bytes() / 2**30:.1f} GiB available now")
                continue
            # the times, with the allocator a learner's process has: the fastest of 5 passes up to
            # 8k, where one pass takes milliseconds and one slow pass would decide the plot
            run = run_fresh(version, L, repeats=5 if L <= 8192 else 1)
            run["peak_bytes"] = run_fresh(version, L, fixed_heap=True)["peak_bytes"]
            runs.append(run)
            print(f"  L={L:6d} {version:6s} peak {run['peak_bytes'] / 2**20:8.1f} MiB, forward "
                  f"{run['forward_s']:.3f} s, backward {run['backward_s']:.3f} s", flush=True)
    runs.append(profile_tiled())
    print(f"  profile at L={runs[-1]['profile_L']}: {runs[-1]['shares']}")
    runs.append(run_fresh("flex", 1024))
    print(f"  FlexAttention: {runs[-1]['flex']}")
    print(f"-> {save_runs('flash_memory', keep_earlier(runs))}")


def keep_earlier(runs: list[dict]) -> list[dict]:
    """``runs``, plus this float path's stored runs not measured this time (a (version, L) of the
    memory runs, or a kind: the profile, FlexAttention)."""
    from course_lib.studies.stored import RESULTS_DIR, float_path

    path = RESULTS_DIR / "flash_memory.json"
    stored = []
    if path.is_file():
        stored = json.loads(path.read_text())["paths"].get(float_path(), {}).get("runs", [])

    def key(run: dict) -> tuple:
        return (run["version"], run["L"]) if "version" in run else (run.get("kind", "profile"),)

    measured = {key(r) for r in runs}
    merged = [r for r in stored if key(r) not in measured] + runs
    memory = sorted((r for r in merged if "version" in r), key=lambda r: (r["L"], VERSIONS.index(r["version"])))
    return memory + [r for r in merged if "version" not in r]


if __name__ == "__main__":
    main()
