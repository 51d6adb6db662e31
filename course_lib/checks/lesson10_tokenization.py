"""What lesson 10's checkers share (tokenization: byte-level BPE and WordPiece), and its Predict
exercise.

* ``check_token_counts(fn)``: ``fn() -> dict[str, int]``, the predicted number of GPT-2 tokens of
  six strings (a "predict, then run" question). The reference is tiktoken's encoding built offline
  from GPT-2's own files (``python -m course_lib.data fetch`` puts them in the data folder).

Shared with ``lesson10_merge``, ``lesson10_train_bpe``, ``lesson10_bpe_encode`` and
``lesson10_wordpiece``: ``run_alone`` runs the learner's function, refusing code that calls the real
tokenizers (Hugging Face's, tiktoken, course_lib.tokenization) and stopping it after a few seconds,
so an endless loop gives a message; ``refuse_hand_in`` refuses course_lib's (``is_course_lib``) or a
library's tokenizer handed in. Speed tests count CPU time (``time.process_time``, an ITIMER_PROF
timer), so that other programs on a busy machine do not count against the learner.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import numbers
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .common import CheckFailure, alarm_within, checker, is_course_lib, run_learner

__all__ = ["check_token_counts"]


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


class TooLong(CheckFailure):
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

    def alarm() -> None:
        raise _OutOfTime

    def cpu_spent(signum: int, frame: Any) -> None:  # noqa: ARG001
        raise _OutOfCPU

    previous_profile = sys.getprofile()
    previous_cpu_handler = None
    with contextlib.ExitStack() as stack:
        if use_alarm:  # nested in the grader's timer, if one runs (it keeps running)
            stack.enter_context(alarm_within(seconds, alarm))
            if cpu_seconds is not None:
                previous_cpu_handler = signal.signal(signal.SIGPROF, cpu_spent)
                signal.setitimer(signal.ITIMER_PROF, cpu_seconds)
        if refuse or not use_alarm:
            sys.setprofile(profile)
        try:
            yield seen
        finally:
            sys.setprofile(previous_profile)
            if use_alarm and cpu_seconds is not None:
                signal.setitimer(signal.ITIMER_PROF, 0)
                signal.signal(signal.SIGPROF, previous_cpu_handler)


def refuse_hand_in(fn: Any, what: str) -> None:
    """Refuse course_lib's own tokenizers and the libraries' objects handed in as the answer."""
    library = _refused_module(_owner_module(fn))
    if is_course_lib(fn) or library == "course_lib":
        raise CheckFailure(f"You handed in course_lib's own code, not yours: {what}")
    if library:
        raise CheckFailure(f"You handed in an object from the `{library}` package, not your own "
                           f"function: {what}")


def run_alone(fn: Callable[..., Any], *args: Any, case: str, hint: str, what: str,
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
        raise TooLong(
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


def id_list(got: Any, case: str, what: str = "token ids") -> list[int]:
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


FETCH = "python -m course_lib.data fetch"


def _gpt2_folder() -> Path:
    from ..data.files import data_dir

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
            raise CheckFailure(f"GPT-2's tokenizer file {name} is not in {folder}: run `{FETCH}` "
                               "once (it needs the network), then run this cell again.")
        if hashlib.sha256(path.read_bytes()).hexdigest() != _GPT2_SHA256[name]:
            raise CheckFailure(f"GPT-2's tokenizer file {path} is not the official one (its "
                               f"sha256 differs): run `{FETCH}` again.")
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
    got = run_alone(fn, case="your prediction", hint="Return a dict {string: number of tokens}.",
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
# shared: messages of the checkers below (short texts, a speed test's budget, the mistake named)
# ----------------------------------------------------------------------------------------------


def short(word: str) -> str:
    """A word for a message: itself, or its start and length if it is long."""
    return repr(word) if len(word) <= 30 else f"{word[:8]!r}... ({len(word)} characters)"


def short_list(pieces: list[str]) -> str:
    """Pieces for a message: the list, or its start and length if it is long."""
    return str(pieces) if len(pieces) <= 8 else f"{pieces[:4]} ... ({len(pieces)} pieces)"


def in_seconds(seconds: float) -> str:
    """A CPU time for a message: "1.23 s", or "2.4 ms" below a tenth of a second."""
    return f"{seconds:.2f} s" if seconds >= 0.1 else f"{seconds * 1000:.1f} ms"


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's garbage collector run once, then paused for the block (the speed tests' timings:
    one full collection in a process holding many objects can cost more than the run it lands in);
    on again afterwards if it was on."""
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def budget_in_words(ratio: float, reference: float, budget: float, what: str) -> str:
    """How the budget of a speed test was set, in words."""
    if budget <= ratio * reference:
        return (f"{ratio} times what course_lib's {what} took on the same text just before "
                f"({in_seconds(reference)})")
    return (f"the least the checker gives (course_lib's {what} took {in_seconds(reference)} on the "
            f"same text just before; {ratio} times that would be less)")


def raise_first_explaining(outputs: list, wrong: list, mistakes: list, prefix: str,
                           variant: Callable[[str, Any, dict], Any]) -> None:
    """Raise for the first of ``mistakes`` (``(knobs, reason)``) whose ``variant(text, arg, knobs)``
    gives the learner's output on every case of ``outputs`` (``(label, text, arg, got, expected)``),
    else for the first that explains the first wrong case."""
    for checked in (outputs, wrong[:1]):
        for knobs, reason in mistakes:
            if all(got == variant(text, arg, knobs) for _, text, arg, got, _ in checked):
                raise CheckFailure(f"{prefix}: {reason}.", mistake=reason)


# ----------------------------------------------------------------------------------------------
# shared by check_bpe_encode and check_train_bpe: course_lib helpers the learner may call, chunks
# ----------------------------------------------------------------------------------------------


def allowed_helpers() -> frozenset:
    """The code of the building blocks the lesson shows (``pre_tokenize``, ``merge``,
    ``pair_counts``, and ``word_counts``: the distinct chunks with their counts); calling them is
    not handing in course_lib's tokenizer (its trainer and encoder are refused)."""
    from .. import tokenization

    return frozenset({tokenization.pre_tokenize.__code__, tokenization.merge.__code__,
                      tokenization.pair_counts.__code__, tokenization.word_counts.__code__,
                      tokenization._check_text.__code__})


def gpt2_chunks(text: str) -> list[str]:
    """``text`` cut into GPT-2's chunks (``GPT2_SPLIT_PATTERN``), inside which BPE merges."""
    import regex

    from ..tokenization import GPT2_SPLIT_PATTERN

    return regex.findall(GPT2_SPLIT_PATTERN, text)
