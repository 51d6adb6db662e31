"""A variable-length toy task for generation (lesson 07): copy or reverse, with an end symbol.

Ids: ``0 = <pad>``, ``1 = <sos>`` (decoder start), ``2 = <eos>`` (end of output), ``3 ..
vocab_size-1`` data symbols. A source is 1 to ``max_len`` symbols, padded on the right; the target
is the same symbols (reversed if ``reverse``) followed by ``<eos>``. A decoder must therefore decide
*when to stop*, which the fixed-length copy task of lesson 06 never asks.
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
        num_heldout: size of the held-out set.
        seed: seeds the held-out set; training batches use the generator they are given.
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
        self.vocab_size, self.min_len, self.max_len, self.reverse = (
            vocab_size,
            min_len,
            max_len,
            reverse,
        )
        gen = torch.Generator().manual_seed(seed)
        self.heldout = self.sample(num_heldout, gen)  # list of 1-D tensors
        self.heldout_src, self.heldout_tgt_in, self.heldout_tgt_out = self.make_batch(self.heldout)

    def sample(self, n: int, generator: torch.Generator) -> list[torch.Tensor]:
        """``n`` random sources (1-D tensors of data symbols, random lengths)."""
        lengths = torch.randint(self.min_len, self.max_len + 1, (n,), generator=generator)
        return [
            torch.randint(3, self.vocab_size, (int(n_i),), generator=generator) for n_i in lengths
        ]

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
        """A fresh random batch ``(src, tgt_in, tgt_out)``."""
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
