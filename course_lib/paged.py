"""The KV cache in pages, as PagedAttention keeps it (Kwon et al., 2023, vLLM) (lesson 13).

Lesson 07's cache gives every sequence one contiguous tensor. A server that does not know how long a
sequence will grow must reserve room for ``max_len`` positions per sequence, and most of it stays
empty. PagedAttention stores keys and values in fixed-size **blocks** of ``block_size`` positions,
taken from one pool of **physical blocks** as a sequence grows. Each sequence has a **block table**:
logical block n (its positions ``n*block_size .. (n+1)*block_size - 1``) lives in physical block
``table[n]``. A sequence never wastes more than one partly filled block, and a finished sequence's
blocks go back to the **free list** for the next one.

``PagedKVCache`` holds the pool (per layer, ``(num_blocks, num_kv_heads, block_size, head_dim)`` for
keys and for values), the free list and the block tables. ``paged_cache_for`` hands lesson 09's
``GPT.step`` a cache whose layers read and write these pages, so the model's own cached attention
(``course_lib.layers.cached_self_attention``) runs unchanged: it reads a sequence's keys gathered
from its blocks (vLLM's kernel reads them in place through the table; a gather is the readable
version) and appends each new position into its block.
"""

from __future__ import annotations

import math

import torch

from .decoding import next_token
from .model import KVCache

__all__ = ["PagedKVCache", "PagedLayerView", "paged_cache_for", "generate_paged",
           "contiguous_cache_bytes"]


class PagedKVCache:
    """A pool of ``num_blocks`` physical blocks of ``block_size`` positions, for every layer.

    ``k_blocks, v_blocks: (num_layers, num_blocks, num_kv_heads, block_size, head_dim)``;
    ``free``: the physical blocks no sequence holds; ``block_tables[seq]``: the physical block of
    each logical block of sequence ``seq``; ``lengths[seq]``: its positions stored so far.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int = 16, dtype: torch.dtype = torch.float32) -> None:
        for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim), ("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PagedKVCache: {name} must be an int >= 1, got {value!r}")
        shape = (num_layers, num_blocks, num_kv_heads, block_size, head_dim)
        self.k_blocks = torch.zeros(shape, dtype=dtype)
        self.v_blocks = torch.zeros(shape, dtype=dtype)
        self.block_size = block_size
        self.free: list[int] = list(range(num_blocks))
        self.block_tables: dict[int, list[int]] = {}
        self.lengths: dict[int, list[int]] = {}  # per sequence, the positions stored in each layer

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int = 16) -> "PagedKVCache":  # noqa: ANN001
        """A pool sized for ``model`` (a ``course_lib.gpt.GPT``): its layers, KV heads, head_dim, dtype."""
        attn = model.blocks.layers[0].self_attn
        return cls(len(model.blocks.layers), attn.num_kv_heads, attn.head_dim, num_blocks, block_size,
                   model.lm_head.weight.dtype)

    @property
    def bytes_per_block(self) -> int:
        """Keys and values of one physical block in every layer."""
        return 2 * self.k_blocks[:, 0].numel() * self.k_blocks.element_size()

    def add_sequence(self, seq: int) -> None:
        """Start sequence ``seq`` with an empty block table (no block is taken before it is needed)."""
        if seq in self.block_tables:
            raise ValueError(f"PagedKVCache: sequence {seq} already exists; free it first")
        self.block_tables[seq] = []
        self.lengths[seq] = [0] * self.k_blocks.size(0)

    def free_sequence(self, seq: int) -> None:
        """Give sequence ``seq``'s physical blocks back to the free list."""
        self._check_seq(seq)
        self.free.extend(self.block_tables.pop(seq))
        del self.lengths[seq]

    def length(self, seq: int) -> int:
        """Positions stored for ``seq`` (in every layer, between two model steps)."""
        self._check_seq(seq)
        return max(self.lengths[seq])

    def blocks_in_use(self) -> int:
        return sum(len(table) for table in self.block_tables.values())

    def bytes_in_use(self) -> int:
        """Bytes of the physical blocks that sequences hold (keys and values, every layer)."""
        return self.blocks_in_use() * self.bytes_per_block

    def _check_seq(self, seq: int) -> None:
        if seq not in self.block_tables:
            raise KeyError(f"PagedKVCache: no sequence {seq}; add_sequence({seq}) first "
                           f"(known: {sorted(self.block_tables)})")

    def _check_layer(self, layer: object, where: str) -> None:
        num_layers = self.k_blocks.size(0)
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < num_layers:
            raise ValueError(f"PagedKVCache.{where}: layer must be an int in 0 .. {num_layers - 1} (the "
                             f"pool holds {num_layers} layer(s)), got {layer!r}")

    def _check_write(self, seq: int, layer: int, k: object, v: object) -> None:
        """Everything ``write`` needs, checked before anything is written or any block taken."""
        self._check_seq(seq)
        self._check_layer(layer, "write")
        _, _, kv, _, hd = self.k_blocks.shape
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.size(0) != kv or t.size(2) != hd:
                what = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"PagedKVCache.write: {name} must be (num_kv_heads={kv}, n, head_dim={hd}), "
                                 f"one sequence's new positions, got {what}")
        if k.shape != v.shape:
            raise ValueError(f"PagedKVCache.write: k and v must hold the same positions, got k "
                             f"{tuple(k.shape)} and v {tuple(v.shape)}")
        blocks = math.ceil((self.lengths[seq][layer] + k.size(1)) / self.block_size)  # after the write
        needed = blocks - len(self.block_tables[seq])
        if needed > len(self.free):
            raise RuntimeError(f"PagedKVCache: out of blocks ({self.k_blocks.size(1)} in the pool, "
                               f"{len(self.free)} free, {needed} needed); free a finished sequence or "
                               "make a larger pool")

    def write(self, seq: int, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append positions ``k, v (num_kv_heads, n, head_dim)`` to ``seq``'s keys and values in
        ``layer``, taking a block from the free list whenever the last one is full. Every argument
        (and the free blocks needed) is checked first: a refused write changes nothing."""
        self._check_write(seq, layer, k, v)
        table, start = self.block_tables[seq], self.lengths[seq][layer]
        for offset in range(k.size(1)):
            position = start + offset
            logical, slot = divmod(position, self.block_size)
            if logical == len(table):  # the sequence's blocks are full: take a free one
                if not self.free:
                    raise RuntimeError(f"PagedKVCache: out of blocks ({self.k_blocks.size(1)} in the "
                                       "pool, all in use); free a finished sequence or make a larger pool")
                table.append(self.free.pop(0))
            physical = table[logical]
            self.k_blocks[layer, physical, :, slot] = k[:, offset]
            self.v_blocks[layer, physical, :, slot] = v[:, offset]
        self.lengths[seq][layer] = start + k.size(1)

    def read(self, seq: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``seq``'s keys and values in ``layer``, in position order: ``(num_kv_heads, t, head_dim)``
        each, gathered from its physical blocks through the block table."""
        self._check_seq(seq)
        self._check_layer(layer, "read")
        t = self.lengths[seq][layer]
        table = torch.tensor(self.block_tables[seq][: math.ceil(t / self.block_size)], dtype=torch.long)
        # (n_blocks, kv, block_size, hd) -> (kv, n_blocks * block_size, hd), then the first t positions
        k = self.k_blocks[layer, table].transpose(0, 1).flatten(1, 2)[:, :t]
        v = self.v_blocks[layer, table].transpose(0, 1).flatten(1, 2)[:, :t]
        return k, v


class PagedLayerView:
    """What ``cached_self_attention`` needs of a layer's cache (``self_k``, ``self_v``), for the
    sequences ``seqs`` (one batch row each, all of the same length), read from and written to the
    pages. Reading gives ``(B, num_kv_heads, t, head_dim)``; assigning a tensor with more positions
    stores the new ones."""

    def __init__(self, cache: PagedKVCache, seqs: list[int], layer: int) -> None:
        self.cache, self.seqs, self.layer = cache, seqs, layer
        self.cross_k = self.cross_v = None  # a decoder-only model: no cross-attention

    def _stacked(self, which: int) -> torch.Tensor:
        return torch.stack([self.cache.read(seq, self.layer)[which] for seq in self.seqs])  # (B, kv, t, hd)

    def _store(self, which: int, value: torch.Tensor) -> None:
        if which == 1:  # values arrive after keys: write both once the values are here
            for row, seq in enumerate(self.seqs):
                t = self.cache.lengths[seq][self.layer]
                self.cache.write(seq, self.layer, self._pending[row][:, t:], value[row][:, t:])

    @property
    def self_k(self) -> torch.Tensor:
        return self._stacked(0)

    @self_k.setter
    def self_k(self, value: torch.Tensor) -> None:
        self._pending = value  # (B, kv, t+1, hd): the new keys wait for their values

    @property
    def self_v(self) -> torch.Tensor:
        return self._stacked(1)

    @self_v.setter
    def self_v(self, value: torch.Tensor) -> None:
        self._store(1, value)


def paged_cache_for(cache: PagedKVCache, seqs: list[int]) -> KVCache:
    """A lesson 07 ``KVCache`` for ``GPT.step`` whose layers are ``seqs``' pages (new sequences).
    All of ``seqs`` are checked (new, distinct) before any is added."""
    known = [seq for seq in seqs if seq in cache.block_tables]
    if known:
        raise ValueError(f"paged_cache_for: sequence(s) {known} already exist in the cache; free them "
                         "first (cache.free_sequence) or choose new ids")
    if len(set(seqs)) != len(seqs):
        raise ValueError(f"paged_cache_for: seqs must be distinct ids, one per batch row, got {list(seqs)}")
    for seq in seqs:
        cache.add_sequence(seq)
    layers = [PagedLayerView(cache, seqs, n) for n in range(cache.k_blocks.size(0))]
    keep = torch.zeros(len(seqs), 0, dtype=torch.bool)  # (B, 0): nothing decoded yet
    return KVCache(layers, None, keep)


@torch.no_grad()
def generate_paged(
    model, ids: torch.Tensor, max_new_tokens: int, cache: PagedKVCache, seqs: list[int],  # noqa: ANN001
    temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
    generator: torch.Generator | None = None, greedy: bool = False,
) -> torch.Tensor:
    """``GPT.generate``'s cached path, with the keys and values in ``cache``'s pages.

    ``ids (B, T)`` are the prompts of new sequences ``seqs`` (B ids); returns ``(B, T +
    max_new_tokens)``, the same tokens as ``model.generate(ids, ..., use_cache=True)`` with the same
    ``generator``. The sequences keep their blocks afterwards (``cache.free_sequence`` frees them);
    if the call fails, its sequences are freed, so that a retry may use the same ids.
    """
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex():
        what = f"a {ids.dtype} tensor" if isinstance(ids, torch.Tensor) else f"a {type(ids).__name__}"
        raise TypeError(f"generate_paged: ids must be a tensor of token ids (B, T), integer dtype, got "
                        f"{what}; build it with torch.tensor(prompts, dtype=torch.long)")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"generate_paged: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if ids.dim() != 2 or ids.size(0) != len(seqs):
        raise ValueError(f"generate_paged: ids must be (B, T) with B = len(seqs) = {len(seqs)}, "
                         f"got {tuple(ids.shape)}")
    if ids.size(1) + max_new_tokens > model.config.max_len:
        raise ValueError(f"generate_paged: {ids.size(1)} + {max_new_tokens} tokens exceed the model's "
                         f"max_len = {model.config.max_len} (a cache cannot slide)")
    kv = paged_cache_for(cache, seqs)  # checks every id before adding any: nothing to undo if refused
    was_training = model.training
    model.eval()
    out, logits, done = ids, None, False
    try:
        for t in range(ids.size(1)):  # the prompt, one position at a time into the pages
            logits = model.step(ids[:, t], kv)
        for _ in range(max_new_tokens):
            next_id = next_token(logits, temperature, top_k, top_p, generator, greedy)  # (B,)
            out = torch.cat([out, next_id.unsqueeze(1)], dim=1)
            if out.size(1) < ids.size(1) + max_new_tokens:  # the last token needs no logits
                logits = model.step(next_id, kv)
        done = True
    finally:
        model.train(was_training)
        if not done:  # a failed call leaves no sequence behind: a retry may use the same ids
            for seq in seqs:
                cache.free_sequence(seq)
    return out


def contiguous_cache_bytes(num_sequences: int, max_len: int, num_layers: int, num_kv_heads: int,
                           head_dim: int, bytes_per_number: int = 4) -> int:
    """What one contiguous cache per sequence reserves when each must hold up to ``max_len``
    positions: keys and values, every layer, every sequence, ``max_len`` rows each."""
    return 2 * num_layers * num_kv_heads * head_dim * max_len * num_sequences * bytes_per_number
