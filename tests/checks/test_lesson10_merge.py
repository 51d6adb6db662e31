"""Lesson-10 Debug checker, one BPE merge (course_lib/checks/lesson10_merge.py): right answers in several
styles pass, each mistake is observed, then named."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from _helpers import as_library, passes, solution_namespace

from course_lib.checks import CheckFailure, check_merge, lesson10_merge as merge10


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
    assert passes(check_merge, solution_namespace("10.merge")["merge"])
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
    merge10._MERGE_SEEN.clear()
    yield
    merge10._MERGE_SEEN.clear()


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
    (lambda ids, pair, new_id: merge10._merge_never_matches(ids, pair, new_id),
     "your result is the input unchanged: the pair (5, 7) was never found",
     "a list, such as a slice ids[i:i + 2], is never equal to a tuple"),
    (lambda ids, pair, new_id: merge10._merge_first_id_only(ids, pair, new_id),
     "a 300 stands where the input has 5 followed by another id than 7",
     "only the first id of the pair is compared"),
    (_misses_end, "the pair at the very end of the input is not merged",
     "the loop never looks at the last pair"),
    (lambda ids, pair, new_id: merge10._merge_by_text(ids, pair, new_id),
     "your result merges ids that are not the pair", "ids are numbers, not text"),
    (lambda ids, pair, new_id: merge10._merge_by_text_comma(ids, pair, new_id),
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
        (lambda ids, pair, new_id: torch.tensor(solution_namespace("10.merge")["merge"](ids, pair, new_id)),
         "returns a Tensor"),
        (lambda ids, pair, new_id: np.array(ids), "returns a ndarray"),
        (lambda ids, pair, new_id: None, "returns None"),
        (lambda ids, pair, new_id: (t for t in ids), "a generator"),
        (lambda ids, pair, new_id: [new_id if t == pair[0] else None for t in ids], "no None"),
        (lambda ids, pair, new_id: [t + 1 for t in ids], "None of the usual mistakes"),
        (lambda ids, pair, new_id: (ids[0], solution_namespace("10.merge")["merge"](ids, pair, new_id))[1],
         "Your code raised IndexError \\(an empty list"),
    ],
)
def test_merge_mistakes(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_merge(fn)


def test_merge_refuses_course_lib_and_libraries():
    solution = solution_namespace("10.merge")["merge"]
    with pytest.raises(CheckFailure, match="course_lib's own code"):
        check_merge(as_library(solution, "course_lib.tokenization"))
    library_merge = as_library(solution, "course_lib.tokenization")

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
