"""course_lib.paged: lesson 09's GPT generates the same tokens with its KV cache in pages as with
the contiguous cache (greedy and sampled, GPT-2 style and Llama-style with grouped-query heads), the
block tables map positions to physical blocks, and freed blocks are reused. Parallel sampling with
the prompt's blocks shared (fork, reference counts, copy-on-write) gives the tokens of separate caches
in fewer blocks, and attention read page by page through the block table equals SDPA on the gathered
cache."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from course_lib.gpt import GPT, GPTConfig
from course_lib.paged import (PagedKVCache, contiguous_cache_bytes, generate_paged, generate_parallel,
                              paged_attention, paged_cache_for)


def _model(kind: str) -> GPT:
    torch.manual_seed(0)
    if kind == "llama":
        config = GPTConfig.llama_style(vocab_size=83, max_len=64, d_model=64, num_heads=4,
                                       num_kv_heads=2, num_layers=2)
    else:
        config = GPTConfig(vocab_size=83, max_len=64, d_model=64, num_heads=4, num_layers=2)
    return GPT(config).eval()


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("greedy", [True, False])
def test_paged_generation_equals_the_contiguous_cache(kind, greedy):
    model = _model(kind)
    prompts = torch.randint(0, 83, (3, 7), generator=torch.Generator().manual_seed(1))
    cache = PagedKVCache.for_model(model, num_blocks=40, block_size=4)
    options = dict(greedy=True) if greedy else dict(temperature=1.3, top_k=20)
    paged = generate_paged(model, prompts, 30, cache, [10, 11, 12],
                           generator=torch.Generator().manual_seed(5), **options)
    contiguous = model.generate(prompts, 30, generator=torch.Generator().manual_seed(5), **options)
    assert torch.equal(paged, contiguous)
    assert cache.length(10) == 7 + 30 - 1  # the last token is drawn, not fed
    assert len(cache.block_tables[10]) == -(-(7 + 29) // 4)


def test_pages_hold_exactly_the_contiguous_keys_and_values():
    model = _model("llama")
    ids = torch.randint(0, 83, (2, 13), generator=torch.Generator().manual_seed(2))
    pages = PagedKVCache.for_model(model, num_blocks=16, block_size=5)
    paged_kv = paged_cache_for(pages, [0, 1])
    contiguous_kv = model.start_cache(2)
    with torch.no_grad():
        for t in range(13):
            assert torch.equal(model.step(ids[:, t], paged_kv), model.step(ids[:, t], contiguous_kv))
    for layer, contiguous_layer in enumerate(contiguous_kv.layers):
        for row, seq in enumerate((0, 1)):
            k, v = pages.read(seq, layer)
            assert torch.equal(k, contiguous_layer.self_k[row])
            assert torch.equal(v, contiguous_layer.self_v[row])
    table = pages.block_tables[1]
    k_blocks = pages.k_blocks[1, table]  # (3, kv, 5, hd): layer 1's blocks of sequence 1
    assert torch.equal(k_blocks[2, :, 1], contiguous_kv.layers[1].self_k[1, :, 11])  # position 11


def test_mixed_lengths_share_one_pool_and_freed_blocks_are_reused():
    model = _model("gpt2")
    cache = PagedKVCache.for_model(model, num_blocks=12, block_size=8)
    lengths = {0: 5, 1: 17, 2: 30}
    for seq, n in lengths.items():
        prompt = torch.randint(0, 83, (1, 3), generator=torch.Generator().manual_seed(seq))
        out = generate_paged(model, prompt, n - 3 + 1, cache, [seq], greedy=True)
        assert torch.equal(out, model.generate(prompt, n - 3 + 1, greedy=True))
        assert cache.length(seq) == n
    assert cache.blocks_in_use() == sum(-(-n // 8) for n in lengths.values()) == 1 + 3 + 4
    tables = [set(t) for t in cache.block_tables.values()]
    assert not (tables[0] & tables[1] or tables[0] & tables[2] or tables[1] & tables[2])
    freed = set(cache.block_tables[1])
    cache.free_sequence(1)
    assert set(cache.free) >= freed and cache.blocks_in_use() == 5
    out = generate_paged(model, torch.tensor([[4, 5, 6]]), 40, cache, [3], greedy=True)
    assert torch.equal(out, model.generate(torch.tensor([[4, 5, 6]]), 40, greedy=True))
    assert set(cache.block_tables[3]) & freed  # the new sequence got the freed blocks
    with pytest.raises(RuntimeError, match="out of blocks"):
        generate_paged(model, torch.tensor([[1, 2, 3]]), 40, cache, [4], greedy=True)


def test_bytes_in_use_and_the_contiguous_reservation():
    model = _model("llama")  # 2 layers, 2 KV heads, head_dim 16
    cache = PagedKVCache.for_model(model, num_blocks=30, block_size=16)
    assert cache.bytes_per_block == 2 * 2 * 2 * 16 * 16 * 4
    cache.add_sequence(0)
    for layer in range(2):
        cache.write(0, layer, torch.zeros(2, 20, 16), torch.zeros(2, 20, 16))
    assert cache.blocks_in_use() == 2 and cache.bytes_in_use() == 2 * cache.bytes_per_block
    assert contiguous_cache_bytes(3, 64, 2, 2, 16) == 3 * 64 * 2 * 2 * 2 * 16 * 4


def test_bad_use_gets_a_clear_error():
    cache = PagedKVCache(1, 1, 4, num_blocks=2, block_size=2)
    with pytest.raises(ValueError, match="block_size must be an int >= 1"):
        PagedKVCache(1, 1, 4, num_blocks=2, block_size=0)
    with pytest.raises(KeyError, match="add_sequence"):
        cache.read(0, 0)
    cache.add_sequence(0)
    with pytest.raises(ValueError, match="already exists"):
        cache.add_sequence(0)
    model = _model("gpt2")
    with pytest.raises(ValueError, match="exceed the model's max_len"):
        generate_paged(model, torch.zeros(1, 10, dtype=torch.long), 60, cache, [5])


# --- bad input (issue #48): checked before anything changes; a failed call leaves nothing behind ---


def _snapshot(cache):
    return (cache.k_blocks.clone(), cache.v_blocks.clone(), list(cache.free),
            {s: list(t) for s, t in cache.block_tables.items()}, {s: list(n) for s, n in cache.lengths.items()})


def _same(a, b):
    return torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2:] == b[2:]


def test_a_failed_generation_frees_its_sequences_and_a_retry_with_the_same_ids_works():
    model = _model("gpt2")
    cache = PagedKVCache.for_model(model, num_blocks=20, block_size=4)
    prompts = torch.randint(0, 83, (2, 6), generator=torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match="top_k must be None or an int >= 1"):  # fails after the prompt
        generate_paged(model, prompts, 5, cache, [1, 2], top_k=0)
    assert cache.block_tables == {} and cache.lengths == {} and sorted(cache.free) == list(range(20))
    out = generate_paged(model, prompts, 5, cache, [1, 2], greedy=True)  # the same ids again
    assert torch.equal(out, model.generate(prompts, 5, greedy=True))
    assert cache.length(1) == 6 + 5 - 1
    with pytest.raises(ValueError, match=r"sequence\(s\) \[2\] already exist in the cache; free them"):
        generate_paged(model, prompts, 5, cache, [3, 2], greedy=True)  # refused before adding 3
    assert 3 not in cache.block_tables
    with pytest.raises(ValueError, match=r"seqs must be distinct ids, one per batch row, got \[4, 4\]"):
        generate_paged(model, prompts, 5, cache, [4, 4], greedy=True)
    assert 4 not in cache.block_tables
    small = PagedKVCache.for_model(model, num_blocks=2, block_size=4)
    with pytest.raises(RuntimeError, match="out of blocks"):
        generate_paged(model, prompts[:1], 10, small, [7], greedy=True)
    assert small.blocks_in_use() == 0 and sorted(small.free) == [0, 1] and 7 not in small.block_tables
    assert model.training is False  # _model() is in eval mode, and stays so


@pytest.mark.parametrize("ids, error, words", [
    ([[1, 2, 3]], TypeError, r"ids must be a tensor of token ids \(B, T\), integer dtype, got a list; "
                             r"build it with torch.tensor"),
    (torch.zeros(1, 3), TypeError, r"got a torch.float32 tensor"),
])
def test_generate_paged_needs_a_tensor_of_ids(ids, error, words):
    model = _model("gpt2")
    cache = PagedKVCache.for_model(model, num_blocks=4, block_size=4)
    with pytest.raises(error, match=words):
        generate_paged(model, ids, 3, cache, [0])
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0, got -1"):
        generate_paged(model, torch.zeros(1, 3, dtype=torch.long), -1, cache, [0])
    assert cache.block_tables == {}


@pytest.mark.parametrize("k, v, layer, error, words", [
    (torch.ones(3, 5, 4), torch.ones(3, 5, 4), 0, ValueError,
     r"k must be \(num_kv_heads=2, n, head_dim=4\), one sequence's new positions, got shape \(3, 5, 4\)"),
    (torch.ones(2, 5, 4), torch.ones(2, 3, 4), 0, ValueError,
     r"k and v must hold the same positions, got k \(2, 5, 4\) and v \(2, 3, 4\)"),
    (torch.ones(2, 5, 4), torch.ones(2, 5, 8), 1, ValueError, r"v must be \(num_kv_heads=2, n, head_dim=4\)"),
    (torch.ones(2, 5, 4), torch.ones(2, 5, 4), 2, ValueError,
     r"PagedKVCache.write: layer must be an int in 0 \.\. 1 \(the pool holds 2 layer\(s\)\), got 2"),
    (torch.ones(2, 5, 4), torch.ones(2, 5, 4), -1, ValueError, r"layer must be an int in 0 \.\. 1"),
    ([[1.0]], torch.ones(2, 5, 4), 0, ValueError, r"k must be .* got list"),
    (torch.ones(2, 30, 4), torch.ones(2, 30, 4), 0, RuntimeError, r"out of blocks .* 3 free, 7 needed"),
])
def test_a_refused_write_leaves_the_cache_unchanged(k, v, layer, error, words):
    cache = PagedKVCache(2, 2, 4, num_blocks=5, block_size=4)
    cache.add_sequence(0)
    cache.write(0, 0, torch.full((2, 6, 4), 2.0), torch.full((2, 6, 4), 3.0))  # 2 blocks taken
    before = _snapshot(cache)
    with pytest.raises(error, match=words):
        cache.write(0, layer, k, v)
    assert _same(_snapshot(cache), before)
    with pytest.raises(ValueError, match=r"PagedKVCache.read: layer must be an int in 0 \.\. 1"):
        cache.read(0, 5)


# --- shared blocks (parallel sampling, copy-on-write) and attention read page by page ------------



@pytest.mark.parametrize("kind, prompt_length, options", [
    ("gpt2", 13, dict(greedy=True)), ("llama", 13, dict(temperature=1.3, top_k=20)),
    ("llama", 16, dict(temperature=0.9, top_p=0.9)),  # the prompt fills its blocks: nothing copied
])
def test_parallel_sampling_with_shared_blocks_equals_separate_caches(kind, prompt_length, options):
    model, n, block_size = _model(kind), 4, 4
    prompt = torch.randint(0, 83, (1, prompt_length), generator=torch.Generator().manual_seed(4))
    shared = PagedKVCache.for_model(model, num_blocks=60, block_size=block_size)
    separate = PagedKVCache.for_model(model, num_blocks=60, block_size=block_size)
    out = generate_parallel(model, prompt, 12, shared, [5, 6, 7, 8],
                            generator=torch.Generator().manual_seed(9), **options)
    alone = generate_paged(model, prompt.expand(n, -1), 12, separate, [5, 6, 7, 8],
                           generator=torch.Generator().manual_seed(9), **options)
    contiguous = model.generate(prompt.expand(n, -1), 12, generator=torch.Generator().manual_seed(9),
                                **options)
    assert torch.equal(out, alone) and torch.equal(out, contiguous)
    if not options.get("greedy"):
        assert len({tuple(row) for row in out.tolist()}) > 1  # the samples did grow apart
    length = prompt_length + 12 - 1  # the last token is drawn, not fed
    full_prompt_blocks = prompt_length // block_size  # shared for good; a partial one is copied
    per_sequence = -(-length // block_size)
    assert separate.blocks_in_use() == n * per_sequence
    assert shared.blocks_in_use() == full_prompt_blocks + n * (per_sequence - full_prompt_blocks)
    assert shared.copies == (n - 1 if prompt_length % block_size else 0)
    tables = [shared.block_tables[seq] for seq in (5, 6, 7, 8)]
    assert all(t[:full_prompt_blocks] == tables[0][:full_prompt_blocks] for t in tables)
    for physical in tables[0][:full_prompt_blocks]:
        assert shared.ref_counts[physical] == n
    for seq in (5, 6, 7, 8):
        shared.free_sequence(seq)
    assert shared.ref_counts == [0] * 60 and sorted(shared.free) == list(range(60))


def test_fork_shares_blocks_and_a_write_copies_only_the_shared_partial_block():
    cache = PagedKVCache(2, 1, 2, num_blocks=8, block_size=4)
    cache.add_sequence(0)
    prompt = torch.arange(10.0).reshape(1, 10, 1).expand(1, 10, 2)  # position p holds p
    for layer in range(2):
        cache.write(0, layer, prompt + layer, -prompt)
    cache.fork(0, 1)
    cache.fork(1, 2)
    assert cache.block_tables[0] == cache.block_tables[1] == cache.block_tables[2] == [0, 1, 2]
    assert cache.ref_counts[:3] == [3, 3, 3] and cache.blocks_in_use() == 3 and cache.copies == 0
    new = torch.full((1, 1, 2), 100.0)
    cache.write(1, 0, new, new)  # sequence 1 writes position 10 into shared block 2 (2 of 4 full)
    assert cache.block_tables[1] == [0, 1, 3] and cache.ref_counts[2:4] == [2, 1]
    assert cache.copies == 1
    k0, _ = cache.read(0, 0)
    k1, _ = cache.read(1, 0)
    assert torch.equal(k0, prompt)  # sequence 0's block 2 is unchanged
    assert torch.equal(k1[:, :10], prompt) and torch.equal(k1[:, 10], new[:, 0])
    cache.write(1, 1, new + 1, new)  # layer 1 of the copy: no second copy
    assert cache.copies == 1 and torch.equal(cache.read(1, 1)[0][:, :10], prompt + 1)
    for layer in range(2):  # sequence 2 copies too; sequence 0, the last holder, writes in place
        cache.write(2, layer, new + 2, new)
        cache.write(0, layer, new + 3, new)
    assert cache.block_tables[2] == [0, 1, 4] and cache.block_tables[0] == [0, 1, 2]
    assert cache.copies == 2 and cache.ref_counts[:5] == [3, 3, 1, 1, 1]
    assert cache.read(0, 1)[0][0, 10, 0] == 103 and cache.read(2, 0)[0][0, 10, 0] == 102
    cache.write(0, 0, torch.zeros(1, 3, 2), torch.zeros(1, 3, 2))  # fills block 2, takes a new one
    assert cache.block_tables[0] == [0, 1, 2, 5]
    for seq, back in ((1, [3]), (0, [2, 5]), (2, [0, 1, 4])):
        cache.free_sequence(seq)
        assert cache.free[-len(back):] == back  # a block returns only once no table holds it
    assert cache.ref_counts == [0] * 8 and sorted(cache.free) == list(range(8))


def _pool(block_size: int, kv: int, head_dim: int, lengths: list[int], seed: int) -> PagedKVCache:
    """A float64 pool with noise in every slot and sequences whose tables are out of order."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in lengths) + 3
    cache = PagedKVCache(2, kv, head_dim, num_blocks, block_size, dtype=torch.float64)
    cache.k_blocks.copy_(torch.randn(cache.k_blocks.shape, generator=gen, dtype=torch.float64))
    cache.v_blocks.copy_(torch.randn(cache.v_blocks.shape, generator=gen, dtype=torch.float64))
    cache.free = torch.randperm(num_blocks, generator=gen).tolist()
    for seq in range(len(lengths)):
        cache.add_sequence(seq)
    for position in range(max(lengths)):  # interleaved, as a server's sequences grow
        for seq, n in enumerate(lengths):
            if position < n:
                for layer in range(2):
                    k, v = (3 * torch.randn(kv, 1, head_dim, generator=gen, dtype=torch.float64)
                            for _ in range(2))
                    cache.write(seq, layer, k, v)
    return cache


@pytest.mark.parametrize("block_size, kv, heads, lengths", [
    (4, 1, 1, [11, 5]), (4, 2, 6, [9, 16, 1]), (16, 2, 2, [37, 16]), (3, 4, 8, [20, 7]), (64, 1, 3, [10]),
])
def test_paged_attention_reads_the_pages_tile_by_tile_and_equals_sdpa(block_size, kv, heads, lengths):
    cache = _pool(block_size, kv, 8, lengths, seed=block_size + kv)
    gen = torch.Generator().manual_seed(1)
    for seq, n in enumerate(lengths):
        assert len(cache.block_tables[seq]) == -(-n // block_size)
        for layer in range(2):
            q = torch.randn(heads, 8, generator=gen, dtype=torch.float64)
            out = paged_attention(q, cache, layer, seq)
            k, v = cache.read(seq, layer)  # (kv, n, 8) gathered, the readable version
            sdpa = F.scaled_dot_product_attention(q[None, :, None], k[None], v[None],
                                                  enable_gqa=True)[0, :, 0]  # (heads, 8)
            group = heads // kv
            formula = torch.stack([((q[i] @ k[i // group].T) / 8 ** 0.5).softmax(-1) @ v[i // group]
                                   for i in range(heads)])
            assert out.shape == (heads, 8)
            assert (out - sdpa).abs().max() <= 1e-10 and (out - formula).abs().max() <= 1e-10


def test_paged_attention_reads_shared_and_copied_blocks():
    cache = _pool(4, 2, 8, [10], seed=3)
    cache.fork(0, 1)
    for layer in range(2):
        one = torch.ones(2, 1, 8, dtype=torch.float64)
        cache.write(1, layer, one, one)
    q = torch.randn(4, 8, dtype=torch.float64)
    for seq in (0, 1):
        k, v = cache.read(seq, 1)
        sdpa = F.scaled_dot_product_attention(q[None, :, None], k[None], v[None], enable_gqa=True)[0, :, 0]
        assert (paged_attention(q, cache, 1, seq) - sdpa).abs().max() <= 1e-10
    assert cache.read(1, 0)[0].size(1) == 11 and cache.read(0, 0)[0].size(1) == 10


def test_shared_blocks_bad_use_gets_a_clear_error():
    cache = PagedKVCache(2, 1, 4, num_blocks=3, block_size=4)
    with pytest.raises(KeyError, match="no sequence 0; add_sequence"):
        cache.fork(0, 1)
    cache.add_sequence(0)
    cache.add_sequence(1)
    with pytest.raises(ValueError, match="PagedKVCache.fork: sequence 1 already exists"):
        cache.fork(0, 1)
    cache.write(0, 0, torch.ones(1, 6, 4), torch.ones(1, 6, 4))
    with pytest.raises(ValueError, match=r"holds \[6, 0\] positions in its layers; fork between two"):
        cache.fork(0, 2)
    cache.write(0, 1, torch.ones(1, 6, 4), torch.ones(1, 6, 4))
    cache.fork(0, 2)
    cache.write(1, 0, torch.ones(1, 4, 4), torch.ones(1, 4, 4))  # the last free block
    before = _snapshot(cache)
    with pytest.raises(RuntimeError, match=r"out of blocks \(3 in the pool, 0 free, 1 needed\)"):
        cache.write(2, 0, torch.ones(1, 1, 4), torch.ones(1, 1, 4))  # the copy needs a block
    assert _same(_snapshot(cache), before) and cache.ref_counts == [2, 2, 1]
    q = torch.ones(2, 4)
    with pytest.raises(ValueError, match=r"q must be \(num_heads, head_dim=4\), one query per head"):
        paged_attention(torch.ones(2, 5), cache, 0, 0)
    with pytest.raises(ValueError, match=r"num_heads a multiple of num_kv_heads=1; got shape \(1, 2, 4\)"):
        paged_attention(torch.ones(1, 2, 4), cache, 0, 0)
    with pytest.raises(ValueError, match="got list"):
        paged_attention([[1.0]], cache, 0, 0)
    with pytest.raises(ValueError, match="paged_attention: layer must be an int in 0 .. 1"):
        paged_attention(q, cache, 2, 0)
    with pytest.raises(KeyError, match="no sequence 9"):
        paged_attention(q, cache, 0, 9)
    cache.add_sequence(3)
    with pytest.raises(ValueError, match="sequence 3 holds no position in layer 0 yet"):
        paged_attention(q, cache, 0, 3)


@pytest.mark.parametrize("prompt, seqs, error, words", [
    ([[1, 2]], [0, 1], TypeError, r"prompt must be a tensor of token ids \(1, T\), integer dtype, got list"),
    (torch.zeros(1, 3), [0, 1], TypeError, "got a torch.float32 tensor"),
    (torch.zeros(2, 3, dtype=torch.long), [0, 1], ValueError,
     r"prompt must be one prompt, \(1, T\) with T >= 1, got \(2, 3\); the samples are len\(seqs\)"),
    (torch.zeros(1, 0, dtype=torch.long), [0, 1], ValueError, r"got \(1, 0\)"),
    (torch.zeros(1, 3, dtype=torch.long), [], ValueError, "seqs must be a non-empty list"),
    (torch.zeros(1, 3, dtype=torch.long), [4, 4], ValueError, r"seqs must be distinct ids.*\[4, 4\]"),
    (torch.zeros(1, 3, dtype=torch.long), [5, 2], ValueError,
     r"generate_parallel: sequence\(s\) \[2\] already exist in the cache"),
])
def test_generate_parallel_refuses_bad_input_and_leaves_nothing_behind(prompt, seqs, error, words):
    model = _model("gpt2")
    cache = PagedKVCache.for_model(model, num_blocks=8, block_size=4)
    cache.add_sequence(2)
    with pytest.raises(error, match=words):
        generate_parallel(model, prompt, 3, cache, seqs)
    assert list(cache.block_tables) == [2] and sorted(cache.free) == list(range(8))


def test_generate_parallel_out_of_room_leaves_nothing_behind():
    model = _model("gpt2")
    cache = PagedKVCache.for_model(model, num_blocks=8, block_size=4)
    cache.add_sequence(2)
    with pytest.raises(ValueError, match="exceed the model's max_len = 64"):
        generate_parallel(model, torch.zeros(1, 10, dtype=torch.long), 60, cache, [0])
    with pytest.raises(RuntimeError, match="out of blocks"):  # 2 samples of 24 positions need 12 blocks
        generate_parallel(model, torch.zeros(1, 3, dtype=torch.long), 22, cache, [0, 1], greedy=True)
    assert list(cache.block_tables) == [2] and cache.ref_counts == [0] * 8 and len(cache.free) == 8
