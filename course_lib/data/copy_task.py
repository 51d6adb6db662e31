"""The copy task (lesson 06) and a tiny word-level vocabulary.

Copy task (the Annotated Transformer's toy problem): the source is a random sequence of symbols,
the target is the same sequence. Ids: ``0 = <pad>``, ``1 = <sos>`` (start symbol, never a data
symbol, never the pad id), ``2 .. vocab_size-1`` data symbols.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["PAD", "SOS", "EOS", "UNK", "CopyTaskBatch", "CopyTask", "Vocab", "pad_sequences"]

PAD, SOS, EOS, UNK = "<pad>", "<sos>", "<eos>", "<unk>"


@dataclass
class CopyTaskBatch:
    """One batch for teacher forcing.

    src:       ``(B, L)`` the sequence to copy
    tgt_in:    ``(B, L)`` decoder input  = ``<sos>`` + ``src[:, :-1]`` (shifted right once)
    tgt_out:   ``(B, L)`` labels         = ``src``
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor


class CopyTask:
    """Random copy-task sequences with a fixed held-out set that training never sees.

    Args:
        vocab_size: total ids including pad and sos (11: pad, sos and 9 data symbols).
        seq_len: length of each sequence.
        num_heldout: size of the held-out set.
        seed: seeds the held-out set; training batches use their own generator.
    """

    pad_id = 0
    sos_id = 1

    def __init__(self, vocab_size: int = 11, seq_len: int = 10, num_heldout: int = 1000, seed: int = 1234) -> None:
        if vocab_size < 3:
            raise ValueError(f"CopyTask: vocab_size must be >= 3 (pad, sos, one symbol), got {vocab_size}")
        if seq_len < 1:
            raise ValueError(f"CopyTask: seq_len must be >= 1, got {seq_len}")
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        gen = torch.Generator().manual_seed(seed)
        self.heldout = self._sample(num_heldout, gen).unique(dim=0)  # (N, L), duplicates removed
        self._heldout_keys = {tuple(row.tolist()) for row in self.heldout}

    def _sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return torch.randint(2, self.vocab_size, (n, self.seq_len), generator=generator)

    def make_batch(self, src: torch.Tensor) -> CopyTaskBatch:
        """Teacher-forcing batch for the sequences ``src (B, L)``."""
        sos = torch.full((src.size(0), 1), self.sos_id, dtype=src.dtype)
        tgt_in = torch.cat([sos, src[:, :-1]], dim=1)  # the ONE shift: labels stay = src
        return CopyTaskBatch(src=src, tgt_in=tgt_in, tgt_out=src.clone())

    def train_batch(self, batch_size: int, generator: torch.Generator) -> CopyTaskBatch:
        """A fresh random batch; any row that happens to be a held-out sequence is redrawn."""
        if batch_size < 1:
            raise ValueError(f"CopyTask.train_batch: batch_size must be >= 1, got {batch_size}")
        src = self._sample(batch_size, generator)
        for i, row in enumerate(src.tolist()):  # one tolist() for the batch, not one per row
            while tuple(row) in self._heldout_keys:
                src[i] = self._sample(1, generator)[0]
                row = src[i].tolist()
        return self.make_batch(src)

    def is_heldout(self, seq: torch.Tensor) -> bool:
        """True if the 1-D sequence ``seq`` is in the held-out set."""
        return tuple(seq.tolist()) in self._heldout_keys


def pad_sequences(seqs: Sequence[Sequence[int]], pad_id: int, length: int | None = None) -> torch.Tensor:
    """Right-pad lists of ids to one length. Returns ``(B, length or longest)`` long tensor."""
    if len(seqs) == 0:
        raise ValueError("pad_sequences: got an empty list of sequences")
    longest = max(len(s) for s in seqs)
    length = longest if length is None else length
    if longest > length:
        raise ValueError(f"pad_sequences: a sequence has {longest} ids, longer than length={length}")
    # Pad in Python, then one tensor: a tensor per row cost lesson 08 a tenth of each training step.
    rows = [[int(i) for i in s] + [pad_id] * (length - len(s)) for s in seqs]
    return torch.tensor(rows, dtype=torch.long)


class Vocab:
    """Word-level vocabulary with the special tokens ``<pad>=0, <sos>=1, <eos>=2, <unk>=3``.

    ``Vocab.build(["a small text", ...])`` lowercases and splits on whitespace.
    """

    specials = (PAD, SOS, EOS, UNK)

    def __init__(self, tokens: Iterable[str]) -> None:
        self.itos: list[str] = list(self.specials)
        for tok in tokens:
            if tok not in self.specials and tok not in self.itos:
                self.itos.append(tok)
        self.stoi = {tok: i for i, tok in enumerate(self.itos)}

    @classmethod
    def build(cls, sentences: Iterable[str]) -> "Vocab":
        words = sorted({w for s in sentences for w in cls.tokenize(s)})
        return cls(words)

    @staticmethod
    def tokenize(sentence: str) -> list[str]:
        return sentence.lower().split()

    def __len__(self) -> int:
        return len(self.itos)

    @property
    def pad_id(self) -> int:
        return self.stoi[PAD]

    @property
    def sos_id(self) -> int:
        return self.stoi[SOS]

    @property
    def eos_id(self) -> int:
        return self.stoi[EOS]

    def encode(self, sentence: str, add_special: bool = True) -> list[int]:
        """Sentence -> ids, unknown words -> ``<unk>``; with ``add_special``: ``<sos> ... <eos>``."""
        ids = [self.stoi.get(w, self.stoi[UNK]) for w in self.tokenize(sentence)]
        return [self.sos_id, *ids, self.eos_id] if add_special else ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Ids -> sentence; stops at ``<eos>`` and drops specials when ``skip_special``."""
        words = []
        for i in ids:
            tok = self.itos[int(i)]
            if skip_special and tok == EOS:
                break
            if skip_special and tok in self.specials:
                continue
            words.append(tok)
        return " ".join(words)

    def encode_batch(self, sentences: Sequence[str], add_special: bool = True) -> torch.Tensor:
        """Several sentences -> padded ``(B, L)`` ids."""
        return pad_sequences([self.encode(s, add_special) for s in sentences], self.pad_id)
