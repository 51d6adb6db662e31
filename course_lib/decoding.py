"""Generating output one token at a time: greedy decoding, beam search and sampling (lessons 06-07).

Every function encodes the source once and then calls the decoder once per new token. With the KV
cache (``Transformer.start_cache`` / ``decode_step``, the default) each step feeds only the newest
token; ``greedy_decode(..., use_cache=False)`` recomputes the whole prefix instead, as lesson 06
does.

Conventions shared by the three functions:

* ``src (B, L_s)`` ids; ``src_mask`` defaults to its padding mask ``(B, 1, L_s)`` (pad =
  ``model.config.pad_id``). Pass it: without it the decoder also attends to the padding.
* The result holds the generated tokens without the start symbol, ``(B, max_len)``. Once a row has
  produced ``end_id``, every later position of that row is ``end_id`` too, and the loop stops as
  soon as every row has finished.
* Put the model in eval mode first (dropout would make every decoding random).
* Which tokens can be generated: ``beam_search`` and ``sample`` never generate ``<pad>``
  (``model.config.pad_id``) or the start symbol ``start_id``; their logits are set to ``-inf``
  (unless one of them is ``end_id``). Neither is ever a right output, yet sampling can draw them
  (with the small probability an imperfect model gives them) and a beam can keep them as
  runners-up. ``greedy_decode`` takes the plain argmax over the whole vocabulary, the definition
  that lessons 06 and 08 build their own loops and checkers on (and that the one-pass exact match
  of ``course_lib.training`` relies on); a trained model never puts <pad> or <sos> first, so the
  two agree there, and ``beam_size=1`` / ``top_k=1`` equal greedy decoding whenever its argmax is
  neither.
* Ties: ``argmax`` takes the lowest id among equal logits, and so do ``filter_logits``'s top-k
  and top-p (a stable sort: among equal logits the lower id ranks first), so ``top_k=1`` keeps
  exactly the token greedy decoding takes. (``torch.topk`` gives no such promise.)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .masks import padding_mask

__all__ = ["greedy_decode", "beam_search", "sample", "filter_logits", "next_token", "length_penalty_factor"]


# --------------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------------


def _check_common(
    where: str, model, src: torch.Tensor, max_len: int, start_id: int, end_id: int | None
):
    if not isinstance(src, torch.Tensor) or src.dim() != 2 or src.numel() == 0:
        shape = tuple(src.shape) if isinstance(src, torch.Tensor) else type(src).__name__
        raise ValueError(f"{where}: src must be a non-empty (B, L_s) tensor of ids, got {shape}")
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(
            f"{where}: max_len must be an int >= 1 (tokens to generate), got {max_len!r}"
        )
    vocab = model.config.tgt_vocab_size
    for name, value in (("start_id", start_id), ("end_id", end_id)):
        if value is None and name == "end_id":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
            raise ValueError(f"{where}: {name} must be a target id in [0, {vocab}), got {value!r}")


def _source(model, src: torch.Tensor, src_mask: torch.Tensor | None, where: str):
    """Encode once: ``memory (B, L_s, d_model)`` and the mask ``(B, 1, L_s)`` used everywhere."""
    if src_mask is None:
        src_mask = padding_mask(src, model.config.pad_id)  # (B, 1, L_s)
    elif src_mask.dtype != torch.bool or src_mask.dim() != 3 or src_mask.size(0) != src.size(0):
        raise ValueError(
            f"{where}: src_mask must be a bool (B, 1, L_s) padding mask with B={src.size(0)}, "
            f"got {src_mask.dtype} {tuple(src_mask.shape)}"
        )
    return model.encode(src, src_mask), src_mask


def _forbidden_ids(model, start_id: int, end_id: int | None, where: str) -> list[int]:
    """Ids that ``beam_search`` and ``sample`` never generate: <pad> and the start symbol."""
    pad_id = getattr(model.config, "pad_id", None)
    ids = sorted({i for i in (pad_id, start_id) if i is not None and i != end_id})
    if len(ids) >= model.config.tgt_vocab_size:
        raise ValueError(
            f"{where}: the target vocabulary ({model.config.tgt_vocab_size} ids) has no token "
            f"besides <pad> and the start symbol {ids}"
        )
    return ids


def _finish(next_id: torch.Tensor, finished: torch.Tensor, end_id: int | None) -> torch.Tensor:
    """A finished row keeps producing ``end_id``; mark rows that produce it now (in place)."""
    if end_id is None:
        return next_id
    next_id = next_id.masked_fill(finished, end_id)
    finished |= next_id == end_id
    return next_id


def _pad_to(ys: torch.Tensor, max_len: int, fill: int | None) -> torch.Tensor:
    """``(B, T) -> (B, max_len)``: a loop that stopped early (all rows done) fills ``end_id``."""
    if ys.size(1) < max_len:
        ys = F.pad(ys, (0, max_len - ys.size(1)), value=fill)
    return ys


# --------------------------------------------------------------------------------------------
# greedy
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def greedy_decode(
    model: torch.nn.Module,
    src: torch.Tensor,
    max_len: int,
    start_id: int,
    end_id: int | None = None,
    src_mask: torch.Tensor | None = None,
    use_cache: bool = True,
) -> torch.Tensor:
    """Decode ``src`` with a ``course_lib.Transformer``, always taking the most likely next token.

    The plain argmax over the whole vocabulary (lowest id on a tie): unlike ``beam_search`` and
    ``sample``, it does not forbid <pad> and ``start_id`` (see the module docstring).

    Args:
        model: an encoder-decoder with ``encode``, ``decode``, ``generator`` (and ``start_cache`` /
            ``decode_step`` for the cache); put it in eval mode.
        src: ``(B, L_s)`` source ids.
        max_len: number of tokens to generate (at most).
        start_id: the decoder's start symbol.
        end_id: optional end symbol; a row that has produced it is finished (then ``end_id`` only),
            and decoding stops once every row has finished.
        src_mask: source padding mask ``(B, 1, L_s)``; default from ``model.config.pad_id``.
        use_cache: feed only the newest token each step and keep the keys and values of the earlier
            ones (``Transformer.decode_step``). False: recompute the whole prefix at every step.
            Both give the same tokens.

    Returns:
        ``(B, max_len)`` generated ids, without the start symbol.
    """
    _check_common("greedy_decode", model, src, max_len, start_id, end_id)
    # memory (B, L_s, d_model), computed once
    memory, src_mask = _source(model, src, src_mask, "greedy_decode")
    B = src.size(0)
    ys = torch.full((B, 1), start_id, dtype=torch.long, device=src.device)  # (B, 1)
    finished = torch.zeros(B, dtype=torch.bool, device=src.device)
    cache = model.start_cache(memory, src_mask) if use_cache else None
    for _ in range(max_len):
        if use_cache:
            logits = model.decode_step(ys[:, -1], cache)  # only the newest token -> (B, V)
        else:
            hidden = model.decode(ys, memory, src_mask)  # the whole prefix again -> (B, t, d_model)
            logits = model.generator(hidden[:, -1])  # last position only -> (B, V)
        next_id = _finish(logits.argmax(dim=-1), finished, end_id)  # (B,)
        ys = torch.cat([ys, next_id.unsqueeze(1)], dim=1)  # (B, t+1)
        if end_id is not None and finished.all():
            break
    return _pad_to(ys[:, 1:], max_len, end_id)


# --------------------------------------------------------------------------------------------
# beam search
# --------------------------------------------------------------------------------------------


def length_penalty_factor(length: torch.Tensor | int, alpha: float) -> torch.Tensor | float:
    """GNMT's length normalisation (Wu et al., 2016): ``lp(len) = ((5 + len) / 6) ** alpha``.

    A hypothesis is scored ``sum of log-probabilities / lp(len)``, where ``len`` counts the
    generated tokens including ``end_id``. ``alpha = 0`` is the plain sum (which favours short
    outputs, since every token adds a negative log-probability); a larger ``alpha`` favours longer
    ones.
    """
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(
    model: torch.nn.Module,
    src: torch.Tensor,
    max_len: int,
    start_id: int,
    end_id: int,
    beam_size: int = 4,
    length_penalty: float = 0.6,
    src_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the ``beam_size`` best partial outputs per row instead of one; return the best one.

    Every step extends each live beam by every token, scores the candidates with
    ``length_penalty_factor`` (GNMT) and keeps the best ``beam_size`` per row. A beam that produced
    ``end_id`` is finished: it stays in the beam with its score and length frozen, competing with
    the live ones. The search stops when every beam of every row has finished, or after
    ``max_len`` tokens.
    ``<pad>`` and ``start_id`` are never generated (see the module docstring). ``beam_size=1``
    is greedy decoding (as long as greedy decoding does not take <pad> or ``start_id``); a beam
    that keeps every prefix is an exhaustive search over the outputs without them.

    Args:
        model, src, max_len, start_id, end_id, src_mask: as in ``greedy_decode`` (``end_id`` is
            required).
        beam_size: beams kept per row, >= 1.
        length_penalty: GNMT's ``alpha`` >= 0 (0.6 in their paper; 0 = raw log-probability).

    Returns:
        ``(tokens (B, max_len), scores (B,))``: the best sequence per row (``end_id`` after its end)
        and its length-normalised log-probability.
    """
    _check_common("beam_search", model, src, max_len, start_id, end_id)
    if end_id is None:
        raise ValueError("beam_search: end_id is required (beams compete once they have ended)")
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_search: beam_size must be an int >= 1, got {beam_size!r}")
    if not (
        isinstance(length_penalty, (int, float))
        and math.isfinite(length_penalty)
        and length_penalty >= 0
    ):
        raise ValueError(
            "beam_search: length_penalty (alpha) must be a finite number >= 0, got "
            f"{length_penalty!r}"
        )
    forbidden = _forbidden_ids(model, start_id, end_id, "beam_search")
    memory, src_mask = _source(model, src, src_mask, "beam_search")
    B, K, device = src.size(0), beam_size, src.device
    # Each row becomes K beams: (B, ...) -> (B*K, ...), rows b*K .. b*K+K-1 belong to source b.
    cache = model.start_cache(
        memory.repeat_interleave(K, dim=0), src_mask.repeat_interleave(K, dim=0)
    )
    # the last token of each beam, (B*K,)
    tokens = torch.full((B * K,), start_id, dtype=torch.long, device=device)
    seqs = torch.empty(B * K, 0, dtype=torch.long, device=device)  # (B*K, t) generated so far
    logp_sum = torch.zeros(B, K, device=device)
    logp_sum[:, 1:] = float("-inf")  # at the start all K beams are the same: keep only the first
    lengths = torch.zeros(B * K, dtype=torch.long, device=device)
    finished = torch.zeros(B * K, dtype=torch.bool, device=device)
    for _ in range(max_len):
        logp = model.decode_step(tokens, cache).float().log_softmax(dim=-1)  # (B*K, V)
        V = logp.size(-1)
        logp[:, forbidden] = float("-inf")  # never <pad> or the start symbol
        # A finished beam has one continuation, end_id, which costs nothing and adds no length.
        logp[finished] = float("-inf")
        logp[finished, end_id] = 0.0
        candidates = logp_sum.view(-1, 1) + logp  # (B*K, V) summed log-probabilities
        new_lengths = lengths + (~finished).long()  # (B*K,)
        normalised = candidates / length_penalty_factor(new_lengths, length_penalty).unsqueeze(1)
        best, flat = normalised.view(B, K * V).topk(K, dim=-1)  # (B, K) best of K*V per row
        rows = (torch.arange(B, device=device).unsqueeze(1) * K + flat // V).view(-1)  # parent beam
        tokens = (flat % V).view(-1)  # (B*K,) the token each kept beam appends
        logp_sum = candidates.view(B, K * V).gather(1, flat)  # (B, K)
        lengths = new_lengths[rows]
        finished = finished[rows] | (tokens == end_id)
        seqs = torch.cat([seqs[rows], tokens.unsqueeze(1)], dim=1)  # follow the parents, append
        cache = cache.reorder(rows)  # each kept beam continues from its parent's keys and values
        if finished.all():
            break
    scores = logp_sum / length_penalty_factor(lengths.view(B, K), length_penalty)  # (B, K)
    best_score, best_beam = scores.max(dim=-1)  # (B,)
    best_rows = torch.arange(B, device=device) * K + best_beam
    return _pad_to(seqs[best_rows], max_len, end_id), best_score


# --------------------------------------------------------------------------------------------
# sampling
# --------------------------------------------------------------------------------------------


def filter_logits(
    logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Set to ``-inf`` every logit outside the top ``top_k`` and outside the nucleus ``top_p``.

    ``logits (..., V)``; returns a new tensor of the same shape (the kept logits unchanged).

    * top-k keeps exactly ``min(top_k, V)`` tokens per row. Ties are broken toward the lower id
      (a stable sort), as ``argmax`` does, so ``top_k=1`` keeps the argmax and nothing else, even
      when two logits are equal.
    * Nucleus (Holtzman et al., 2020): keep the smallest set of most likely tokens whose
      probabilities add up to at least ``top_p``: in order of decreasing probability (ties: lower
      id first), a token is kept while the mass of the tokens ranked above it is still ``< top_p``.
      The most likely token is always kept; ``top_p=1`` keeps everything.
    """
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"filter_logits: top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0
    ):
        raise ValueError(f"filter_logits: top_p must be None or a number in (0, 1], got {top_p!r}")
    if top_k is not None and top_k < logits.size(-1):
        order = logits.sort(dim=-1, descending=True, stable=True).indices  # ties: lower id first
        drop = torch.ones_like(logits, dtype=torch.bool).scatter(-1, order[..., :top_k], False)
        logits = logits.masked_fill(drop, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
        probs = sorted_logits.softmax(dim=-1)
        # the probability of the tokens ranked above each one
        mass_before = probs.cumsum(dim=-1) - probs
        drop_sorted = mass_before >= top_p  # the nucleus is already complete without this token
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_token(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    greedy: bool = False,
) -> torch.Tensor:
    """One next id per row of ``logits (B, V)``; returns ``(B,)``: the argmax if ``greedy``, else a
    draw from ``softmax(filter_logits(logits / temperature, top_k, top_p))`` with ``generator``
    (a decoder-only model's sampling step: ``GPT.generate``, ``generate_paged``)."""
    if greedy:
        return logits.argmax(dim=-1)
    probs = filter_logits(logits / temperature, top_k, top_p).softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (B, 1) -> (B,)


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    src: torch.Tensor,
    max_len: int,
    start_id: int,
    end_id: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    src_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Draw each next token at random from the model's distribution, reshaped by three knobs.

    Args:
        model, src, max_len, start_id, end_id, src_mask: as in ``greedy_decode``.
        temperature: > 0; the logits are divided by it (< 1 sharpens, > 1 flattens; ~0 = greedy).
        top_k: keep only the k most likely tokens (k >= 1; 1 = greedy; ties as in
            ``filter_logits``).
        top_p: nucleus sampling, in (0, 1]: the most likely tokens whose mass reaches ``top_p``.
        generator: a seeded ``torch.Generator`` makes the draws reproducible.

    ``<pad>`` and ``start_id`` are never drawn (their logits are ``-inf`` before top-k and top-p).

    Returns:
        ``(B, max_len)`` generated ids, without the start symbol.
    """
    _check_common("sample", model, src, max_len, start_id, end_id)
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature <= 0
    ):
        raise ValueError(
            f"sample: temperature must be a finite number > 0, got {temperature!r} "
            "(for temperature -> 0 use greedy_decode, or top_k=1)"
        )
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"sample: top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0
    ):
        raise ValueError(f"sample: top_p must be None or a number in (0, 1], got {top_p!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"sample: generator must be a torch.Generator or None, got {type(generator).__name__}"
        )
    forbidden = _forbidden_ids(model, start_id, end_id, "sample")
    memory, src_mask = _source(model, src, src_mask, "sample")
    B = src.size(0)
    ys = torch.full((B, 1), start_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(B, dtype=torch.bool, device=src.device)
    cache = model.start_cache(memory, src_mask)
    for _ in range(max_len):
        logits = model.decode_step(ys[:, -1], cache).float() / temperature  # (B, V)
        logits[:, forbidden] = float("-inf")  # never <pad> or the start symbol
        probs = filter_logits(logits, top_k, top_p).softmax(dim=-1)
        next_id = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (B,)
        next_id = _finish(next_id, finished, end_id)
        ys = torch.cat([ys, next_id.unsqueeze(1)], dim=1)
        if end_id is not None and finished.all():
            break
    return _pad_to(ys[:, 1:], max_len, end_id)
