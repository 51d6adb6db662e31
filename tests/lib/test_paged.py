"""course_lib.paged: lesson 09's GPT generates the same tokens with its KV cache in pages as with
the contiguous cache (greedy and sampled, GPT-2 style and Llama-style with grouped-query heads), the
block tables map positions to physical blocks, and freed blocks are reused."""

from __future__ import annotations

import pytest
import torch

from course_lib.gpt import GPT, GPTConfig
from course_lib.paged import PagedKVCache, contiguous_cache_bytes, generate_paged, paged_cache_for


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
