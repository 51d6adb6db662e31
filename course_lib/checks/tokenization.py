"""Checkers for the exercises of lesson 10 (tokenization: byte-level BPE and WordPiece).

* ``check_token_counts(fn)``: ``fn() -> dict[str, int]``, the predicted number of GPT-2 tokens of
  six strings (a "predict, then run" question). The reference is tiktoken's encoding built offline
  from GPT-2's own files (``python -m course_lib.tokenization fetch`` puts them in the data folder).
* ``check_merge(fn)``: ``fn(ids, pair, new_id) -> list[int]``, one BPE merge: every occurrence of
  ``pair`` replaced by ``new_id``, left to right, without overlaps (the lesson's debug exercise:
  the stub merges overlapping occurrences). A first failure says what is observed; the same
  mistake seen again says what goes wrong; the fix is ``show_solution``'s.
* ``check_train_bpe(fn)``: ``fn(text, num_merges) -> {(a, b): new_id}``, BPE's training loop
  (count inside chunks, the most frequent pair, a tie to the smallest, stop when no pair occurs
  twice), against ``BPETokenizer.train``'s merges on eight texts; then fast (the lesson's ★★★):
  1,000 merges on a megabyte of the plays, equal to course_lib's, in at most 20 times the CPU time
  of course_lib's trainer, measured just before in the same process.
* ``check_bpe_encode(fn)``: ``fn(text, merges) -> list[int]``, encoding by merge rank inside each
  chunk, with a toy trainer's merges and GPT-2's 50,000 (whose results equal ``GPT2Tokenizer``'s);
  then 400 distinct made-up words in at most 20 times the CPU time of course_lib's encoder.
* ``check_wordpiece(fn)``: ``fn(word, vocab) -> list[str]``, BERT's greedy longest-match-first
  WordPiece on one word, with ``##`` on continuation pieces and ``["[UNK]"]`` for a word that cannot
  be matched or is over 100 characters. Vocabularies: MiniLM's (30,522 tokens) and a small
  hand-made one on which each mistake gives a different answer.

The references live in this module on purpose (the tests prove them equal to
``course_lib.tokenization``, whose functions the learner is refused to hand in). Each call of the
learner's function is stopped after a few seconds, so an endless loop gives a message.
Speed tests count CPU time (``time.process_time``, an ITIMER_PROF timer), so that other programs
on a busy machine do not count against the learner.
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


class _OutOfCPU(_OutOfTime):
    """Raised inside the learner's code when its CPU-time budget is spent (a speed test)."""


class _TooLong(CheckFailure):
    """The learner's function did not finish in time (the message says so)."""


class _Seen(set):
    """The refused packages seen running, and the first course_lib function among them."""

    def __init__(self) -> None:
        super().__init__()
        self.functions: list[str] = []


@contextlib.contextmanager
def _watched(seconds: float, refuse: bool = True, allowed: frozenset = frozenset(),
             cpu_seconds: float | None = None) -> Iterator[_Seen]:
    """Run the block for at most ``seconds``, and (``refuse``) record which refused packages
    (Hugging Face ``transformers``/``tokenizers``, ``tiktoken``, ``course_lib.tokenization``) run
    inside it: Python calls and calls into their compiled code (a fast tokenizer's Rust methods).
    Functions whose code objects are in ``allowed`` (and what they call) are not recorded.

    The time limit: a SIGALRM timer where there is one (the main thread on Linux and macOS, no
    cost to the learner's code); elsewhere the profile hook looks at the clock every 256 events.
    The profile hook (a cost of 2-4x on call-heavy code) runs only when ``refuse`` or no timer.

    ``cpu_seconds``: a budget of this process's CPU time (a speed test that other programs on a
    busy machine do not disturb), an ITIMER_PROF timer where there is one, else the profile hook
    looks at ``time.process_time()``; ``_OutOfCPU`` when it is spent."""
    seen = _Seen()
    deadline = time.monotonic() + seconds
    use_alarm = (hasattr(signal, "setitimer")
                 and threading.current_thread() is threading.main_thread())
    cpu_deadline = None if cpu_seconds is None else time.process_time() + cpu_seconds
    inside_allowed = [0]
    events = [0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        events[0] += 1
        if not use_alarm and not events[0] & 255:
            if time.monotonic() > deadline:
                raise _OutOfTime
            if cpu_deadline is not None and time.process_time() > cpu_deadline:
                raise _OutOfCPU
        if not refuse:
            return
        if event == "call":
            if frame.f_code in allowed:
                inside_allowed[0] += 1
                return
            found = _refused_module(frame.f_globals.get("__name__", "") or "")
            if found == "course_lib" and not inside_allowed[0] and not seen.functions:
                seen.functions.append(frame.f_code.co_qualname)
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

    def cpu_spent(signum: int, frame: Any) -> None:  # noqa: ARG001
        raise _OutOfCPU

    previous_profile = sys.getprofile()
    previous_handler = previous_cpu_handler = None
    if use_alarm:
        previous_handler = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        if cpu_seconds is not None:
            previous_cpu_handler = signal.signal(signal.SIGPROF, cpu_spent)
            signal.setitimer(signal.ITIMER_PROF, cpu_seconds)
    if refuse or not use_alarm:
        sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous_profile)
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous_handler)
            if cpu_seconds is not None:
                signal.setitimer(signal.ITIMER_PROF, 0)
                signal.signal(signal.SIGPROF, previous_cpu_handler)


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
               allowed: frozenset = frozenset(), slow: str = "",
               cpu_seconds: float | None = None, too_slow: str = "") -> Any:
    """``fn(*args)``, refusing code that calls the real tokenizers to do the work (``refuse``),
    and stopping it after ``seconds`` with a message instead of hanging; a speed test also stops
    it when it has used ``cpu_seconds`` of CPU time, with the message ``too_slow``."""
    try:
        with _watched(seconds, refuse, allowed, cpu_seconds) as seen:
            got = run_learner(fn, *args, case=case, hint=hint)
    except _OutOfCPU:
        raise CheckFailure(too_slow) from None
    except _OutOfTime:
        raise _TooLong(
            f"Your function did not finish within {seconds:g} s ({case}), where a right answer "
            f"takes a few milliseconds: {slow or 'it may loop forever.'} Interrupt it, follow "
            "your loop by hand on this input, and make sure each turn moves forward.") from None
    if seen.functions:
        raise CheckFailure(f"Your function calls `course_lib`'s `{seen.functions[0]}` ({case}): "
                           f"that is the course's own tokenizer, the very thing this exercise "
                           f"builds; {what}")
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
    (_merge_overlapping,
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
    _refuse_hand_in(fn, what)
    for case, ids, pair in _MERGE_CASES:
        given = list(ids)
        got = _run_alone(fn, given, pair, NEW, case=f"{case}: ids {ids}, pair {pair}",
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


def _short(word: str) -> str:
    return repr(word) if len(word) <= 30 else f"{word[:8]!r}... ({len(word)} characters)"


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
            _run_alone(fn, word, vocab, case=label, what=what, seconds=_PROBE_SECONDS, hint="")
        except _TooLong:
            return False
        except CheckFailure:
            pass
        return True

    if ends(_PROBE_WORD, set(_HAND_VOCAB)):
        return  # a right or wrong answer, or a crash: the cases below say what is wrong
    if not ends("able", set(_HAND_VOCAB)):
        raise _TooLong(f"Your function did not finish within {_PROBE_SECONDS:g} s, on {label} "
                       "and even on 'able', which is one piece of that vocabulary: it may loop "
                       "forever. Interrupt it, follow your loop by hand on 'able', and make sure "
                       "each turn moves forward.")
    if ends(_PROBE_WORD, set(_HAND_VOCAB) - {"#"}):
        raise _TooLong(f"Your function did not finish within {_PROBE_SECONDS:g} s ({label}), "
                       f"where a right answer takes a few milliseconds: {_ENDLESS_HINT}")
    raise CheckFailure(f"Likely mistake: {_NO_UNK_LOOP.format(word=_PROBE_WORD)}.")


@checker
def check_wordpiece(fn: Callable[..., Any]) -> None:
    """Check ``fn(word, vocab) -> list[str]`` against BERT's algorithm on three vocabularies (two
    small hand-made ones first, then MiniLM's), each call stopped after 5 s."""
    what = "write the greedy longest-match-first loop yourself."
    _refuse_hand_in(fn, what)
    _probe_endless(fn, what)
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


def _short_list(pieces: list[str]) -> str:
    return str(pieces) if len(pieces) <= 8 else f"{pieces[:4]} ... ({len(pieces)} pieces)"


# ----------------------------------------------------------------------------------------------
# shared by check_bpe_encode and check_train_bpe: course_lib helpers the learner may call
# ----------------------------------------------------------------------------------------------


def _allowed_helpers() -> frozenset:
    """The code of the building blocks the lesson shows (``pre_tokenize``, ``merge``,
    ``pair_counts``, and ``word_counts``: the distinct chunks with their counts); calling them is
    not handing in course_lib's tokenizer (its trainer and encoder are refused)."""
    from .. import tokenization

    return frozenset({tokenization.pre_tokenize.__code__, tokenization.merge.__code__,
                      tokenization.pair_counts.__code__, tokenization.word_counts.__code__,
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
    pieces = _split(text) if chunks is True else [text] if chunks is False else chunks(text)
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


# The speed test: distinct made-up words, each two GPT-2 words glued (" ability" + "indexed"),
# so that no word is a single token and a loop over all 50,000 merges runs to the end for each.
_ENCODE_SPEED_WORDS = 400
_ENCODE_SPEED_RATIO = 20  # the learner's CPU time at most this many times course_lib's encoder's
_ENCODE_SPEED_FLOOR = 1.0  # CPU seconds: a budget never below this (a fast machine's jitter)
_NONE_COMPARED = ("min, max or sorted compared None with a new id: merges.get(pair) is None for a "
                  "pair that is not a merge, and None cannot be compared with an int. Give such "
                  "pairs a rank that comes LAST (merges.get(pair, float('inf'))), or look only "
                  "at the pairs that are in merges")


@functools.lru_cache(maxsize=1)
def _speed_text() -> str:
    """``_ENCODE_SPEED_WORDS`` distinct made-up words from GPT-2's vocabulary (seeded)."""
    import random

    merges = gpt2_byte_level_merges()
    pieces = {b: bytes([b]) for b in range(256)}
    for (a, b), new_id in sorted(merges.items(), key=lambda item: item[1]):
        pieces[new_id] = pieces[a] + pieces[b]
    words = [p for i, p in sorted(pieces.items()) if i >= 256 and len(p) >= 5
             and p[:1] == b" " and p[1:].isalpha() and p[1:].islower()]
    rng = random.Random(0)
    chosen: set[bytes] = set()
    while len(chosen) < _ENCODE_SPEED_WORDS:
        chosen.add(rng.choice(words) + rng.choice(words)[1:])
    return b"".join(sorted(chosen)).decode("ascii")


def _times(ratio: float, reference: float, budget: float, what: str) -> str:
    """How the budget of a speed test was set, in words."""
    if budget <= ratio * reference:
        return (f"{ratio} times what course_lib's {what} took on the same text just before "
                f"({reference:.2f} s)")
    return (f"the least the checker gives (course_lib's {what} took {reference:.2f} s on the same "
            f"text just before; {ratio} times that would be less)")


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
    _refuse_hand_in(fn, what)
    cases = [("a toy trainer's 40 merges", _toy_merges, s) for s in _ENCODE_TOY_STRINGS]
    cases += [("GPT-2's 50,000 merges", gpt2_byte_level_merges, s) for s in _ENCODE_GPT2_STRINGS]
    allowed = _allowed_helpers()
    watched: set[str] = set()
    outputs = []
    hint = ("merges maps a pair (a, b) of ids to its new id; merges.get(pair) is None for a pair "
            "that is not a merge.")
    for where, get_merges, text in cases:
        merges = get_merges()
        label = f"text {text!r} with {where}"
        try:
            got = _run_alone(
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
        outputs.append((label, text, merges, _id_list(got, label),
                        reference_bpe_encode(text, merges)))
    _name_encode_mistake(outputs)
    _check_encode_speed(fn, allowed, what, hint)
    print(f"check_bpe_encode: all {len(cases)} texts encoded as byte-level BPE does (merges by "
          f"rank, inside each chunk), GPT-2's merges included, and {_ENCODE_SPEED_WORDS} words "
          "encoded in good time. Well done!")


def _raise_first_explaining(outputs: list, wrong: list, mistakes: list, prefix: str,
                            variant: Callable[[str, Any, dict], Any]) -> None:
    """Raise for the first of ``mistakes`` (``(knobs, reason)``) whose ``variant(text, arg, knobs)``
    gives the learner's output on every case of ``outputs`` (``(label, text, arg, got, expected)``),
    else for the first that explains the first wrong case."""
    for checked in (outputs, wrong[:1]):
        for knobs, reason in mistakes:
            if all(got == variant(text, arg, knobs) for _, text, arg, got, _ in checked):
                raise CheckFailure(f"{prefix}: {reason}.", mistake=reason)


def _name_encode_mistake(outputs: list) -> None:
    """Fail, naming the likely mistake, if some output differs from the reference's."""
    wrong = [out for out in outputs if out[3] != out[4]]
    if not wrong:
        return
    # the mistake that explains every text (else: one that explains the first wrong one)
    label, text, merges, got, expected = wrong[0]
    shown = f"you return {_short_list(got)}, expected {_short_list(expected)}"
    _raise_first_explaining(outputs, wrong, _ENCODE_MISTAKES, f"Likely mistake ({label}): {shown}",
                            lambda text, merges, knobs: reference_bpe_encode(text, merges, **knobs))
    chunks = _split(text)
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
    ``_ENCODE_SPEED_RATIO`` times the CPU time course_lib's encoder takes just before."""
    merges, text = gpt2_byte_level_merges(), _speed_text()
    begin = time.process_time()
    expected = reference_bpe_encode(text, merges)
    reference = time.process_time() - begin
    budget = max(_ENCODE_SPEED_FLOOR, _ENCODE_SPEED_RATIO * reference)
    label = f"{_ENCODE_SPEED_WORDS} distinct made-up words such as {_split(text)[0]!r}"
    got = _run_alone(
        fn, text, _merges_copy(merges), case=label, what=what, refuse=False, allowed=allowed,
        seconds=max(_ENCODE_SECONDS, 10 * budget + 30), cpu_seconds=budget, hint=hint,
        too_slow=f"Too slow ({label}, with GPT-2's 50,000 merges): your function was stopped "
                 f"after {budget:.1f} s of CPU time, "
                 + _times(_ENCODE_SPEED_RATIO, reference, budget, "encoder") + ". "
                 "Your results on the short texts are right, so the work is in how you find the "
                 "next merge: going over all 50,000 merges (in rank order, or sorting them) for "
                 "each word costs hundreds of times more than looking at the word's own "
                 "adjacent pairs, of which there are a dozen.")
    _name_encode_mistake([(label, text, merges, _id_list(got, label), expected)])


# ----------------------------------------------------------------------------------------------
# check_train_bpe (build, ★★★): the training loop
# ----------------------------------------------------------------------------------------------


def reference_train_bpe(text: str, num_merges: int, chunks: bool | str = True,
                        weighted: bool = True, tie: str = "smallest", min_count: int = 2,
                        first_id: int = 256, start: str = "bytes", update: bool = True,
                        overlapping: bool = False,
                        once_per_chunk: bool = False) -> dict[tuple[int, int], int]:
    """The training loop; the defaults are course_lib's (``BPETokenizer.train``): count the
    adjacent pairs in every chunk (each occurrence, so a run "aaa" has 2 pairs (a, a)), merge the
    most frequent, a tie to the smallest pair, stop when no pair occurs twice. The knobs give the
    mistakes: ``chunks=False`` (the text as one list), ``chunks`` a key of ``_HOME_MADE_CHUNKS``
    (other chunks than GPT-2's: ``text.split()``, home-made regexes), ``weighted=False`` (each
    distinct chunk once), ``once_per_chunk`` (a pair counted once per chunk, however often it
    occurs in it: ``set(zip(w, w[1:]))``), ``tie`` "largest"/"first" (the first counted,
    Counter.most_common), ``min_count`` 1 (go on with pairs seen once) or 3, ``first_id``
    255/257, ``start`` "code points", ``update=False`` (the first counts' best pairs, words never
    merged), ``overlapping`` (the merge bug of exercise 1)."""
    from collections import Counter

    if isinstance(chunks, str):
        pieces = _HOME_MADE_CHUNKS[chunks](text)
    else:
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
            for pair in (set if once_per_chunk else list)(zip(word, word[1:])):
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


def _findall(pattern: str) -> Callable[[str], list[str]]:
    import re

    return lambda text: re.findall(pattern, text)


# Chunks a learner may cut instead of GPT-2's (pre_tokenize): by whitespace, or a home-made regex.
_HOME_MADE_CHUNKS: dict[str, Callable[[str], list[str]]] = {
    "split": str.split,
    "split space": lambda text: [c for c in text.split(" ") if c],
    "words": _findall(r"\w+|[^\w\s]+"),
    "words and symbols": _findall(r"\w+|[^\w\s]"),
    "space words": _findall(r" ?\w+| ?[^\w\s]+|\s+"),
    "space letters": _findall(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+"),
    "non-space runs": _findall(r"\S+|\s+"),
    "split, spaces back": lambda text: [" " + w for w in text.split()],
    "split, spaces back after the first": lambda text: [
        w if k == 0 else " " + w for k, w in enumerate(text.split())],
}
_CHUNKS_NOT_GPT2 = ("your chunks are not pre_tokenize's: {how}. The course's trainer (and "
                    "GPT-2's) cuts the text with pre_tokenize(text), GPT-2's regex: a word keeps "
                    "the space in front of it (\" the\"), numbers, punctuation and runs of "
                    "spaces are chunks of their own, and \"'s\" is cut off the word")
_SPACES_OUT = _CHUNKS_NOT_GPT2.format(
    how="yours leave the spaces out of the words (as text.split(), text.split(' ') or a regex of "
        "words and symbols do), so no token holds a space in front of a word")
_SPACES_BACK = _CHUNKS_NOT_GPT2.format(
    how="yours are the words of text.split() with a space put back in front, which is not where "
        "GPT-2 cuts: punctuation stays on the word, and newlines and runs of spaces are lost")
_ELSEWHERE = _CHUNKS_NOT_GPT2.format(how="your home-made regex cuts some chunks elsewhere than "
                                         "GPT-2's")
_TRAIN_MISTAKES: list[tuple[dict[str, Any], str]] = [
    ({"chunks": False}, "pairs are counted across chunks: cut the text with pre_tokenize(text) "
     "first and count (and merge) inside each chunk only, so that no merge joins two chunks"),
    ({"chunks": "split"}, _SPACES_OUT),
    ({"chunks": "split space"}, _SPACES_OUT),
    ({"chunks": "words"}, _SPACES_OUT),
    ({"chunks": "words and symbols"}, _SPACES_OUT),
    ({"chunks": "non-space runs"}, _SPACES_OUT),
    ({"chunks": "split, spaces back"}, _SPACES_BACK),
    ({"chunks": "split, spaces back after the first"}, _SPACES_BACK),
    ({"chunks": "space words"}, _ELSEWHERE),
    ({"chunks": "space letters"}, _ELSEWHERE),
    ({"once_per_chunk": True}, "a pair is counted once per chunk, however often it occurs in it "
     "(a set of the chunk's pairs, or `if pair not in seen`): the run \"aaaa\" holds the pair "
     "(a, a) 3 times and \"abab\" holds (a, b) twice; count every occurrence"),
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
    ("contractions and numbers", "it's Kate's 22nd act:  it's Kate's 22nd act, isn't it", 10),
]
_TRAIN_SECONDS = 10.0
# The speed test: num_merges merges on the first megabyte of the training plays, in at most
# _TRAIN_SPEED_RATIO times the CPU time course_lib's trainer takes on it just before (CPU time: a
# busy machine's other programs do not count). Measured on the course's 2-core machine under
# heavy load (load average 11-14), 1,000 merges on 1 MB, the CPU time of each style against
# course_lib's: the counts updated incrementally 1.4x (a heap), 4.8x (max() over all counts each
# merge), 8.6x (every chunk kept instead of the distinct ones with their counts), 12.3x (the counts
# updated, but every word scanned for the pair); a recount of all pairs after each merge 49x (the
# distinct chunks with their counts; every chunk, as the lesson's loop first does, is slower still).
# 20 leaves a margin of 1.6 to 2.4 on either side. With 300 merges the recount was only 24x (the
# text's pre-tokenisation, which both pay, weighs more): too close to any limit, hence 1,000.
_TRAIN_SPEED_CHARS = 1_000_000
_TRAIN_SPEED_MERGES = 1000
_TRAIN_SPEED_RATIO = 20
_TRAIN_SPEED_FLOOR = 2.0  # CPU seconds: a budget never below this (a fast machine's jitter)


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


def _tokens_of(items: list) -> dict[int, bytes]:
    """The bytes each new id of the merges ``[((a, b), new_id), ...]`` stands for."""
    pieces = {b: bytes([b]) for b in range(256)}
    for (a, b), new_id in items:
        if a in pieces and b in pieces:
            pieces[new_id] = pieces[a] + pieces[b]
    return {i: p for i, p in pieces.items() if i >= 256}


def _name_train_mistake(outputs: list) -> None:
    """Fail, naming the likely mistake, if some learner's merges differ from the expected ones.
    ``outputs``: ``(label, text, num_merges, got, expected)``, merges as sorted item lists."""
    wrong = [out for out in outputs if out[3] != out[4]]
    if not wrong:
        return
    label, text, num_merges, got, expected = wrong[0]
    shown = f"you return {_describe_merges(got)}, expected {_describe_merges(expected)}"
    _raise_first_explaining(outputs, wrong, _TRAIN_MISTAKES, f"Likely mistake ({label}): {shown}",
                            lambda text, n, knobs: sorted(reference_train_bpe(text, n, **knobs).items(),
                                                          key=lambda item: item[1]))
    ids = [n for _, n in got]
    if ids != list(range(256, 256 + len(got))):
        skipped = sorted(set(range(256, max(ids, default=256))) - set(ids))
        used = {t for (a, b), _ in got for t in (a, b)}
        gaps = set(range(ids[0], ids[-1] + 1)) - set(ids) if ids else set()
        if ids and ids[0] >= 256 and (gaps or used & set(skipped)) and len(skipped) < len(ids):
            raise CheckFailure(
                f"Likely mistake ({label}): {shown}: the new ids skip {skipped[:5]}: your dict "
                "holds fewer merges than your loop made. A pair merged a second time keeps only "
                "its last new id in the dict, and a pair can only come back if a merge left some "
                "of its occurrences in place: each merge replaces every occurrence of the pair, "
                "in every chunk.")
        raise CheckFailure(f"Wrong new ids ({label}): {shown}; the i-th merge (from 0) makes "
                           "id 256 + i, one after the other.")
    # Chunks other than GPT-2's, by what the learned tokens hold: on every text together, no
    # space in front of anything, or a token of the text that no chunk of pre_tokenize holds.
    def spaced(merges: list) -> bool:
        return any(b" " in t[:-1] for t in _tokens_of(merges).values())

    if any(spaced(e) for *_, e in outputs) and not any(spaced(g) for *_, g, _ in outputs):
        raise CheckFailure(f"Likely mistake ({label}): {shown}: {_SPACES_OUT}.")
    yours = _tokens_of(got)
    encoded, whole = [c.encode("utf-8") for c in _split(text)], text.encode("utf-8")
    across = [t for t in yours.values() if t in whole and not any(t in c for c in encoded)]
    if across:
        raise CheckFailure(f"Likely mistake ({label}): {shown}: " + _CHUNKS_NOT_GPT2.format(
            how=f"your token {across[0]!r} is in none of them"))
    first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b),
                 min(len(got), len(expected)))
    if all(n == 256 + i for i, (_, n) in enumerate(got[:first + 1])):
        counts = _counts_after(text, expected[:first])
        tokens = {**_tokens_of(expected), **{b: bytes([b]) for b in range(256)}}

        def said(pair: tuple[int, int]) -> str:
            spelled = b"".join(tokens.get(t, b"?") for t in pair)
            return f"{pair} ({spelled!r}), which occurs {counts.get(pair, 0)} times there"

        where = f"merge {first} (new id {256 + first})"
        if first < len(got) and first < len(expected):
            mine, theirs = got[first][0], expected[first][0]
            if counts.get(mine, 0) < counts[theirs]:
                raise CheckFailure(
                    f"Wrong merges ({label}): {shown}. At {where}, after the same merges as "
                    f"course_lib's before it, you merge {said(mine)}, but {said(theirs)}: the "
                    "most frequent pair must be merged. The counts your loop used have drifted "
                    "from the true counts: after a merge, every pair that lost or gained an "
                    "occurrence must change (or be counted again), and a pair whose count fell "
                    "must not be picked with its old count.")
        elif first < len(got):
            raise CheckFailure(
                f"Wrong merges ({label}): {shown}. You go on after {first} merges, but then "
                f"the most frequent pair is {said(got[first][0])}: training stops when the "
                "most frequent pair occurs fewer than 2 times, before recording it.")
        elif first < len(expected):
            raise CheckFailure(
                f"Wrong merges ({label}): {shown}. You stop after {first} merges, but then "
                f"{said(expected[first][0])}: training goes on while the most frequent pair "
                "occurs at least twice.")
    raise CheckFailure(f"Wrong merges ({label}): {shown}; the first difference is merge "
                       f"{first} (new id {256 + first}). None of the usual mistakes explains "
                       "it; print the pair counts before that merge and compare.")


def _counts_after(text: str, items: list) -> dict[tuple[int, int], int]:
    """The true pair counts of ``text`` (course_lib's way) after the merges ``items``."""
    from collections import Counter

    words = [list(chunk.encode("utf-8")) for chunk in _split(text)]
    for pair, new_id in items:
        words = [reference_merge(w, pair, new_id) for w in words]
    return Counter(p for w in words for p in zip(w, w[1:]))


@functools.lru_cache(maxsize=1)
def _speed_plays() -> str:
    """The first ``_TRAIN_SPEED_CHARS`` characters of the training plays (lessons 09 and 10)."""
    from ..tasks import VALIDATION_PLAYS, read_plays

    try:
        plays = read_plays()
    except (FileNotFoundError, ValueError) as err:
        raise CheckFailure(f"The speed test trains on Shakespeare's plays, which are not ready: "
                           f"{err}") from None
    text = "\n".join(p.text for p in plays if p.title not in VALIDATION_PLAYS)
    return text[:_TRAIN_SPEED_CHARS]


def _check_train_speed(fn: Callable[..., Any], allowed: frozenset, what: str) -> None:
    """The learner's trainer on a megabyte of the plays: course_lib's merges, in at most
    ``_TRAIN_SPEED_RATIO`` times the CPU time course_lib's trainer takes just before."""
    import warnings

    from ..tokenization import BPETokenizer

    text, num_merges = _speed_plays(), _TRAIN_SPEED_MERGES
    begin = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        course = BPETokenizer.train(text, 256 + num_merges).merges
    reference = time.process_time() - begin
    budget = max(_TRAIN_SPEED_FLOOR, _TRAIN_SPEED_RATIO * reference)
    label = (f"the first {len(text):,} characters of the training plays, "
             f"num_merges={num_merges}")
    got = _run_alone(
        fn, text, num_merges, case=label, what=what, refuse=False, allowed=allowed,
        seconds=10 * budget + 60, cpu_seconds=budget,
        hint="Count with a dict or collections.Counter; words is a list of lists.",
        too_slow=f"Too slow ({label}): your function was stopped after {budget:.1f} s of CPU "
                 "time, " + _times(_TRAIN_SPEED_RATIO, reference, budget, "trainer")
                 + ". Your merges on the small texts are "
                 "right, so the work is in the loop: counting every pair of every chunk again "
                 f"after each merge goes over the whole megabyte {num_merges} times, while a "
                 "merge changes the counts of only a few pairs, in the chunks that hold the "
                 "merged pair.")
    items = _merges_output(got, label)
    expected = sorted(course.items(), key=lambda item: item[1])
    if items != expected:
        first = next((i for i, (a, b) in enumerate(zip(items, expected)) if a != b),
                     min(len(items), len(expected)))
        yours = _tokens_of(items)
        right = _tokens_of(expected)
        mine = items[first] if first < len(items) else None
        theirs = expected[first] if first < len(expected) else None

        def said(item: Any, tokens: dict) -> str:
            if item is None:
                return "no merge (you stopped)"
            return f"{item[0]} -> {item[1]} ({tokens.get(item[1], b'?')!r})"

        raise CheckFailure(
            f"Wrong merges ({label}): your merges are right on the small texts, but here merge "
            f"{first} (new id {256 + first}) is {said(mine, yours)}, expected "
            f"{said(theirs, right)}. The counts your loop keeps have drifted from the true "
            "counts: after a merge, every pair that lost or gained an occurrence must change "
            "(the neighbours on both sides of each merged place, in every chunk that held it, "
            "times how often that chunk occurs), and a pair whose count fell must not be picked "
            "with its old count. Print the counts of both pairs before that merge and compare "
            "with a full recount.")


@checker
def check_train_bpe(fn: Callable[..., Any]) -> None:
    """Check ``fn(text, num_merges) -> dict[(a, b), new_id]`` against course_lib's trainer
    (``BPETokenizer.train``'s merges) on texts where each mistake gives other merges, then on a
    megabyte of the plays, where it must also be fast: at most ``_TRAIN_SPEED_RATIO`` times
    course_lib's CPU time."""
    import warnings

    from ..tokenization import BPETokenizer

    what = ("write the training loop yourself (pre_tokenize, pair_counts and your merge may "
            "help; course_lib's trainer may not).")
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
    _name_train_mistake(outputs)
    _check_train_speed(fn, allowed, what)
    print(f"check_train_bpe: all {len(_TRAIN_CASES)} texts give course_lib's merges (counted "
          "inside chunks, ties to the smallest pair, stopped when no pair repeats), and "
          f"{_TRAIN_SPEED_MERGES:,} merges on a megabyte of the plays in good time. Well done!")
