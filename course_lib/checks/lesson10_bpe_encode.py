"""Checker for lesson 10's BPE encoder.

* ``check_bpe_encode(fn)``: ``fn(text, merges) -> list[int]``, encoding by merge rank inside each
  chunk, with a toy trainer's merges and GPT-2's 50,000 (whose results equal ``GPT2Tokenizer``'s);
  then 400 distinct made-up words (" qzv": a space and three letters) in at most 20 times the CPU
  time of course_lib's encoder, and never less than 0.05 s.

``reference_bpe_encode`` lives here on purpose (the tests prove it equal to
``course_lib.tokenization``, whose encoder the learner is refused to call).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..tokenization import merge as reference_merge  # left to right, never overlapping
from .common import CheckFailure, checker
from .lesson10_tokenization import (
    FETCH, allowed_helpers, budget_in_words, collector_paused, gpt2_chunks, id_list, in_seconds,
    raise_first_explaining, refuse_hand_in, run_alone, short_list,
)

__all__ = ["check_bpe_encode"]


# ----------------------------------------------------------------------------------------------
# check_bpe_encode (build): encoding by merge rank
# ----------------------------------------------------------------------------------------------


def _merge_first(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            return ids[:i] + [new_id] + ids[i + 2:]
    return ids


def _encode_chunk_variant(ids: list[int], merges: dict, pick: str) -> list[int]:
    """One chunk's ids after the merges; ``pick`` says which pair goes next: "lowest" (right: the
    lowest new id), "highest", "pair" (the smallest pair (a, b)), "leftmost" (the first mergeable
    pair from the left, one occurrence), "first known" (the first mergeable pair from the left,
    every occurrence), "absent first" (pairs that are not merges rank lowest, as with
    ``merges.get(p, 0)``, and the loop stops at one), "once" (the lowest, then stop), "rising"
    (each rank at most once, its first occurrence only), "pass" (one left-to-right pass, no
    repeat), "start pairs" (the merges among the chunk's first adjacent pairs, each once in rank
    order: a pair that a merge creates is never merged)."""
    if pick == "pass":
        out, i = [], 0
        while i < len(ids):
            if i + 1 < len(ids) and (ids[i], ids[i + 1]) in merges:
                out.append(merges[(ids[i], ids[i + 1])])
                i += 2
            else:
                out.append(ids[i])
                i += 1
        return out
    if pick == "start pairs":
        for pair in sorted({p for p in zip(ids, ids[1:]) if p in merges}, key=merges.__getitem__):
            ids = reference_merge(ids, pair, merges[pair])
        return ids
    last = -1
    while len(ids) >= 2:
        if pick == "absent first" and any(p not in merges for p in zip(ids, ids[1:])):
            break
        present = [p for p in zip(ids, ids[1:]) if p in merges and merges[p] > last]
        if not present:
            break
        if pick == "highest":
            pair = max(present, key=merges.__getitem__)
        elif pick == "pair":
            pair = min(present)
        elif pick in ("leftmost", "first known"):
            pair = present[0]
        else:
            pair = min(present, key=merges.__getitem__)
        if pick in ("leftmost", "rising"):
            ids = _merge_first(ids, pair, merges[pair])
        else:
            ids = reference_merge(ids, pair, merges[pair])
        if pick == "rising":
            last = merges[pair]
        if pick == "once":
            break
    return ids


_VOCABS: dict[int, tuple[dict, dict, int]] = {}  # id(merges) -> (merges, token -> id, longest)


def _encode_longest(chunk_bytes: bytes, merges: dict) -> list[int]:
    """Greedy longest vocabulary match from the left (WordPiece's way, not BPE's)."""
    if id(merges) not in _VOCABS or _VOCABS[id(merges)][0] is not merges:
        vocab = {bytes([b]): b for b in range(256)}
        pieces = {b: bytes([b]) for b in range(256)}
        for (a, b), new_id in sorted(merges.items(), key=lambda item: item[1]):
            pieces[new_id] = pieces[a] + pieces[b]
            vocab[pieces[new_id]] = new_id
        if len(_VOCABS) > 4:
            _VOCABS.clear()
        _VOCABS[id(merges)] = (merges, vocab, max(map(len, vocab)))
    _, vocab, longest = _VOCABS[id(merges)]
    out, start = [], 0
    while start < len(chunk_bytes):
        for end in range(min(len(chunk_bytes), start + longest), start, -1):
            if chunk_bytes[start:end] in vocab:
                out.append(vocab[chunk_bytes[start:end]])
                start = end
                break
    return out


def reference_bpe_encode(text: str, merges: dict, pick: str = "lowest",
                         chunks: bool | Callable[[str], list[str]] = True,
                         start: str = "bytes") -> list[int]:
    """Byte-level BPE encoding; the defaults are right: cut ``text`` with GPT-2's regex, start
    each chunk from its UTF-8 bytes, merge the lowest-new-id pair present until none is a merge.
    The knobs give the mistakes: ``pick`` (see ``_encode_chunk_variant``, or "longest"),
    ``chunks=False`` (the whole text as one list), ``start="code points"`` (``ord`` of each
    character instead of its bytes)."""
    out: list[int] = []
    pieces = gpt2_chunks(text) if chunks is True else [text] if chunks is False else chunks(text)
    for chunk in pieces:
        if pick == "longest":
            out += _encode_longest(chunk.encode("utf-8"), merges)
            continue
        ids = [ord(c) for c in chunk] if start == "code points" else list(chunk.encode("utf-8"))
        out += _encode_chunk_variant(ids, merges, pick)
    return out


def _regex_chunks(pattern: str) -> Callable[[str], list[str]]:
    import re

    return lambda text: re.findall(pattern, text)


# Home-made chunks a learner may encode with (their ids still decode to the text).
_HOME_MADE_CHUNKS_ENCODE = {"non-space runs": _regex_chunks(r"\S+|\s+"),
                            "words": _regex_chunks(r"\w+|[^\w\s]+|\s+")}


_ENCODE_MISTAKES: list[tuple[dict[str, Any], str]] = [
    ({"chunks": False}, "merges cross the chunks: the whole text was merged as one list. Cut the "
     "text with pre_tokenize(text) first and merge inside each chunk, so that no token spans two "
     "chunks (e.g. a word and the space before the next word)"),
    ({"chunks": str.split}, "your chunks are not pre_tokenize's: text.split() drops the spaces "
     "(and newlines), so your ids stand for the text without them. Cut the text with "
     "pre_tokenize(text): a word keeps the space in front of it, and runs of spaces are chunks "
     "of their own"),
    ({"chunks": _HOME_MADE_CHUNKS_ENCODE["non-space runs"]}, "your chunks are not pre_tokenize's: "
     "runs of non-spaces keep punctuation on the word, and the space stays out of the word that "
     "follows it. Cut the text with pre_tokenize(text): a word keeps the space in front of it"),
    ({"chunks": _HOME_MADE_CHUNKS_ENCODE["words"]}, "your chunks are not pre_tokenize's: a regex "
     "of words and symbols leaves the space out of the word that follows it. Cut the text with "
     "pre_tokenize(text): a word keeps the space in front of it"),
    ({"start": "code points"}, "ids vs bytes: a chunk starts from its UTF-8 BYTES "
     "(list(chunk.encode('utf-8'))), not from its characters' code points (ord): 'é' is the two "
     "bytes 195 169, and a code point above 255 is not a byte at all"),
    ({"pick": "leftmost"}, "greedy left to right: you merge the first mergeable pair from the left; "
     "BPE merges the pair with the LOWEST new id (learned first) wherever it is, then looks again"),
    ({"pick": "first known"}, "the first known pair is merged first: you merge the leftmost "
     "adjacent pair that is in merges; BPE merges the pair with the LOWEST new id (learned "
     "first), wherever it stands in the chunk, then looks again"),
    ({"pick": "absent first"}, "pairs that are not merges come first: with a default such as "
     "merges.get(pair, 0) (or -1), a pair that is not a merge gets the lowest rank, so your loop "
     "stops as soon as a chunk holds one, though other pairs are still merges; give them a rank "
     "that comes LAST (float('inf')), or look only at the pairs in merges"),
    ({"pick": "pass"}, "one left-to-right pass: you merge each known pair as you meet it, once. "
     "BPE repeats: merge the pair with the lowest new id, then look for the next one, until no "
     "adjacent pair is a merge"),
    ({"pick": "highest"}, "the highest new id is merged first: the merge learned FIRST (the lowest "
     "new id) has priority"),
    ({"pick": "pair"}, "the smallest pair (a, b) is merged first: the priority is the merge's new "
     "id (the order learned), min(pairs, key=lambda p: merges.get(p, inf)), not the pair itself"),
    ({"pick": "once"}, "only one merge per chunk: repeat until no adjacent pair is a merge (a "
     "merge creates new pairs, which may be merges too)"),
    ({"pick": "rising"}, "each merge is applied at most once, and only at its first occurrence: "
     "merge EVERY occurrence of the chosen pair (your merge function), then look again"),
    ({"pick": "start pairs"}, "merges stop early: your ids are what merging only the pairs "
     "present in the chunk's starting bytes gives, each once, in rank order; a pair that appears "
     "only after a merge (the new token next to its neighbour) is never merged, though it may be "
     "a merge too"),
    ({"pick": "longest"}, "greedy longest match: you take the longest token that starts the "
     "chunk, as WordPiece does; BPE replays the merges by rank, which can give other pieces"),
]


# A hand-made rank order: ("b", "c") before ("a", "b"), so "abc" is "a" "bc", not "ab" "c".
_TOY_MERGES_TEXT = ("lower lowest newer newest wider widest slower slowest bc bc bc abc abc "
                    "café cafés naïve naïvely 1234 12345 a   b\n\n x    y z    w")


_ENCODE_TOY_STRINGS = ["abc abcabc", "lowest newest", "slowly wide", "cafés naïve",
                       "12341234 1234", "a   b\n\n", "a    b", " abc", ""]


_ENCODE_GPT2_STRINGS = ["unbelievable tokenization", "I'LL say it's 1234567", "café naïve 日本語",
                        "  indented\n\tcode()", "Hello,\r\nworld!!!", " strawberry raspberry",
                        "👍🏽 Brrr!", "aaaaaaaaaaaa", "x    y", "if x:\n        return"]


_ENCODE_SECONDS = 10.0


@functools.lru_cache(maxsize=1)
def _toy_merges() -> dict[tuple[int, int], int]:
    """A toy trainer's merges (course_lib's trainer on a small text) with two hand-made ones in
    front: ("b", "c") -> 256 comes before ("a", "b") -> 257."""
    import warnings

    from ..tokenization import BPETokenizer

    trained = {(98, 99): 256, (97, 98): 257}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        learned = BPETokenizer.train(_TOY_MERGES_TEXT, 256 + 40).merges
    renumber = {i: i for i in range(256)}
    for (a, b), new_id in learned.items():
        a, b = renumber[a], renumber[b]
        if (a, b) in trained:
            renumber[new_id] = trained[(a, b)]
            continue
        renumber[new_id] = trained[(a, b)] = 256 + len(trained)
    return trained


@functools.lru_cache(maxsize=1)
def gpt2_byte_level_merges() -> dict[tuple[int, int], int]:
    """GPT-2's 50,000 merges from ``vocab.bpe`` (checked by sha256) in byte ids: byte ``b`` is
    id ``b``, the merge of rank ``r`` makes ``256 + r``. Built here, without ``encoder.json``;
    tests/checks/test_lesson10_bpe_encode.py proves it equal to ``GPT2Tokenizer.byte_level_merges``."""
    from ..tokenization import bytes_to_unicode, gpt2_files

    try:
        _, vocab_bpe = gpt2_files()
    except Exception as err:  # missing or altered files: say what to run
        raise CheckFailure(f"GPT-2's tokenizer files are not ready ({err}): run `{FETCH}` once "
                           "(it needs the network), then run this cell again.") from None
    byte_ids = {c: b for b, c in bytes_to_unicode().items()}
    piece_id = dict(byte_ids)
    merges = {}
    lines = Path(vocab_bpe).read_text(encoding="utf-8").split("\n")[1:]
    for rank, line in enumerate(line for line in lines if line):
        a, b = line.split(" ")
        merges[(piece_id[a], piece_id[b])] = piece_id[a + b] = 256 + rank
    return merges


def _merges_copy(merges: dict) -> dict:
    return dict(merges)  # the learner may change theirs; ours stays as it is


# The speed test: distinct made-up words, each a space and three letters (" qzv") that GPT-2's
# merges leave as two tokens or more, so that a loop over all 50,000 merges in rank order runs to
# the end for each word. Short words make the verdict plain: such a loop costs 50,000 look-ups per
# word whatever its length, while the right encoder does a few merges per word. Measured at one
# thread (the encoders of tests/checks/test_lesson10_bpe_encode.py): course_lib's encoder about
# 2.3 ms, the right encoders 2-3 ms (a rank table sorted on every call 13-15 ms), the rank-order
# loops 0.8-1.0 s, against a budget of 0.05 s: 16-20 times over it, 17-25 times under it. The old
# words (two GPT-2 words glued, 16 bytes) cost the right encoders 20-35 ms and the rank-order loops
# 1.0-1.1 s, at the old 1-s floor: accepted in some runs, refused in others (issue #48).
_ENCODE_SPEED_WORDS = 400


_ENCODE_SPEED_RATIO = 20  # the learner's CPU time at most this many times course_lib's encoder's


_ENCODE_SPEED_FLOOR = 0.05  # CPU seconds: a budget never below this (a fast machine's jitter)


_ENCODE_SPEED_REPEATS = 3  # course_lib's encoder is timed this many times: the median counts


_NONE_COMPARED = ("min, max or sorted compared None with a new id: merges.get(pair) is None for a "
                  "pair that is not a merge, and None cannot be compared with an int. Give such "
                  "pairs a rank that comes LAST (merges.get(pair, float('inf'))), or look only "
                  "at the pairs that are in merges")


@functools.lru_cache(maxsize=1)
def _speed_text() -> str:
    """``_ENCODE_SPEED_WORDS`` distinct made-up words (seeded), each a space and three lowercase
    letters that GPT-2's merges do not make one token."""
    import random

    merges = gpt2_byte_level_merges()
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    chosen: set[str] = set()
    while len(chosen) < _ENCODE_SPEED_WORDS:
        word = " " + "".join(rng.choice(letters) for _ in range(3))
        if len(reference_bpe_encode(word, merges)) >= 2:
            chosen.add(word)
    return "".join(sorted(chosen))


def _none_compared(failure: CheckFailure) -> bool:
    """The learner's code raised TypeError comparing None with an int (min(..., key=merges.get))."""
    cause = failure.__cause__
    return isinstance(cause, TypeError) and "NoneType" in str(cause) and (
        "<" in str(cause) or ">" in str(cause))


@checker
def check_bpe_encode(fn: Callable[..., Any]) -> None:
    """Check ``fn(text, merges) -> list[int]``: byte-level BPE encoding by merge rank, with a toy
    trainer's merges and with GPT-2's 50,000 merges, on strings where each mistake differs; then
    its speed on 400 distinct words with GPT-2's merges, against course_lib's encoder's."""
    what = "write the encoding loop yourself (pre_tokenize and your merge may help)."
    refuse_hand_in(fn, what)
    cases = [("a toy trainer's 40 merges", _toy_merges, s) for s in _ENCODE_TOY_STRINGS]
    cases += [("GPT-2's 50,000 merges", gpt2_byte_level_merges, s) for s in _ENCODE_GPT2_STRINGS]
    allowed = allowed_helpers()
    watched: set[str] = set()
    outputs = []
    hint = ("merges maps a pair (a, b) of ids to its new id; merges.get(pair) is None for a pair "
            "that is not a merge.")
    for where, get_merges, text in cases:
        merges = get_merges()
        label = f"text {text!r} with {where}"
        try:
            got = run_alone(
                fn, text, _merges_copy(merges), case=label, what=what,
                refuse=where not in watched, allowed=allowed, seconds=_ENCODE_SECONDS,
                slow="with GPT-2's 50,000 merges, looping over all merges for each chunk is too "
                     "slow, or the loop never ends. In each step look only at the chunk's own "
                     "adjacent pairs and pick the one with the lowest new id; stop when none is a "
                     "merge.", hint=hint)
        except CheckFailure as failure:
            cause = failure.__cause__
            if isinstance(cause, KeyError) and isinstance(cause.args[0] if cause.args else None,
                                                          tuple):
                raise CheckFailure(f"Likely mistake ({label}): your code raised KeyError: "
                                   f"{cause.args[0]}: merges[pair] for a pair that is not a "
                                   "merge. Most adjacent pairs are not merges: look them up with "
                                   "merges.get(pair) or `pair in merges`, and give those that "
                                   "are not a rank that comes last.") from None
            if _none_compared(failure):
                raise CheckFailure(f"Likely mistake ({label}): your code raised "
                                   f"TypeError: {failure.__cause__}: {_NONE_COMPARED}.") from None
            raise
        watched.add(where)
        outputs.append((label, text, merges, id_list(got, label),
                        reference_bpe_encode(text, merges)))
    _name_encode_mistake(outputs)
    _check_encode_speed(fn, allowed, what, hint)
    print(f"check_bpe_encode: all {len(cases)} texts encoded as byte-level BPE does (merges by "
          f"rank, inside each chunk), GPT-2's merges included, and {_ENCODE_SPEED_WORDS} words "
          "encoded in good time. Well done!")


def _name_encode_mistake(outputs: list) -> None:
    """Fail, naming the likely mistake, if some output differs from the reference's."""
    wrong = [out for out in outputs if out[3] != out[4]]
    if not wrong:
        return
    # the mistake that explains every text (else: one that explains the first wrong one)
    label, text, merges, got, expected = wrong[0]
    shown = f"you return {short_list(got)}, expected {short_list(expected)}"
    raise_first_explaining(outputs, wrong, _ENCODE_MISTAKES, f"Likely mistake ({label}): {shown}",
                           lambda text, merges, knobs: reference_bpe_encode(text, merges, **knobs))
    chunks = gpt2_chunks(text)
    if len(chunks) > 1 and got == reference_bpe_encode(chunks[-1], merges):
        raise CheckFailure(f"Likely mistake ({label}): {shown}: your result holds only the last "
                           "chunk's ids: the list of ids is started again for every chunk, "
                           "inside the loop, instead of once before it.")
    pieces = {b: bytes([b]) for b in range(256)}
    for (a, b), new_id in sorted(merges.items(), key=lambda item: item[1]):
        pieces[new_id] = pieces[a] + pieces[b]
    if any(i not in pieces for i in got):
        bad = next(i for i in got if i not in pieces)
        raise CheckFailure(f"Wrong ids ({label}): {shown}; id {bad} is neither a byte (0-255) "
                           "nor a merge's new id.")
    if b"".join(pieces[i] for i in got) != text.encode("utf-8"):
        raise CheckFailure(f"Wrong ids ({label}): {shown}; your ids do not decode to the text: "
                           "every byte of every chunk must end up in exactly one token.")
    raise CheckFailure(f"Wrong ids ({label}): {shown}; they decode to the text, but are not "
                       "the merges applied by rank. None of the usual mistakes explains it; "
                       "follow your loop by hand on this text.")


def _check_encode_speed(fn: Callable[..., Any], allowed: frozenset, what: str, hint: str) -> None:
    """The learner's encoder on ``_speed_text()`` with GPT-2's merges, in at most
    ``_ENCODE_SPEED_RATIO`` times the CPU time course_lib's encoder takes just before (the median
    of ``_ENCODE_SPEED_REPEATS`` runs), and never less than ``_ENCODE_SPEED_FLOOR``.

    The garbage collector is run before and paused during both timings: a full collection of a
    lesson's kernel (torch, transformers and the learner's objects) takes about 0.1 s, twice the
    budget, and would otherwise land now and then in the learner's run."""
    merges, text = gpt2_byte_level_merges(), _speed_text()
    label = f"{_ENCODE_SPEED_WORDS} distinct made-up words such as {gpt2_chunks(text)[0]!r}"
    with collector_paused():
        times = []
        for _ in range(_ENCODE_SPEED_REPEATS):
            begin = time.process_time()
            expected = reference_bpe_encode(text, merges)
            times.append(time.process_time() - begin)
        reference = sorted(times)[len(times) // 2]
        budget = max(_ENCODE_SPEED_FLOOR, _ENCODE_SPEED_RATIO * reference)
        got = run_alone(
            fn, text, _merges_copy(merges), case=label, what=what, refuse=False, allowed=allowed,
            seconds=max(_ENCODE_SECONDS, 10 * budget + 30), cpu_seconds=budget, hint=hint,
            too_slow=f"Too slow ({label}, with GPT-2's 50,000 merges): your function was stopped "
                     f"after {in_seconds(budget)} of CPU time, "
                     + budget_in_words(_ENCODE_SPEED_RATIO, reference, budget, "encoder") + ". "
                     "Your results on the short texts are right, so the work is in how you find "
                     "the next merge: going over all 50,000 merges (in rank order, or sorting "
                     "them) for each word costs hundreds of times more than looking at the "
                     "word's own adjacent pairs, of which there are three.")
    _name_encode_mistake([(label, text, merges, id_list(got, label), expected)])
