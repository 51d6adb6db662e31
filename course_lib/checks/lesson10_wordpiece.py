"""Checker for lesson 10's WordPiece exercise.

* ``check_wordpiece(fn)``: ``fn(word, vocab) -> list[str]``, BERT's greedy longest-match-first
  WordPiece on one word, with ``##`` on continuation pieces and ``["[UNK]"]`` for a word that cannot
  be matched or is over 100 characters. Vocabularies: MiniLM's (30,522 tokens) and a small
  hand-made one on which each mistake gives a different answer.

``reference_wordpiece`` lives here on purpose (the tests prove it equal to
``course_lib.tokenization``'s ``WordPieceTokenizer``, which the learner is refused to hand in).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .common import CheckFailure, checker
from .lesson10_tokenization import TooLong, refuse_hand_in, run_alone, short, short_list

__all__ = ["check_wordpiece"]


# ----------------------------------------------------------------------------------------------
# check_wordpiece (build)
# ----------------------------------------------------------------------------------------------


UNK = "[UNK]"


MAX_CHARS = 100  # BERT's max_input_chars_per_word: a longer word is [UNK]


def _segment_backtracking(word: str, vocab: Any, start: int = 0) -> list[str] | None:
    """A segmentation that backtracks: longest piece first, but a shorter one when the rest cannot
    be split (not BERT's algorithm: BERT never goes back)."""
    if start == len(word):
        return []
    for end in range(len(word), start, -1):
        piece = ("##" if start else "") + word[start:end]
        if piece in vocab:
            rest = _segment_backtracking(word, vocab, end)
            if rest is not None:
                return [piece, *rest]
    return None


def reference_wordpiece(word: str, vocab: Any, shortest: bool = False, hashes: str = "continuation",
                        on_failure: str = "unk", max_chars: int | None = MAX_CHARS,
                        strict_max: bool = True, backtrack: bool = False,
                        shortest_piece: int = 1, first_short: bool = False) -> list[str]:
    """BERT's greedy longest-match-first WordPiece on one word; the defaults are right.

    The knobs give the plausible mistakes: ``shortest`` (shortest match first); ``hashes``:
    "continuation", "none" (no ``##`` at all), "all" (also on the first piece); ``on_failure``:
    "unk" (the whole word), "partial" (the pieces so far + [UNK]), "skip" ([UNK] for one
    character, then go on), "empty" (no piece at all), "word" (the word itself), "pieces" (the
    pieces so far, the rest dropped); ``max_chars``: None (no limit); ``strict_max``: False for
    ">= 100" instead of "> 100"; ``backtrack``: go back to a shorter piece when the rest fails;
    ``shortest_piece`` 2: a piece of one character is never tried; ``first_short``: the longest
    first piece tried is word[:-1] (an end one short at the start), so the whole word never is.
    """
    if max_chars is not None and (len(word) > max_chars if strict_max else len(word) >= max_chars):
        return [UNK]
    if backtrack:
        found_all = _segment_backtracking(word, vocab)
        return [UNK] if found_all is None else found_all
    pieces: list[str] = []
    start = 0
    while start < len(word):
        longest = len(word) - 1 if first_short and start == 0 else len(word)
        ends = (range(start + 1, len(word) + 1) if shortest
                else range(longest, start + shortest_piece - 1, -1))
        found = None
        for end in ends:
            piece = word[start:end]
            prefixed = "##" + piece if (start > 0 or hashes == "all") and hashes != "none" else piece
            if prefixed in vocab:
                found = (end, prefixed)
                break
        if found is None:
            if on_failure == "partial":
                return pieces + [UNK]
            if on_failure == "skip":
                pieces.append(UNK)
                start += 1
                continue
            return {"empty": [], "word": [word], "pieces": pieces}.get(on_failure, [UNK])
        start, piece = found
        pieces.append(piece)
    return pieces


_WHOLE_WORD = ("a word not turned into a single [UNK]: when any part of the word matches no "
               "piece, the WHOLE word becomes ['[UNK]'], one token, whatever was matched before")


_WORDPIECE_MISTAKES: list[tuple[dict[str, Any], str]] = [
    ({"backtrack": True}, "the search goes back: when the rest of the word cannot be split after "
     "the longest first piece, you try a shorter piece. BERT's WordPiece is greedy and never goes "
     "back: it takes the longest piece, and if the rest fails the whole word is ['[UNK]']"),
    ({"shortest": True}, "the SHORTEST match is taken: WordPiece is greedy longest-match-first; "
     "try the longest substring first (end = len(word)) and shorten it until it is in the "
     "vocabulary"),
    ({"hashes": "none"}, "'##' is missing on continuation pieces: a piece that does not start "
     "the word is looked up in the vocabulary AND returned as '##' + piece"),
    ({"hashes": "all"}, "'##' is also on the first piece: only pieces after the first (start > 0) "
     "get the prefix"),
    ({"on_failure": "partial"}, f"{_WHOLE_WORD}: return ['[UNK]'] alone, not the pieces found so "
     "far plus '[UNK]'"),
    ({"on_failure": "skip"}, f"{_WHOLE_WORD}: do not replace one character by '[UNK]' and go on"),
    ({"on_failure": "empty"}, f"{_WHOLE_WORD}: you return no piece at all (an empty list), so "
     "the word vanishes from the text"),
    ({"on_failure": "word"}, f"{_WHOLE_WORD}: you return the word itself, which is not in the "
     "vocabulary (it has no id)"),
    ({"on_failure": "pieces"}, f"{_WHOLE_WORD}: you return the pieces found so far and drop the "
     "rest of the word"),
    ({"max_chars": None}, "a word over 100 characters must give ['[UNK]'] (BERT's "
     "max_input_chars_per_word), even if it could be split"),
    ({"strict_max": False}, "the limit is OVER 100 characters: a word of exactly 100 characters "
     "is still split (len(word) > 100 gives [UNK])"),
    ({"shortest_piece": 2}, "a piece of one character is never tried: the loop stops before "
     "end = start + 1, so a word that needs a one-character piece (such as '##s') becomes "
     "['[UNK]']; the shortest piece tried is one character"),
    ({"first_short": True}, "the first piece is never the whole word: the longest candidate tried "
     "at the start of the word leaves out its last character, so a word that is itself in the "
     "vocabulary is split into smaller pieces (or becomes ['[UNK]'] when it is one character)"),
]


# A small vocabulary on which each mistake gives a different answer. Whole-word forms and "##"
# forms differ on purpose: "un" and "##un", "aff" but no "##aff" at the start. "#" is a token, as
# in BERT's vocabulary: a loop that looks up "##" + rest as one string can match "#" forever.
_HAND_VOCAB = frozenset({
    "un", "una", "unaff", "##aff", "##a", "##ff", "##f", "##able", "##ab", "##le", "##l", "##e",
    "a", "ab", "able", "b", "##b", "x", "##x", "##un", "s", "##s", "#", UNK,
})


_HAND_WORDS = ["unaffable", "able", "ables", "unable", "abab", "xabx", "unz", "zun", "sun",
               "a" * MAX_CHARS, "a" * (MAX_CHARS + 1), "b"]


# Where the greedy longest match fails and going back would succeed ("abcd": "abc" leaves "d";
# a backtracking search finds "ab" "##cd"), and where it succeeds with other pieces than the
# fewest ("abcde": greedy "abc" "##de", while "a" "##bcde" also exists).
_GREEDY_VOCAB = frozenset({"abc", "ab", "a", "##cd", "##de", "##bcde", "##c", "q", UNK})


_GREEDY_WORDS = ["abcd", "abcde", "abc", "abcdq", "qabc"]


_MINILM_WORDS = ["tokenization", "unaffable", "wherefore", "supercalifragilistic",
                 "snow\u2603man", "a" * 101]


_SECONDS_PER_WORD = 5.0


_ENDLESS_HINT = ("it may loop forever. If you put '##' in front of the rest of the word and look "
                 "up the prefixes of that string, a vocabulary with the token '#' (BERT's has it) "
                 "matches '#' again and again: keep the '##' apart from the word, look up "
                 "'##' + word[start:end], and move `start` forward.")


@functools.lru_cache(maxsize=1)
def _minilm_vocab() -> dict[str, int]:
    from ..pretrained import minilm_path

    lines = (minilm_path() / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return {token: i for i, token in enumerate(lines) if token}


_PROBE_WORD = "unz"  # "un", then nothing in _HAND_VOCAB continues it: the whole word is [UNK]


_PROBE_SECONDS = 2.0


_NO_UNK_LOOP = ("your loop never ends on the word {word!r} with a small vocabulary (a set): after "
                "'un', no piece of the vocabulary continues the word ('##z' is not in it), and "
                "your loop stays where it is, trying again and again. When some part of the word "
                "matches nothing, the WHOLE word becomes ['[UNK]']: your function must notice "
                "that no piece was found at this position, and return")


def _probe_endless(fn: Callable[..., Any], what: str) -> None:
    """Run ``fn`` on a word that cannot be split, with the profile watch on (which also slows a
    loop that appends forever, so its list stays small). If it never ends, tell the endless loops
    apart: one that never ends on a word that IS a piece; the Hugging Face course's loop (it glues
    '##' to the rest of the word), which ends once the token '#' is out of the vocabulary; and a
    loop that never gives up on a word that cannot be split."""
    label = f"{_PROBE_WORD!r} with a small vocabulary (a set)"

    def ends(word: str, vocab: set) -> bool:
        try:
            run_alone(fn, word, vocab, case=label, what=what, seconds=_PROBE_SECONDS, hint="")
        except TooLong:
            return False
        except CheckFailure:
            pass
        return True

    if ends(_PROBE_WORD, set(_HAND_VOCAB)):
        return  # a right or wrong answer, or a crash: the cases below say what is wrong
    if not ends("able", set(_HAND_VOCAB)):
        raise TooLong(f"Your function did not finish within {_PROBE_SECONDS:g} s, on {label} "
                      "and even on 'able', which is one piece of that vocabulary: it may loop "
                      "forever. Interrupt it, follow your loop by hand on 'able', and make sure "
                      "each turn moves forward.")
    if ends(_PROBE_WORD, set(_HAND_VOCAB) - {"#"}):
        raise TooLong(f"Your function did not finish within {_PROBE_SECONDS:g} s ({label}), "
                      f"where a right answer takes a few milliseconds: {_ENDLESS_HINT}")
    raise CheckFailure(f"Likely mistake: {_NO_UNK_LOOP.format(word=_PROBE_WORD)}.")


@checker
def check_wordpiece(fn: Callable[..., Any]) -> None:
    """Check ``fn(word, vocab) -> list[str]`` against BERT's algorithm on three vocabularies (two
    small hand-made ones first, then MiniLM's), each call stopped after 5 s."""
    what = "write the greedy longest-match-first loop yourself."
    refuse_hand_in(fn, what)
    _probe_endless(fn, what)
    cases = [("a small vocabulary (a set)", _HAND_VOCAB, w) for w in _HAND_WORDS]
    cases += [("a vocabulary where the greedy match can fail (a set)", _GREEDY_VOCAB, w)
              for w in _GREEDY_WORDS]
    cases += [("MiniLM's vocabulary (a dict token -> id)", _minilm_vocab(), w) for w in _MINILM_WORDS]
    # The library-call watch slows call-heavy code 2-4x: it runs on the first word of each small
    # vocabulary (a library's tokenizer gives itself away there), not on MiniLM's 30,522 tokens.
    watched: set[str] = set()
    for where, vocab, word in cases:
        label = f"{short(word)} with {where}"
        given = set(vocab) if isinstance(vocab, frozenset) else dict(vocab)  # a copy to change
        refuse = where not in watched and isinstance(vocab, frozenset)
        got = run_alone(fn, word, given, case=label, what=what, refuse=refuse,
                        seconds=_SECONDS_PER_WORD, slow=_ENDLESS_HINT,
                        hint="Test membership with `piece in vocab`; it works for a set and a dict.")
        watched.add(where)
        if isinstance(got, str):
            raise CheckFailure(f"Your function returns a string ({label}): {got[:60]!r}. Return a "
                               "list of pieces, e.g. ['un', '##aff', '##able'], and ['[UNK]'] "
                               "(a list) for an unknown word.")
        if got is None:
            raise CheckFailure(f"Your function returns None ({label}): return the list of pieces "
                               "(did you forget `return`?).")
        if not isinstance(got, (list, tuple)) or not all(isinstance(t, str) for t in got):
            raise CheckFailure(f"Your function returns {type(got).__name__} ({label}): return a "
                               "list of strings (the pieces).")
        got = list(got)
        expected = reference_wordpiece(word, vocab)
        if got == expected:
            continue
        shown = f"you return {short_list(got)}, expected {short_list(expected)}"
        for knobs, reason in _WORDPIECE_MISTAKES:
            if got == reference_wordpiece(word, vocab, **knobs):
                raise CheckFailure(f"Likely mistake ({label}): {shown}: {reason}.", mistake=reason)
        if UNK in got and expected == [UNK]:
            raise CheckFailure(f"Likely mistake ({label}): {shown}: {_WHOLE_WORD}.")
        if [t.removeprefix("##") for t in got] == [t.removeprefix("##") for t in expected]:
            bare = [t for k, t in enumerate(got) if k and not t.startswith("##")]
            first = [t for t in got[:1] if t.startswith("##")]
            where = (f"{bare[0]!r} continues the word without '##'" if bare
                     else f"the first piece {first[0]!r} has '##'" if first else "")
            raise CheckFailure(f"Likely mistake ({label}): {shown}: the right pieces, with '##' "
                               f"in the wrong places: {where}. Every piece after the first, "
                               "and only those, is looked up and returned with '##' in front.")
        if "".join(t.removeprefix("##") for t in got) != word and UNK not in got:
            raise CheckFailure(f"Wrong pieces ({label}): {shown}; without their '##', your pieces "
                               "do not spell the word: each piece starts where the last ended.")
        raise CheckFailure(f"Wrong pieces ({label}): {shown}. None of the usual mistakes explains "
                           "it; follow your loop by hand on this word.")
    print(f"check_wordpiece: all {len(cases)} words split as BERT's WordPiece does (longest match "
          "first, never going back, '##' on continuations, [UNK] for the whole word). Well done!")
