"""Benchmark: grouped-query attention (lesson 11), its KV cache and its fused kernel.

    python benchmarks/modern.py          (or: make benchmark)

1. **KV-cache memory and decode time.** One Llama-style model (``GPTConfig.llama_style``: d_model
   512, 8 heads of 64, 2 layers, vocabulary 256, random weights, eval mode), built three times from
   the same seed with 8 KV heads (MHA), 2 (GQA 4:1) and 1 (MQA). Greedy decoding with the cache
   (``GPT.generate(..., greedy=True)``) of 256 new tokens after the same 16-token prompt, batch 32.
   The cache is rebuilt by ``decode_with_cache``, the same loop as ``generate`` (``start_cache``,
   then ``step`` per position; it must give the same tokens), and its bytes, counted tensor by
   tensor (``numel() * element_size()`` of every cached key and value), must EQUAL
   ``course_lib.modern.kv_cache_bytes`` for the 16 + 255 positions it holds (the last token is
   returned, never fed). Decode time is the best of a few rounds; the three models take turns in
   every round, so a change of machine load hits them alike. Both attention paths are timed:
   the readable one (``repeat_interleave`` copies each KV head to its query heads at every step)
   and the fused one (``fused_attention=True``, PyTorch's kernel with ``enable_gqa``), which is what
   ``set_fused_attention`` recommends for generation; the last line uses the fused path.
   Target: GQA decodes in <= 1.1x MHA's time while storing 4x less.

2. **Fused attention with GQA at L = 1024** (B = 8, d_model 256, 8 heads, 2 KV heads, causal,
   forward + backward as in ``benchmarks/attention.py``). What is fair to compare: the same weights,
   the same input and the same work (four projections and one causal GQA attention), so that the
   timings differ only in how the module wraps PyTorch's kernel (``nn.MultiheadAttention`` has no
   GQA, so it cannot be the reference here). "PyTorch" is the same four projections (``F.linear``
   with the module's weights) around one call of ``F.scaled_dot_product_attention(q, k, v,
   is_causal=True, enable_gqa=True)``, with no checks and no reshaping beyond the head split: the
   least a module can do. "course_lib fused" is
   ``MultiHeadAttention(..., num_kv_heads=2, fused=True)(x, x, x, is_causal=True)``; "readable"
   is the same module with ``fused=False`` (it materialises the (B, h, L, L) weights and repeats
   the KV heads), for scale. All three outputs are asserted equal (1e-5) before timing; fused and
   PyTorch alternate, median of 9 runs each.
   Target: course_lib's fused path <= 1.15x PyTorch's own call.

``--threads`` (default 2) sets PyTorch's threads. On a machine that other processes keep busy, two
threads can make each decode step many times slower (every small operation waits for both
threads); ``--threads 1`` then gives steadier figures.

Last line, e.g.

    gqa: cache 4.0x smaller than MHA, decode 1.03x MHA's time (batch 32, 256 new tokens)
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from course_lib import MultiHeadAttention
from course_lib.gpt import GPT, GPTConfig
from course_lib.model import KVCache
from course_lib.modern import kv_cache_bytes

D_MODEL, NUM_HEADS, NUM_LAYERS, VOCAB, PROMPT_LEN = 512, 8, 2, 256, 16
BATCH, NEW_TOKENS = 32, 256
KV_HEADS = {"MHA": NUM_HEADS, "GQA": NUM_HEADS // 4, "MQA": 1}
ATTN_B, ATTN_D, ATTN_HEADS, ATTN_KV_HEADS, ATTN_L = 8, 256, 8, 2, 1024


def build(num_kv_heads: int, fused: bool, num_layers: int = NUM_LAYERS, d_model: int = D_MODEL,
          num_heads: int = NUM_HEADS, vocab_size: int = VOCAB, max_len: int = 512) -> GPT:
    """The benchmark's model with ``num_kv_heads`` KV heads; every variant from seed 0."""
    torch.manual_seed(0)
    config = GPTConfig.llama_style(
        vocab_size=vocab_size, max_len=max_len, d_model=d_model, num_heads=num_heads,
        num_layers=num_layers, num_kv_heads=num_kv_heads, fused_attention=fused,
    )
    return GPT(config).eval().requires_grad_(False)


@torch.no_grad()
def decode_with_cache(
    model: GPT, prompt: torch.Tensor, new_tokens: int
) -> tuple[torch.Tensor, KVCache]:
    """``GPT.generate(prompt, new_tokens, greedy=True)``'s loop, keeping the cache it builds.

    ``prompt (B, T)`` -> ``(ids (B, T + new_tokens), cache)``; the cache holds T + new_tokens - 1
    positions (the last token is returned, never fed back)."""
    cache = model.start_cache(prompt.size(0))
    for t in range(prompt.size(1)):  # the prompt, one position at a time, as generate does
        logits = model.step(prompt[:, t], cache)
    out = prompt
    for i in range(new_tokens):
        if i > 0:
            logits = model.step(out[:, -1], cache)
        out = torch.cat([out, logits.argmax(dim=-1, keepdim=True)], dim=1)  # (B, t) -> (B, t+1)
    return out, cache


def measured_cache_bytes(cache: KVCache) -> int:
    """Bytes of every tensor the cache keeps for attention: ``numel() * element_size()``."""
    total = 0
    for layer in cache.layers:
        for t in (layer.self_k, layer.self_v, layer.cross_k, layer.cross_v):
            if t is not None:
                total += t.numel() * t.element_size()
    return total


def formula_cache_bytes(model: GPT, batch_size: int, tokens: int) -> int:
    c = model.config
    size = model.lm_head.weight.element_size()
    return kv_cache_bytes(c.num_layers, c.num_kv_heads, c.head_dim, tokens, batch_size, size)


def check_cache(model: GPT, prompt: torch.Tensor, new_tokens: int,
                expected: torch.Tensor | None = None) -> int:
    """Decode once with ``decode_with_cache``; assert the tokens are ``generate``'s (``expected``,
    or a new call) and the bytes the formula's. Returns the measured bytes."""
    ids, cache = decode_with_cache(model, prompt, new_tokens)
    if expected is None:
        expected = model.generate(prompt, new_tokens, greedy=True)
    assert torch.equal(ids, expected), "decode_with_cache must follow GPT.generate exactly"
    tokens = prompt.size(1) + new_tokens - 1
    assert cache.length == tokens, (cache.length, tokens)
    measured = measured_cache_bytes(cache)
    formula = formula_cache_bytes(model, prompt.size(0), tokens)
    assert measured == formula, f"measured {measured:,} bytes, kv_cache_bytes says {formula:,}"
    return measured


def decode_seconds(models: dict[str, GPT], prompt: torch.Tensor, new_tokens: int,
                   rounds: int = 3) -> tuple[dict[str, list[float]], dict[str, torch.Tensor]]:
    """Seconds of ``generate(prompt, new_tokens, greedy=True)`` for every model, ``rounds`` times,
    the models taking turns in each round (after one short warm-up each); also the ids each
    model generated."""
    for model in models.values():
        model.generate(prompt, 2, greedy=True)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in models}
    ids = {}
    for _ in range(rounds):
        for name, model in models.items():
            start = time.perf_counter()
            ids[name] = model.generate(prompt, new_tokens, greedy=True)
            times[name].append(time.perf_counter() - start)
    return times, ids


def attention_callables(
    batch: int = ATTN_B, length: int = ATTN_L, d_model: int = ATTN_D, num_heads: int = ATTN_HEADS,
    num_kv_heads: int = ATTN_KV_HEADS,
) -> tuple[dict, torch.Tensor]:
    """Three ways to run the same causal GQA self-attention (same weights, same input):
    course_lib's fused and readable paths, and the same projections around PyTorch's SDPA call.
    Each callable returns the output ``(B, L, d_model)``."""
    torch.manual_seed(0)
    fused = MultiHeadAttention(d_model, num_heads, num_kv_heads=num_kv_heads, bias=False,
                               fused=True)
    readable = MultiHeadAttention(d_model, num_heads, num_kv_heads=num_kv_heads, bias=False)
    readable.load_state_dict(fused.state_dict())
    x = torch.randn(batch, length, d_model, requires_grad=True)
    hd = d_model // num_heads

    def pytorch() -> torch.Tensor:
        q = F.linear(x, fused.q_proj.weight).view(batch, length, num_heads, hd).transpose(1, 2)
        k = F.linear(x, fused.k_proj.weight).view(batch, length, num_kv_heads, hd).transpose(1, 2)
        v = F.linear(x, fused.v_proj.weight).view(batch, length, num_kv_heads, hd).transpose(1, 2)
        heads = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        heads = heads.transpose(1, 2).reshape(batch, length, d_model)  # (B, h, L, hd) -> (B, L, d)
        return F.linear(heads, fused.out_proj.weight)

    calls = {
        "course_lib fused": lambda: fused(x, x, x, is_causal=True),
        "PyTorch": pytorch,
        "course_lib readable": lambda: readable(x, x, x, is_causal=True),
    }
    return calls, x


def attention_ms(
    calls: dict, x: torch.Tensor, rounds: int = 3, repeats: int = 3
) -> dict[str, float]:
    """Median ms of forward + backward for each callable; they alternate round by round (the
    readable one, much slower, runs in the last round only)."""
    with torch.no_grad():
        outs = {name: fn() for name, fn in calls.items()}
    ref = outs["PyTorch"]
    for name, out in outs.items():
        assert torch.allclose(out, ref, atol=1e-5), f"{name} differs from PyTorch's call"

    def once(fn) -> float:
        x.grad = None
        start = time.perf_counter()
        fn().sum().backward()
        return time.perf_counter() - start

    times: dict[str, list[float]] = {name: [] for name in calls}
    for fn in calls.values():
        once(fn)  # warm-up
    for r in range(rounds):
        for name, fn in calls.items():
            if name == "course_lib readable" and r < rounds - 1:
                continue
            times[name] += [once(fn) for _ in range(repeats)]
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="decode rounds (best is reported)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-attention", action="store_true", help="only the KV-cache part")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{platform.processor() or platform.machine()}, "
          f"{torch.backends.cpu.get_cpu_capability()}")
    torch.manual_seed(1)
    prompt = torch.randint(0, VOCAB, (BATCH, PROMPT_LEN))
    tokens = PROMPT_LEN + NEW_TOKENS - 1
    print(f"\nLlama-style GPT, d_model {D_MODEL}, {NUM_HEADS} heads, {NUM_LAYERS} layers, "
          f"vocabulary {VOCAB}; greedy generate, batch {BATCH}, prompt {PROMPT_LEN}, "
          f"{NEW_TOKENS} new tokens "
          f"(cache of {tokens} positions); best of {args.rounds} rounds")
    print(f"{'':>4} | {'KV heads':>8} | {'cache (measured = formula)':>26} | "
          f"{'readable path':>13} | {'/ MHA':>5} | {'fused path':>10} | {'/ MHA':>5}")
    results = {}
    for fused in (False, True):
        models = {name: build(kv, fused) for name, kv in KV_HEADS.items()}
        times, ids = decode_seconds(models, prompt, NEW_TOKENS, args.rounds)
        for name, model in models.items():
            results[name, fused] = min(times[name])
            results[name, "spread", fused] = max(times[name]) / min(times[name])
        if fused:
            cache = {name: check_cache(model, prompt, NEW_TOKENS, ids[name])
                     for name, model in models.items()}
    for name, kv in KV_HEADS.items():
        readable, fused = results[name, False], results[name, True]
        print(f"{name:>4} | {kv:>8} | {cache[name] / 2**20:>22.1f} MiB | "
              f"{readable:>11.2f} s | {readable / results['MHA', False]:>4.2f}x | "
              f"{fused:>8.2f} s | {fused / results['MHA', True]:>4.2f}x")
    spread = max(v for k, v in results.items() if "spread" in k)
    print(f"(slowest round / best round, worst model: {spread:.2f}x)")

    if not args.skip_attention:
        calls, x = attention_callables()
        ms = attention_ms(calls, x)
        ratio = ms["course_lib fused"] / ms["PyTorch"]
        print(f"\ncausal self-attention with GQA, forward + backward, B={ATTN_B}, L={ATTN_L}, "
              f"d_model {ATTN_D}, {ATTN_HEADS} heads, {ATTN_KV_HEADS} KV heads, median ms")
        print(f"gqa attention: course_lib fused {ms['course_lib fused']:.1f} ms, PyTorch's SDPA "
              f"call {ms['PyTorch']:.1f} ms, course_lib readable "
              f"{ms['course_lib readable']:.1f} ms: "
              f"fused {ratio:.2f}x PyTorch at L={ATTN_L}")

    smaller = cache["MHA"] / cache["GQA"]
    slower = results["GQA", True] / results["MHA", True]
    print(f"gqa: cache {smaller:.1f}x smaller than MHA, decode {slower:.2f}x MHA's time "
          f"(batch {BATCH}, {NEW_TOKENS} new tokens)")


if __name__ == "__main__":
    main()
