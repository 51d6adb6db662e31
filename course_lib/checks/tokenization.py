"""Checkers for the exercises of lesson 10 (tokenization: byte-level BPE and WordPiece).

* ``check_token_counts(fn)``: ``fn() -> dict[str, int]``, the predicted number of GPT-2 tokens of
  six strings (a "predict, then run" question). The reference is tiktoken's encoding built offline
  from GPT-2's own files (``python -m course_lib.tokenization fetch`` puts them in the data folder).
* ``check_merge(fn)``: ``fn(ids, pair, new_id) -> list[int]``, one BPE merge: every occurrence of
  ``pair`` replaced by ``new_id``, left to right, without overlaps (the lesson's debug exercise:
  the stub merges overlapping occurrences). Reference: a small private implementation.
* ``check_train_bpe(fn)``: ``fn(text, num_merges) -> {(a, b): new_id}``, BPE's training loop
  (count inside chunks, the most frequent pair, a tie to the smallest, stop when no pair occurs
  twice), against ``BPETokenizer.train``'s merges on seven texts.
* ``check_bpe_encode(fn)``: ``fn(text, merges) -> list[int]``, encoding by merge rank inside each
  chunk, with a toy trainer's merges and GPT-2's 50,000 (whose results equal ``GPT2Tokenizer``'s).
* ``check_wordpiece(fn)``: ``fn(word, vocab) -> list[str]``, BERT's greedy longest-match-first
  WordPiece on one word, with ``##`` on continuation pieces and ``["[UNK]"]`` for a word that cannot
  be matched or is over 100 characters. Vocabularies: MiniLM's (30,522 tokens) and a small
  hand-made one on which each mistake gives a different answer.

The references live in this module on purpose (the tests prove them equal to
``course_lib.tokenization``, whose functions the learner is refused to hand in). Each call of the
learner's function is stopped after a few seconds, so an endless loop gives a message.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import numbers
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..tokenization import merge as reference_merge  # left to right, never overlapping
from ._common import CheckFailure, checker, is_course_lib, run_learner

__all__ = ["check_token_counts", "check_merge", "check_wordpiece", "check_bpe_encode",
           "check_train_bpe"]


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


class _OutOfTime(BaseException):
    """Raised inside the learner's code when its time is up (a BaseException, so that a learner's
    ``except Exception`` does not swallow it)."""


@contextlib.contextmanager
def _watched(seconds: float, refuse: bool = True,
             allowed: frozenset = frozenset()) -> Iterator[set[str]]:
    """Run the block for at most ``seconds``, and (``refuse``) record which refused packages
    (Hugging Face ``transformers``/``tokenizers``, ``tiktoken``, ``course_lib.tokenization``) run
    inside it: Python calls and calls into their compiled code (a fast tokenizer's Rust methods).
    Functions whose code objects are in ``allowed`` (and what they call) are not recorded.

    The time limit: a SIGALRM timer where there is one (the main thread on Linux and macOS, no
    cost to the learner's code); elsewhere the profile hook looks at the clock every 256 events.
    The profile hook (a cost of 2-4x on call-heavy code) runs only when ``refuse`` or no timer."""
    seen: set[str] = set()
    deadline = time.monotonic() + seconds
    use_alarm = (hasattr(signal, "setitimer")
                 and threading.current_thread() is threading.main_thread())
    inside_allowed = [0]
    events = [0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        events[0] += 1
        if not use_alarm and not events[0] & 255 and time.monotonic() > deadline:
            raise _OutOfTime
        if not refuse:
            return
        if event == "call":
            if frame.f_code in allowed:
                inside_allowed[0] += 1
                return
            found = _refused_module(frame.f_globals.get("__name__", "") or "")
        elif event == "return":
            if frame.f_code in allowed:
                inside_allowed[0] -= 1
            return
        elif event == "c_call":
            found = _refused_module(_owner_module(arg))
        else:
            return
        if found and not inside_allowed[0]:
            seen.add(found)

    def alarm(signum: int, frame: Any) -> None:  # noqa: ARG001 (signal handler signature)
        raise _OutOfTime

    previous_profile = sys.getprofile()
    previous_handler = None
    if use_alarm:
        previous_handler = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    if refuse or not use_alarm:
        sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous_profile)
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous_handler)


def _refuse_hand_in(fn: Any, what: str) -> None:
    """Refuse course_lib's own tokenizers and the libraries' objects handed in as the answer."""
    library = _refused_module(_owner_module(fn))
    if is_course_lib(fn) or library == "course_lib":
        raise CheckFailure(f"You handed in course_lib's own code, not yours: {what}")
    if library:
        raise CheckFailure(f"You handed in an object from the `{library}` package, not your own "
                           f"function: {what}")


def _run_alone(fn: Callable[..., Any], *args: Any, case: str, hint: str, what: str,
               refuse: bool = True, seconds: float = 10.0,
               allowed: frozenset = frozenset(), slow: str = "") -> Any:
    """``fn(*args)``, refusing code that calls the real tokenizers to do the work (``refuse``),
    and stopping it after ``seconds`` with a message instead of hanging."""
    try:
        with _watched(seconds, refuse, allowed) as seen:
            got = run_learner(fn, *args, case=case, hint=hint)
    except _OutOfTime:
        raise CheckFailure(
            f"Your function did not finish within {seconds:g} s ({case}), where a right answer "
            f"takes a few milliseconds: {slow or 'it may loop forever.'} Interrupt it, follow "
            "your loop by hand on this input, and make sure each turn moves forward.") from None
    if seen:
        names = ", ".join(f"`{name}`" for name in sorted(seen))
        raise CheckFailure(f"Your function calls {names}, a real tokenizer ({case}): {what}")
    return got


def _id_list(got: Any, case: str, what: str = "token ids") -> list[int]:
    """The learner's ids as a list of ints: a list or tuple of ints (NumPy ints too), or an
    integer tensor or array; anything else is a ``CheckFailure`` that says what came instead."""
    if got is None:
        raise CheckFailure(f"Your function returns None ({case}): return the list of {what} "
                           "(did you forget `return`?).")
    kind = type(got).__module__.split(".")[0]
    if kind in {"torch", "numpy"} and hasattr(got, "dtype") and hasattr(got, "tolist"):
        if getattr(got, "ndim", 1) != 1 or not ("int" in str(got.dtype)):
            raise CheckFailure(f"Your function returns a {type(got).__name__} of dtype "
                               f"{got.dtype} with {getattr(got, 'ndim', '?')} axes ({case}): "
                               f"return a plain list of ints, the {what}.")
        got = got.tolist()
    if isinstance(got, (str, bytes)) or not isinstance(got, (list, tuple)):
        raise CheckFailure(f"Your function returns {type(got).__name__} ({case}): return a list "
                           f"of ints, the {what} (a generator or map must be turned into a list).")
    for t in got:
        if isinstance(t, (list, tuple)):
            raise CheckFailure(f"Your list holds lists ({case}), e.g. {list(t)[:6]}: return one "
                               f"flat list of {what} (extend, not append, the ids of each chunk).")
        if isinstance(t, (bytes, str)):
            raise CheckFailure(f"Your list holds {type(t).__name__} {t!r} ({case}): return the "
                               f"{what} (ints), not the tokens' bytes or text.")
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise CheckFailure(f"Your list holds {type(t).__name__} {t!r} ({case}): every "
                               f"element must be an int id (no None, no floats, no tensors).")
    return [int(t) for t in got]


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


def _merge_by_text(ids, pair, new_id, sep=" "):
    """The ids written as text, the pair replaced as a substring, read back: "12 1" also matches
    inside "112 1" and "12 11"."""
    text = sep.join(map(str, ids)).replace(f"{pair[0]}{sep}{pair[1]}", str(new_id))
    return [int(t) for t in text.split(sep) if t != ""]


def _merge_by_text_comma(ids, pair, new_id):
    return _merge_by_text(ids, pair, new_id, sep=",")


_MERGE_MISTAKES: list[tuple[str, Callable[..., list[int]]]] = [
    ("the merge replaces text, not ids: written as a string, the pair (12, 1) is \"12 1\", which "
     "also occurs inside \"112 1\" and \"12 11\", so ids that only END or START with those digits "
     "are merged. Compare ids, two at a time: (ids[i], ids[i + 1]) == pair", _merge_by_text),
    ("the merge replaces text, not ids: written as a string, the pair (12, 1) is \"12,1\", which "
     "also occurs inside \"112,1\" and \"12,11\". Compare ids, two at a time: "
     "(ids[i], ids[i + 1]) == pair", _merge_by_text_comma),
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
                        strict_max: bool = True, backtrack: bool = False) -> list[str]:
    """BERT's greedy longest-match-first WordPiece on one word; the defaults are right.

    The knobs give the plausible mistakes: ``shortest`` (shortest match first); ``hashes``:
    "continuation", "none" (no ``##`` at all), "all" (also on the first piece); ``on_failure``:
    "unk" (the whole word), "partial" (the pieces so far + [UNK]), "skip" ([UNK] for one
    character, then go on), "empty" (no piece at all), "word" (the word itself), "pieces" (the
    pieces so far, the rest dropped); ``max_chars``: None (no limit); ``strict_max``: False for
    ">= 100" instead of "> 100"; ``backtrack``: go back to a shorter piece when the rest fails.
    """
    if max_chars is not None and (len(word) > max_chars if strict_max else len(word) >= max_chars):
        return [UNK]
    if backtrack:
        found_all = _segment_backtracking(word, vocab)
        return [UNK] if found_all is None else found_all
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


def _short(word: str) -> str:
    return repr(word) if len(word) <= 30 else f"{word[:8]!r}... ({len(word)} characters)"


@checker
def check_wordpiece(fn: Callable[..., Any]) -> None:
    """Check ``fn(word, vocab) -> list[str]`` against BERT's algorithm on three vocabularies (two
    small hand-made ones first, then MiniLM's), each call stopped after 5 s."""
    what = "write the greedy longest-match-first loop yourself."
    _refuse_hand_in(fn, what)
    cases = [("a small vocabulary (a set)", _HAND_VOCAB, w) for w in _HAND_WORDS]
    cases += [("a vocabulary where the greedy match can fail (a set)", _GREEDY_VOCAB, w)
              for w in _GREEDY_WORDS]
    cases += [("MiniLM's vocabulary (a dict token -> id)", _minilm_vocab(), w) for w in _MINILM_WORDS]
    # The library-call watch slows call-heavy code 2-4x: it runs on the first word of each small
    # vocabulary (a library's tokenizer gives itself away there), not on MiniLM's 30,522 tokens.
    watched: set[str] = set()
    for where, vocab, word in cases:
        label = f"{_short(word)} with {where}"
        given = set(vocab) if isinstance(vocab, frozenset) else dict(vocab)  # a copy to change
        refuse = where not in watched and isinstance(vocab, frozenset)
        got = _run_alone(fn, word, given, case=label, what=what, refuse=refuse,
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
        shown = f"you return {_short_list(got)}, expected {_short_list(expected)}"
        for knobs, reason in _WORDPIECE_MISTAKES:
            if got == reference_wordpiece(word, vocab, **knobs):
                raise CheckFailure(f"Likely mistake ({label}): {shown}: {reason}.")
        if UNK in got and expected == [UNK]:
            raise CheckFailure(f"Likely mistake ({label}): {shown}: {_WHOLE_WORD}.")
        if "".join(t.removeprefix("##") for t in got) != word and UNK not in got:
            raise CheckFailure(f"Wrong pieces ({label}): {shown}; without their '##', your pieces "
                               "do not spell the word: each piece starts where the last ended.")
        raise CheckFailure(f"Wrong pieces ({label}): {shown}. None of the usual mistakes explains "
                           "it; follow your loop by hand on this word.")
    print(f"check_wordpiece: all {len(cases)} words split as BERT's WordPiece does (longest match "
          "first, never going back, '##' on continuations, [UNK] for the whole word). Well done!")


def _short_list(pieces: list[str]) -> str:
    return str(pieces) if len(pieces) <= 8 else f"{pieces[:4]} ... ({len(pieces)} pieces)"


# ----------------------------------------------------------------------------------------------
# shared by check_bpe_encode and check_train_bpe: course_lib helpers the learner may call
# ----------------------------------------------------------------------------------------------


def _allowed_helpers() -> frozenset:
    """The code of the helpers the lesson hands out (``pre_tokenize``, ``merge``, ``pair_counts``
    is not among them: counting is part of the exercise); calling them is not handing in
    course_lib's tokenizer."""
    from .. import tokenization

    return frozenset({tokenization.pre_tokenize.__code__, tokenization.merge.__code__,
                      tokenization._check_text.__code__})


def _split(text: str) -> list[str]:
    import regex

    from ..tokenization import GPT2_SPLIT_PATTERN

    return regex.findall(GPT2_SPLIT_PATTERN, text)


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
    pair from the left, one occurrence), "once" (the lowest, then stop), "rising" (each rank at
    most once, its first occurrence only), "pass" (one left-to-right pass, no repeat)."""
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
    last = -1
    while len(ids) >= 2:
        present = [p for p in zip(ids, ids[1:]) if p in merges and merges[p] > last]
        if not present:
            break
        if pick == "highest":
            pair = max(present, key=merges.__getitem__)
        elif pick == "pair":
            pair = min(present)
        elif pick == "leftmost":
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


def reference_bpe_encode(text: str, merges: dict, pick: str = "lowest", chunks: bool = True,
                         start: str = "bytes") -> list[int]:
    """Byte-level BPE encoding; the defaults are right: cut ``text`` with GPT-2's regex, start
    each chunk from its UTF-8 bytes, merge the lowest-new-id pair present until none is a merge.
    The knobs give the mistakes: ``pick`` (see ``_encode_chunk_variant``, or "longest"),
    ``chunks=False`` (the whole text as one list), ``start="code points"`` (``ord`` of each
    character instead of its bytes)."""
    out: list[int] = []
    for chunk in (_split(text) if chunks else [text]):
        if pick == "longest":
            out += _encode_longest(chunk.encode("utf-8"), merges)
            continue
        ids = [ord(c) for c in chunk] if start == "code points" else list(chunk.encode("utf-8"))
        out += _encode_chunk_variant(ids, merges, pick)
    return out


_ENCODE_MISTAKES: list[tuple[dict[str, Any], str]] = [
    ({"chunks": False}, "merges cross the chunks: the whole text was merged as one list. Cut the "
     "text with pre_tokenize(text) first and merge inside each chunk, so that no token spans two "
     "chunks (e.g. a word and the space before the next word)"),
    ({"start": "code points"}, "ids vs bytes: a chunk starts from its UTF-8 BYTES "
     "(list(chunk.encode('utf-8'))), not from its characters' code points (ord): 'é' is the two "
     "bytes 195 169, and a code point above 255 is not a byte at all"),
    ({"pick": "leftmost"}, "greedy left to right: you merge the first mergeable pair from the left; "
     "BPE merges the pair with the LOWEST new id (learned first) wherever it is, then looks again"),
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
    tests/test_checks_tokenization.py proves it equal to ``GPT2Tokenizer.byte_level_merges``."""
    from ..tokenization import bytes_to_unicode, gpt2_files

    try:
        _, vocab_bpe = gpt2_files()
    except Exception as err:  # missing or altered files: say what to run
        raise CheckFailure(f"GPT-2's tokenizer files are not ready ({err}): run `{_FETCH}` once "
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


@checker
def check_bpe_encode(fn: Callable[..., Any]) -> None:
    """Check ``fn(text, merges) -> list[int]``: byte-level BPE encoding by merge rank, with a toy
    trainer's merges and with GPT-2's 50,000 merges, on strings where each mistake differs."""
    what = "write the encoding loop yourself (pre_tokenize and your merge may help)."
    _refuse_hand_in(fn, what)
    cases = [("a toy trainer's 40 merges", _toy_merges, s) for s in _ENCODE_TOY_STRINGS]
    cases += [("GPT-2's 50,000 merges", gpt2_byte_level_merges, s) for s in _ENCODE_GPT2_STRINGS]
    allowed = _allowed_helpers()
    watched: set[str] = set()
    outputs = []
    for where, get_merges, text in cases:
        merges = get_merges()
        label = f"text {text!r} with {where}"
        got = _run_alone(
            fn, text, _merges_copy(merges), case=label, what=what, refuse=where not in watched,
            allowed=allowed, seconds=_ENCODE_SECONDS,
            slow="with GPT-2's 50,000 merges, looping over all merges for each chunk is too slow, "
                 "or the loop never ends. In each step look only at the chunk's own adjacent pairs "
                 "and pick the one with the lowest new id; stop when none is a merge.",
            hint="merges maps a pair (a, b) of ids to its new id; merges.get(pair) is None for a "
                 "pair that is not a merge.")
        watched.add(where)
        outputs.append((label, text, merges, _id_list(got, label),
                        reference_bpe_encode(text, merges)))
    wrong = [out for out in outputs if out[3] != out[4]]
    if wrong:
        # the mistake that explains every text (else: one that explains the first wrong one)
        label, text, merges, got, expected = wrong[0]
        shown = f"you return {_short_list(got)}, expected {_short_list(expected)}"
        for every in (True, False):
            for knobs, reason in _ENCODE_MISTAKES:
                checked = outputs if every else wrong[:1]
                if all(g == reference_bpe_encode(t, m, **knobs) for _, t, m, g, _ in checked):
                    raise CheckFailure(f"Likely mistake ({label}): {shown}: {reason}.")
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
    print(f"check_bpe_encode: all {len(cases)} texts encoded as byte-level BPE does (merges by "
          "rank, inside each chunk), GPT-2's merges included. Well done!")


# ----------------------------------------------------------------------------------------------
# check_train_bpe (build, ★★★): the training loop
# ----------------------------------------------------------------------------------------------


def reference_train_bpe(text: str, num_merges: int, chunks: bool = True, weighted: bool = True,
                        tie: str = "smallest", min_count: int = 2, first_id: int = 256,
                        start: str = "bytes", update: bool = True,
                        overlapping: bool = False) -> dict[tuple[int, int], int]:
    """The training loop; the defaults are course_lib's (``BPETokenizer.train``): count the
    adjacent pairs in every chunk (each occurrence, so a run "aaa" has 2 pairs (a, a)), merge the
    most frequent, a tie to the smallest pair, stop when no pair occurs twice. The knobs give the
    mistakes: ``chunks=False`` (the text as one list), ``weighted=False`` (each distinct chunk
    once), ``tie`` "largest"/"first" (the first counted, Counter.most_common), ``min_count``
    1 (go on with pairs seen once) or 3, ``first_id`` 255/257, ``start`` "code points",
    ``update=False`` (the first counts' best pairs, words never merged), ``overlapping`` (the
    merge bug of exercise 1)."""
    from collections import Counter

    pieces = _split(text) if chunks else [text]
    if not weighted:
        pieces = list(dict.fromkeys(pieces))
    words = [[ord(c) for c in p] if start == "code points" else list(p.encode("utf-8"))
             for p in pieces]
    merges: dict[tuple[int, int], int] = {}
    first_counts = None
    for i in range(num_merges):
        counts: Counter = Counter()
        for word in words:
            for pair in zip(word, word[1:]):
                counts[pair] += 1
        if not update:
            first_counts = first_counts or counts
            counts = Counter({p: n for p, n in first_counts.items() if p not in merges})
        if not counts:
            break
        if tie == "first":
            pair, n = counts.most_common(1)[0]
        elif tie == "largest":
            pair, n = max(counts.items(), key=lambda item: (item[1], item[0]))
        else:
            pair, n = max(counts.items(), key=lambda item: (item[1], -item[0][0], -item[0][1]))
        if n < min_count:
            break
        new_id = first_id + i
        merges[pair] = new_id
        if update:
            merge_fn = _merge_overlapping if overlapping else reference_merge
            words = [merge_fn(w, pair, new_id) for w in words]
    return merges


_TRAIN_MISTAKES: list[tuple[dict[str, Any], str]] = [
    ({"chunks": False}, "pairs are counted across chunks: cut the text with pre_tokenize(text) "
     "first and count (and merge) inside each chunk only, so that no merge joins two chunks"),
    ({"weighted": False}, "each distinct chunk is counted once: a chunk that occurs 5 times in the "
     "text gives its pairs 5 times"),
    ({"start": "code points"}, "ids vs bytes: each chunk starts from its UTF-8 BYTES "
     "(list(chunk.encode('utf-8'))), not from its characters' code points (ord)"),
    ({"tie": "first"}, "a tie goes to the pair counted first (Counter.most_common does that); the "
     "course's rule gives a tie to the SMALLEST pair (a, b), so that the result never depends on "
     "the order of counting: max(counts, key=lambda p: (counts[p], -p[0], -p[1]))"),
    ({"tie": "largest"}, "a tie goes to the largest pair; the course's rule gives it to the "
     "SMALLEST pair (a, b): max(counts, key=lambda p: (counts[p], -p[0], -p[1]))"),
    ({"min_count": 1}, "training goes on with pairs that occur only once. Hugging Face's "
     "BpeTrainer and minbpe do that, but the course's rule (BPETokenizer.train) stops as soon as "
     "the most frequent pair occurs fewer than 2 times"),
    ({"min_count": 3}, "training stops too early: it stops when the most frequent pair occurs "
     "fewer than 2 times (count < 2), a pair seen twice is still merged"),
    ({"first_id": 257}, "the new ids are one too high: the first merge makes id 256 (ids 0-255 "
     "are the bytes), the i-th (from 0) makes 256 + i"),
    ({"first_id": 255}, "the new ids are one too low: id 255 is a byte; the first merge makes "
     "id 256, the i-th (from 0) makes 256 + i"),
    ({"update": False}, "the counts are never updated: after each merge, replace the pair in "
     "every chunk by its new id and count the pairs again"),
    ({"overlapping": True}, "your merge reuses ids of overlapping pairs (exercise 1's bug): use "
     "the merge that passed check_merge"),
]

_TRAIN_CASES: list[tuple[str, str, int]] = [
    ("the lesson's toy text", "the cat sat on the mat; the hat", 4),
    ("a tie between two pairs", "cdcd abab", 5),
    ("pairs across chunks", "x.x.x.x. yy yy", 6),
    ("repeated chunks", "zzqzzq aab aab aab xyxy", 5),
    ("accents", "café café naïve naïve naïve", 8),
    ("a run of one letter", "aaaaaa aaaa aaa", 6),
    ("a longer text", "To be, or not to be, that is the question: whether 'tis nobler in the mind "
     "to suffer the slings and arrows of outrageous fortune, or to take arms against a sea of "
     "troubles, and by opposing end them. To die, to sleep, no more; and by a sleep to say we "
     "end the heart-ache and the thousand natural shocks that flesh is heir to. " * 3, 60),
]
_TRAIN_SECONDS = 10.0


def _merges_output(got: Any, label: str) -> list[tuple[tuple[int, int], int]]:
    """The learner's merges as ``[((a, b), new_id), ...]`` ordered by new id."""
    if got is None:
        raise CheckFailure(f"Your function returns None ({label}): return the dict of merges "
                           "{(a, b): new_id} (did you forget `return`?).")
    if not isinstance(got, dict):
        raise CheckFailure(f"Your function returns {type(got).__name__} ({label}): return a dict "
                           "{(a, b): new_id}, the pairs in the order learned, new ids 256, 257, ...")
    items = []
    for pair, new_id in got.items():
        ok_pair = (isinstance(pair, tuple) and len(pair) == 2
                   and all(isinstance(t, numbers.Integral) and not isinstance(t, bool)
                           for t in pair))
        if not ok_pair or isinstance(new_id, bool) or not isinstance(new_id, numbers.Integral):
            raise CheckFailure(f"Your dict holds {pair!r}: {new_id!r} ({label}): each key is a "
                               "pair of ids (a tuple of two ints), each value the new id (an int).")
        items.append(((int(pair[0]), int(pair[1])), int(new_id)))
    return sorted(items, key=lambda item: item[1])


def _describe_merges(items: list, limit: int = 6) -> str:
    shown = ", ".join(f"{a, b}->{n}" for (a, b), n in items[:limit])
    return f"[{shown}{', ...' if len(items) > limit else ''}] ({len(items)} merges)"


@checker
def check_train_bpe(fn: Callable[..., Any]) -> None:
    """Check ``fn(text, num_merges) -> dict[(a, b), new_id]`` against course_lib's trainer
    (``BPETokenizer.train``'s merges) on texts where each mistake gives other merges."""
    import warnings

    from ..tokenization import BPETokenizer

    what = "write the training loop yourself (pre_tokenize and your merge may help)."
    _refuse_hand_in(fn, what)
    allowed = _allowed_helpers()
    outputs = []
    for k, (case, text, num_merges) in enumerate(_TRAIN_CASES):
        label = f"{case}: {_short(text)}, num_merges={num_merges}"
        got = _run_alone(fn, text, num_merges, case=label, what=what, refuse=k == 0,
                         allowed=allowed, seconds=_TRAIN_SECONDS,
                         hint="Count with a dict or collections.Counter; words is a list of lists.")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "stopped after k merges" is part of the check
            course = BPETokenizer.train(text, 256 + num_merges, method="naive").merges
        outputs.append((label, text, num_merges, _merges_output(got, label),
                        sorted(course.items(), key=lambda item: item[1])))
    wrong = [out for out in outputs if out[3] != out[4]]
    if wrong:
        label, text, num_merges, got, expected = wrong[0]
        shown = f"you return {_describe_merges(got)}, expected {_describe_merges(expected)}"
        for every in (True, False):
            for knobs, reason in _TRAIN_MISTAKES:
                checked = outputs if every else wrong[:1]
                if all(g == sorted(reference_train_bpe(t, n, **knobs).items(),
                                   key=lambda item: item[1]) for _, t, n, g, _ in checked):
                    raise CheckFailure(f"Likely mistake ({label}): {shown}: {reason}.")
        if [n for _, n in got] != list(range(256, 256 + len(got))):
            raise CheckFailure(f"Wrong new ids ({label}): {shown}; the i-th merge (from 0) makes "
                               "id 256 + i, one after the other.")
        first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b),
                     min(len(got), len(expected)))
        raise CheckFailure(f"Wrong merges ({label}): {shown}; the first difference is merge "
                           f"{first} (new id {256 + first}). None of the usual mistakes explains "
                           "it; print the pair counts before that merge and compare.")
    print(f"check_train_bpe: all {len(_TRAIN_CASES)} texts give course_lib's merges (counted "
          "inside chunks, ties to the smallest pair, stopped when no pair repeats). Well done!")
