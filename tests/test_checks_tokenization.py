"""Lesson-10 checkers: correct answers in several styles pass, each named mistake is caught."""

from __future__ import annotations

import importlib
import shutil

import numpy as np
import pytest
import torch
from _helpers import passes

from course_lib.checks import (
    check_bpe_encode, check_merge, check_token_counts, check_train_bpe, check_wordpiece,
)
from course_lib.checks import tokenization as checks10
from course_lib.checks._common import CheckFailure
from course_lib.solutions import predicted_answer, solution_source


def _solution(key: str) -> dict:
    """The names a solution block defines (run with the solution file's header imports)."""
    module = importlib.import_module("course_lib.solutions.lesson10")
    namespace: dict = dict(vars(module))
    exec(solution_source(key), namespace)  # noqa: S102  (our own solution file)
    return namespace


def _as_library(fn, module: str):
    """``fn`` re-created as if defined in ``module`` (its calls then look like that library's)."""
    namespace = {"__name__": module}
    exec(f"def {fn.__name__}(*args):\n    return _impl(*args)\n", namespace)  # noqa: S102
    namespace["_impl"] = fn
    impostor = namespace[fn.__name__]
    impostor.__module__ = module
    return impostor


# ----------------------------------------------------------------------------------------------
# predict: how many GPT-2 tokens
# ----------------------------------------------------------------------------------------------

RIGHT = {"hello world": 2, " Shakespeare": 1, "HELLO WORLD": 4, "123456789": 4, "strawberry": 3,
         "   indented": 4}


def _counts(**changes):
    """The right counts with some replaced: keys are the strings' positions s0..s5."""
    got = dict(RIGHT)
    for key, value in changes.items():
        got[checks10.TOKEN_COUNT_STRINGS[int(key[1:])]] = value
    return lambda: got


def test_true_counts_are_tiktokens():
    """The checker's reference: tiktoken on GPT-2's files; the right answer is RIGHT."""
    assert {s: len(checks10.gpt2_tokens(s)) for s in checks10.TOKEN_COUNT_STRINGS} == RIGHT
    assert checks10.gpt2_tokens("   indented") == [" ", " ", " ind", "ented"]
    assert checks10.gpt2_tokens("123456789") == ["123", "45", "67", "89"]


def test_token_counts_solution_passes(capsys):
    assert passes(check_token_counts, _solution("10.token_counts")["predicted_token_counts"])
    out = capsys.readouterr().out
    assert "check_token_counts: right" in out
    assert "' ' ' ' ' ind' 'ented'" in out and "'HE' 'LL' 'O' ' WORLD'" in out


def test_token_counts_predicted_answer():
    assert predicted_answer("10.token_counts") == RIGHT


def test_token_counts_other_styles_pass():
    reordered = dict(reversed(list(RIGHT.items())))
    assert passes(check_token_counts, lambda: reordered)
    numpy_ints = {s: np.int64(n) for s, n in RIGHT.items()}
    assert passes(check_token_counts, lambda: numpy_ints)


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"s0": 3}, "the space is not a token of its own"),
        ({"s0": 1}, "the space splits"),
        ({"s0": 11}, "number of characters \\(11\\)"),
        ({"s1": 2}, "leading space is not a token of its own"),
        ({"s1": 3}, "leading space is not a token of its own"),
        ({"s1": 12}, "number of characters"),
        ({"s2": 2}, "capitals split more"),
        ({"s2": 3}, "characters / 4"),
        ({"s3": 3}, "fixed groups of 3 digits"),
        ({"s3": 5}, "fixed groups of 2 digits"),
        ({"s3": 9}, "number of characters"),
        ({"s3": 1}, "one token per word"),
        ({"s4": 1}, "one token per word"),
        ({"s4": 2}, "not the parts of a compound word"),
        ({"s4": 10}, "number of characters"),
        ({"s5": 1}, "one token per word"),
        ({"s5": 2}, "a run of spaces is not one token"),
        ({"s5": 3}, "a run of spaces is not one token"),
        ({"s5": 5}, "the last space of a run belongs to the word"),
        ({"s5": 0}, "at least one token"),
        ({"s4": 6}, "too many"),
        ({"s2": 1}, "too few"),
    ],
)
def test_token_counts_mistakes(changes, words):
    with pytest.raises(CheckFailure, match=words):
        check_token_counts(_counts(**changes))


def test_token_counts_names_every_wrong_string():
    words = {s: len(s.split()) for s in RIGHT}
    with pytest.raises(CheckFailure, match="4 of the 6 counts are off") as info:
        check_token_counts(lambda: words)
    message = str(info.value)  # " Shakespeare" and "hello world" are right
    assert message.count("one token per word") == 3 and "capitals split more" in message


@pytest.mark.parametrize(
    "answer, words",
    [
        ([2, 1, 4, 4, 3, 4], "Return a dict"),
        (None, "Return a dict"),
        ({s: n for s, n in RIGHT.items() if s != "strawberry"}, "Missing: 'strawberry'"),
        ({**RIGHT, "hello": 1}, "Unexpected: 'hello'"),
        ({("Shakespeare" if s == " Shakespeare" else s): n for s, n in RIGHT.items()},
         "Spaces count"),
        ({**RIGHT, "strawberry": 3.0}, "an int"),
        ({**RIGHT, "strawberry": "3"}, "an int"),
        ({**RIGHT, " Shakespeare": True}, "an int"),
    ],
)
def test_token_counts_bad_input(answer, words):
    with pytest.raises(CheckFailure, match=words):
        check_token_counts(lambda: answer)


def test_token_counts_computed_with_a_tokenizer_is_refused():
    def encode(text):
        return RIGHT[text]

    count = _as_library(encode, "tiktoken.core")

    def predicted_token_counts():
        return {s: count(s) for s in RIGHT}

    with pytest.raises(CheckFailure, match="calls `tiktoken`.*predict the counts yourself"):
        check_token_counts(predicted_token_counts)


def test_token_counts_stub(capsys):
    def predicted_token_counts():
        raise NotImplementedError

    check_token_counts(predicted_token_counts)
    assert "not implemented yet" in capsys.readouterr().out


def test_token_counts_without_gpt2_files_says_what_to_run(monkeypatch, tmp_path):
    monkeypatch.setattr(checks10, "_gpt2_folder", lambda: tmp_path)
    with pytest.raises(CheckFailure, match="run `python -m course_lib.tokenization fetch`"):
        check_token_counts(lambda: RIGHT)


def test_token_counts_with_an_altered_file_says_so(monkeypatch, tmp_path):
    source = checks10._gpt2_folder()
    for name in ("vocab.bpe", "encoder.json"):
        shutil.copy(source / name, tmp_path / name)
    with open(tmp_path / "vocab.bpe", "a", encoding="utf-8") as f:
        f.write("x y\n")
    monkeypatch.setattr(checks10, "_gpt2_folder", lambda: tmp_path)
    with pytest.raises(CheckFailure, match="not the official one"):
        check_token_counts(lambda: RIGHT)


# ----------------------------------------------------------------------------------------------
# debug: the merge of one pair
# ----------------------------------------------------------------------------------------------


def _stub_merge(ids, pair, new_id):
    """The stub's code without its `raise`."""
    out = list(ids)
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            out[i] = new_id
            out[i + 1] = None  # the second id of the pair is gone
    return [t for t in out if t is not None]


def test_merge_solution_passes(capsys):
    assert passes(check_merge, _solution("10.merge")["merge"])
    assert "check_merge: all 14 cases right" in capsys.readouterr().out


def test_merge_other_styles_pass():
    def with_a_skip_flag(ids, pair, new_id):
        out, skip = [], False
        for i, t in enumerate(ids):
            if skip:
                skip = False
                continue
            if i < len(ids) - 1 and (t, ids[i + 1]) == pair:
                out.append(new_id)
                skip = True
            else:
                out.append(t)
        return out

    def recursive(ids, pair, new_id):
        if len(ids) < 2:
            return list(ids)
        if tuple(ids[:2]) == pair:
            return [new_id] + recursive(ids[2:], pair, new_id)
        return [ids[0]] + recursive(ids[1:], pair, new_id)

    def on_a_copy(ids, pair, new_id):  # edits a copy in place, returns a tuple
        out, i = list(ids), 0
        while i < len(out) - 1:
            if out[i] == pair[0] and out[i + 1] == pair[1]:
                out[i:i + 2] = [new_id]
            i += 1
        return tuple(out)

    for fn in (with_a_skip_flag, recursive, on_a_copy):
        assert passes(check_merge, fn), fn.__name__


@pytest.fixture(autouse=True)
def _first_attempts():
    """Each test starts as a learner's first run: check_merge has met no mistake yet."""
    checks10._MERGE_SEEN.clear()
    yield
    checks10._MERGE_SEEN.clear()


# What a fix says (the stub's fix, or another mistake's): never in a Debug checker's first message.
_FIX_WORDS = ("i += 2", "i += 1", "skip", "range(len(ids)", "ids[i + 1]) == pair", "append what",
              "EVERY occurrence", "(ids[i], ids[i + 1])", "out = []")


def test_merge_stub_first_message_says_what_is_observed_not_the_fix():
    """The untouched stub without its raise (the learner's first run): what the output shows."""
    with pytest.raises(CheckFailure) as info:
        check_merge(_stub_merge)
    message = str(info.value)
    assert message.startswith("Not yet (a run of 3, pair (a, a)")
    assert "you return [1, 300, 300, 2], expected [1, 300, 5, 2]" in message
    assert "stands for [1, 5, 5, 5, 5, 2]: one id more than the input [1, 5, 5, 5, 2]" in message
    assert not any(words in message for words in _FIX_WORDS), message
    assert "Likely mistake" not in message and "show_solution" not in message


def test_merge_stub_second_message_says_more_but_not_the_fix():
    with pytest.raises(CheckFailure):
        check_merge(_stub_merge)
    with pytest.raises(CheckFailure) as info:
        check_merge(_stub_merge)
    message = str(info.value)
    assert "Likely mistake: in a run of one id, the pair occurs at i and again at i + 1" in message
    assert "the id in the middle is used by two new ids" in message
    assert 'show_solution("10.merge")' in message
    assert not any(words in message for words in _FIX_WORDS), message


def _right_to_left(ids, pair, new_id):
    out, i = [], len(ids) - 1
    while i >= 0:
        if i > 0 and (ids[i - 1], ids[i]) == pair:
            out.insert(0, new_id)
            i -= 2
        else:
            out.insert(0, ids[i])
            i -= 1
    return out


def _first_only(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            return ids[:i] + [new_id] + ids[i + 2:]
    return list(ids)


def _either_order(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and set((ids[i], ids[i + 1])) == set(pair):
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def _keeps_second(ids, pair, new_id):
    out = []
    for i in range(len(ids)):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
        else:
            out.append(ids[i])
    return out


def _drops_last(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def _drops_pair(ids, pair, new_id):  # the pair found and skipped, the new id never appended
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            i += 2
            continue
        out.append(ids[i])
        i += 1
    return out


def _misses_end(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if i < len(ids) - 2 and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def _in_place(ids, pair, new_id):
    i = 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == pair:
            ids[i:i + 2] = [new_id]
        i += 1
    return ids


def _both_new(ids, pair, new_id):  # a blind tryout's (2026-11-27): new_id written in both places
    out = list(ids)
    for i in range(len(ids) - 1):
        if out[i] != new_id and (ids[i], ids[i + 1]) == tuple(pair):
            out[i] = out[i + 1] = new_id
    return out


_MERGE_NAMED = [  # (wrong merge, its first message (observed), its second (more))
    (_both_new, "each occurrence of the pair became two 300s", "the pair stands for ONE new id"),
    (_right_to_left, "your merged pair is further right than expected",
     "BPE reads a run from the left"),
    (_first_only, "a later occurrence of the pair is still there, unmerged",
     "after the first match the loop stops merging"),
    (_either_order, "the pair's two ids in the other order", "(b, a) is another pair"),
    (_keeps_second, "after each 300, the pair's second id appears once more",
     "the pair's second id is looked at again and kept"),
    (_drops_last, "the input's last id 5 is missing", "the loop stops one id before the end"),
    (_drops_pair, "your result holds no 300 at all", "without putting the new id in their place"),
    (lambda ids, pair, new_id: checks10._merge_never_matches(ids, pair, new_id),
     "your result is the input unchanged: the pair (5, 7) was never found",
     "a list, such as a slice ids[i:i + 2], is never equal to a tuple"),
    (lambda ids, pair, new_id: checks10._merge_first_id_only(ids, pair, new_id),
     "a 300 stands where the input has 5 followed by another id than 7",
     "only the first id of the pair is compared"),
    (_misses_end, "the pair at the very end of the input is not merged",
     "the loop never looks at the last pair"),
    (lambda ids, pair, new_id: checks10._merge_by_text(ids, pair, new_id),
     "your result merges ids that are not the pair", "ids are numbers, not text"),
    (lambda ids, pair, new_id: checks10._merge_by_text_comma(ids, pair, new_id),
     "your result merges ids that are not the pair", "ids are numbers, not text"),
    (lambda ids, pair, new_id: [int(t) for t in " ".join(map(str, ids)).replace(
        f"{pair[0]} {pair[1]}", str(new_id)).split()],
     "your result merges ids that are not the pair", "ids are numbers, not text"),
]


@pytest.mark.parametrize("fn, observed, more", _MERGE_NAMED)
def test_merge_mistakes_observed_first_then_named(fn, observed, more):
    with pytest.raises(CheckFailure, match="Not yet") as first:
        check_merge(fn)
    assert observed in str(first.value) and more not in str(first.value)
    assert not any(words in str(first.value) for words in _FIX_WORDS), str(first.value)
    with pytest.raises(CheckFailure, match="Likely mistake") as second:
        check_merge(fn)
    assert observed in str(second.value) and more in str(second.value)


@pytest.mark.parametrize(
    "fn, words",
    [
        (_in_place, "changed its input list"),
        (lambda ids, pair, new_id: torch.tensor(_solution("10.merge")["merge"](ids, pair, new_id)),
         "returns a Tensor"),
        (lambda ids, pair, new_id: np.array(ids), "returns a ndarray"),
        (lambda ids, pair, new_id: None, "returns None"),
        (lambda ids, pair, new_id: (t for t in ids), "a generator"),
        (lambda ids, pair, new_id: [new_id if t == pair[0] else None for t in ids], "no None"),
        (lambda ids, pair, new_id: [t + 1 for t in ids], "None of the usual mistakes"),
        (lambda ids, pair, new_id: (ids[0], _solution("10.merge")["merge"](ids, pair, new_id))[1],
         "Your code raised IndexError \\(an empty list"),
    ],
)
def test_merge_mistakes(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_merge(fn)


def test_merge_refuses_course_lib_and_libraries():
    solution = _solution("10.merge")["merge"]
    with pytest.raises(CheckFailure, match="course_lib's own code"):
        check_merge(_as_library(solution, "course_lib.tokenization"))
    library_merge = _as_library(solution, "course_lib.tokenization")

    def merge(ids, pair, new_id):
        return library_merge(ids, pair, new_id)

    with pytest.raises(CheckFailure, match="calls `course_lib`"):
        check_merge(merge)


def test_merge_refuses_the_real_course_lib_merge_if_there():
    try:
        from course_lib.tokenization import merge as course_merge
    except ImportError:
        pytest.skip("course_lib.tokenization.merge is not written yet")
    with pytest.raises(CheckFailure, match="course_lib"):
        check_merge(course_merge)

    def merge(ids, pair, new_id):
        return course_merge(ids, pair, new_id)

    with pytest.raises(CheckFailure, match="calls `course_lib`"):
        check_merge(merge)


def test_merge_stub(capsys):
    def merge(ids, pair, new_id):
        raise NotImplementedError

    check_merge(merge)
    assert "not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# build: WordPiece on one word
# ----------------------------------------------------------------------------------------------


def test_wordpiece_reference_equals_minilm_tokenizer():
    from course_lib.pretrained import load_tokenizer

    tokenizer = load_tokenizer()
    vocab = checks10._minilm_vocab()
    for word in checks10._MINILM_WORDS + ["a" * 100, "naive", "hello"]:
        assert checks10.reference_wordpiece(word, vocab) == tokenizer.tokenize(word), word


def test_wordpiece_solution_passes(capsys):
    assert passes(check_wordpiece, _solution("10.wordpiece")["wordpiece"])
    assert "check_wordpiece: all 23 words" in capsys.readouterr().out


def test_wordpiece_other_styles_pass():
    def with_for_loops(word, vocab):
        if len(word) > 100:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = ("##" if start else "") + word[start:end]
                if piece in vocab:
                    pieces.append(piece)
                    start = end
                    break
            else:
                return ["[UNK]"]
        return pieces

    def recursive(word, vocab, prefix=""):
        if len(word) > 100:
            return ["[UNK]"]
        if not word:
            return []
        for end in range(len(word), 0, -1):
            if prefix + word[:end] in vocab:
                rest = recursive(word[end:], vocab, "##")
                return ["[UNK]"] if rest == ["[UNK]"] else [prefix + word[:end]] + rest
        return ["[UNK]"]

    for fn in (with_for_loops, recursive):
        assert passes(check_wordpiece, fn), fn.__name__


def _wordpiece(**knobs):
    def wordpiece(word, vocab):
        return checks10.reference_wordpiece(word, vocab, **knobs)

    return wordpiece


@pytest.mark.parametrize(
    "fn, words",
    [
        (_wordpiece(backtrack=True), "the search goes back"),
        (_wordpiece(on_failure="empty"), "a word not turned into a single \\[UNK\\].*empty list"),
        (_wordpiece(on_failure="word"), "a word not turned into a single \\[UNK\\].*the word itself"),
        (_wordpiece(on_failure="pieces"), "a word not turned into a single \\[UNK\\].*drop the rest"),
        (_wordpiece(shortest=True), "the SHORTEST match is taken"),
        (_wordpiece(hashes="none"), "'##' is missing on continuation pieces"),
        (_wordpiece(hashes="all"), "'##' is also on the first piece"),
        (_wordpiece(on_failure="partial"), "not the pieces found so far plus '\\[UNK\\]'"),
        (_wordpiece(on_failure="skip"), "a word not turned into a single \\[UNK\\]"),
        (_wordpiece(max_chars=None), "over 100 characters must give"),
        (_wordpiece(shortest_piece=2), "a piece of one character is never tried"),
        (_wordpiece(strict_max=False), "a word of exactly 100 characters"),
        (_wordpiece(first_short=True), "the first piece is never the whole word"),
        (lambda word, vocab: " ".join(checks10.reference_wordpiece(word, vocab)),
         "returns a string"),
        (lambda word, vocab: "[UNK]", "returns a string"),
        (lambda word, vocab: None, "returns None"),
        (lambda word, vocab: [len(word)], "list of strings"),
        (lambda word, vocab: [p.removeprefix("##") for p in checks10.reference_wordpiece(word, vocab)],
         "'##' is missing"),
        (lambda word, vocab: checks10.reference_wordpiece(word, vocab)[:1], "do not spell the word"),
        (lambda word, vocab: vocab[word], "Your code raised"),
    ],
)
def test_wordpiece_mistakes(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_wordpiece(fn)


@pytest.mark.parametrize(
    "prefix, words",
    [
        (lambda word, start, end: "##" if start and end == len(word) else "",
         "with '##' in the wrong places: 'b' continues the word without '##'"),
        (lambda word, start, end: "##" if end == len(word) else "",
         "'##' is also on the first piece"),
    ],
)
def test_wordpiece_hashes_in_the_wrong_places_are_named(prefix, words):
    def wordpiece(word, vocab):
        if len(word) > 100:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = prefix(word, start, end) + word[start:end]
                if piece in vocab:
                    pieces.append(piece)
                    start = end
                    break
            else:
                return ["[UNK]"]
        return pieces

    with pytest.raises(CheckFailure, match="Likely mistake") as info:
        check_wordpiece(wordpiece)
    assert words in str(info.value)


def test_wordpiece_bare_lookup_is_named_as_missing_hashes():
    """Looked up with '##' but returned without: the same message as '##' missing."""
    def wordpiece(word, vocab):
        right = checks10.reference_wordpiece(word, vocab)
        return [p.removeprefix("##") for p in right]

    with pytest.raises(CheckFailure, match="'##' is missing"):
        check_wordpiece(wordpiece)


def test_wordpiece_refuses_hugging_face_and_course_lib():
    from course_lib.pretrained import load_tokenizer

    tokenizer = load_tokenizer()
    with pytest.raises(CheckFailure, match="from the `transformers` package"):
        check_wordpiece(tokenizer.tokenize)

    def wordpiece(word, vocab):
        return tokenizer.tokenize(word)

    with pytest.raises(CheckFailure, match="calls .*`transformers`, a real tokenizer"):
        check_wordpiece(wordpiece)

    def wordpiece_rust(word, vocab):  # the Rust tokenizer underneath, no transformers code
        return tokenizer.backend_tokenizer.encode(word, add_special_tokens=False).tokens

    with pytest.raises(CheckFailure, match="calls `tokenizers`"):
        check_wordpiece(wordpiece_rust)

    solution = _solution("10.wordpiece")["wordpiece"]
    with pytest.raises(CheckFailure, match="course_lib's own code"):
        check_wordpiece(_as_library(solution, "course_lib.tokenization"))


def test_wordpiece_stub(capsys):
    def wordpiece(word, vocab):
        raise NotImplementedError

    check_wordpiece(wordpiece)
    assert "not implemented yet" in capsys.readouterr().out


def test_wordpiece_refuses_the_real_course_lib_wordpiece_if_there():
    try:
        from course_lib.tokenization import WordPieceTokenizer
        tokenizer = WordPieceTokenizer.from_vocab()
    except (ImportError, AttributeError):
        pytest.skip("course_lib.tokenization.WordPieceTokenizer is not written yet")
    if not hasattr(tokenizer, "wordpiece"):
        pytest.skip("course_lib's WordPieceTokenizer has no wordpiece(word) method")
    with pytest.raises(CheckFailure, match="course_lib's own code"):
        check_wordpiece(tokenizer.wordpiece)

    def wordpiece(word, vocab):
        return tokenizer.wordpiece(word)

    with pytest.raises(CheckFailure, match="calls `course_lib`"):
        check_wordpiece(wordpiece)



def test_wordpiece_trie_style_passes_within_the_time_budget():
    """A trie built from the vocabulary on every call (the style the profile hook slowed 2-4x)."""
    import time

    def wordpiece(word, vocab):
        if len(word) > 100:
            return ["[UNK]"]
        trie: dict = {}
        for token in vocab:
            node = trie
            for ch in token:
                node = node.setdefault(ch, {})
            node["$"] = True
        pieces, start = [], 0
        while start < len(word):
            node, prefix_len = trie, 0
            if start:
                node = trie.get("#", {}).get("#", {})
            best = None
            for k in range(start, len(word)):
                node = node.get(word[k])
                if node is None:
                    break
                if "$" in node:
                    best = k + 1
            if best is None:
                return ["[UNK]"]
            pieces.append(("##" if start else "") + word[start:best])
            start = best
        return pieces

    begin = time.process_time()  # this process's CPU time: the shared machine's load aside
    assert passes(check_wordpiece, wordpiece)
    assert time.process_time() - begin < 5


def test_wordpiece_endless_loop_is_stopped_with_a_message():
    """The Hugging Face course's encode_word: "##" glued to the rest, so "#" matches forever."""
    def encode_word(word, vocab):
        tokens = []
        while len(word) > 0:
            i = len(word)
            while i > 0 and word[:i] not in vocab:
                i -= 1
            if i == 0:
                return ["[UNK]"]
            tokens.append(word[:i])
            word = word[i:]
            if len(word) > 0:
                word = f"##{word}"
        return tokens

    with pytest.raises(CheckFailure, match="did not finish within 2 s.*'unz'.*the token '#'"):
        check_wordpiece(encode_word)


def test_wordpiece_loop_without_calls_is_stopped(monkeypatch):
    monkeypatch.setattr(checks10, "_PROBE_SECONDS", 0.5)

    def wordpiece(word, vocab):
        n = 0
        while True:
            n += 1

    with pytest.raises(CheckFailure, match="did not finish within 0.5 s.*even on 'able'"):
        check_wordpiece(wordpiece)


def test_wordpiece_loop_without_unk_is_named():
    """No [UNK] branch: when nothing matches, the loop stays where it is (and appends forever).
    The message says what happens and the rule, not the '#' of the Hugging Face course's loop."""
    import resource

    def wordpiece(word, vocab):
        if len(word) > 100:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in vocab:
                    break
                end -= 1
            pieces.append(piece)
            start = end
        return pieces

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(CheckFailure, match="Likely mistake: your loop never ends on the word "
                                           "'unz'") as info:
        check_wordpiece(wordpiece)
    assert "the WHOLE word becomes ['[UNK]']" in str(info.value)
    assert "#' (BERT's has it)" not in str(info.value)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 500_000  # KB: < 0.5 GB


def test_wordpiece_loop_that_gives_up_only_on_the_first_piece_is_named():
    """[UNK] only when the word's first piece fails: a failing continuation loops forever."""
    def wordpiece(word, vocab):
        if len(word) > 100:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in vocab:
                    pieces.append(piece)
                    start = end
                    break
            else:
                if start == 0:
                    return ["[UNK]"]
        return pieces

    with pytest.raises(CheckFailure, match="your loop never ends on the word 'unz'"):
        check_wordpiece(wordpiece)


# ----------------------------------------------------------------------------------------------
# build (★★★): the BPE training loop
# ----------------------------------------------------------------------------------------------


def _train_fast_with_max(text, num_merges):
    """Incremental counts with an index pair -> words; max() over all counts picks each merge."""
    import collections

    from course_lib.tokenization import merge, pre_tokenize

    words = collections.Counter(tuple(c.encode()) for c in pre_tokenize(text))
    lists, freq = [list(w) for w in words], list(words.values())
    counts, where = collections.defaultdict(int), collections.defaultdict(set)
    for k, w in enumerate(lists):
        for p in zip(w, w[1:]):
            counts[p] += freq[k]
            where[p].add(k)
    merges = {}
    for i in range(num_merges):
        if not counts:
            break
        pair = max(counts, key=lambda p: (counts[p], -p[0], -p[1]))
        if counts[pair] < 2:
            break
        merges[pair] = 256 + i
        for k in list(where.pop(pair)):
            old = lists[k]
            new = merge(old, pair, 256 + i)
            for p in zip(old, old[1:]):
                counts[p] -= freq[k]
                if counts[p] == 0:
                    del counts[p]
            for p in zip(new, new[1:]):
                counts[p] += freq[k]
                where[p].add(k)
            lists[k] = new
    return merges


def _train_fast_every_chunk(text, num_merges):
    """Incremental, but every chunk of the text kept (no distinct chunks with counts), positions
    of each pair in a dict of sets; ties by sorting the best candidates (the slowest style that
    passes: about 6x course_lib's CPU time)."""
    from course_lib.tokenization import pre_tokenize

    words = [list(c.encode("utf-8")) for c in pre_tokenize(text)]
    counts, where = {}, {}
    for k, w in enumerate(words):
        for p in zip(w, w[1:]):
            counts[p] = counts.get(p, 0) + 1
            where.setdefault(p, set()).add(k)
    merges = {}
    while len(merges) < num_merges and counts:
        top = max(counts.values())
        if top < 2:
            break
        pair = sorted(p for p, n in counts.items() if n == top)[0]
        new_id = 256 + len(merges)
        merges[pair] = new_id
        for k in where.pop(pair):
            w, out, j = words[k], [], 0
            while j < len(w):
                if j + 1 < len(w) and (w[j], w[j + 1]) == pair:
                    out.append(new_id)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            for p in zip(w, w[1:]):
                counts[p] -= 1
                if not counts[p]:
                    del counts[p]
            for p in zip(out, out[1:]):
                counts[p] = counts.get(p, 0) + 1
                where.setdefault(p, set()).add(k)
            words[k] = out
        counts.pop(pair, None)
    return merges


def _train_with_pair_counts(text, num_merges):
    """pair_counts and word_counts, which the lesson shows, for the first counts; then a lazy heap
    of (-count, pair) updated as words change (numpy ints as new ids)."""
    import heapq

    from course_lib.tokenization import pair_counts, word_counts

    words = {w: n for w, n in word_counts(text).items()}
    counts = pair_counts(words)
    holders: dict = {}
    for w in words:
        for p in zip(w, w[1:]):
            holders.setdefault(p, set()).add(w)
    heap = [(-n, p) for p, n in counts.items()]
    heapq.heapify(heap)
    merges = {}
    for i in range(num_merges):
        while heap and counts.get(heap[0][1], 0) != -heap[0][0]:
            heapq.heappop(heap)
        if not heap or -heap[0][0] < 2:
            break
        pair = heapq.heappop(heap)[1]
        merges[pair] = np.int64(256 + i)
        touched = set()
        for w in holders.pop(pair, ()):
            if w not in words:
                continue
            n = words.pop(w)
            out, j = [], 0
            while j < len(w):
                if w[j:j + 2] == pair:
                    out.append(256 + i)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            new = tuple(out)
            words[new] = words.get(new, 0) + n
            for p in zip(w, w[1:]):
                counts[p] -= n
                touched.add(p)
            for p in zip(new, new[1:]):
                counts[p] += n
                holders.setdefault(p, set()).add(new)
                touched.add(p)
        for p in touched:
            if counts[p] > 0:
                heapq.heappush(heap, (-counts[p], p))
            else:
                del counts[p]
    return merges


def _train_naive(text, num_merges):
    """Correct, but recounts every pair of the distinct chunks after each merge (too slow)."""
    import collections

    from course_lib.tokenization import merge, pre_tokenize

    words = collections.Counter(tuple(c.encode()) for c in pre_tokenize(text))
    merges = {}
    for i in range(num_merges):
        counts = collections.Counter()
        for w, n in words.items():
            for p in zip(w, w[1:]):
                counts[p] += n
        best = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if not best or best[0][1] < 2:
            break
        pair = best[0][0]
        merges[pair] = 256 + i
        new = collections.Counter()
        for w, n in words.items():
            new[tuple(merge(list(w), pair, 256 + i))] += n
        words = new
    return merges


def _train_naive_lesson(text, num_merges):
    """The lesson's loop as first written: every chunk, pair_counts recounting after each merge."""
    from course_lib.tokenization import merge, pair_counts, pre_tokenize

    words = [list(c.encode("utf-8")) for c in pre_tokenize(text)]
    merges = {}
    while len(merges) < num_merges:
        counts = pair_counts(words)
        top = max(counts.values(), default=0)
        if top < 2:
            return merges
        pair = min(p for p, n in counts.items() if n == top)
        merges[pair] = 256 + len(merges)
        words = [merge(w, pair, merges[pair]) for w in words]
    return merges


@pytest.fixture
def tenth_of_the_text(monkeypatch):
    """The speed test on the first 100,000 characters: a tenth of the test's cost, with the same
    separation (measured there under load, 1,000 merges: the incremental styles 6x course_lib's CPU
    time, the recount 38x; the 2 s floor of the budget applies, about 5-7 s here)."""
    text = checks10._speed_plays()[:100_000]
    monkeypatch.setattr(checks10, "_speed_plays", lambda: text)


def test_train_bpe_solution_passes(capsys):
    """The solution, on the checker's real megabyte and 1,000 merges, within its CPU budget."""
    assert passes(check_train_bpe, _solution("10.train_bpe")["train_bpe"])
    out = capsys.readouterr().out
    assert "check_train_bpe: all 8 texts" in out and "1,000 merges on a megabyte" in out


def test_train_bpe_speed_text_is_a_megabyte_of_the_training_plays():
    from course_lib.tasks import ShakespeareCorpus

    text = checks10._speed_plays()
    assert len(text) == checks10._TRAIN_SPEED_CHARS == 1_000_000
    assert ShakespeareCorpus().train_text.startswith(text)


def test_train_bpe_reference_is_course_libs_trainer():
    import warnings

    from course_lib.tokenization import BPETokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _, text, n in checks10._TRAIN_CASES:
            for method in ("naive", "incremental"):
                assert checks10.reference_train_bpe(text, n) == BPETokenizer.train(
                    text, 256 + n, method=method).merges


@pytest.mark.parametrize("fn", [_train_fast_with_max, _train_fast_every_chunk,
                                _train_with_pair_counts], ids=lambda f: f.__name__)
def test_train_bpe_other_fast_styles_pass(fn, tenth_of_the_text):
    assert passes(check_train_bpe, fn), fn.__name__


@pytest.mark.parametrize("fn", [_train_naive, _train_naive_lesson], ids=lambda f: f.__name__)
def test_train_bpe_recount_after_every_merge_is_too_slow(fn, tenth_of_the_text):
    """Right on the small texts, stopped on the plays after 20x course_lib's CPU time, and told
    why; pair_counts, which the lesson shows, is not refused as course_lib's."""
    with pytest.raises(CheckFailure, match="Too slow") as info:
        check_train_bpe(fn)
    message = str(info.value)
    assert "20 times what course_lib's trainer took" in message
    assert "counting every pair of every chunk again after each merge" in message


def test_train_bpe_cpu_budget_is_cpu_time_not_wall_time(tenth_of_the_text, monkeypatch):
    """Sleeping (another program's turn on a busy machine) does not count against the budget."""
    import time

    solution = _solution("10.train_bpe")["train_bpe"]

    def train_bpe(text, num_merges):
        if len(text) > 100_000:
            time.sleep(3)
        return solution(text, num_merges)

    monkeypatch.setattr(checks10, "_TRAIN_SPEED_FLOOR", 0.5)
    monkeypatch.setattr(checks10, "_TRAIN_SPEED_RATIO", 3)
    assert passes(check_train_bpe, train_bpe)


def _train_stale_heap(text, num_merges):
    """A heap of (-count, pair) whose entries are never checked against the current counts: an
    entry pushed before a merge lowered that pair's count is taken with its old count."""
    import collections
    import heapq

    from course_lib.tokenization import merge, pre_tokenize

    words = collections.Counter(tuple(c.encode()) for c in pre_tokenize(text))
    lists, freq = [list(w) for w in words], list(words.values())
    counts, where = collections.defaultdict(int), collections.defaultdict(set)
    for k, w in enumerate(lists):
        for p in zip(w, w[1:]):
            counts[p] += freq[k]
            where[p].add(k)
    heap = [(-n, p) for p, n in counts.items()]
    heapq.heapify(heap)
    merges = {}
    for i in range(num_merges):
        while heap and heap[0][1] in merges:
            heapq.heappop(heap)
        if not heap or -heap[0][0] < 2:
            break
        pair = heapq.heappop(heap)[1]
        merges[pair] = 256 + i
        touched = set()
        for k in where.pop(pair, ()):
            old, new = lists[k], merge(lists[k], pair, 256 + i)
            for p in zip(old, old[1:]):
                counts[p] -= freq[k]
                touched.add(p)
            for p in zip(new, new[1:]):
                counts[p] += freq[k]
                where[p].add(k)
                touched.add(p)
            lists[k] = new
        for p in touched:
            if counts[p] > 0:
                heapq.heappush(heap, (-counts[p], p))
    return merges


def test_train_bpe_merging_only_the_first_occurrence_is_named():
    """A merge of its own that replaces the first occurrence only: the pair comes back, is
    merged again, and the dict keeps its last new id (the ids skip)."""
    from course_lib.tokenization import pre_tokenize

    def train_bpe(text, num_merges):
        def merge_first(w, pair, new):
            for j in range(len(w) - 1):
                if (w[j], w[j + 1]) == pair:
                    return w[:j] + [new] + w[j + 2:]
            return w

        words = [list(c.encode()) for c in pre_tokenize(text)]
        merges = {}
        for i in range(num_merges):
            counts = {}
            for w in words:
                for p in zip(w, w[1:]):
                    counts[p] = counts.get(p, 0) + 1
            best = max(counts.values(), default=0)
            if best < 2:
                break
            pair = min(p for p in counts if counts[p] == best)
            merges[pair] = 256 + i
            words = [merge_first(w, pair, 256 + i) for w in words]
        return merges

    with pytest.raises(CheckFailure, match="the new ids skip \\[256\\]") as info:
        check_train_bpe(train_bpe)
    assert "each merge replaces every occurrence of the pair, in every chunk" in str(info.value)


def test_train_bpe_stale_counts_are_named_with_the_true_counts():
    with pytest.raises(CheckFailure, match="At merge 2 \\(new id 258\\)") as info:
        check_train_bpe(_train_stale_heap)
    message = str(info.value)
    assert "you merge (116, 104) (b'th'), which occurs 0 times there" in message
    assert "but (116, 257) (b'the'), which occurs 3 times there" in message
    assert "have drifted from the true counts" in message


def test_train_bpe_stopping_early_is_named_with_the_count():
    def train_bpe(text, num_merges):  # stops 10 merges early on the longer text
        merges = _solution("10.train_bpe")["train_bpe"](text, num_merges)
        return dict(list(merges.items())[:50]) if num_merges == 60 else merges

    with pytest.raises(CheckFailure, match="You stop after 50 merges, but then .*, which occurs "
                                           "[2-9] times there: training goes on"):
        check_train_bpe(train_bpe)


def test_train_bpe_one_merge_too_many_is_named():
    """The stop checked after the merge is recorded: one merge of a pair seen once."""
    from course_lib.tokenization import merge, pre_tokenize

    def train_bpe(text, num_merges):
        words = [list(c.encode()) for c in pre_tokenize(text)]
        merges = {}
        for i in range(num_merges):
            counts = {}
            for w in words:
                for p in zip(w, w[1:]):
                    counts[p] = counts.get(p, 0) + 1
            if not counts:
                break
            pair = max(counts, key=lambda p: (counts[p], -p[0], -p[1]))
            merges[pair] = 256 + i
            if counts[pair] < 2:
                break
            words = [merge(w, pair, 256 + i) for w in words]
        return merges

    with pytest.raises(CheckFailure, match="You go on after 2 merges, but then the most frequent "
                                           "pair is \\(32, 256\\) \\(b' ab'\\), which "
                                           "occurs 1 times there"):
        check_train_bpe(train_bpe)


def test_train_bpe_wrong_merges_on_the_plays_only(tenth_of_the_text):
    """Right on the small texts, one merge changed on the plays: where, and what to look at."""
    solution = _solution("10.train_bpe")["train_bpe"]

    def train_bpe(text, num_merges):
        merges = solution(text, num_merges)
        if len(text) < 50_000:
            return merges
        items = list(merges.items())
        (a, b), new_id = items[500]
        return dict(items[:500] + [((b, a), new_id)] + items[501:])

    with pytest.raises(CheckFailure, match="Wrong merges .*first 100,000 characters.*merge 500 "
                                           "\\(new id 756\\)") as info:
        check_train_bpe(train_bpe)
    assert "The counts your loop keeps have drifted from the true counts" in str(info.value)


def _train(**knobs):
    def train_bpe(text, num_merges):
        return checks10.reference_train_bpe(text, num_merges, **knobs)

    return train_bpe


@pytest.mark.parametrize("knobs, reason", checks10._TRAIN_MISTAKES,
                         ids=[str(k) for k, _ in checks10._TRAIN_MISTAKES])
def test_train_bpe_every_mistake_is_named(knobs, reason):
    with pytest.raises(CheckFailure, match="Likely mistake") as info:
        check_train_bpe(_train(**knobs))
    assert reason in str(info.value)


def _chunked(chunker, once_per_chunk=False):
    """A learner's (slow, small-text) trainer with its own chunks and counting."""
    from course_lib.tokenization import merge

    def train_bpe(text, num_merges):
        words = [list(c.encode()) for c in chunker(text)]
        merges = {}
        for i in range(num_merges):
            counts = {}
            for w in words:
                for p in (set(zip(w, w[1:])) if once_per_chunk else zip(w, w[1:])):
                    counts[p] = counts.get(p, 0) + 1
            if not counts:
                break
            pair = max(counts, key=lambda p: (counts[p], -p[0], -p[1]))
            if counts[pair] < 2:
                break
            merges[pair] = 256 + i
            words = [merge(w, pair, 256 + i) for w in words]
        return merges

    return train_bpe


@pytest.mark.parametrize(
    "chunker, once, words",
    [
        (lambda text: checks10._split(text), True, "a pair is counted once per chunk"),
        (str.split, False, "yours leave the spaces out of the words"),
        (lambda text: __import__("re").findall(r"\w+|[^\w\s]+", text), False,
         "yours leave the spaces out of the words"),
        (lambda text: __import__("re").findall(r"[A-Za-z]+|\S", text), False,
         "yours leave the spaces out of the words"),
        (lambda text: __import__("re").findall(r" ?\w+| ?[^\w\s]+|\s+", text), False,
         "your home-made regex cuts some chunks elsewhere"),
        (lambda text: __import__("re").findall(r"\s?\w+|\s?[^\w\s]+", text), False,
         "your chunks are not pre_tokenize's: your token b'2n' is in none of them"),
        (lambda text: __import__("re").findall(r" ?[a-zA-Z']+|.", text), False,
         "your home-made regex cuts some chunks elsewhere"),
    ],
)
def test_train_bpe_chunks_and_counting_mistakes_are_named(chunker, once, words):
    with pytest.raises(CheckFailure, match="Likely mistake") as info:
        check_train_bpe(_chunked(chunker, once))
    assert __import__("re").search(words, str(info.value)), str(info.value)
    assert "training stops too early" not in str(info.value)
    assert "each distinct chunk is counted once" not in str(info.value)


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda text, n: None, "returns None"),
        (lambda text, n: list(checks10.reference_train_bpe(text, n)), "return a dict"),
        (lambda text, n: {str(p): i for p, i in checks10.reference_train_bpe(text, n).items()},
         "a pair of ids"),
        (lambda text, n: {tuple(t + 2 * (t >= 256) for t in p): i + 2
                          for p, i in checks10.reference_train_bpe(text, n).items()},
         "Wrong new ids"),
        (lambda text, n: {(0, 0): 256, **{p: i for p, i in checks10.reference_train_bpe(
            text, n).items() if i > 256}}, "At merge 0 \\(new id 256\\).*you merge \\(0, 0\\)"),
        (lambda text, n: {}[text], "Your code raised KeyError"),
    ],
)
def test_train_bpe_bad_answers(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_train_bpe(fn)


def test_train_bpe_refuses_course_libs_trainer_kindly():
    import warnings

    from course_lib.tokenization import BPETokenizer, _train_incremental, word_counts

    def with_the_trainer(text, num_merges):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return BPETokenizer.train(text, 256 + num_merges).merges

    with pytest.raises(CheckFailure, match="calls `course_lib`'s `BPETokenizer.train`.*the very "
                                           "thing this exercise builds"):
        check_train_bpe(with_the_trainer)

    def with_the_inner_trainer(text, num_merges):
        return _train_incremental(word_counts(text), num_merges)

    with pytest.raises(CheckFailure, match="`_train_incremental`"):
        check_train_bpe(with_the_inner_trainer)
    with pytest.raises(CheckFailure, match="course_lib's own code"):
        check_train_bpe(_as_library(with_the_trainer, "course_lib.tokenization"))


def test_train_bpe_endless_loop_is_stopped(monkeypatch):
    monkeypatch.setattr(checks10, "_TRAIN_SECONDS", 0.5)

    def train_bpe(text, num_merges):
        while True:
            pass

    with pytest.raises(CheckFailure, match="did not finish within 0.5 s"):
        check_train_bpe(train_bpe)


def test_train_bpe_without_the_plays_says_what_to_run(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(checks10, "_speed_plays", checks10._speed_plays.__wrapped__)
    with pytest.raises(CheckFailure, match="python -m course_lib.tasks fetch"):
        check_train_bpe(_solution("10.train_bpe")["train_bpe"])


def test_train_bpe_stub(capsys):
    def train_bpe(text, num_merges):
        raise NotImplementedError

    check_train_bpe(train_bpe)
    assert "not implemented yet" in capsys.readouterr().out


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
    text = checks10._speed_text()
    chunks = checks10._split(text)
    assert len(chunks) == len(set(chunks)) == checks10._ENCODE_SPEED_WORDS == 400
    assert all(c[0] == " " and c[1:].isalpha() for c in chunks)
    merges = checks10.gpt2_byte_level_merges()
    assert all(len(checks10.reference_bpe_encode(c, merges)) >= 2 for c in chunks)  # never 1 token


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

    monkeypatch.setattr(checks10, "_ENCODE_SPEED_FLOOR", 1.0)
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
        for chunk in checks10._split(text):
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
    merges = checks10.gpt2_byte_level_merges()
    assert merges == gpt2.byte_level_merges() and len(merges) == 50_000
    for text in checks10._ENCODE_GPT2_STRINGS:
        ids = checks10.reference_bpe_encode(text, merges)
        assert gpt2.from_byte_level(ids) == gpt2.encode(text), text
    toy = checks10._toy_merges()
    for text in checks10._ENCODE_TOY_STRINGS:
        assert checks10.reference_bpe_encode(text, toy) == BPETokenizer(toy).encode(text), text


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
        ours = checks10.gpt2_byte_level_merges() if len(merges) == 50_000 else checks10._toy_merges()
        assert merges == ours
        return checks10.reference_bpe_encode(text, ours, **knobs)

    return bpe_encode


def _knobs_id(index: int, knobs: dict) -> str:
    """A test id that is the same in every process: a callable knob by its name, never its address
    (pytest-xdist's workers must collect the same ids)."""
    parts = [f"{k}={getattr(v, '__name__', v) if callable(v) else v}" for k, v in knobs.items()]
    return f"{index}-" + ",".join(parts)


@pytest.mark.parametrize("knobs, reason", checks10._ENCODE_MISTAKES,
                         ids=[_knobs_id(i, k) for i, (k, _) in enumerate(checks10._ENCODE_MISTAKES)])
def test_bpe_encode_every_mistake_is_named(knobs, reason):
    with pytest.raises(CheckFailure, match="Likely mistake") as info:
        check_bpe_encode(_encode(**knobs))
    assert reason in str(info.value)


def _pieces_of(text, merges):
    ids = checks10.reference_bpe_encode(text, merges)
    return [bytes([i]) if i < 256 else b"?" for i in ids]


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda text, merges: None, "returns None"),
        (_pieces_of, "not the tokens' bytes"),
        (lambda text, merges: [checks10.reference_bpe_encode(c, merges)
                               for c in checks10._split(text)], "one\\s+flat list"),
        (lambda text, merges: np.array(checks10.reference_bpe_encode(text, merges), dtype=float),
         "dtype float64"),
        (lambda text, merges: torch.tensor(checks10.reference_bpe_encode(text, merges) or [0.0]),
         "dtype torch.float32"),
        (lambda text, merges: [float(i) for i in checks10.reference_bpe_encode(text, merges)],
         "no floats"),
        (lambda text, merges: list(text.encode()), "None of the usual mistakes|Likely mistake"),
        (lambda text, merges: checks10.reference_bpe_encode(text, merges)[:-1] or [1],
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
        check_bpe_encode(BPETokenizer(checks10._toy_merges()).encode)


def test_bpe_encode_endless_loop_is_stopped(monkeypatch):
    monkeypatch.setattr(checks10, "_ENCODE_SECONDS", 0.5)

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


def test_wordpiece_first_piece_one_short_is_named():
    """tryout3's attempt: the longest first candidate is word[:-1], the later ones run to the end."""

    def wordpiece(word, vocab):
        if len(word) > 100:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            end = len(word) - 1 if start == 0 else len(word)
            while end > start and (word[start:end] if start == 0 else "##" + word[start:end]) not in vocab:
                end -= 1
            if end == start:
                return ["[UNK]"]
            pieces.append(word[start:end] if start == 0 else "##" + word[start:end])
            start = end
        return pieces

    with pytest.raises(CheckFailure, match="'able'.*you return \\['ab', '##le'\\], expected "
                       "\\['able'\\]: the first piece is never the whole word") as info:
        check_wordpiece(wordpiece)
    assert info.value.mistake and "first piece is never the whole word" in info.value.mistake


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
