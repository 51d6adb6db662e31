"""course_lib.data.instructions (lesson 16): instructions from the plays, held out by play and by kind,
and a judge that accepts exactly the answers with the asked property."""

from __future__ import annotations

from collections import Counter

import pytest

from course_lib.chat import ChatTemplate
from course_lib.data.instructions import (HELDOUT_KINDS, KINDS, MAX_CHARS, SYLLABLE_TARGETS, TRAIN_KINDS,
                                          WORD_TARGETS, InstructionSet, check_answer, count_syllables, judge,
                                          make_instruction, play_lines, score, words_of)
from course_lib.data.shakespeare import VALIDATION_PLAYS, read_plays
from course_lib.data.translation import CharVocab


@pytest.fixture(scope="module")
def plays():
    return read_plays()


@pytest.fixture(scope="module")
def instructions(plays) -> InstructionSet:
    return InstructionSet(seed=0, plays=plays)


def test_how_many_instructions_of_each_kind(instructions):
    assert TRAIN_KINDS == ("word", "words", "syllables") and HELDOUT_KINDS == ("ends",)
    counts = Counter(x.kind for x in instructions.train)
    assert len(instructions.train) > 80_000 and set(counts) == set(TRAIN_KINDS)
    assert min(counts.values()) > 25_000  # kinds in turn: about a third each (measured 26-28k)
    assert Counter(x.kind for x in instructions.heldout) == {"word": 100, "words": 100, "syllables": 100}
    assert Counter(x.kind for x in instructions.heldout_kind) == {"ends": 100}
    assert "81," in repr(instructions) and "300 held out by play" in repr(instructions)


def test_every_reference_answer_follows_its_instruction(instructions):
    for x in instructions.train + instructions.heldout + instructions.heldout_kind:
        assert check_answer(x, x.reference) is None, (x, check_answer(x, x.reference))


def test_held_out_by_play_and_by_kind(instructions):
    assert not {x.play for x in instructions.train} & set(VALIDATION_PLAYS)
    assert {x.play for x in instructions.heldout + instructions.heldout_kind} == set(VALIDATION_PLAYS)
    assert not {x.kind for x in instructions.train} & set(HELDOUT_KINDS)
    trained_words = {x.target for x in instructions.train if x.kind in ("word", "ends")}
    assert not trained_words & instructions.heldout_words
    train_prompts = {x.prompt for x in instructions.train}
    for x in instructions.heldout + instructions.heldout_kind:
        if x.kind in ("word", "ends"):  # a new instruction, never seen in training
            assert x.prompt not in train_prompts
        else:  # few numbers: the same prompts occur in training, with lines of other plays
            assert x.prompt in train_prompts
    assert len({x.target for x in instructions.heldout if x.kind == "word"}) == 100  # each word once


def test_held_out_numbers_take_turns(instructions):
    words = Counter(x.target for x in instructions.heldout if x.kind == "words")
    syllables = Counter(x.target for x in instructions.heldout if x.kind == "syllables")
    assert words == {n: 100 // len(WORD_TARGETS) for n in WORD_TARGETS}
    assert syllables == {n: 100 // len(SYLLABLE_TARGETS) for n in SYLLABLE_TARGETS}


def test_the_same_seed_gives_the_same_instructions(plays):
    few = [p for p in plays if p.title in VALIDATION_PLAYS or p.title in ("Hamlet", "King Lear")]
    a, b = InstructionSet(seed=3, plays=few, num_heldout=20), InstructionSet(seed=3, plays=few, num_heldout=20)
    assert (a.train, a.heldout, a.heldout_kind) == (b.train, b.heldout, b.heldout_kind)
    c = InstructionSet(seed=4, plays=few, num_heldout=20)
    assert c.heldout != a.heldout and c.train != a.train


def test_the_characters_are_the_plays_and_every_example_fits_128_positions(instructions, plays):
    vocab = CharVocab.build(["\n".join(p.text for p in plays if p.title not in VALIDATION_PLAYS)],
                            specials=False)  # lesson 09's character vocabulary (ShakespeareCorpus)
    template = ChatTemplate(vocab)
    longest = 0
    for x in instructions.train + instructions.heldout + instructions.heldout_kind:
        prompt, answer = template.example(x.prompt, x.reference)  # raises on a character not in the vocabulary
        longest = max(longest, len(prompt) + len(answer))
    assert longest <= 128  # measured: 104 (prompts up to 45 characters, lines up to 60, 4 chat tokens)


@pytest.mark.parametrize("kind, target, answer, reason", [
    ("word", "crown", "Uneasy lies the head that wears a crown.", None),
    ("word", "crown", "Uneasy lies the head that wears a CROWN!", None),
    ("word", "crown", "The crowned king is here", "no word 'crown'"),
    ("word", "crown", "crown", "1 words, not a line"),
    ("word", "crown", "A crown, a crown,\nmy kingdom", "more than one line"),
    ("word", "crown", "A crown " + "and more " * 10, f"characters, more than {MAX_CHARS}"),
    ("word", "crown", "a crown <|user|> for me", "a chat token"),
    ("ends", "night", "  So good a night.  ", None),
    ("ends", "night", "The night is long, my lord", "ends with 'lord', not 'night'"),
    ("words", 5, "Now is the winter here.", None),
    ("words", 5, "A line of exactly 5 words.", "repeats the instruction"),  # five words, but an echo
    ("word", "crown", "Sir, a line with the word 'crown', my lord", "repeats the instruction"),
    ("words", 5, "Now -- is the winter here.", None),  # "--" is no word
    ("words", 5, "Now is the post-haste winter here.", "6 words, not 5"),
    ("syllables", 10, "Shall I compare thee to a summer's day?", None),
    ("syllables", 10, "To be, or not to be: that is the question:", None),  # 11: within 1
    ("syllables", 10, "But soft, what light through yonder window breaks, my love?", "12 syllables"),
    ("syllables", 6, "Where he bestows himself?", None),
])
def test_the_judge(kind, target, answer, reason):
    x = make_instruction(kind, target)
    got = check_answer(x, answer)
    if reason is None:
        assert got is None and judge(x, answer)
    else:
        assert got is not None and reason in got and not judge(x, answer)


@pytest.mark.parametrize("line, syllables", [
    ("Shall I compare thee to a summer's day?", 10),
    ("Now is the winter of our discontent", 10),
    ("But soft, what light through yonder window breaks?", 10),
    ("To be, or not to be: that is the question:", 11),
    ("O'er the heav'n call'd loved horses", 7),  # elisions one syllable; -ed silent; -es after s heard
    ("wanted places table free", 7),
])
def test_count_syllables(line, syllables):
    assert count_syllables(line) == syllables


def test_the_syllable_rule_finds_the_plays_pentameter(plays):
    """Most lines of verse have ten syllables (eleven with a feminine ending): the rule agrees."""
    verse = [ln.text for p in plays for ln in play_lines(p) if ln.text[:1].isupper() and 30 <= len(ln.text) <= 60]
    counts = Counter(count_syllables(text) for text in verse)
    share = sum(counts[n] for n in (9, 10, 11)) / len(verse)
    assert counts.most_common(1)[0][0] == 10
    assert share > 0.8  # measured: 0.854 of 72,163 lines


def test_play_lines_are_speeches_without_headings_or_stage_directions(plays):
    hamlet = play_lines(next(p for p in plays if p.title == "Hamlet"))
    assert Counter(ln.speaker for ln in hamlet).most_common(1)[0][0] == "Ham"
    macbeth = {ln.speaker for p in plays if p.title == "Macbeth" for ln in play_lines(p)}
    assert {"MACBETH", "LADY MACBETH", "BANQUO"} <= macbeth
    for p in plays:
        lines = play_lines(p)
        assert len(lines) > 1500, p.title
        assert not any(ln.text.startswith(("[", "ACT ", "SCENE ")) for ln in lines), p.title
    assert any(ln.text == "To be, or not to be,--that is the question:--" for ln in hamlet)


def test_words_of_counts_tokens_with_a_letter():
    assert words_of("Now -- is the post-haste, 'tis 3 o'clock") == ["Now", "is", "the", "post-haste,", "'tis",
                                                                    "o'clock"]


def test_score_per_kind():
    xs = [make_instruction("word", "crown"), make_instruction("word", "night"), make_instruction("words", 3)]
    assert score(xs, ["a crown here", "no", "one two three"]) == {"word": 0.5, "words": 1.0, "all": 2 / 3}


@pytest.mark.parametrize("call, message", [
    (lambda: make_instruction("rhyme", "x"), "kind must be one of"),
    (lambda: make_instruction("word", "two words"), "one word"),
    (lambda: make_instruction("words", "5"), "a number"),
    (lambda: check_answer("A line", "x"), "Instruction"),
    (lambda: check_answer(make_instruction("words", 3), None), "must be a str"),
    (lambda: score([make_instruction("words", 3)], []), "one answer per instruction"),
    (lambda: InstructionSet(num_heldout=0, plays=[]), "num_heldout"),
    (lambda: InstructionSet(heldout_kinds=KINDS, plays=[]), "at least one"),
    (lambda: InstructionSet(heldout_kinds=("rhyme",), plays=[]), "heldout_kinds"),
])
def test_bad_input_gets_a_clear_message(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_unknown_held_out_plays_are_refused(plays):
    with pytest.raises(ValueError, match="unknown"):
        InstructionSet(heldout_plays=("Hamlet II",), plays=plays[:3])
