"""The variable-length task (lesson 07): copy or reverse, with an end symbol.

Ids: ``0 = <pad>``, ``1 = <sos>`` (decoder start), ``2 = <eos>`` (end of output), ``3 ..
vocab_size-1`` data symbols. A source is 1 to ``max_len`` symbols, padded on the right; the target
is the same symbols (reversed if ``reverse``) followed by ``<eos>``. A decoder must therefore decide
*when to stop*, which the fixed-length copy task of lesson 06 never asks.

The held-out set is fixed by a seed, and ``train_batch`` never returns one of its sequences (a draw
that equals one is replaced by a fresh draw). Short sequences are too few to hold out: with 10 data
symbols there are 10 of length 1, 100 of length 2 and 1,000 of length 3, so holding out ~25 per
length would take a quarter of the length-1 sequences away from training. Held-out sequences
therefore have at least ``heldout_min_len`` = 4 symbols (10,000 possible sequences of length 4, of
which ~30 are held out): training sees every length from ``min_len``, and almost every sequence.
"""

from __future__ import annotations

import torch

__all__ = ["VariableLengthTask"]


class VariableLengthTask:
    """Random sequences of random length, and a fixed held-out set that training never sees.

    Args:
        vocab_size: ids including pad, sos and eos (13 = 10 data symbols).
        min_len, max_len: source lengths, both included.
        reverse: the target is the source reversed (else: copied).
        num_heldout: size of the held-out set (distinct sequences).
        seed: seeds the held-out set; training batches use the generator they are given.
        heldout_min_len: the shortest held-out sequence (default 4, see the module docstring);
            the held-out lengths are ``max(min_len, heldout_min_len) .. max_len``.

    ``train_batch`` draws lengths ``min_len .. max_len`` uniformly and symbols uniformly, and
    replaces any drawn sequence that is in the held-out set by a new draw, so that no held-out
    sequence is ever trained on (``is_heldout`` tells).
    """

    pad_id, sos_id, eos_id = 0, 1, 2

    def __init__(
        self,
        vocab_size: int = 13,
        min_len: int = 1,
        max_len: int = 20,
        reverse: bool = False,
        num_heldout: int = 500,
        seed: int = 1234,
        heldout_min_len: int = 4,
    ) -> None:
        if vocab_size < 4:
            raise ValueError(
                "VariableLengthTask: vocab_size must be >= 4 (pad, sos, eos, a symbol), got "
                f"{vocab_size}"
            )
        if not 1 <= min_len <= max_len:
            raise ValueError(
                f"VariableLengthTask: need 1 <= min_len <= max_len, got {min_len}, {max_len}"
            )
        if not 1 <= heldout_min_len <= max_len:
            raise ValueError(
                f"VariableLengthTask: need 1 <= heldout_min_len <= max_len ({max_len}), got "
                f"{heldout_min_len}"
            )
        if num_heldout < 1:
            raise ValueError(f"VariableLengthTask: num_heldout must be >= 1, got {num_heldout}")
        self.vocab_size, self.min_len, self.max_len, self.reverse = (
            vocab_size,
            min_len,
            max_len,
            reverse,
        )
        self.heldout_min_len = max(min_len, heldout_min_len)
        symbols = vocab_size - 3
        possible = sum(symbols**n for n in range(self.heldout_min_len, max_len + 1))
        if num_heldout > possible // 2:
            raise ValueError(
                f"VariableLengthTask: num_heldout={num_heldout} is more than half of the "
                f"{possible} sequences of lengths {self.heldout_min_len}..{max_len}; training "
                "would lose too many of them. Hold out fewer, or allow longer sequences."
            )
        gen = torch.Generator().manual_seed(seed)
        self.heldout: list[torch.Tensor] = []  # distinct 1-D tensors, in the order drawn
        self._heldout_keys: set[tuple[int, ...]] = set()
        while len(self.heldout) < num_heldout:
            (seq,) = self._draw(1, gen, self.heldout_min_len)
            if tuple(seq.tolist()) not in self._heldout_keys:
                self._heldout_keys.add(tuple(seq.tolist()))
                self.heldout.append(seq)
        self.heldout_src, self.heldout_tgt_in, self.heldout_tgt_out = self.make_batch(self.heldout)

    def _draw(self, n: int, generator: torch.Generator, min_len: int) -> list[torch.Tensor]:
        """``n`` random sources of lengths ``min_len .. max_len`` (1-D tensors of data symbols)."""
        lengths = torch.randint(min_len, self.max_len + 1, (n,), generator=generator)
        return [
            torch.randint(3, self.vocab_size, (int(n_i),), generator=generator) for n_i in lengths
        ]

    def is_heldout(self, seq: torch.Tensor) -> bool:
        """True if the 1-D source ``seq`` (data symbols, no padding) is in the held-out set."""
        if len(seq) < self.heldout_min_len:  # shorter than every held-out sequence
            return False
        return tuple(seq.tolist()) in self._heldout_keys

    def sample(self, n: int, generator: torch.Generator) -> list[torch.Tensor]:
        """``n`` random training sources (lengths ``min_len .. max_len``), none of them held out.

        A draw that equals a held-out sequence is replaced by a new draw.
        """
        seqs = self._draw(n, generator, self.min_len)
        for i in range(n):
            while self.is_heldout(seqs[i]):
                (seqs[i],) = self._draw(1, generator, self.min_len)
        return seqs

    def target(self, seq: torch.Tensor) -> torch.Tensor:
        """The output for one source, without ``<eos>``."""
        return seq.flip(0) if self.reverse else seq

    def make_batch(
        self, seqs: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(src (B, L_s), tgt_in (B, L_t), tgt_out (B, L_t))``, padded with ``pad_id``.

        ``tgt_out`` = target + ``<eos>``; ``tgt_in`` = ``<sos>`` + target (shifted right once).
        """
        B, L = len(seqs), max(len(s) for s in seqs)
        src = torch.full((B, L), self.pad_id, dtype=torch.long)
        tgt_in = torch.full((B, L + 1), self.pad_id, dtype=torch.long)
        tgt_out = torch.full((B, L + 1), self.pad_id, dtype=torch.long)
        for b, seq in enumerate(seqs):
            n, out = len(seq), self.target(seq)
            src[b, :n] = seq
            tgt_in[b, 0], tgt_in[b, 1 : n + 1] = self.sos_id, out
            tgt_out[b, :n], tgt_out[b, n] = out, self.eos_id
        return src, tgt_in, tgt_out

    def train_batch(self, batch_size: int, generator: torch.Generator):
        """A fresh random batch ``(src, tgt_in, tgt_out)`` of training sequences (none held out)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(
                "VariableLengthTask.train_batch: batch_size must be an int >= 1, got "
                f"{batch_size!r}"
            )
        return self.make_batch(self.sample(batch_size, generator))

    def exact_match(self, outputs: torch.Tensor, tgt_out: torch.Tensor | None = None) -> float:
        """Fraction of rows whose output is target + ``<eos>`` (what follows ``<eos>`` is ignored).

        ``outputs (B, T)`` from a decoder; ``tgt_out`` defaults to the held-out targets.
        """
        tgt_out = self.heldout_tgt_out if tgt_out is None else tgt_out
        n = min(outputs.size(1), tgt_out.size(1))
        real = tgt_out != self.pad_id  # (B, L_t): target symbols and <eos>
        if outputs.size(1) < tgt_out.size(1) and real[:, outputs.size(1) :].any(dim=1).any():
            real_cut = real[:, n:].any(dim=1)  # rows whose target does not fit are wrong
        else:
            real_cut = torch.zeros(tgt_out.size(0), dtype=torch.bool)
        ok = ((outputs[:, :n] == tgt_out[:, :n]) | ~real[:, :n]).all(dim=1) & ~real_cut
        return ok.float().mean().item()
