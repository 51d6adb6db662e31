"""FlashAttention from scratch: the online softmax and FlashAttention-2's tiled passes (lesson 13).

Attention never needs the whole ``(L_q, L_k)`` score matrix at once. A row's softmax can be built
from blocks of keys, keeping three numbers per query (Milakov and Gimelshein, 2018):

    m  the running maximum of the scores seen so far
    ℓ  the running sum of exp(score - m)
    O  the running sum of exp(score - m) * value            (not yet divided by ℓ)

Two such partial states merge exactly (``merge_softmax_states``). FlashAttention-2 (Dao, 2023),
Algorithm 1, for each tile of queries Q_i (``block_q`` rows), over the tiles K_j, V_j
(``block_k`` rows):

    1  S = Q_i K_j^T * scale                                (block_q, block_k), the only scores held
    2  m_new = max(m, rowmax(S))
    3  P = exp(S - m_new)
    4  ℓ = exp(m - m_new) ℓ + rowsum(P)
    5  O = exp(m - m_new) O + P V_j
    6  m = m_new
  after the last tile:
    7  O_i = O / ℓ,   L_i = m + log ℓ                        (L: the log-sum-exp, saved for backward)

Algorithm 2, the backward pass, recomputes each tile's probabilities from Q, K and L instead of
storing them, with D = rowsum(dO ∘ O):

    1  P = exp(Q_i K_j^T * scale - L_i)
    2  dV_j += P^T dO_i
    3  dP = dO_i V_j^T
    4  dS = P ∘ (dP - D_i)
    5  dQ_i += dS K_j * scale,   dK_j += dS^T Q_i * scale

So memory grows with L (the inputs, the output, L and D), plus one tile of scores: not with L².
``flash_backward_tile`` is steps 1-5 for one pair of tiles. ``attention_io_bytes`` counts the
bytes a forward pass moves between slow and fast memory, as the paper's Theorem 2 counts them.

Conventions, as ``F.scaled_dot_product_attention``: ``q (B, h, L_q, d)``, ``k (B, kv, L_k, d)``,
``v (B, kv, L_k, d_v)``; ``kv`` divides ``h`` (grouped-query attention: query head i reads KV head
``i // (h // kv)``); ``mask`` bool broadcastable to ``(B, h, L_q, L_k)``, True = may attend;
``is_causal`` is SDPA's top-left causal mask (query i sees keys 0..i, also when L_q != L_k), and may
be combined with ``mask``. A query that may attend to no key gets a zero output, a log-sum-exp of
-inf and zero gradients (what SDPA returns on CPU), never NaN.

Precision, as real kernels keep it: inputs in bfloat16 or float16 are read tile by tile into float32,
and the scores, m, ℓ, O (and the backward's D, dQ, dK, dV) are accumulated in float32; the output
and the gradients are cast back to the input dtype at the end, and the log-sum-exp stays float32
(FlashAttention's and PyTorch's kernels return it so). float32 and float64 inputs are computed in
their own dtype.
"""

from __future__ import annotations

import math

import torch

__all__ = ["merge_softmax_states", "flash_attention_forward", "flash_backward_tile",
           "flash_attention_backward", "FlashAttention", "flash_attention", "naive_attention",
           "attention_io_bytes"]

_NEG_INF = float("-inf")


def merge_softmax_states(
    m_a: torch.Tensor, ell_a: torch.Tensor, o_a: torch.Tensor,
    m_b: torch.Tensor, ell_b: torch.Tensor, o_b: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge two partial softmax states of the same rows, seen over disjoint sets of keys.

    ``m (...,)`` running maximum, ``ell (...,)`` sum of exp(score - m), ``o (..., d_v)`` sum of
    exp(score - m) * value. Returns ``(m, ell, o)`` of all the keys together: each state is
    rescaled to the common maximum, ``exp(m_a - m)``, then added. A state that has seen no key
    (m = -inf, ell = 0, o = 0) leaves the other unchanged (no NaN from -inf - -inf).
    """
    m = torch.maximum(m_a, m_b)
    m_safe = torch.where(m == _NEG_INF, 0.0, m)  # rows with no key at all: any finite reference
    alpha, beta = torch.exp(m_a - m_safe), torch.exp(m_b - m_safe)  # each state's rescaling
    return m, alpha * ell_a + beta * ell_b, alpha[..., None] * o_a + beta[..., None] * o_b


def _tiles(n: int, block: int) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` covering ``0..n`` in blocks of ``block`` (the last one may be short)."""
    return [(start, min(start + block, n)) for start in range(0, n, block)]


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the tiles are computed in: float32 for the 16-bit floats, else ``dtype`` itself."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _check_is_causal(is_causal: object, where: str) -> None:
    if not isinstance(is_causal, bool):
        raise TypeError(f"{where}: is_causal must be True or False, got {is_causal!r} "
                        f"({type(is_causal).__name__}); pass the bool itself (a string such as "
                        "'False' would count as true)")


def _check_block(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"flash_attention: {name} must be an int >= 1, got {value!r}")


def _prepare(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
    scale: float | None, block_q: int, block_k: int, is_causal: bool = False,
) -> tuple[torch.Tensor | None, float]:
    """Check every input and say what to fix; return the mask as ``(B, kv, g, L_q, L_k)`` (a view,
    never a copy) and the scale."""
    where = "flash_attention"
    _check_is_causal(is_causal, where)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{where}: {name} must be 4-D (B, heads, L, head_dim), got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{where}: {name} must be a floating-point tensor, got {t.dtype}")
        if 0 in t.shape:
            raise ValueError(f"{where}: {name} is empty, shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise TypeError(f"{where}: q, k and v must share dtype and device, got {q.dtype}/{q.device}, "
                        f"{k.dtype}/{k.device}, {v.dtype}/{v.device}")
    (B, h, L_q, d), (B_k, kv, L_k, d_k) = q.shape, k.shape
    if B_k != B or v.size(0) != B:
        raise ValueError(f"{where}: q, k and v must have the same batch size, got {B}, {B_k}, {v.size(0)}")
    if d_k != d:
        raise ValueError(f"{where}: q and k must share head_dim, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if v.shape[1:3] != k.shape[1:3]:
        raise ValueError(f"{where}: k and v must have the same heads and length, got k {tuple(k.shape)} "
                         f"and v {tuple(v.shape)}")
    if h % kv:
        raise ValueError(f"{where}: the number of query heads ({h}) must be a multiple of the number of "
                         f"KV heads ({kv}) (grouped-query attention)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not torch.isfinite(t).all():
            raise ValueError(f"{where}: {name} contains NaN or inf; attention of it would too")
    _check_block(block_q, "block_q")
    _check_block(block_k, "block_k")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"{where}: scale must be a finite number or None (1/sqrt(head_dim)), got {scale!r}")
    if mask is None:
        return None, float(scale)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"{where}: mask must be a bool tensor (True = may attend), got {got}. Convert a "
                        "0/1 mask with mask.bool(), an additive -inf mask with mask == 0")
    try:
        full = mask.expand(B, h, L_q, L_k)  # a view: no (L_q, L_k) matrix is made here
    except RuntimeError:
        raise ValueError(f"{where}: mask of shape {tuple(mask.shape)} does not broadcast to "
                         f"(B, h, L_q, L_k) = {(B, h, L_q, L_k)}; a padding mask of keys is "
                         "(B, 1, 1, L_k)") from None
    return full.unflatten(1, (kv, h // kv)), float(scale)  # (B, kv, g, L_q, L_k)


def _check_saved(d_out: object, out: object, lse: object, q: torch.Tensor, v: torch.Tensor) -> None:
    """The backward's other inputs: ``d_out`` and ``out`` ``(B, h, L_q, d_v)`` in q's dtype and
    device, ``lse (B, h, L_q)``, all as the forward pass made them."""
    where = "flash_attention_backward"
    B, h, L_q = q.shape[:3]
    expected = (B, h, L_q, v.size(-1))
    for name, t, shape in (("d_out", d_out, expected), ("out", out, expected), ("lse", lse, expected[:3])):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: {name} must be a torch.Tensor of shape {shape}, got "
                            f"{type(t).__name__}")
        if tuple(t.shape) != shape:
            what = ("the gradient of the output, shaped as the output" if name == "d_out"
                    else "what flash_attention_forward returned for these q, k, v")
            raise ValueError(f"{where}: {name} must be (B, h, L_q{', d_v' if name != 'lse' else ''}) = "
                             f"{shape}, {what}; got {tuple(t.shape)}")
        if not t.is_floating_point() or t.device != q.device:
            raise TypeError(f"{where}: {name} must be a floating-point tensor on {q.device}, got "
                            f"{t.dtype} on {t.device}")
    for name, t in (("d_out", d_out), ("out", out)):
        if t.dtype != q.dtype:
            raise TypeError(f"{where}: {name} must have the inputs' dtype {q.dtype}, got {t.dtype}; "
                            f"convert it with .to({q.dtype})")


def _allowed(mask5: torch.Tensor | None, is_causal: bool, i0: int, i1: int, j0: int, j1: int,
             device: torch.device) -> torch.Tensor | None:
    """Bool ``(..., i1-i0, j1-j0)``: which keys of tile j each query of tile i may see, or None (all)."""
    allowed = None if mask5 is None else mask5[..., i0:i1, j0:j1]
    if is_causal and j1 - 1 > i0:  # the tile crosses the diagonal: some of it is in the future
        rows = torch.arange(i0, i1, device=device)[:, None]
        cols = torch.arange(j0, j1, device=device)[None, :]
        causal = rows >= cols  # (bq, bk)
        allowed = causal if allowed is None else allowed & causal
    return allowed


def _skipped(is_causal: bool, i1: int, j0: int) -> bool:
    """True if causal attention hides the whole tile: its first key is after its last query."""
    return is_causal and j0 > i1 - 1


def flash_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
    is_causal: bool = False, scale: float | None = None, block_q: int = 64, block_k: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-2's forward pass (Algorithm 1), one tile of scores at a time.

    ``q (B, h, L_q, d)``, ``k (B, kv, L_k, d)``, ``v (B, kv, L_k, d_v)`` -> ``(out (B, h, L_q, d_v),
    lse (B, h, L_q))``, where ``lse`` is the log-sum-exp of each query's scaled, masked scores
    (float32 for bf16/fp16 inputs). Block sizes need not divide the lengths. Without gradients;
    ``flash_attention`` adds them.
    """
    mask5, scale = _prepare(q, k, v, mask, scale, block_q, block_k, is_causal)
    B, h, L_q, _ = q.shape
    kv, L_k, d_v = k.size(1), k.size(2), v.size(-1)
    acc = _accumulation_dtype(q.dtype)  # float32 for bf16/fp16 inputs: m, ell, o and the scores
    q5 = q.unflatten(1, (kv, h // kv))  # (B, h, L_q, d) -> (B, kv, g, L_q, d): a group per KV head
    k5, v5 = k.unsqueeze(2), v.unsqueeze(2)  # (B, kv, 1, L_k, d): shared by the group
    out = q.new_zeros(B, kv, h // kv, L_q, d_v)  # the input dtype
    lse = q.new_full((B, kv, h // kv, L_q), _NEG_INF, dtype=acc)
    with torch.no_grad():
        for i0, i1 in _tiles(L_q, block_q):
            q_i = q5[..., i0:i1, :].to(acc)  # (a no-op in float32 and float64)
            m = q.new_full((*q_i.shape[:-1],), _NEG_INF, dtype=acc)  # (B, kv, g, bq)
            ell = q.new_zeros(m.shape, dtype=acc)
            o = q.new_zeros(*m.shape, d_v, dtype=acc)  # (B, kv, g, bq, d_v)
            for j0, j1 in _tiles(L_k, block_k):
                if _skipped(is_causal, i1, j0):
                    break  # this tile and every later one lie wholly in the future
                allowed = _allowed(mask5, is_causal, i0, i1, j0, j1, q.device)
                if allowed is not None and not allowed.any():
                    continue  # nothing to see in this tile
                s = q_i @ k5[..., j0:j1, :].to(acc).transpose(-2, -1) * scale  # (B, kv, g, bq, bk)   1
                if allowed is not None:
                    s = s.masked_fill(~allowed, _NEG_INF)
                m_new = torch.maximum(m, s.amax(dim=-1))  # 2
                m_safe = torch.where(m_new == _NEG_INF, 0.0, m_new)  # a row with no key yet
                p = torch.exp(s - m_safe[..., None])  # 3 (hidden keys: exp(-inf) = 0)
                alpha = torch.exp(m - m_safe)  # how much the old state shrinks
                ell = alpha * ell + p.sum(dim=-1)  # 4
                o = alpha[..., None] * o + p @ v5[..., j0:j1, :].to(acc)  # 5
                m = m_new  # 6
            seen = ell > 0  # False: the query may attend to no key
            out[..., i0:i1, :] = torch.where(seen[..., None], o / torch.where(seen, ell, 1.0)[..., None],
                                             0.0).to(out.dtype)  # 7, back to the input dtype
            lse[..., i0:i1] = torch.where(seen, m + torch.log(torch.where(seen, ell, 1.0)), _NEG_INF)
    return out.flatten(1, 2), lse.flatten(1, 2)  # (B, h, L_q, d_v), (B, h, L_q)


def flash_backward_tile(
    q_i: torch.Tensor, k_j: torch.Tensor, v_j: torch.Tensor, d_out_i: torch.Tensor,
    lse_i: torch.Tensor, D_i: torch.Tensor, scale: float, allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One tile of FlashAttention-2's backward pass (Algorithm 2, steps 1-5): what the query tile
    ``i`` and the key tile ``j`` add to dQ_i, dK_j and dV_j.

    ``q_i (..., bq, d)``, ``k_j (..., bk, d)``, ``v_j (..., bk, d_v)``, ``d_out_i (..., bq, d_v)``
    the output's gradient, ``lse_i (..., bq)`` the forward's log-sum-exp (0 in a row that sees no
    key), ``D_i (..., bq)`` = rowsum(dO_i ∘ O_i), ``allowed`` bool ``(..., bq, bk)`` or None (all
    keys visible); leading dimensions broadcast. Returns ``(dq_i (..., bq, d), dk_j (..., bk, d),
    dv_j (..., bk, d_v))``, with the broadcast leading dimensions (the caller sums a group's heads).
    P is recomputed from S and L: no state from other tiles is needed.
    """
    s = q_i @ k_j.transpose(-2, -1) * scale  # (..., bq, bk)
    if allowed is not None:
        s = s.masked_fill(~allowed, _NEG_INF)
    p = torch.exp(s - lse_i[..., None])  # 1: the softmax's probabilities, from L (hidden keys: 0)
    dv_j = p.transpose(-2, -1) @ d_out_i  # 2: (..., bk, d_v)
    dp = d_out_i @ v_j.transpose(-2, -1)  # 3: (..., bq, bk)
    ds = p * (dp - D_i[..., None])  # 4: the softmax's backward, D for the row sums of P ∘ dP
    dq_i = ds @ k_j * scale  # 5: (..., bq, d)
    dk_j = ds.transpose(-2, -1) @ q_i * scale  # (..., bk, d)
    return dq_i, dk_j, dv_j


def flash_backward_tile_at(
    q_i: torch.Tensor, k_j: torch.Tensor, v_j: torch.Tensor, d_out_i: torch.Tensor,
    lse_i: torch.Tensor, D_i: torch.Tensor, scale: float, i0: int = 0, j0: int = 0,
    is_causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``flash_backward_tile`` for the tile whose first query is at position ``i0`` and first key at
    ``j0``: under ``is_causal`` query ``i0 + r`` sees key ``j0 + c`` if ``j0 + c <= i0 + r`` (SDPA's
    alignment). Shapes as ``flash_backward_tile``: ``q_i (..., bq, d)`` ... ; lesson 13's exercise's
    signature."""
    _check_is_causal(is_causal, "flash_backward_tile_at")
    allowed = None
    if is_causal:
        rows = torch.arange(i0, i0 + q_i.size(-2), device=q_i.device)  # (bq,) query positions
        cols = torch.arange(j0, j0 + k_j.size(-2), device=q_i.device)  # (bk,) key positions
        allowed = cols[None, :] <= rows[:, None]  # (bq, bk)
    return flash_backward_tile(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, allowed)


def flash_attention_backward(
    d_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, mask: torch.Tensor | None = None, is_causal: bool = False,
    scale: float | None = None, block_q: int = 64, block_k: int = 64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention-2's backward pass (Algorithm 2): ``(dq, dk, dv)``, shaped as ``q, k, v``.

    ``d_out (B, h, L_q, d_v)`` is the gradient of the output; ``out (B, h, L_q, d_v)`` and
    ``lse (B, h, L_q)`` are what ``flash_attention_forward`` returned. The probabilities are
    recomputed tile by tile from ``q``, ``k`` and ``lse``; the gradients of a group's query heads
    add up in their KV head. bf16/fp16 inputs: D, dQ, dK and dV accumulate in float32, and the
    gradients are cast back to the inputs' dtype.
    """
    mask5, scale = _prepare(q, k, v, mask, scale, block_q, block_k, is_causal)
    _check_saved(d_out, out, lse, q, v)
    h, kv, L_q, L_k = q.size(1), k.size(1), q.size(2), k.size(2)
    g = h // kv
    acc = _accumulation_dtype(q.dtype)  # float32 for bf16/fp16 inputs
    q5, d_out5 = q.unflatten(1, (kv, g)), d_out.unflatten(1, (kv, g))  # (B, kv, g, L_q, .)
    lse5 = lse.unflatten(1, (kv, g)).to(acc)  # (B, kv, g, L_q)
    lse5 = torch.where(lse5 == _NEG_INF, 0.0, lse5)  # a row that sees nothing: all its P are 0
    D = (d_out5.to(acc) * out.unflatten(1, (kv, g)).to(acc)).sum(dim=-1)  # (B, kv, g, L_q): rowsum(dO ∘ O)
    dq = torch.zeros_like(q5, dtype=acc)
    dk, dv = torch.zeros_like(k, dtype=acc), torch.zeros_like(v, dtype=acc)
    with torch.no_grad():
        for j0, j1 in _tiles(L_k, block_k):
            k_j, v_j = k[:, :, None, j0:j1].to(acc), v[:, :, None, j0:j1].to(acc)  # (B, kv, 1, bk, .)
            for i0, i1 in _tiles(L_q, block_q):
                if _skipped(is_causal, i1, j0):
                    continue  # queries before this tile's first key
                allowed = _allowed(mask5, is_causal, i0, i1, j0, j1, q.device)
                if allowed is not None and not allowed.any():
                    continue
                q_i, d_out_i = q5[..., i0:i1, :].to(acc), d_out5[..., i0:i1, :].to(acc)
                dq_i, dk_j, dv_j = flash_backward_tile(q_i, k_j, v_j, d_out_i, lse5[..., i0:i1],
                                                       D[..., i0:i1], scale, allowed)  # 1-5
                dq[..., i0:i1, :] += dq_i
                dk[:, :, j0:j1] += dk_j.sum(dim=2)  # (B, kv, g, bk, d): the group adds up
                dv[:, :, j0:j1] += dv_j.sum(dim=2)
    return dq.flatten(1, 2).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class FlashAttention(torch.autograd.Function):
    """Autograd for the tiled passes: saves ``q, k, v, out`` and the log-sum-exp, nothing ``L²``."""

    @staticmethod
    def forward(ctx, q, k, v, mask, is_causal, scale, block_q, block_k):  # noqa: ANN001, ANN205
        out, lse = flash_attention_forward(q, k, v, mask, is_causal, scale, block_q, block_k)
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.options = (is_causal, scale, block_q, block_k)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):  # noqa: ANN001, ANN205, ARG004 (lse gets no gradient)
        q, k, v, out, lse, mask = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(d_out.contiguous(), q, k, v, out, lse, mask, *ctx.options)
        return dq, dk, dv, None, None, None, None, None


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
    is_causal: bool = False, scale: float | None = None, block_q: int = 64, block_k: int = 64,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention as ``F.scaled_dot_product_attention`` computes it, forward and backward by tiles.

    ``q (B, h, L_q, d)``, ``k (B, kv, L_k, d)``, ``v (B, kv, L_k, d_v)`` -> ``(B, h, L_q, d_v)``
    (and the log-sum-exp ``(B, h, L_q)`` with ``return_lse``). See the module's docstring.
    """
    out, lse = FlashAttention.apply(q, k, v, mask, is_causal, scale, block_q, block_k)
    return (out, lse) if return_lse else out


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
) -> torch.Tensor:
    """Lesson 01's attention on ``(B, h, L, d)`` heads, the whole ``(L, L)`` score matrix at once:
    the baseline whose memory lesson 13 measures. Autograd keeps the scores' softmax for backward."""
    from .attention import scaled_dot_product_attention
    from .masks import causal_mask

    _check_is_causal(is_causal, "naive_attention")
    mask = causal_mask(q.size(-2), q.device) if is_causal else None
    return scaled_dot_product_attention(q, k, v, mask)[0]


def attention_io_bytes(L: int, head_dim: int, method: str, block: int = 256,
                       bytes_per_number: int = 4) -> int:
    """Bytes one head's attention forward pass reads and writes in slow memory (a GPU's HBM).

    Counted as FlashAttention's paper counts (Dao et al., 2022, Theorem 2: standard attention
    Θ(L·d + L²), FlashAttention Θ(L²·d²/M) for a fast memory of M numbers), with ``L`` queries and
    keys, ``d = head_dim`` (for q, k, v and the output), no mask:

    * ``"standard"`` (the paper's Algorithm 0): read Q, K, write S; read S, write P; read P and V,
      write O: ``4·L·d + 4·L²`` numbers.
    * ``"flash"`` (FlashAttention-2's forward, tiles of ``block`` queries and keys): read each query
      tile once and all of K and V once per query tile; write O and the log-sum-exp:
      ``L·d + ⌈L/block⌉·2·L·d + L·d + L`` numbers. The block must fit in the fast memory:
      ``block ≈ M / (4·d)`` gives the theorem's Θ(L²·d²/M).

    Returns the number of bytes (``bytes_per_number`` each: 4 for float32).
    """
    for name, value in (("L", L), ("head_dim", head_dim), ("block", block),
                        ("bytes_per_number", bytes_per_number)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"attention_io_bytes: {name} must be an int >= 1, got {value!r}")
    if method == "standard":
        numbers = 4 * L * head_dim + 4 * L * L
    elif method == "flash":
        query_tiles = -(-L // block)  # ⌈L / block⌉
        numbers = L * head_dim + query_tiles * 2 * L * head_dim + L * head_dim + L
    else:
        raise ValueError(f"attention_io_bytes: method must be 'standard' or 'flash', got {method!r}")
    return numbers * bytes_per_number
