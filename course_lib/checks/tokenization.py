"""Checkers for the exercises of lesson 10 (tokenization: byte-level BPE and WordPiece).

* ``check_token_counts(fn)``: ``fn() -> dict[str, int]``, the predicted number of GPT-2 tokens of
  six strings (a "predict, then run" question). The reference is tiktoken's encoding built offline
  from GPT-2's own files (``python -m course_lib.tokenization fetch`` puts them in the data folder).
* ``check_merge(fn)``: ``fn(ids, pair, new_id) -> list[int]``, one BPE merge: every occurrence of
  ``pair`` replaced by ``new_id``, left to right, without overlaps (the lesson's debug exercise:
  the stub merges overlapping occurrences). Reference: a small private implementation.
* ``check_wordpiece(fn)``: ``fn(word, vocab) -> list[str]``, BERT's greedy longest-match-first
  WordPiece on one word, with ``##`` on continuation pieces and ``["[UNK]"]`` for a word that cannot
  be matched or is over 100 characters. Vocabularies: MiniLM's (30,522 tokens) and a small
  hand-made one on which each mistake gives a different answer.

The references live in this module on purpose: the checkers do not depend on
``course_lib.tokenization``, the module whose functions the learner is refused to hand in.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import numbers
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..tokenization import merge as reference_merge  # left to right, never overlapping
from ._common import CheckFailure, checker, is_course_lib, run_learner

__all__ = ["check_token_counts", "check_merge", "check_wordpiece"]


# ----------------------------------------------------------------------------------------------
# shared: refusing the real tokenizers
# ----------------------------------------------------------------------------------------------

_REFUSED_MODULES = ("transformers", "tokenizers", "tiktoken", "course_lib.tokeniz")


def _refused_module(name: str) -> str | None:
    """The refused package a module name belongs to (``"transformers"``, ...), else None."""
    for prefix in _REFUSED_MODULES:
        if name == prefix or name.startswith(prefix + ".") or (
                prefix.startswith("course_lib.") and name.startswith(prefix)):
            return "course_lib" if prefix.startswith("course_lib") else prefix
    return None


def _owner_module(obj: Any) -> str:
    """The module of a function, a bound method's object, or an instance's class."""
    owner = getattr(obj, "__self__", None)
    if owner is not None and not isinstance(owner, type(sys)):  # a bound method: its object's class
        return type(owner).__module__ or ""
    module = getattr(obj, "__module__", None)
    if isinstance(module, str):
        return module
    return type(obj).__module__ or ""


@contextlib.contextmanager
def _library_calls() -> Iterator[set[str]]:
    """Record which refused packages (Hugging Face ``transformers``/``tokenizers``, ``tiktoken``,
    ``course_lib.tokenization``) run inside the block: Python calls and calls into their compiled
    code (a fast tokenizer's Rust methods)."""
    seen: set[str] = set()
    previous = sys.getprofile()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            found = _refused_module(frame.f_globals.get("__name__", "") or "")
        elif event == "c_call":
            found = _refused_module(_owner_module(arg))
        else:
            return
        if found:
            seen.add(found)

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


def _refuse_hand_in(fn: Any, what: str) -> None:
    """Refuse course_lib's own tokenizers and the libraries' objects handed in as the answer."""
    library = _refused_module(_owner_module(fn))
    if is_course_lib(fn) or library == "course_lib":
        raise CheckFailure(f"You handed in course_lib's own code, not yours: {what}")
    if library:
        raise CheckFailure(f"You handed in an object from the `{library}` package, not your own "
                           f"function: {what}")


def _run_alone(fn: Callable[..., Any], *args: Any, case: str, hint: str, what: str) -> Any:
    """``fn(*args)``, refusing code that calls the real tokenizers to do the work."""
    with _library_calls() as seen:
        got = run_learner(fn, *args, case=case, hint=hint)
    if seen:
        names = ", ".join(f"`{name}`" for name in sorted(seen))
        raise CheckFailure(f"Your function calls {names}, a real tokenizer ({case}): {what}")
    return got


# ----------------------------------------------------------------------------------------------
# check_token_counts (predict)
# ----------------------------------------------------------------------------------------------

TOKEN_COUNT_STRINGS = ("hello world", " Shakespeare", "HELLO WORLD", "123456789", "strawberry",
                       "   indented")

# The sha256 of GPT-2's official files (the ones tiktoken checks when it downloads them).
_GPT2_SHA256 = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}
_FETCH = "python -m course_lib.tokenization fetch"


def _gpt2_folder() -> Path:
    from ..tasks import data_dir

    return data_dir() / "gpt2"


@functools.lru_cache(maxsize=None)
def _gpt2_encoding(folder: str) -> Any:
    """tiktoken's GPT-2 encoding, built from the local files in ``folder`` (checked by sha256)."""
    import tiktoken
    import tiktoken.load
    from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's pre-tokenisation regex

    paths = {name: Path(folder) / name for name in _GPT2_SHA256}
    for name, path in paths.items():
        if not path.is_file():
            raise CheckFailure(f"GPT-2's tokenizer file {name} is not in {folder}: run `{_FETCH}` "
                               "once (it needs the network), then run this cell again.")
        if hashlib.sha256(path.read_bytes()).hexdigest() != _GPT2_SHA256[name]:
            raise CheckFailure(f"GPT-2's tokenizer file {path} is not the official one (its "
                               f"sha256 differs): run `{_FETCH}` again.")
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(paths["vocab.bpe"]), encoder_json_file=str(paths["encoder.json"]))
    return tiktoken.Encoding(name="gpt2_local", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256})


def gpt2_tokens(text: str) -> list[str]:
    """GPT-2's tokens of ``text`` as strings (byte pieces decoded with replacement), via tiktoken."""
    enc = _gpt2_encoding(str(_gpt2_folder()))
    return [enc.decode_single_token_bytes(i).decode("utf-8", errors="replace")
            for i in enc.encode(text)]


_WHY_AVERAGE = ("\"a token is about 4 characters of English\" is an average over a lot of text, "
                "not a rule for one string")

# Per string: (wrong count, what it suggests), tried before the general explanations below.
_STRING_MISTAKES: dict[str, list[tuple[int, str]]] = {
    "hello world": [
        (3, "the space is not a token of its own: GPT-2 glues a space to the word that follows "
            "it, so a space-separated word starts with its space"),
        (1, "the space splits: GPT-2 cuts the text before each word (with its leading space) "
            "before merging, so no token spans two words"),
    ],
    " Shakespeare": [
        (2, "the leading space is not a token of its own: it belongs to the word that follows, "
            "and GPT-2's vocabulary has many words WITH their leading space"),
        (3, "the leading space is not a token of its own: it belongs to the word that follows; "
            "a capitalised word is often one token with its space, even if it splits without it"),
    ],
    "HELLO WORLD": [
        (2, "capitals split more: upper-case text is rare in the training text, so BPE learned "
            "few merges for it; \"HELLO WORLD\" does not get as few tokens as \"hello world\""),
    ],
    "123456789": [
        (3, "GPT-2 does not split numbers in fixed groups of 3 digits: its merges were learned "
            "from frequencies, so a long number splits into whatever digit groups were common"),
        (5, "GPT-2 does not split numbers in fixed groups of 2 digits: its merges were learned "
            "from frequencies, so a long number splits into whatever digit groups were common"),
    ],
    "strawberry": [
        (2, "BPE's pieces are not the parts of a compound word: they are the merges that "
            "were frequent in the training text, and \"straw\" + \"berry\" is not how it goes"),
    ],
    "   indented": [
        (2, "a run of spaces is not one token: GPT-2's vocabulary has no token for several "
            "spaces, and the last space of the run belongs to the next word"),
        (3, "a run of spaces is not one token: GPT-2's vocabulary has no token for several "
            "spaces, and the last space of the run belongs to the next word"),
        (5, "the last space of a run belongs to the word that follows it: GPT-2's "
            "pre-tokenisation gives it to the word, the spaces before it stand alone"),
    ],
}


def _count_reason(text: str, got: int, right: int) -> str:
    """Why ``got`` is a plausible wrong count for ``text`` (the named mistake, or a direction)."""
    for value, reason in _STRING_MISTAKES.get(text, []):
        if got == value:
            return reason
    n_chars, n_words = len(text), len(text.split())
    n_letters = sum(not c.isspace() for c in text)
    if got == n_chars:
        return (f"that is the number of characters ({n_chars}): tokens are usually longer than "
                "one character, GPT-2 has 50,257 of them, most are pieces of words")
    if got == n_words:
        return ("that is one token per word: only common words (with their leading space) are "
                "single tokens; rarer words, capitals and numbers split into pieces")
    if got in {n_chars // 4, -(-n_chars // 4), round(n_chars / 4), n_letters // 4,
               -(-n_letters // 4), round(n_letters / 4)}:
        return f"that looks like characters / 4: {_WHY_AVERAGE}"
    if got <= 0:
        return "every non-empty string is at least one token"
    if got < right:
        return "too few: this string splits into more pieces than you think"
    return "too many: GPT-2 has merged more of this string than you think"


@checker
def check_token_counts(fn: Callable[[], Any]) -> None:
    """Check ``fn() -> dict[str, int]``: the number of GPT-2 tokens of each of the six strings."""
    if is_course_lib(fn):
        raise CheckFailure("You handed in course_lib's own code: write your prediction as a dict.")
    got = _run_alone(fn, case="your prediction", hint="Return a dict {string: number of tokens}.",
                     what="predict the counts yourself, write them as numbers, then run the "
                          "reveal cell below to see the tokens.")
    if not isinstance(got, dict):
        raise CheckFailure(f"Return a dict {{string: number of tokens}}, got {type(got).__name__}.")
    missing = [s for s in TOKEN_COUNT_STRINGS if s not in got]
    extra = [s for s in got if s not in TOKEN_COUNT_STRINGS]
    if missing or extra:
        message = "The keys must be exactly the six strings of the exercise."
        if missing:
            message += f" Missing: {', '.join(map(repr, missing))}."
        if extra:
            message += f" Unexpected: {', '.join(map(repr, extra))}."
        if any(str(s).strip() in {m.strip() for m in missing} for s in extra):
            message += " Spaces count: copy each string exactly, its leading spaces included."
        raise CheckFailure(message)
    not_ints = [s for s in TOKEN_COUNT_STRINGS
                if isinstance(got[s], bool) or not isinstance(got[s], numbers.Integral)]
    if not_ints:
        shown = ", ".join(f"{s!r}: {got[s]!r}" for s in not_ints)
        raise CheckFailure(f"Each count is a whole number of tokens (an int); not these: {shown}.")
    tokens = {s: gpt2_tokens(s) for s in TOKEN_COUNT_STRINGS}
    wrong = [s for s in TOKEN_COUNT_STRINGS if int(got[s]) != len(tokens[s])]
    if wrong:
        lines = [f"  {s!r}: you said {int(got[s])}; {_count_reason(s, int(got[s]), len(tokens[s]))}."
                 for s in wrong]
        raise CheckFailure(
            f"Not quite: {len(wrong)} of the {len(TOKEN_COUNT_STRINGS)} counts are off.\n"
            + "\n".join(lines) + "\nChange those and run the checker again.")
    lines = [f"  {s!r:15} -> {len(tokens[s])}: " + " ".join(repr(t) for t in tokens[s])
             for s in TOKEN_COUNT_STRINGS]
    print("check_token_counts: right, all six counts. GPT-2's tokens (spaces shown inside the "
          "quotes):\n" + "\n".join(lines))


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


def _merge_overlapping(ids, pair, new_id):  # the stub's bug
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


def _merge_drops_last(ids, pair, new_id):  # while i < len(ids) - 1, last id never appended
    return _merge_variant(ids, pair, new_id, stop=1)


def _merge_misses_end(ids, pair, new_id):  # range(len(ids) - 2): the last pair is never looked at
    return _merge_variant(ids, pair, new_id, lookahead=2)


_MERGE_MISTAKES: list[tuple[str, Callable[..., list[int]]]] = [
    ("overlapping occurrences are merged (the stub's bug): after a match at i, the loop also "
     "matches at i + 1, reusing an id that is already part of the merged pair. BPE merges left "
     "to right without overlaps: after a match, skip BOTH ids (i += 2)", _merge_overlapping),
    ("the merge runs right to left: BPE scans left to right, so a run (a, a, a) becomes "
     "(new, a), not (a, new)", _merge_right_to_left),
    ("only the first occurrence is merged: replace EVERY occurrence of the pair, keep scanning "
     "after a match", _merge_first_only),
    ("the pair's order is ignored: (b, a) is merged too, but the pair (a, b) means a followed "
     "by b, exactly", _merge_either_order),
    ("the second id of the pair is kept: after a match, skip both ids (i += 2), not one",
     _merge_keeps_second),
    ("the last id is lost: a loop `while i < len(ids) - 1` never appends the last id when it "
     "is not part of a pair; append what is left after the loop", _merge_drops_last),
    ("a pair at the very end is missed: the last pair starts at i = len(ids) - 2, so loop up "
     "to it (range(len(ids) - 1))", _merge_misses_end),
]

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
    bad = [t for t in got if isinstance(t, bool) or not isinstance(t, int)]
    if bad:
        raise CheckFailure(f"Your list holds {type(bad[0]).__name__} {bad[0]!r} ({case}): every "
                           "element must be an int id (no None, no tensors); remove the "
                           "placeholders of merged ids.")
    return list(got)


@checker
def check_merge(fn: Callable[..., Any]) -> None:
    """Check ``fn(ids, pair, new_id) -> list[int]`` on runs, ends, overlaps and empty input."""
    what = "write the merge loop yourself."
    _refuse_hand_in(fn, what)
    for case, ids, pair in _MERGE_CASES:
        given = list(ids)
        got = _run_alone(fn, given, pair, NEW, case=f"{case}: ids {ids}, pair {pair}",
                         hint="Check the index at the end of the list: ids[i + 1] must exist.",
                         what=what)
        label = f"{case}: ids {ids}, pair {pair}, new_id {NEW}"
        if given != ids:
            raise CheckFailure(f"Your function changed its input list ({label}): it became "
                               f"{given}. Build a new list (out = []) and leave `ids` as it is: "
                               "the caller still needs it.")
        got = _merge_output(got, label)
        expected = reference_merge(ids, pair, NEW)
        if got == expected:
            continue
        for reason, variant in _MERGE_MISTAKES:
            if got == variant(ids, pair, NEW):
                raise CheckFailure(f"Likely mistake ({label}): you return {got}, expected "
                                   f"{expected}: {reason}.")
        raise CheckFailure(f"Wrong result ({label}): you return {got}, expected {expected}. None "
                           "of the usual mistakes explains it; follow your loop by hand on this "
                           "list.")
    print(f"check_merge: all {len(_MERGE_CASES)} cases right (overlapping runs merge left to "
          "right, without overlaps). Well done!")


# ----------------------------------------------------------------------------------------------
# check_wordpiece (build)
# ----------------------------------------------------------------------------------------------

UNK = "[UNK]"
MAX_CHARS = 100  # BERT's max_input_chars_per_word: a longer word is [UNK]


def reference_wordpiece(word: str, vocab: Any, shortest: bool = False, hashes: str = "continuation",
                        on_failure: str = "unk", max_chars: int | None = MAX_CHARS,
                        strict_max: bool = True) -> list[str]:
    """BERT's greedy longest-match-first WordPiece on one word; the defaults are right.

    The knobs give the plausible mistakes: ``shortest`` (shortest match first); ``hashes``:
    "continuation", "none" (no ``##`` at all), "all" (also on the first piece); ``on_failure``:
    "unk" (the whole word), "partial" (the pieces so far + [UNK]), "skip" ([UNK] for one
    character, then go on);
    ``max_chars``: None (no limit); ``strict_max``: False for ">= 100" instead of "> 100".
    """
    if max_chars is not None and (len(word) > max_chars if strict_max else len(word) >= max_chars):
        return [UNK]
    pieces: list[str] = []
    start = 0
    while start < len(word):
        ends = range(start + 1, len(word) + 1) if shortest else range(len(word), start, -1)
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
            return [UNK]
        start, piece = found
        pieces.append(piece)
    return pieces


_WORDPIECE_MISTAKES: list[tuple[dict[str, Any], str]] = [
    ({"shortest": True}, "the SHORTEST match is taken: WordPiece is greedy longest-match-first; "
     "try the longest substring first (end = len(word)) and shorten it until it is in the "
     "vocabulary"),
    ({"hashes": "none"}, "'##' is missing on continuation pieces: a piece that does not start "
     "the word is looked up in the vocabulary AND returned as '##' + piece"),
    ({"hashes": "all"}, "'##' is also on the first piece: only pieces after the first (start > 0) "
     "get the prefix"),
    ({"on_failure": "partial"}, "when part of the word cannot be matched, the whole word becomes "
     "['[UNK]']: return ['[UNK]'] alone, not the pieces found so far plus '[UNK]'"),
    ({"on_failure": "skip"}, "when part of the word cannot be matched, the whole word becomes "
     "['[UNK]']: do not replace one character by '[UNK]' and go on"),
    ({"max_chars": None}, "a word over 100 characters must give ['[UNK]'] (BERT's "
     "max_input_chars_per_word), even if it could be split"),
    ({"strict_max": False}, "the limit is OVER 100 characters: a word of exactly 100 characters "
     "is still split (len(word) > 100 gives [UNK])"),
]

# A small vocabulary on which each mistake gives a different answer. Whole-word forms and "##"
# forms differ on purpose: "un" and "##un", "aff" but no "##aff" at the start.
_HAND_VOCAB = frozenset({
    "un", "una", "unaff", "##aff", "##a", "##ff", "##f", "##able", "##ab", "##le", "##l", "##e",
    "a", "ab", "able", "b", "##b", "x", "##x", "##un", "s", "##s", UNK,
})
_HAND_WORDS = ["unaffable", "able", "ables", "unable", "abab", "xabx", "unz", "zun", "sun",
               "a" * MAX_CHARS, "a" * (MAX_CHARS + 1), "b"]
_MINILM_WORDS = ["tokenization", "unaffable", "embeddings", "wherefore", "shakespeare", "xyz",
                 "supercalifragilistic", "snow\u2603man", "\u2603", "a" * 101, "a" * 60]


@functools.lru_cache(maxsize=1)
def _minilm_vocab() -> dict[str, int]:
    from ..pretrained import minilm_path

    lines = (minilm_path() / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return {token: i for i, token in enumerate(lines) if token}


def _short(word: str) -> str:
    return repr(word) if len(word) <= 30 else f"{word[:8]!r}... ({len(word)} characters)"


@checker
def check_wordpiece(fn: Callable[..., Any]) -> None:
    """Check ``fn(word, vocab) -> list[str]`` against BERT's algorithm on two vocabularies."""
    what = "write the greedy longest-match-first loop yourself."
    _refuse_hand_in(fn, what)
    cases = [("a small vocabulary (a set)", _HAND_VOCAB, w) for w in _HAND_WORDS]
    cases += [("MiniLM's vocabulary (a dict token -> id)", _minilm_vocab(), w) for w in _MINILM_WORDS]
    for where, vocab, word in cases:
        label = f"{_short(word)} with {where}"
        given = set(vocab) if isinstance(vocab, frozenset) else dict(vocab)  # a copy to change
        got = _run_alone(fn, word, given, case=label, what=what,
                         hint="Test membership with `piece in vocab`; it works for a set and a dict.")
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
        shown = f"you return {_short_list(got)}, expected {_short_list(expected)}"
        for knobs, reason in _WORDPIECE_MISTAKES:
            if got == reference_wordpiece(word, vocab, **knobs):
                raise CheckFailure(f"Likely mistake ({label}): {shown}: {reason}.")
        if "".join(t.removeprefix("##") for t in got) != word and UNK not in got:
            raise CheckFailure(f"Wrong pieces ({label}): {shown}; without their '##', your pieces "
                               "do not spell the word: each piece starts where the last ended.")
        raise CheckFailure(f"Wrong pieces ({label}): {shown}. None of the usual mistakes explains "
                           "it; follow your loop by hand on this word.")
    print(f"check_wordpiece: all {len(cases)} words split as BERT's WordPiece does (longest match "
          "first, '##' on continuations, [UNK] for the whole word). Well done!")


def _short_list(pieces: list[str]) -> str:
    return str(pieces) if len(pieces) <= 8 else f"{pieces[:4]} ... ({len(pieces)} pieces)"
