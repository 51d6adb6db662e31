"""Translation-shaped data (lesson 08): character vocabularies, padded pair batches, TSV files.

``CharVocab`` gives the source and the target their own character vocabularies (lesson 09's
language model uses it too, without specials), ``make_translation_batch`` pads both sides, and
``read_tsv_pairs`` reads any corpus of sentence pairs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .copy_task import EOS, PAD, SOS, UNK, pad_sequences

__all__ = ["CharVocab", "TranslationBatch", "make_translation_batch", "read_tsv_pairs", "write_tsv_pairs"]

# ==============================================================================================
# Translation-shaped data (lesson 08): character vocabularies, padded pair batches, TSV files,
# and a date-normalisation corpus generated offline ("3rd of March 2024" -> "2024-03-03").
# ==============================================================================================


class CharVocab:
    """Character-level vocabulary: ``<pad>=0, <sos>=1, <eos>=2`` (and ``<unk>=3`` if ``unk``), then
    characters. With ``specials=False`` (a language model, lesson 09) only the characters (and
    ``<unk>`` if asked): ``pad_id``, ``sos_id`` and ``eos_id`` are then None.

    Without ``unk`` an unknown character is an error that names it, instead of silently becoming
    ``<unk>``: on a closed corpus (like the dates) an unknown character means the data or the
    vocabulary is wrong.
    """

    def __init__(self, chars: Iterable[str], unk: bool = False, specials: bool = True) -> None:
        self.has_unk = unk
        self.has_specials = specials
        self.itos: list[str] = ([PAD, SOS, EOS] if specials else []) + ([UNK] if unk else [])
        for ch in chars:
            if len(ch) != 1:
                raise ValueError(f"CharVocab: every entry must be one character, got {ch!r}")
            if ch not in self.itos:
                self.itos.append(ch)
        self.stoi = {tok: i for i, tok in enumerate(self.itos)}

    @classmethod
    def build(cls, texts: Iterable[str], unk: bool = False, specials: bool = True) -> "CharVocab":
        """Every character that occurs in ``texts``, in sorted order (so the ids never depend on
        order)."""
        return cls(sorted({ch for text in texts for ch in text}), unk=unk, specials=specials)

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, ch: str) -> bool:
        return ch in self.stoi

    @property
    def pad_id(self) -> int | None:
        return 0 if self.has_specials else None

    @property
    def sos_id(self) -> int | None:
        return 1 if self.has_specials else None

    @property
    def eos_id(self) -> int | None:
        return 2 if self.has_specials else None

    @property
    def unk_id(self) -> int | None:
        return self.stoi[UNK] if self.has_unk else None

    @property
    def chars(self) -> list[str]:
        """The characters, without the special tokens."""
        return [t for t in self.itos if t not in (PAD, SOS, EOS, UNK)]

    def unknown(self, text: str) -> list[str]:
        """The characters of ``text`` that are not in the vocabulary, in order of first
        appearance."""
        return list(dict.fromkeys(ch for ch in text if ch not in self.stoi))

    def encode(self, text: str, where: str = "") -> list[int]:
        """Text -> ids, one per character (no specials added). Unknown characters: ``<unk>`` or an
        error."""
        missing = self.unknown(text)
        if missing and not self.has_unk:
            shown = ", ".join(f"{ch!r} (U+{ord(ch):04X})" for ch in missing)
            raise ValueError(
                f"CharVocab.encode{' (' + where + ')' if where else ''}: {text!r} contains "
                f"{'a character' if len(missing) == 1 else 'characters'} not in the vocabulary: "
                f"{shown}. "
                "This vocabulary has no <unk>: build it over all your data (CharVocab.build) or "
                "pass unk=True."
            )
        unk = self.unk_id
        return [self.stoi.get(ch, unk) for ch in text]  # type: ignore[misc]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Ids -> text; stops at ``<eos>`` and drops ``<pad>``/``<sos>`` when ``skip_special``."""
        out = []
        for i in ids:
            if not 0 <= int(i) < len(self.itos):
                raise ValueError(f"CharVocab.decode: id {int(i)} is outside the vocabulary "
                                 f"(0 .. {len(self.itos) - 1})")
            tok = self.itos[int(i)]
            if skip_special and tok == EOS:
                break
            if skip_special and tok in (PAD, SOS):
                continue
            out.append(tok)
        return "".join(out)


@dataclass
class TranslationBatch:
    """A padded batch of (source, target) pairs for teacher forcing; pad id 0 on both sides.

    src:     ``(B, L_s)``     source ids, right-padded
    tgt_in:  ``(B, L_t)``     decoder input = ``<sos>`` + target, right-padded
    tgt_out: ``(B, L_t)``     labels        = target + ``<eos>``, right-padded
    (``L_t`` = longest target + 1.)
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    pad_id: int = 0

    @property
    def src_mask(self) -> torch.Tensor:
        """Source padding mask ``(B, 1, L_s)`` for the encoder and cross-attention (True = real
        token)."""
        return (self.src != self.pad_id).unsqueeze(1)

    @property
    def tgt_mask(self) -> torch.Tensor:
        """Decoder self-attention mask ``(B, L_t, L_t)``: padding AND causal."""
        causal = torch.ones(self.tgt_in.size(1), self.tgt_in.size(1), dtype=torch.bool).tril()
        return (self.tgt_in != self.pad_id).unsqueeze(1) & causal

    @property
    def label_mask(self) -> torch.Tensor:
        """``(B, L_t)``: True where a label counts in the loss (not padding)."""
        return self.tgt_out != self.pad_id


def make_translation_batch(
    pairs: Sequence[Sequence[str]], src_vocab: CharVocab, tgt_vocab: CharVocab
) -> TranslationBatch:
    """``[(source, target), ...]`` -> ``TranslationBatch`` (each pair's first two items are
    used)."""
    if len(pairs) == 0:
        raise ValueError("make_translation_batch: got no pairs")
    if src_vocab.pad_id != tgt_vocab.pad_id:
        raise ValueError("make_translation_batch: the two vocabularies must share the pad id")
    src = [src_vocab.encode(p[0], where=f"pair {i}, source") for i, p in enumerate(pairs)]
    tgt = [tgt_vocab.encode(p[1], where=f"pair {i}, target") for i, p in enumerate(pairs)]
    pad = src_vocab.pad_id
    return TranslationBatch(
        src=pad_sequences(src, pad),
        tgt_in=pad_sequences([[tgt_vocab.sos_id, *t] for t in tgt], pad),  # the one shift
        tgt_out=pad_sequences([[*t, tgt_vocab.eos_id] for t in tgt], pad),
        pad_id=pad,
    )


# ----------------------------------------------------------------------------------------------
# TSV files of sentence pairs
# ----------------------------------------------------------------------------------------------


def read_tsv_pairs(
    path: str | Path, src_vocab: CharVocab | None = None, tgt_vocab: CharVocab | None = None
) -> list[tuple[str, str]]:
    """Read ``source<TAB>target`` lines (UTF-8) into a list of pairs.

    Any corpus of sentence pairs works. Errors name the line: an empty line, a line without exactly
    one tab (two columns), an empty column, or (when vocabularies are given) a character that a
    vocabulary without ``<unk>`` does not know. A final newline and Windows line ends are fine.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    if not lines:
        raise ValueError(
            f"read_tsv_pairs: {path.name} is empty; expected lines of source<TAB>target"
        )
    pairs = []
    for number, line in enumerate(lines, start=1):
        line = line.removesuffix("\r")
        where = f"{path.name}, line {number}"
        if line.strip() == "":
            raise ValueError(
                f"read_tsv_pairs: {where} is empty; every line must be source<TAB>target "
                "(remove blank lines)"
            )
        columns = line.split("\t")
        if len(columns) != 2:
            raise ValueError(
                f"read_tsv_pairs: {where} has {len(columns)} "
                f"column{'s' if len(columns) != 1 else ''} "
                f"({len(columns) - 1} tabs), expected 2 (source<TAB>target): {line!r}"
            )
        for name, col in zip(("source", "target"), columns):
            if col.strip() == "":
                raise ValueError(f"read_tsv_pairs: {where} has an empty {name}: {line!r}")
        for name, col, vocab in (
            ("source", columns[0], src_vocab),
            ("target", columns[1], tgt_vocab),
        ):
            if vocab is not None and not vocab.has_unk and vocab.unknown(col):
                shown = ", ".join(f"{ch!r} (U+{ord(ch):04X})" for ch in vocab.unknown(col))
                raise ValueError(
                    f"read_tsv_pairs: {where}: the {name} {col!r} contains characters not in the "
                    f"{name} "
                    f"vocabulary, which has no <unk>: {shown}. Build the vocabulary over this file "
                    "(CharVocab.build) or pass unk=True."
                )
        pairs.append((columns[0], columns[1]))
    return pairs


def write_tsv_pairs(pairs: Iterable[Sequence[str]], path: str | Path) -> Path:
    """Write ``source<TAB>target`` lines (the first two items of each pair); returns the path."""
    lines = []
    for i, p in enumerate(pairs):
        for name, col in zip(("source", "target"), p[:2]):
            if "\t" in col or "\n" in col or "\r" in col or col.strip() == "":
                raise ValueError(
                    f"write_tsv_pairs: pair {i} has a {name} that is empty or holds a tab or "
                    f"newline: {col!r}"
                )
        lines.append(f"{p[0]}\t{p[1]}\n")
    path = Path(path)
    path.write_text("".join(lines), encoding="utf-8")
    return path
