"""Lesson-10 Predict checker, GPT-2's token counts, and the checkers' shared rules
(course_lib/checks/lesson10_tokenization.py): right answers pass, mistakes are named."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from _helpers import as_library, passes, solution_namespace

from course_lib.checks import CheckFailure, check_token_counts, lesson10_tokenization as tokens10
from course_lib.solutions import predicted_answer


# ----------------------------------------------------------------------------------------------
# predict: how many GPT-2 tokens
# ----------------------------------------------------------------------------------------------


RIGHT = {"hello world": 2, " Shakespeare": 1, "HELLO WORLD": 4, "123456789": 4, "strawberry": 3,
         "   indented": 4}


def _counts(**changes):
    """The right counts with some replaced: keys are the strings' positions s0..s5."""
    got = dict(RIGHT)
    for key, value in changes.items():
        got[tokens10.TOKEN_COUNT_STRINGS[int(key[1:])]] = value
    return lambda: got


def test_true_counts_are_tiktokens():
    """The checker's reference: tiktoken on GPT-2's files; the right answer is RIGHT."""
    assert {s: len(tokens10.gpt2_tokens(s)) for s in tokens10.TOKEN_COUNT_STRINGS} == RIGHT
    assert tokens10.gpt2_tokens("   indented") == [" ", " ", " ind", "ented"]
    assert tokens10.gpt2_tokens("123456789") == ["123", "45", "67", "89"]


def test_token_counts_solution_passes(capsys):
    assert passes(check_token_counts, solution_namespace("10.token_counts")["predicted_token_counts"])
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

    count = as_library(encode, "tiktoken.core")

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
    monkeypatch.setattr(tokens10, "_gpt2_folder", lambda: tmp_path)
    with pytest.raises(CheckFailure, match="run `python -m course_lib.data fetch`"):
        check_token_counts(lambda: RIGHT)


def test_token_counts_with_an_altered_file_says_so(monkeypatch, tmp_path):
    source = tokens10._gpt2_folder()
    for name in ("vocab.bpe", "encoder.json"):
        shutil.copy(source / name, tmp_path / name)
    with open(tmp_path / "vocab.bpe", "a", encoding="utf-8") as f:
        f.write("x y\n")
    monkeypatch.setattr(tokens10, "_gpt2_folder", lambda: tmp_path)
    with pytest.raises(CheckFailure, match="not the official one"):
        check_token_counts(lambda: RIGHT)
