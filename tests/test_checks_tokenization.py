"""Lesson-10 checkers: correct answers in several styles pass, each named mistake is caught."""

from __future__ import annotations

import importlib
import shutil

import numpy as np
import pytest
import torch
from _helpers import passes

from course_lib.checks import check_merge, check_token_counts, check_wordpiece
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
    assert "check_merge: all 12 cases right" in capsys.readouterr().out


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


def test_merge_stub_bug_is_named_with_its_example():
    with pytest.raises(CheckFailure, match="overlapping occurrences are merged") as info:
        check_merge(_stub_merge)
    assert "you return [1, 300, 300, 2], expected [1, 300, 5, 2]" in str(info.value)


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


@pytest.mark.parametrize(
    "fn, words",
    [
        (_right_to_left, "right to left"),
        (_first_only, "only the first occurrence"),
        (_either_order, "order is ignored"),
        (_keeps_second, "second id of the pair is kept"),
        (_drops_last, "the last id is lost"),
        (_misses_end, "a pair at the very end is missed"),
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
        (_wordpiece(shortest=True), "the SHORTEST match is taken"),
        (_wordpiece(hashes="none"), "'##' is missing on continuation pieces"),
        (_wordpiece(hashes="all"), "'##' is also on the first piece"),
        (_wordpiece(on_failure="partial"), "not the pieces found so far plus '\\[UNK\\]'"),
        (_wordpiece(on_failure="skip"), "the whole word becomes \\['\\[UNK\\]'\\]"),
        (_wordpiece(max_chars=None), "over 100 characters must give"),
        (_wordpiece(strict_max=False), "a word of exactly 100 characters"),
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
