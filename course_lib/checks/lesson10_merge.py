"""Checker for lesson 10's Debug exercise: one BPE merge.

* ``check_merge(fn)``: ``fn(ids, pair, new_id) -> list[int]``, one BPE merge: every occurrence of
  ``pair`` replaced by ``new_id``, left to right, without overlaps (the stub merges overlapping
  occurrences). A first failure says what is observed; the same mistake seen again says what goes
  wrong; the fix is ``show_solution``'s.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

from ..tokenization import merge as reference_merge  # left to right, never overlapping
from .common import CheckFailure, checker
from .lesson10_tokenization import refuse_hand_in, run_alone

__all__ = ["check_merge"]


# ----------------------------------------------------------------------------------------------
# check_merge (debug)
# ----------------------------------------------------------------------------------------------


def _merge_variant(ids, pair, new_id, either_order=False, step=2, stop=0, lookahead=1):
    """The merge loop with one knob per mistake (the defaults give course_lib's ``merge``):
    ``either_order`` also merges the reversed pair; ``step`` ids are skipped after a match;
    the loop stops ``stop`` ids before the end; a match needs ``lookahead`` ids after ``i``."""
    pairs = {tuple(pair), tuple(pair[::-1])} if either_order else {tuple(pair)}
    out, i = [], 0
    while i < len(ids) - stop:
        if i + lookahead < len(ids) and (ids[i], ids[i + 1]) in pairs:
            out.append(new_id)
            i += step
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_overlapping(ids, pair, new_id):  # the stub's bug
    out = list(ids)
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            out[i] = new_id
            out[i + 1] = None
    return [t for t in out if t is not None]


def _merge_right_to_left(ids, pair, new_id):
    return reference_merge(ids[::-1], pair[::-1], new_id)[::-1]


def _merge_first_only(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            return list(ids[:i]) + [new_id] + list(ids[i + 2:])
    return list(ids)


def _merge_either_order(ids, pair, new_id):
    return _merge_variant(ids, pair, new_id, either_order=True)


def _merge_keeps_second(ids, pair, new_id):  # i += 1 after a match
    return _merge_variant(ids, pair, new_id, step=1)


def _merge_both_new(ids, pair, new_id):  # both places of a match get the new id
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == tuple(pair):
            out += [new_id, new_id]
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def _merge_drops_last(ids, pair, new_id):  # while i < len(ids) - 1, last id never appended
    return _merge_variant(ids, pair, new_id, stop=1)


def _merge_misses_end(ids, pair, new_id):  # range(len(ids) - 2): the last pair is never looked at
    return _merge_variant(ids, pair, new_id, lookahead=2)


def _merge_never_matches(ids, pair, new_id):  # e.g. a list slice compared with the tuple
    return list(ids)


def _merge_first_id_only(ids, pair, new_id):  # the pair's second id never compared
    out, i = [], 0
    while i < len(ids):
        if ids[i] == pair[0] and i + 1 < len(ids):
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def _merge_drops_pair(ids, pair, new_id):  # after a match, i += 2 but no new_id appended
    return [t for t in reference_merge(ids, pair, new_id) if t != new_id]


def _merge_by_text(ids, pair, new_id, sep=" "):
    """The ids written as text, the pair replaced as a substring, read back: "12 1" also matches
    inside "112 1" and "12 11"."""
    text = sep.join(map(str, ids)).replace(f"{pair[0]}{sep}{pair[1]}", str(new_id))
    return [int(t) for t in text.split(sep) if t != ""]


def _merge_by_text_comma(ids, pair, new_id):
    return _merge_by_text(ids, pair, new_id, sep=",")


def _spelled(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """The ids with each ``new_id`` written back as the pair: what the result stands for."""
    return [t for i in ids for t in (pair if i == new_id else (i,))]


# Exercise 1 is a Debug exercise: a first failure says what is observed, never the fix; the same
# mistake seen again says more (what goes wrong, still not the code); the fix is show_solution's.
# Each row: (the wrong variant, what is observed, what a second failure adds).
_MERGE_MISTAKES: list[tuple[Callable[..., list[int]], str, str]] = [
    (_merge_by_text,
     "your result merges ids that are not the pair: {strange}",
     "the ids were matched as digits in a string: written out, \"112 1\" contains \"12 1\", so "
     "ids that only end or start with the pair's digits are merged too; ids are numbers, not text"),
    (_merge_by_text_comma,
     "your result merges ids that are not the pair: {strange}",
     "the ids were matched as digits in a string: written out, \"112,1\" contains \"12,1\", so "
     "ids that only end or start with the pair's digits are merged too; ids are numbers, not text"),
    (merge_overlapping,
     "written back as pairs, your result stands for {spelled}: {extra} more than the "
     "input {ids} holds, so decoding would not give the text back",
     "in a run of one id, the pair occurs at i and again at i + 1, and both matches are "
     "merged: the id in the middle is used by two new ids. BPE merges left to right and "
     "uses each id at most once"),
    (_merge_right_to_left,
     "your result holds as many {new}s as expected, at other places: in a run, your merged "
     "pair is further right than expected",
     "BPE reads a run from the left: the first two ids of a run (a, a, a) form the pair, the "
     "last one stays alone"),
    (_merge_first_only,
     "your result holds fewer {new}s than expected: a later occurrence of the pair is still "
     "there, unmerged",
     "after the first match the loop stops merging; every occurrence of the pair is replaced"),
    (_merge_either_order,
     "your result holds more {new}s than expected: a {new} stands where the input has the "
     "pair's two ids in the other order",
     "the pair (a, b) means a followed by b, in that order; (b, a) is another pair"),
    (_merge_keeps_second,
     "written back as pairs, your result stands for {spelled}: {extra} more than the "
     "input {ids} holds; after each {new}, the pair's second id appears once more",
     "after a match, the pair's second id is looked at again and kept: both ids of the pair "
     "are used up by the match"),
    (_merge_first_id_only,
     "your result holds more {new}s than expected: a {new} stands where the input has {first} "
     "followed by another id than {second}",
     "only the first id of the pair is compared; both must match, in order"),
    (_merge_drops_pair,
     "your result holds no {new} at all: where the input has the pair, both of its ids are gone",
     "when the pair is found, the loop moves past its two ids without putting the new id in "
     "their place"),
    (_merge_both_new,
     "your result is as long as the input: each occurrence of the pair became two {new}s, one "
     "in each of the pair's places",
     "both ids of a found pair are overwritten by the new id; the pair stands for ONE new id, "
     "so the result is one id shorter per occurrence"),
    (_merge_drops_last,
     "your result ends before the input does: the input's last id {last} is missing",
     "the loop stops one id before the end, and the last id, when it is not part of a pair, is "
     "never added"),
    (_merge_misses_end,
     "the pair at the very end of the input is not merged: your result ends with the pair's two "
     "ids",
     "the loop never looks at the last pair, which starts at i = len(ids) - 2"),
    (_merge_never_matches,
     "your result is the input unchanged: the pair {pair} was never found, though the input "
     "holds it",
     "the comparison with the pair never succeeds: the two ids at i and i + 1 must be compared "
     "with the pair as values of the same kind (a list, such as a slice ids[i:i + 2], is never "
     "equal to a tuple)"),
]


_MERGE_SEEN: dict[Callable[..., list[int]], int] = {}  # how often check_merge met each mistake


A, B, C, D, NEW = 5, 7, 1, 2, 300  # ids: a pair (A, B) or (A, A) is merged into NEW


_MERGE_CASES: list[tuple[str, list[int], tuple[int, int]]] = [
    ("no occurrence", [C, A, D, B, A], (A, B)),
    ("one occurrence", [C, A, B, D], (A, B)),
    ("several occurrences", [A, B, C, A, B, A, B, D], (A, B)),
    ("a pair at the end", [C, D, A, B], (A, B)),
    ("the pair reversed also present", [B, A, C, A, B, D], (A, B)),
    ("only the pair", [A, B], (A, B)),
    ("a run of 3, pair (a, a)", [C, A, A, A, D], (A, A)),
    ("a run of 4, pair (a, a)", [A, A, A, A], (A, A)),
    ("a run of 5, pair (a, a)", [D, A, A, A, A, A], (A, A)),
    ("a run of 3 at the end, pair (a, a)", [C, A, A, A], (A, A)),
    ("multi-digit ids", [112, 1, 12, 1, 12, 11, 3], (12, 1)),
    ("multi-digit ids, a pair inside a longer number", [5, 12, 11, 21, 2, 1], (12, 1)),
    ("an empty list", [], (A, B)),
    ("a single id", [A], (A, B)),
]


def _merge_output(got: Any, case: str) -> list[int]:
    """The learner's output as a list of ints, or a ``CheckFailure`` saying what came instead."""
    if got is None:
        raise CheckFailure(f"Your function returns None ({case}): return the new list of ids "
                           "(did you forget `return`?).")
    kind = type(got).__module__.split(".")[0]
    if kind in {"torch", "numpy"}:
        raise CheckFailure(f"Your function returns a {type(got).__name__} ({case}): return a "
                           "plain list of ints, like its input.")
    if isinstance(got, (str, bytes)) or not isinstance(got, (list, tuple)):
        raise CheckFailure(f"Your function returns {type(got).__name__} ({case}): return a list "
                           "of ints (a generator or map must be turned into a list).")
    bad = [t for t in got if isinstance(t, bool) or not isinstance(t, numbers.Integral)]
    if bad:
        raise CheckFailure(f"Your list holds {type(bad[0]).__name__} {bad[0]!r} ({case}): every "
                           "element must be an int id (no None, no tensors); remove the "
                           "placeholders of merged ids.")
    return [int(t) for t in got]


@checker
def check_merge(fn: Callable[..., Any]) -> None:
    """Check ``fn(ids, pair, new_id) -> list[int]`` on runs, ends, overlaps and empty input."""
    what = "write the merge loop yourself."
    refuse_hand_in(fn, what)
    for case, ids, pair in _MERGE_CASES:
        given = list(ids)
        got = run_alone(fn, given, pair, NEW, case=f"{case}: ids {ids}, pair {pair}",
                        hint="Check the index at the end of the list: ids[i + 1] must exist.",
                        what=what)
        label = f"{case}: ids {ids}, pair {pair}, new_id {NEW}"
        if given != ids:
            raise CheckFailure(f"Your function changed its input list ({label}): it became "
                               f"{given}. The input must stay as it was: the caller still "
                               "needs it.")
        got = _merge_output(got, label)
        expected = reference_merge(ids, pair, NEW)
        if got == expected:
            continue
        for variant, observed, more in _MERGE_MISTAKES:
            if got == variant(ids, pair, NEW):
                seen = _MERGE_SEEN[variant] = _MERGE_SEEN.get(variant, 0) + 1
                spelled = _spelled(got, pair, NEW)
                extra = len(spelled) - len(ids)
                odd = sorted(set(got) - set(ids) - {NEW})
                strange = (f"it holds {odd}, ids that are neither in the input nor {NEW}" if odd
                           else f"a {NEW} stands where the input does not hold the pair {pair}")
                facts = observed.format(new=NEW, ids=ids, spelled=spelled, strange=strange,
                                        pair=pair, first=pair[0], second=pair[1],
                                        last=ids[-1] if ids else None,
                                        extra="one id" if extra == 1 else f"{extra} ids")
                message = f"Not yet ({label}): you return {got}, expected {expected}: {facts}."
                if seen == 1:
                    raise CheckFailure(message + " Follow your loop by hand on this list, then run "
                                       "the checker again.")
                raise CheckFailure(f"{message} Likely mistake: {more}. show_solution(\"10.merge\") "
                                   "shows a fix.", mistake=more)
        raise CheckFailure(f"Wrong result ({label}): you return {got}, expected {expected}. None "
                           "of the usual mistakes explains it; follow your loop by hand on this "
                           "list.")
    print(f"check_merge: all {len(_MERGE_CASES)} cases right (overlapping runs merge left to "
          "right, without overlaps). Well done!")
