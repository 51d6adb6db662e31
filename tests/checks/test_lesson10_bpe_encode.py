"""Lesson-10 checker of BPE encoding by merge rank (course_lib/checks/lesson10_bpe_encode.py): right
answers in several styles pass (in time), each mistake is named."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from _helpers import passes

from course_lib.checks import (
    CheckFailure, check_bpe_encode, lesson10_bpe_encode as encode10,
    lesson10_tokenization as tokens10,
)
from course_lib.solutions import solution_source


def _solution(key: str) -> dict:
    """The names a solution block defines (run with the solution file's header imports)."""
    module = importlib.import_module("course_lib.solutions.lesson10")
    namespace: dict = dict(vars(module))
    exec(solution_source(key), namespace)  # noqa: S102  (our own solution file)
    return namespace


# ----------------------------------------------------------------------------------------------
# build (★★): encoding by merge rank
# ----------------------------------------------------------------------------------------------


def test_bpe_encode_solution_passes(capsys):
    try:
        solution = _solution("10.bpe_encode")["bpe_encode"]
    except KeyError:
        pytest.skip("lesson 10's bpe_encode exercise (its solution block) is not in this commit")
    assert passes(check_bpe_encode, solution)
    out = capsys.readouterr().out
    assert "check_bpe_encode: all 19 texts" in out and "400 words encoded in good time" in out


def test_bpe_encode_speed_text():
    text = encode10._speed_text()
    chunks = tokens10.gpt2_chunks(text)
    assert len(chunks) == len(set(chunks)) == encode10._ENCODE_SPEED_WORDS == 400
    assert all(c[0] == " " and c[1:].isalpha() for c in chunks)
    merges = encode10.gpt2_byte_level_merges()
    assert all(len(encode10.reference_bpe_encode(c, merges)) >= 2 for c in chunks)  # never 1 token


def _encode_by_rank_loop(text, merges):
    """Right, but goes over all merges in rank order for each chunk."""
    from course_lib.tokenization import merge, pre_tokenize

    order = sorted(merges.items(), key=lambda item: item[1])
    out = []
    for chunk in pre_tokenize(text):
        ids = list(chunk.encode("utf-8"))
        for pair, new_id in order:
            if len(ids) < 2:
                break
            if pair in zip(ids, ids[1:]):
                ids = merge(ids, pair, new_id)
        out += ids
    return out


def test_bpe_encode_rank_loop_is_too_slow():
    """Right on the short texts (about 1 s with GPT-2's merges), stopped on the 400 words."""
    with pytest.raises(CheckFailure, match="Too slow \\(400 distinct made-up words") as info:
        check_bpe_encode(_encode_by_rank_loop)
    assert "going over all 50,000 merges" in str(info.value)


def test_bpe_encode_cpu_budget_is_cpu_time_not_wall_time(monkeypatch):
    import time

    solution = _solution("10.bpe_encode")["bpe_encode"]

    def bpe_encode(text, merges):
        if len(text) > 1000:
            time.sleep(1.5)
        return solution(text, merges)

    monkeypatch.setattr(encode10, "_ENCODE_SPEED_FLOOR", 1.0)
    assert passes(check_bpe_encode, bpe_encode)


def _encode_chunks(pick_pair):
    """A learner's encoder: ``pick_pair(pairs, merges)`` chooses; stop when it is not a merge."""
    from course_lib.tokenization import merge, pre_tokenize

    def bpe_encode(text, merges):
        out = []
        for chunk in pre_tokenize(text):
            ids = list(chunk.encode("utf-8"))
            while len(ids) > 1:
                pair = pick_pair(list(zip(ids, ids[1:])), merges)
                if pair is None or pair not in merges:
                    break
                ids = merge(ids, pair, merges[pair])
            out.extend(ids)
        return out

    return bpe_encode


@pytest.mark.parametrize(
    "pick_pair, words",
    [
        (lambda pairs, merges: min(pairs, key=merges.get),
         "TypeError: '<' not supported.*merges.get\\(pair\\) is None for a pair that is not a "
         "merge"),
        (lambda pairs, merges: sorted(pairs, key=lambda p: merges.get(p))[0],
         "None cannot be compared with an int"),
        (lambda pairs, merges: next((p for p in pairs if p in merges), None),
         "the first known pair is merged first"),
        (lambda pairs, merges: min(pairs, key=lambda p: merges.get(p, 0)),
         "pairs that are not merges come first"),
        (lambda pairs, merges: min(pairs, key=lambda p: merges.get(p, -1)),
         "pairs that are not merges come first"),
        (lambda pairs, merges: min(pairs, key=lambda p: merges[p]),
         "KeyError: \\(97, 256\\): merges\\[pair\\] for a pair that is not a merge"),
    ],
)
def test_bpe_encode_choice_mistakes_are_named(pick_pair, words):
    with pytest.raises(CheckFailure, match="Likely mistake") as info:
        check_bpe_encode(_encode_chunks(pick_pair))
    assert __import__("re").search(words, str(info.value)), str(info.value)


def test_bpe_encode_ids_of_the_last_chunk_only_are_named():
    solution = _solution("10.bpe_encode")["bpe_encode"]

    def bpe_encode(text, merges):
        out = []
        for chunk in tokens10.gpt2_chunks(text):
            out = solution(chunk, merges)  # started again for every chunk
        return out

    with pytest.raises(CheckFailure, match="your result holds only the last chunk's ids"):
        check_bpe_encode(bpe_encode)


def test_bpe_encode_chunks_from_split_are_named():
    from course_lib.tokenization import merge

    def bpe_encode(text, merges):
        out = []
        for word in text.split():
            ids = list(word.encode())
            while len(ids) > 1:
                pair = min(zip(ids, ids[1:]), key=lambda p: merges.get(p, float("inf")))
                if pair not in merges:
                    break
                ids = merge(ids, pair, merges[pair])
            out += ids
        return out

    with pytest.raises(CheckFailure, match="text.split\\(\\) drops the spaces"):
        check_bpe_encode(bpe_encode)


def test_bpe_encode_references_are_gpt2s_and_course_libs():
    """The checker's GPT-2 merges and encoding give GPT2Tokenizer's (and so tiktoken's) ids."""
    from course_lib.tokenization import BPETokenizer, GPT2Tokenizer

    gpt2 = GPT2Tokenizer.from_files()
    merges = encode10.gpt2_byte_level_merges()
    assert merges == gpt2.byte_level_merges() and len(merges) == 50_000
    for text in encode10._ENCODE_GPT2_STRINGS:
        ids = encode10.reference_bpe_encode(text, merges)
        assert gpt2.from_byte_level(ids) == gpt2.encode(text), text
    toy = encode10._toy_merges()
    for text in encode10._ENCODE_TOY_STRINGS:
        assert encode10.reference_bpe_encode(text, toy) == BPETokenizer(toy).encode(text), text


def test_bpe_encode_other_styles_pass():
    import regex

    from course_lib.tokenization import GPT2_SPLIT_PATTERN

    def recursive_numpy(text, merges):  # recursion per chunk, a NumPy array out
        def encode_chunk(ids):
            ranked = [(merges[p], k) for k, p in enumerate(zip(ids, ids[1:])) if p in merges]
            if not ranked:
                return ids
            new_id, k = min(ranked)  # the leftmost occurrence of the lowest rank first
            return encode_chunk(ids[:k] + [new_id] + ids[k + 2:])

        out = []
        for chunk in regex.findall(GPT2_SPLIT_PATTERN, text):
            out += encode_chunk(list(chunk.encode("utf-8")))
        return np.array(out, dtype=np.int64)

    def by_rank_table(text, merges):  # a rank per pair, a tuple out
        rank = {pair: r for r, pair in enumerate(sorted(merges, key=merges.get))}
        out = []
        for chunk in regex.findall(GPT2_SPLIT_PATTERN, text):
            ids = list(chunk.encode())
            while True:
                pairs = [p for p in zip(ids, ids[1:]) if p in rank]
                if not pairs:
                    break
                best = min(pairs, key=rank.__getitem__)
                merged, i = [], 0
                while i < len(ids):
                    if tuple(ids[i:i + 2]) == best:
                        merged.append(merges[best])
                        i += 2
                    else:
                        merged.append(ids[i])
                        i += 1
                ids = merged
            out.extend(ids)
        return tuple(out)

    for fn in (recursive_numpy, by_rank_table):
        assert passes(check_bpe_encode, fn), fn.__name__


def _encode(**knobs):
    def bpe_encode(text, merges):  # the checker's own merges (equal to the copy it hands in)
        ours = encode10.gpt2_byte_level_merges() if len(merges) == 50_000 else encode10._toy_merges()
        assert merges == ours
        return encode10.reference_bpe_encode(text, ours, **knobs)

    return bpe_encode


def _knobs_id(index: int, knobs: dict) -> str:
    """A test id that is the same in every process: a callable knob by its name, never its address
    (pytest-xdist's workers must collect the same ids)."""
    parts = [f"{k}={getattr(v, '__name__', v) if callable(v) else v}" for k, v in knobs.items()]
    return f"{index}-" + ",".join(parts)


@pytest.mark.parametrize("knobs, reason", encode10._ENCODE_MISTAKES,
                         ids=[_knobs_id(i, k) for i, (k, _) in enumerate(encode10._ENCODE_MISTAKES)])
def test_bpe_encode_every_mistake_is_named(knobs, reason):
    with pytest.raises(CheckFailure, match="Likely mistake") as info:
        check_bpe_encode(_encode(**knobs))
    assert reason in str(info.value)


def _pieces_of(text, merges):
    ids = encode10.reference_bpe_encode(text, merges)
    return [bytes([i]) if i < 256 else b"?" for i in ids]


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda text, merges: None, "returns None"),
        (_pieces_of, "not the tokens' bytes"),
        (lambda text, merges: [encode10.reference_bpe_encode(c, merges)
                               for c in tokens10.gpt2_chunks(text)], "one\\s+flat list"),
        (lambda text, merges: np.array(encode10.reference_bpe_encode(text, merges), dtype=float),
         "dtype float64"),
        (lambda text, merges: torch.tensor(encode10.reference_bpe_encode(text, merges) or [0.0]),
         "dtype torch.float32"),
        (lambda text, merges: [float(i) for i in encode10.reference_bpe_encode(text, merges)],
         "no floats"),
        (lambda text, merges: list(text.encode()), "None of the usual mistakes|Likely mistake"),
        (lambda text, merges: encode10.reference_bpe_encode(text, merges)[:-1] or [1],
         "do not decode to the text"),
        (lambda text, merges: [99_999], "neither a byte"),
        (lambda text, merges: merges[text], "Your code raised KeyError"),
    ],
)
def test_bpe_encode_bad_answers(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_bpe_encode(fn)


def test_bpe_encode_refuses_course_lib_and_tiktoken():
    from course_lib.tokenization import BPETokenizer

    def with_course_lib(text, merges):
        return BPETokenizer(merges).encode(text)

    with pytest.raises(CheckFailure, match="calls `course_lib`"):
        check_bpe_encode(with_course_lib)
    with pytest.raises(CheckFailure, match="course_lib's own code"):
        check_bpe_encode(BPETokenizer(encode10._toy_merges()).encode)


def test_bpe_encode_endless_loop_is_stopped(monkeypatch):
    monkeypatch.setattr(encode10, "_ENCODE_SECONDS", 0.5)

    def bpe_encode(text, merges):
        ids = list(text.encode())
        while len(ids) > 1:  # never merges, never stops
            pair = min(zip(ids, ids[1:]), key=lambda p: merges.get(p, 10**9))
        return ids

    with pytest.raises(CheckFailure, match="did not finish within 0.5 s"):
        check_bpe_encode(bpe_encode)


def test_bpe_encode_stub(capsys):
    def bpe_encode(text, merges):
        raise NotImplementedError

    check_bpe_encode(bpe_encode)
    assert "not implemented yet" in capsys.readouterr().out


def test_bpe_encode_pairs_of_the_start_only_are_named():
    """tryout3's attempt: the merges among the chunk's first pairs, each once in rank order; a
    pair that a merge creates is never merged."""
    from course_lib.tokenization import merge, pre_tokenize

    def bpe_encode(text, merges):
        out = []
        for chunk in pre_tokenize(text):
            ids = list(chunk.encode("utf-8"))
            for pair in sorted({p for p in zip(ids, ids[1:]) if p in merges}, key=merges.get):
                ids = merge(ids, pair, merges[pair])
            out.extend(ids)
        return out

    with pytest.raises(CheckFailure, match="you return .*, expected .*: merges stop early") as info:
        check_bpe_encode(bpe_encode)
    assert info.value.mistake and "merges stop early" in info.value.mistake
