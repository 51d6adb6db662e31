"""Lesson-10 WordPiece checker (course_lib/checks/lesson10_wordpiece.py): right answers in several styles
pass, each mistake is named, an endless loop is stopped."""

from __future__ import annotations


import pytest
from _helpers import as_library, passes, solution_namespace

from course_lib.checks import CheckFailure, check_wordpiece, lesson10_wordpiece as wordpiece10


# ----------------------------------------------------------------------------------------------
# build: WordPiece on one word
# ----------------------------------------------------------------------------------------------


def test_wordpiece_reference_equals_minilm_tokenizer():
    from course_lib.pretrained import load_tokenizer

    tokenizer = load_tokenizer()
    vocab = wordpiece10._minilm_vocab()
    for word in wordpiece10._MINILM_WORDS + ["a" * 100, "naive", "hello"]:
        assert wordpiece10.reference_wordpiece(word, vocab) == tokenizer.tokenize(word), word


def test_wordpiece_solution_passes(capsys):
    assert passes(check_wordpiece, solution_namespace("10.wordpiece")["wordpiece"])
    assert "check_wordpiece: all 23 words" in capsys.readouterr().out


def test_wordpiece_other_styles_pass():
    def with_for_loops(word, vocab):
        if len(word) > 100:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = ("##" if start else "") + word[start:end]
                if piece in vocab:
                    pieces.append(piece)
                    start = end
                    break
            else:
                return ["[UNK]"]
        return pieces

    def recursive(word, vocab, prefix=""):
        if len(word) > 100:
            return ["[UNK]"]
        if not word:
            return []
        for end in range(len(word), 0, -1):
            if prefix + word[:end] in vocab:
                rest = recursive(word[end:], vocab, "##")
                return ["[UNK]"] if rest == ["[UNK]"] else [prefix + word[:end]] + rest
        return ["[UNK]"]

    for fn in (with_for_loops, recursive):
        assert passes(check_wordpiece, fn), fn.__name__


def _wordpiece(**knobs):
    def wordpiece(word, vocab):
        return wordpiece10.reference_wordpiece(word, vocab, **knobs)

    return wordpiece


@pytest.mark.parametrize(
    "fn, words",
    [
        (_wordpiece(backtrack=True), "the search goes back"),
        (_wordpiece(on_failure="empty"), "a word not turned into a single \\[UNK\\].*empty list"),
        (_wordpiece(on_failure="word"), "a word not turned into a single \\[UNK\\].*the word itself"),
        (_wordpiece(on_failure="pieces"), "a word not turned into a single \\[UNK\\].*drop the rest"),
        (_wordpiece(shortest=True), "the SHORTEST match is taken"),
        (_wordpiece(hashes="none"), "'##' is missing on continuation pieces"),
        (_wordpiece(hashes="all"), "'##' is also on the first piece"),
        (_wordpiece(on_failure="partial"), "not the pieces found so far plus '\\[UNK\\]'"),
        (_wordpiece(on_failure="skip"), "a word not turned into a single \\[UNK\\]"),
        (_wordpiece(max_chars=None), "over 100 characters must give"),
        (_wordpiece(shortest_piece=2), "a piece of one character is never tried"),
        (_wordpiece(strict_max=False), "a word of exactly 100 characters"),
        (_wordpiece(first_short=True), "the first piece is never the whole word"),
        (lambda word, vocab: " ".join(wordpiece10.reference_wordpiece(word, vocab)),
         "returns a string"),
        (lambda word, vocab: "[UNK]", "returns a string"),
        (lambda word, vocab: None, "returns None"),
        (lambda word, vocab: [len(word)], "list of strings"),
        (lambda word, vocab: [p.removeprefix("##") for p in wordpiece10.reference_wordpiece(word, vocab)],
         "'##' is missing"),
        (lambda word, vocab: wordpiece10.reference_wordpiece(word, vocab)[:1], "do not spell the word"),
        (lambda word, vocab: vocab[word], "Your code raised"),
    ],
)
def test_wordpiece_mistakes(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_wordpiece(fn)


@pytest.mark.parametrize(
    "prefix, words",
    [
        (lambda word, start, end: "##" if start and end == len(word) else "",
         "with '##' in the wrong places: 'b' continues the word without '##'"),
        (lambda word, start, end: "##" if end == len(word) else "",
         "'##' is also on the first piece"),
    ],
)
def test_wordpiece_hashes_in_the_wrong_places_are_named(prefix, words):
    def wordpiece(word, vocab):
        if len(word) > 100:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = prefix(word, start, end) + word[start:end]
                if piece in vocab:
                    pieces.append(piece)
                    start = end
                    break
            else:
                return ["[UNK]"]
        return pieces

    with pytest.raises(CheckFailure, match="Likely mistake") as info:
        check_wordpiece(wordpiece)
    assert words in str(info.value)


def test_wordpiece_bare_lookup_is_named_as_missing_hashes():
    """Looked up with '##' but returned without: the same message as '##' missing."""
    def wordpiece(word, vocab):
        right = wordpiece10.reference_wordpiece(word, vocab)
        return [p.removeprefix("##") for p in right]

    with pytest.raises(CheckFailure, match="'##' is missing"):
        check_wordpiece(wordpiece)


def test_wordpiece_refuses_hugging_face_and_course_lib():
    from course_lib.pretrained import load_tokenizer

    tokenizer = load_tokenizer()
    with pytest.raises(CheckFailure, match="from the `transformers` package"):
        check_wordpiece(tokenizer.tokenize)

    def wordpiece(word, vocab):
        return tokenizer.tokenize(word)

    with pytest.raises(CheckFailure, match="calls .*`transformers`, a real tokenizer"):
        check_wordpiece(wordpiece)

    def wordpiece_rust(word, vocab):  # the Rust tokenizer underneath, no transformers code
        return tokenizer.backend_tokenizer.encode(word, add_special_tokens=False).tokens

    with pytest.raises(CheckFailure, match="calls `tokenizers`"):
        check_wordpiece(wordpiece_rust)

    solution = solution_namespace("10.wordpiece")["wordpiece"]
    with pytest.raises(CheckFailure, match="course_lib's own code"):
        check_wordpiece(as_library(solution, "course_lib.tokenization"))


def test_wordpiece_stub(capsys):
    def wordpiece(word, vocab):
        raise NotImplementedError

    check_wordpiece(wordpiece)
    assert "not implemented yet" in capsys.readouterr().out


def test_wordpiece_refuses_the_real_course_lib_wordpiece_if_there():
    try:
        from course_lib.tokenization import WordPieceTokenizer
        tokenizer = WordPieceTokenizer.from_vocab()
    except (ImportError, AttributeError):
        pytest.skip("course_lib.tokenization.WordPieceTokenizer is not written yet")
    if not hasattr(tokenizer, "wordpiece"):
        pytest.skip("course_lib's WordPieceTokenizer has no wordpiece(word) method")
    with pytest.raises(CheckFailure, match="course_lib's own code"):
        check_wordpiece(tokenizer.wordpiece)

    def wordpiece(word, vocab):
        return tokenizer.wordpiece(word)

    with pytest.raises(CheckFailure, match="calls `course_lib`"):
        check_wordpiece(wordpiece)


def test_wordpiece_trie_style_passes_within_the_time_budget():
    """A trie built from the vocabulary on every call (the style the profile hook slowed 2-4x)."""
    import time

    def wordpiece(word, vocab):
        if len(word) > 100:
            return ["[UNK]"]
        trie: dict = {}
        for token in vocab:
            node = trie
            for ch in token:
                node = node.setdefault(ch, {})
            node["$"] = True
        pieces, start = [], 0
        while start < len(word):
            node, prefix_len = trie, 0
            if start:
                node = trie.get("#", {}).get("#", {})
            best = None
            for k in range(start, len(word)):
                node = node.get(word[k])
                if node is None:
                    break
                if "$" in node:
                    best = k + 1
            if best is None:
                return ["[UNK]"]
            pieces.append(("##" if start else "") + word[start:best])
            start = best
        return pieces

    begin = time.process_time()  # this process's CPU time: the shared machine's load aside
    assert passes(check_wordpiece, wordpiece)
    assert time.process_time() - begin < 5


def test_wordpiece_endless_loop_is_stopped_with_a_message():
    """The Hugging Face course's encode_word: "##" glued to the rest, so "#" matches forever."""
    def encode_word(word, vocab):
        tokens = []
        while len(word) > 0:
            i = len(word)
            while i > 0 and word[:i] not in vocab:
                i -= 1
            if i == 0:
                return ["[UNK]"]
            tokens.append(word[:i])
            word = word[i:]
            if len(word) > 0:
                word = f"##{word}"
        return tokens

    with pytest.raises(CheckFailure, match="did not finish within 2 s.*'unz'.*the token '#'"):
        check_wordpiece(encode_word)


def test_wordpiece_loop_without_calls_is_stopped(monkeypatch):
    monkeypatch.setattr(wordpiece10, "_PROBE_SECONDS", 0.5)

    def wordpiece(word, vocab):
        n = 0
        while True:
            n += 1

    with pytest.raises(CheckFailure, match="did not finish within 0.5 s.*even on 'able'"):
        check_wordpiece(wordpiece)


def test_wordpiece_loop_without_unk_is_named():
    """No [UNK] branch: when nothing matches, the loop stays where it is (and appends forever).
    The message says what happens and the rule, not the '#' of the Hugging Face course's loop."""
    import resource

    def wordpiece(word, vocab):
        if len(word) > 100:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in vocab:
                    break
                end -= 1
            pieces.append(piece)
            start = end
        return pieces

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(CheckFailure, match="Likely mistake: your loop never ends on the word "
                                           "'unz'") as info:
        check_wordpiece(wordpiece)
    assert "the WHOLE word becomes ['[UNK]']" in str(info.value)
    assert "#' (BERT's has it)" not in str(info.value)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 500_000  # KB: < 0.5 GB


def test_wordpiece_loop_that_gives_up_only_on_the_first_piece_is_named():
    """[UNK] only when the word's first piece fails: a failing continuation loops forever."""
    def wordpiece(word, vocab):
        if len(word) > 100:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in vocab:
                    pieces.append(piece)
                    start = end
                    break
            else:
                if start == 0:
                    return ["[UNK]"]
        return pieces

    with pytest.raises(CheckFailure, match="your loop never ends on the word 'unz'"):
        check_wordpiece(wordpiece)


# ----------------------------------------------------------------------------------------------
# build: WordPiece, a first piece one character short
# ----------------------------------------------------------------------------------------------


def test_wordpiece_first_piece_one_short_is_named():
    """tryout3's attempt: the longest first candidate is word[:-1], the later ones run to the end."""

    def wordpiece(word, vocab):
        if len(word) > 100:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            end = len(word) - 1 if start == 0 else len(word)
            while end > start and (word[start:end] if start == 0 else "##" + word[start:end]) not in vocab:
                end -= 1
            if end == start:
                return ["[UNK]"]
            pieces.append(word[start:end] if start == 0 else "##" + word[start:end])
            start = end
        return pieces

    with pytest.raises(CheckFailure, match="'able'.*you return \\['ab', '##le'\\], expected "
                       "\\['able'\\]: the first piece is never the whole word") as info:
        check_wordpiece(wordpiece)
    assert info.value.mistake and "first piece is never the whole word" in info.value.mistake
