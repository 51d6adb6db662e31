"""Data for the course: the copy task, a tiny word-level text pipeline, and translation pairs.

Copy task (the Annotated Transformer's toy problem): the source is a random sequence of symbols,
the target is the same sequence. Ids: ``0 = <pad>``, ``1 = <sos>`` (start symbol, never a data
symbol, never the pad id), ``2 .. vocab_size-1`` data symbols.

Translation (lesson 08): ``DatesCorpus`` writes dates from 1900 to 2099 in many surface forms
("3rd of March 2024", "Sonntag, 3. März 2024", "3/3/2024", ...) and asks for ISO 8601
("2024-03-03"); ``CharVocab`` gives the source and the target their own character vocabularies,
``make_translation_batch`` pads both sides, and ``read_tsv_pairs`` reads any corpus of sentence
pairs.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

__all__ = [
    "CopyTaskBatch", "CopyTask", "Vocab", "pad_sequences", "PAD", "SOS", "EOS", "UNK",
    "CharVocab", "TranslationBatch", "make_translation_batch", "read_tsv_pairs", "write_tsv_pairs",
    "DATE_FORMATS", "TRAIN_FORMATS", "render_date", "iso_date", "ordinal", "DatePair", "DatesCorpus",
]

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


# ----------------------------------------------------------------------------------------------
# The date corpus
# ----------------------------------------------------------------------------------------------

MONTHS_EN = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
MONTHS_DE = [
    "Januar",
    "Februar",
    "März",
    "April",
    "Mai",
    "Juni",
    "Juli",
    "August",
    "September",
    "Oktober",
    "November",
    "Dezember",
]
MONTHS_DE_ABBR = [
    "Jan",
    "Feb",
    "Mär",
    "Apr",
    "Mai",
    "Jun",
    "Jul",
    "Aug",
    "Sep",
    "Okt",
    "Nov",
    "Dez",
]
WEEKDAYS_EN = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
WEEKDAYS_DE = ["Montag", "Dienstag", "Mittwoch", "Donnerstag", "Freitag", "Samstag", "Sonntag"]


def ordinal(n: int) -> str:
    """1 -> '1st', 2 -> '2nd', 3 -> '3rd', 11 -> '11th', 22 -> '22nd'."""
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th') }"


# Each surface form: name -> function(date) -> text. Weekdays come from the calendar
# (date.weekday()).
DATE_FORMATS: dict[str, Callable[[datetime.date], str]] = {
    "en day month": lambda d: f"{d.day} {MONTHS_EN[d.month - 1]} {d.year}",
    "en month day": lambda d: f"{MONTHS_EN[d.month - 1]} {d.day}, {d.year}",
    "en ordinal": lambda d: f"{ordinal(d.day)} of {MONTHS_EN[d.month - 1]} {d.year}",
    "en weekday": lambda d: (
        f"{WEEKDAYS_EN[d.weekday()]}, {MONTHS_EN[d.month - 1]} {d.day}, {d.year}"
    ),
    "en abbreviated": lambda d: (
        f"{WEEKDAYS_EN[d.weekday()][:3]} {d.day} {MONTHS_EN[d.month - 1][:3]} {d.year}"
    ),
    "de day month": lambda d: f"{d.day}. {MONTHS_DE[d.month - 1]} {d.year}",
    "de weekday": lambda d: (
        f"{WEEKDAYS_DE[d.weekday()]}, {d.day}. {MONTHS_DE[d.month - 1]} {d.year}"
    ),
    "de abbreviated": lambda d: (
        f"{WEEKDAYS_DE[d.weekday()][:2]}, {d.day:02d}. {MONTHS_DE_ABBR[d.month - 1]} {d.year}"
    ),
    "numeric m/d/y": lambda d: f"{d.month}/{d.day}/{d.year}",
    "numeric d.m.y": lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}",
    "numeric y/m/d": lambda d: f"{d.year}/{d.month:02d}/{d.day:02d}",
}
# The last form is left out of training by default: lesson 08 uses it to show what the model does
# not generalise to (the year first, an order it never saw).
TRAIN_FORMATS: tuple[str, ...] = tuple(name for name in DATE_FORMATS if name != "numeric y/m/d")


def render_date(d: datetime.date, fmt: str) -> str:
    """The date ``d`` written in the surface form ``fmt`` (a key of ``DATE_FORMATS``)."""
    if fmt not in DATE_FORMATS:
        raise ValueError(f"render_date: unknown format {fmt!r}; known: {', '.join(DATE_FORMATS)}")
    return DATE_FORMATS[fmt](d)


def iso_date(d: datetime.date) -> str:
    """The target form, ISO 8601: ``2024-03-03``."""
    return d.isoformat()


class DatePair(NamedTuple):
    """One example: ``source`` text, ``target`` ISO date, the surface ``format`` and the
    ``date``."""

    source: str
    target: str
    format: str
    date: datetime.date


class DatesCorpus:
    """Dates from ``first_year`` to ``last_year`` in several surface forms, to ISO 8601.

    The held-out set is chosen **by date**: ``num_heldout`` dates are drawn once (``seed``) and
    never appear in training, in any format. Each held-out date is written in one training format,
    the formats taking turns, so every format has the same share of the held-out set
    (``heldout_pairs(fmt)`` writes all of them in one format instead). The held-out dates depend
    on ``seed`` and ``num_heldout`` only, not on ``formats``: a corpus with more training formats
    (lesson 08 adds the year-first form) is scored on the same unseen dates.

    Vocabularies are separate and character-level: ``src_vocab`` holds every character any format of
    ``DATE_FORMATS`` can produce (the held-out format included), ``tgt_vocab`` the digits and ``-``.
    Neither has ``<unk>``: an unknown character is a bug here, and it raises.
    """

    def __init__(
        self,
        num_heldout: int = 2000,
        seed: int = 0,
        formats: Sequence[str] = TRAIN_FORMATS,
        first_year: int = 1900,
        last_year: int = 2099,
    ) -> None:
        if first_year > last_year or first_year < 1:
            raise ValueError(
                f"DatesCorpus: need 1 <= first_year <= last_year, got {first_year}, {last_year}"
            )
        unknown = [f for f in formats if f not in DATE_FORMATS]
        if unknown or not formats:
            raise ValueError(
                f"DatesCorpus: formats must be a non-empty list of DATE_FORMATS keys, got "
                f"{unknown or formats}"
            )
        self.formats = tuple(formats)
        self.first = datetime.date(first_year, 1, 1)
        self.last = datetime.date(last_year, 12, 31)
        self.num_days = (self.last - self.first).days + 1
        if not 0 < num_heldout < self.num_days:
            raise ValueError(
                f"DatesCorpus: num_heldout must be in [1, {self.num_days - 1}], got {num_heldout}"
            )
        gen = torch.Generator().manual_seed(seed)
        order = torch.randperm(self.num_days, generator=gen)
        self._heldout_days = order[:num_heldout].sort().values  # day offsets from self.first
        self._train_days = order[num_heldout:].sort().values
        self.heldout_dates = [self._date(int(i)) for i in self._heldout_days]
        self._heldout_set = set(self.heldout_dates)
        # the held-out dates in a seeded shuffled order, each in one format, formats taking turns
        shuffled = torch.randperm(num_heldout, generator=gen).tolist()
        self.heldout: list[DatePair] = [None] * num_heldout  # type: ignore[list-item]
        for rank, i in enumerate(shuffled):
            self.heldout[i] = self.pair(
                self.heldout_dates[i], self.formats[rank % len(self.formats)]
            )
        self.src_vocab = CharVocab.build(self._all_source_characters())
        self.tgt_vocab = CharVocab.build("0123456789-")

    @staticmethod
    def _all_source_characters() -> set[str]:
        words = (
            MONTHS_EN + MONTHS_DE + MONTHS_DE_ABBR + WEEKDAYS_EN + WEEKDAYS_DE + ["st nd rd th of"]
        )
        return {ch for w in words for ch in w} | set("0123456789 ,./")

    def _date(self, offset: int) -> datetime.date:
        return self.first + datetime.timedelta(days=offset)

    @staticmethod
    def pair(d: datetime.date, fmt: str) -> DatePair:
        return DatePair(render_date(d, fmt), iso_date(d), fmt, d)

    def is_heldout(self, d: datetime.date) -> bool:
        return d in self._heldout_set

    def heldout_pairs(self, fmt: str | None = None) -> list[DatePair]:
        """The held-out set: as drawn (``fmt=None``), or every held-out date written in ``fmt``."""
        if fmt is None:
            return list(self.heldout)
        return [self.pair(d, fmt) for d in self.heldout_dates]

    def sample_pairs(self, n: int, generator: torch.Generator) -> list[DatePair]:
        """``n`` random training pairs: a date that is not held out, in a random training format."""
        if n < 1:
            raise ValueError(f"DatesCorpus.sample_pairs: n must be >= 1, got {n}")
        days = self._train_days[torch.randint(len(self._train_days), (n,), generator=generator)]
        fmts = torch.randint(len(self.formats), (n,), generator=generator)
        return [self.pair(self._date(int(d)), self.formats[int(f)]) for d, f in zip(days, fmts)]

    def batch(self, pairs: Sequence[Sequence[str]]) -> TranslationBatch:
        """Padded batch of pairs with this corpus's vocabularies."""
        return make_translation_batch(pairs, self.src_vocab, self.tgt_vocab)

    def train_batch(self, batch_size: int, generator: torch.Generator) -> TranslationBatch:
        """A fresh batch of ``batch_size`` random training pairs."""
        return self.batch(self.sample_pairs(batch_size, generator))
