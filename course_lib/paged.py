"""The KV cache in pages, as PagedAttention keeps it (Kwon et al., 2023, vLLM) (lesson 13).

Lesson 07's cache gives every sequence one contiguous tensor. A server that does not know how long a
sequence will grow must reserve room for ``max_len`` positions per sequence, and most of it stays
empty. PagedAttention stores keys and values in fixed-size **blocks** of ``block_size`` positions,
taken from one pool of **physical blocks** as a sequence grows. Each sequence has a **block table**:
logical block n (its positions ``n*block_size .. (n+1)*block_size - 1``) lives in physical block
``table[n]``. A sequence never wastes more than one partly filled block, and a finished sequence's
blocks go back to the **free list** for the next one.

Blocks can also be **shared**. Parallel sampling draws n continuations of one prompt: the prompt is
written once, then ``fork`` gives each other sample a copy of the block table, pointing to the same
physical blocks, and every block keeps a **reference count** (how many tables hold it). A block is
copied only when a sequence writes into it while another still holds it (**copy-on-write**): with
appends only, that is the prompt's last block, when it is partly filled. ``free_sequence`` lowers the
counts; a block returns to the free list when its count reaches 0. ``generate_parallel`` samples
this way, and ``paged_attention`` reads a sequence's keys and values page by page through its block
table, one page a tile, merging the tiles' softmax states as FlashAttention does (lesson 13).

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
from .flash import merge_softmax_states
from .model import KVCache

__all__ = ["PagedKVCache", "PagedLayerView", "paged_cache_for", "generate_paged", "generate_parallel",
           "paged_attention", "contiguous_cache_bytes"]


class PagedKVCache:
    """A pool of ``num_blocks`` physical blocks of ``block_size`` positions, for every layer.

    ``k_blocks, v_blocks: (num_layers, num_blocks, num_kv_heads, block_size, head_dim)``;
    ``free``: the physical blocks no sequence holds; ``block_tables[seq]``: the physical block of
    each logical block of sequence ``seq``; ``lengths[seq]``: its positions stored so far;
    ``ref_counts[b]``: how many block tables hold physical block b (0 for a free block);
    ``copies``: the blocks copied on write so far.
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
        self.ref_counts: list[int] = [0] * num_blocks
        self.copies = 0

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

    def fork(self, parent: int, child: int) -> None:
        """Start sequence ``child`` as a copy of ``parent`` that copies nothing: ``child``'s block table
        is a copy of ``parent``'s, pointing to the same physical blocks, whose reference counts go up
        by one. Both may then grow apart: a write into a block that another table still holds copies
        that block first (``write``). ``parent`` must hold the same positions in every layer (fork
        between two model steps)."""
        self._check_seq(parent)
        if child in self.block_tables:
            raise ValueError(f"PagedKVCache.fork: sequence {child} already exists; free it first or "
                             "choose a new id")
        if len(set(self.lengths[parent])) != 1:
            raise ValueError(f"PagedKVCache.fork: sequence {parent} holds {self.lengths[parent]} positions "
                             "in its layers; fork between two model steps, when every layer holds the "
                             "same positions")
        self.block_tables[child] = list(self.block_tables[parent])
        self.lengths[child] = list(self.lengths[parent])
        for physical in self.block_tables[child]:
            self.ref_counts[physical] += 1

    def free_sequence(self, seq: int) -> None:
        """End sequence ``seq``: each of its physical blocks loses one reference, and a block that no
        table holds any more goes back to the free list."""
        self._check_seq(seq)
        for physical in self.block_tables.pop(seq):
            self.ref_counts[physical] -= 1
            if self.ref_counts[physical] == 0:
                self.free.append(physical)
        del self.lengths[seq]

    def length(self, seq: int) -> int:
        """Positions stored for ``seq`` (in every layer, between two model steps)."""
        self._check_seq(seq)
        return max(self.lengths[seq])

    def blocks_in_use(self) -> int:
        """Physical blocks that sequences hold, each counted once however many tables share it."""
        return len({physical for table in self.block_tables.values() for physical in table})

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
        start, table = self.lengths[seq][layer], self.block_tables[seq]
        blocks = math.ceil((start + k.size(1)) / self.block_size)  # after the write
        needed = blocks - len(table)
        first = start // self.block_size  # the logical block of the first new position
        if k.size(1) and first < len(table) and self._shared(table[first]):
            needed += 1  # the write lands in a block another table holds: it is copied first
        if needed > len(self.free):
            raise RuntimeError(f"PagedKVCache: out of blocks ({self.k_blocks.size(1)} in the pool, "
                               f"{len(self.free)} free, {needed} needed); free a finished sequence or "
                               "make a larger pool")

    def _shared(self, physical: int) -> bool:
        return self.ref_counts[physical] > 1

    def _take_free_block(self) -> int:
        if not self.free:
            raise RuntimeError(f"PagedKVCache: out of blocks ({self.k_blocks.size(1)} in the "
                               "pool, all in use); free a finished sequence or make a larger pool")
        physical = self.free.pop(0)
        self.ref_counts[physical] = 1
        return physical

    def write(self, seq: int, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append positions ``k, v (num_kv_heads, n, head_dim)`` to ``seq``'s keys and values in
        ``layer``, taking a block from the free list whenever the last one is full. A block that
        another sequence's table also holds is copied first (every layer of it) and ``seq``'s table
        points to the copy (copy-on-write); the other sequences keep the original. Every argument
        (and the free blocks needed) is checked first: a refused write changes nothing."""
        self._check_write(seq, layer, k, v)
        table, start = self.block_tables[seq], self.lengths[seq][layer]
        for offset in range(k.size(1)):
            position = start + offset
            logical, slot = divmod(position, self.block_size)
            if logical == len(table):  # the sequence's blocks are full: take a free one
                table.append(self._take_free_block())
            elif self._shared(table[logical]):  # copy-on-write: the others keep the original
                shared, copy = table[logical], self._take_free_block()
                self.k_blocks[:, copy] = self.k_blocks[:, shared]  # every layer of the block
                self.v_blocks[:, copy] = self.v_blocks[:, shared]
                self.ref_counts[shared] -= 1
                table[logical] = copy
                self.copies += 1
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


def _check_new_ids(cache: PagedKVCache, seqs: list[int], where: str) -> None:
    known = [seq for seq in seqs if seq in cache.block_tables]
    if known:
        raise ValueError(f"{where}: sequence(s) {known} already exist in the cache; free them "
                         "first (cache.free_sequence) or choose new ids")
    if len(set(seqs)) != len(seqs):
        raise ValueError(f"{where}: seqs must be distinct ids, one per batch row, got {list(seqs)}")


def paged_cache_for(cache: PagedKVCache, seqs: list[int]) -> KVCache:
    """A lesson 07 ``KVCache`` for ``GPT.step`` whose layers are ``seqs``' pages (new sequences).
    All of ``seqs`` are checked (new, distinct) before any is added."""
    _check_new_ids(cache, seqs, "paged_cache_for")
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
    _check_lengths(model, ids.size(1), max_new_tokens, "generate_paged")
    kv = paged_cache_for(cache, seqs)  # checks every id before adding any: nothing to undo if refused
    was_training = model.training
    model.eval()
    out, logits, done = ids, None, False
    try:
        for t in range(ids.size(1)):  # the prompt, one position at a time into the pages
            logits = model.step(ids[:, t], kv)
        out = _decode(model, kv, logits, out, max_new_tokens,
                      (temperature, top_k, top_p, generator, greedy))
        done = True
    finally:
        model.train(was_training)
        if not done:  # a failed call leaves no sequence behind: a retry may use the same ids
            for seq in seqs:
                if seq in cache.block_tables:
                    cache.free_sequence(seq)
    return out


def _check_lengths(model, prompt_length: int, max_new_tokens: int, where: str) -> None:  # noqa: ANN001
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"{where}: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if prompt_length + max_new_tokens > model.config.max_len:
        raise ValueError(f"{where}: {prompt_length} + {max_new_tokens} tokens exceed the model's "
                         f"max_len = {model.config.max_len} (a cache cannot slide)")


def _decode(model, kv: KVCache, logits: torch.Tensor, out: torch.Tensor, max_new_tokens: int,  # noqa: ANN001
            sampling: tuple) -> torch.Tensor:
    """Draw ``max_new_tokens`` tokens from ``logits (B, V)`` on, feeding each back through ``kv``;
    ``out (B, T)`` grows to ``(B, T + max_new_tokens)``. ``sampling``: next_token's options."""
    total = out.size(1) + max_new_tokens
    for _ in range(max_new_tokens):
        next_id = next_token(logits, *sampling)  # (B,)
        out = torch.cat([out, next_id.unsqueeze(1)], dim=1)
        if out.size(1) < total:  # the last token needs no logits
            logits = model.step(next_id, kv)
    return out


@torch.no_grad()
def generate_parallel(
    model, prompt: torch.Tensor, max_new_tokens: int, cache: PagedKVCache, seqs: list[int],  # noqa: ANN001
    temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
    generator: torch.Generator | None = None, greedy: bool = False,
) -> torch.Tensor:
    """Parallel sampling: ``len(seqs)`` continuations of one prompt, the prompt's blocks shared.

    ``prompt (1, T)`` is written once, into sequence ``seqs[0]``; every other id is a ``fork`` of it,
    so the prompt's blocks are held by all and stored once; each sample then writes its own tokens
    (the prompt's last block, if partly filled, is copied at the first write). Returns ``(n, T +
    max_new_tokens)``, n = len(seqs): the same tokens as ``generate_paged`` (or ``model.generate``)
    on n copies of the prompt with the same ``generator``. The sequences keep their blocks afterwards;
    if the call fails, its sequences are freed.
    """
    if not isinstance(prompt, torch.Tensor) or prompt.is_floating_point() or prompt.is_complex():
        what = f"a {prompt.dtype} tensor" if isinstance(prompt, torch.Tensor) else type(prompt).__name__
        raise TypeError(f"generate_parallel: prompt must be a tensor of token ids (1, T), integer dtype, "
                        f"got {what}")
    if prompt.dim() != 2 or prompt.size(0) != 1 or prompt.size(1) == 0:
        raise ValueError(f"generate_parallel: prompt must be one prompt, (1, T) with T >= 1, got "
                         f"{tuple(prompt.shape)}; the samples are len(seqs), not rows of the prompt")
    if not isinstance(seqs, (list, tuple)) or len(seqs) == 0:
        raise ValueError(f"generate_parallel: seqs must be a non-empty list of new sequence ids, one "
                         f"per sample, got {seqs!r}")
    _check_lengths(model, prompt.size(1), max_new_tokens, "generate_parallel")
    seqs = list(seqs)
    _check_new_ids(cache, seqs, "generate_parallel")  # every id, before any is added
    first = paged_cache_for(cache, seqs[:1])
    was_training = model.training
    model.eval()
    done = False
    try:
        for t in range(prompt.size(1)):  # the prompt, once, into seqs[0]'s blocks
            logits = model.step(prompt[:, t], first)  # (1, V)
        for seq in seqs[1:]:
            cache.fork(seqs[0], seq)  # the same blocks, their counts + 1; nothing copied
        layers = [PagedLayerView(cache, seqs, n) for n in range(cache.k_blocks.size(0))]
        keep = torch.ones(len(seqs), prompt.size(1), dtype=torch.bool)  # (n, T): the prompt, no padding
        kv = KVCache(layers, None, keep)
        out = _decode(model, kv, logits.expand(len(seqs), -1), prompt.expand(len(seqs), -1),
                      max_new_tokens, (temperature, top_k, top_p, generator, greedy))
        done = True
    finally:
        model.train(was_training)
        if not done:
            for seq in seqs:
                if seq in cache.block_tables:
                    cache.free_sequence(seq)
    return out


def paged_attention(q: torch.Tensor, cache: PagedKVCache, layer: int, seq: int) -> torch.Tensor:
    """One query per head attends to sequence ``seq``'s keys and values in ``layer``, read page by
    page through its block table, never gathered: ``softmax(q Kᵀ / √head_dim) V``.

    ``q (num_heads, head_dim)``, ``num_heads`` a multiple of the pool's ``num_kv_heads`` (query head
    i reads KV head ``i // (num_heads / num_kv_heads)``, grouped-query). Returns ``(num_heads,
    head_dim)``. Each physical block is one tile: its scores give a partial softmax state ``(m, ℓ, o)``
    (running maximum, sum of exp, sum of exp times values), merged with the tiles before it by
    ``flash.merge_softmax_states``; the last block counts only its filled slots. At the end, ``o / ℓ``.
    """
    cache._check_seq(seq)
    cache._check_layer(layer, "paged_attention")
    _, _, kv, block_size, head_dim = cache.k_blocks.shape
    if not isinstance(q, torch.Tensor) or q.dim() != 2 or q.size(1) != head_dim or q.size(0) % kv:
        what = f"shape {tuple(q.shape)}" if isinstance(q, torch.Tensor) else type(q).__name__
        raise ValueError(f"paged_attention: q must be (num_heads, head_dim={head_dim}), one query per "
                         f"head, num_heads a multiple of num_kv_heads={kv}; got {what}")
    t = cache.lengths[seq][layer]
    if t == 0:
        raise ValueError(f"paged_attention: sequence {seq} holds no position in layer {layer} yet: "
                         "write its keys and values first (a query attends at least to itself)")
    group = q.size(0) // kv
    dtype = torch.promote_types(q.dtype, cache.k_blocks.dtype)
    q = q.to(dtype).reshape(kv, group, head_dim)  # (h, d) -> (kv, group, d)
    scale = 1.0 / math.sqrt(head_dim)
    m = torch.full((kv, group), -math.inf, dtype=q.dtype)  # no key seen yet
    ell = torch.zeros(kv, group, dtype=q.dtype)
    o = torch.zeros(kv, group, head_dim, dtype=q.dtype)
    for logical, physical in enumerate(cache.block_tables[seq][: math.ceil(t / block_size)]):
        filled = min(block_size, t - logical * block_size)  # the last block may be partly full
        k = cache.k_blocks[layer, physical, :, :filled].to(dtype)  # (kv, filled, d): one page, one tile
        v = cache.v_blocks[layer, physical, :, :filled].to(dtype)
        s = q @ k.transpose(-2, -1) * scale  # (kv, group, filled)
        m_tile = s.amax(dim=-1)
        p = torch.exp(s - m_tile[..., None])
        m, ell, o = merge_softmax_states(m, ell, o, m_tile, p.sum(dim=-1), p @ v)
    return (o / ell[..., None]).reshape(kv * group, head_dim)  # (kv, group, d) -> (h, d)


def contiguous_cache_bytes(num_sequences: int, max_len: int, num_layers: int, num_kv_heads: int,
                           head_dim: int, bytes_per_number: int = 4) -> int:
    """What one contiguous cache per sequence reserves when each must hold up to ``max_len``
    positions: keys and values, every layer, every sequence, ``max_len`` rows each."""
    return 2 * num_layers * num_kv_heads * head_dim * max_len * num_sequences * bytes_per_number
