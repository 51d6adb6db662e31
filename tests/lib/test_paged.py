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
