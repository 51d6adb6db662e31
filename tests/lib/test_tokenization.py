"""Lesson 10's tokenizers against independent references: GPT2Tokenizer against tiktoken and Hugging
Face's GPT-2 tokenizer built from the same local files, WordPieceTokenizer against MiniLM's fast
BertTokenizer, on 20,000 lines of the Shakespeare corpus drawn with a fixed seed and on hard strings
(lesson 10 compares every line, 181,671, and `make test` runs it with strict nbval: a second pass
over the whole corpus here cost a minute and could fail on nothing the lesson does not check);
BPETokenizer's two trainers against each other, its round trip on random Unicode, and clear errors
for bad input."""

from __future__ import annotations

import json
import random
import shutil
import urllib.request
from collections import Counter

import pytest
import regex

from course_lib.data import gpt2_bpe, files
from course_lib.data.shakespeare import ShakespeareCorpus
from course_lib.tokenization import (
    GPT2_SPLIT_PATTERN,
    BPETokenizer,
    GPT2Tokenizer,
    WordPieceTokenizer,
    bytes_to_unicode,
    merge,
    pair_counts,
    pre_tokenize,
)
from course_lib.data.gpt2_bpe import fetch_gpt2_files, gpt2_files

GPT2_HARD = [
    "", " ", "I'LL", "I'll", "you'RE", "it's", "'s", "'s'", "don't'", "1234567", " 2024", "3.14159",
    "  leading spaces", "a   b", "trailing  ", "trailing \n", "\n\n", "\n\nword", "\t\ttabs\t",
    " \t x", "café naïve", "日本語の文章", "👍🏽 family 👨‍👩‍👧", "<|endoftext|>",
    "one<|endoftext|>two", "<|endoftext|><|endoftext|>", "<|endoftext", "Hello мир κόσμε مرحبا",
    "x" * 300, "Pneumonoultramicroscopicsilicovolcanoconiosis", "\x1c\x85a\u2028b\u3000c",
    "Hello,\r\nworld!!!", "e\u0301 combining", "$100,000.00", "   ", "a\u00a0b",
]
WORDPIECE_HARD = [
    "", "café naïve ÉCOLE", "日本語の文章 中文", "!!!???...", ",;:--", "hello [SEP] world", "a[CLS]b",
    "[sep] stays text", "[MASK][PAD] [UNK]x", "\x00a\x07b\ufffd c", "x" * 101, "y" * 100,
    "İstanbul ΣΑΣ", "$5+3=8^2|`~", "\u2028a\xa0b\x85c", "naïve—dash «quote»",
    "\U0002B820\U0002B920",  # between Google's and the Rust list of CJK ranges
    "tab\there\x0bvt\x0cff\x7fdel\x1fus\x00nul", "ALL CAPS, MiXeD-case_words!", "Ǆ ß ﬁ", "don't", "👍🏽 emoji", "\tTabs\nand\r\nnewlines", "zzzqqqxxx", "mañana",
]


@pytest.fixture(scope="module")
def corpus_lines() -> list[str]:
    corpus = ShakespeareCorpus()
    return (corpus.train_text + "\n" + corpus.val_text).split("\n")


@pytest.fixture(scope="module")
def sampled_lines(corpus_lines) -> list[str]:
    """20,000 corpus lines, the same every run (lesson 10's proof cells take every line)."""
    assert len(corpus_lines) > 180_000
    return random.Random(0).sample(corpus_lines, 20_000)


@pytest.fixture(scope="module")
def gpt2() -> GPT2Tokenizer:
    return GPT2Tokenizer.from_files()


@pytest.fixture(scope="module")
def small_bpe() -> BPETokenizer:
    play = next(p for p in ShakespeareCorpus().train_plays if p.title == "Hamlet")
    return BPETokenizer.train(play.text, 256 + 300)


# ---------------------------------------------------------------------------------------------
# GPT-2
# ---------------------------------------------------------------------------------------------

def test_bytes_to_unicode_is_gpt2s_table():
    table = bytes_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert sum(chr(b) == c for b, c in table.items()) == 188
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("A")] == "A"
    assert all(c.isprintable() and not c.isspace() for c in table.values())


def test_gpt2_equals_tiktoken_and_hugging_face_on_sampled_lines_and_hard_strings(gpt2, sampled_lines):
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str
    from transformers import GPT2TokenizerFast

    encoder_json, vocab_bpe = gpt2_files()
    assert GPT2_SPLIT_PATTERN == r50k_pat_str
    enc = tiktoken.Encoding(
        name="gpt2_local", pat_str=r50k_pat_str,
        mergeable_ranks=data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=str(vocab_bpe), encoder_json_file=str(encoder_json)),
        special_tokens={"<|endoftext|>": 50256})
    # transformers 5: `vocab=`/`merges=` take the paths (`vocab_file=` is ignored there)
    hf = GPT2TokenizerFast(vocab=str(encoder_json), merges=str(vocab_bpe))
    assert len(hf) == enc.n_vocab == len(gpt2) == 50257
    cases = sampled_lines + GPT2_HARD
    ours = [gpt2.encode(s) for s in cases]
    # one call per line: encode_batch hands each line to a thread pool (7x slower on the corpus)
    theirs = [enc.encode(s, allowed_special={"<|endoftext|>"}) for s in cases]
    hugging = hf(cases, add_special_tokens=False)["input_ids"]
    differ = [s for s, a, b, c in zip(cases, ours, theirs, hugging) if not a == b == c]
    assert differ == [], f"{len(differ)} of {len(cases)} differ, e.g. {differ[:3]}"
    print(f"\nGPT-2: {len(cases):,} cases ({len(sampled_lines):,} corpus lines + {len(GPT2_HARD)} "
          "hard strings) give the same ids as tiktoken and Hugging Face")
    assert all(gpt2.decode(ids) == s for s, ids in zip(cases, ours))
    assert gpt2.decode(ours[-5]) == enc.decode(theirs[-5])


def test_gpt2_known_ids_and_special_token(gpt2):
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.encode("a<|endoftext|>b") == [64, GPT2Tokenizer.ENDOFTEXT, 65]
    assert gpt2.encode("I'LL") == [40, 6, 3069]  # upper-case contractions are not contractions
    import tiktoken  # tiktoken also refuses the special token unless it is allowed
    with pytest.raises(ValueError):
        tiktoken.Encoding(name="t", pat_str=GPT2_SPLIT_PATTERN,
                          mergeable_ranks={bytes([b]): b for b in range(256)},
                          special_tokens={"<|endoftext|>": 256}).encode("a<|endoftext|>")
    with pytest.raises(ValueError, match="allowed_special"):
        gpt2.encode("a<|endoftext|>", allowed_special=())
    assert gpt2.encode("plain text", allowed_special=()) == gpt2.encode("plain text")
    with pytest.raises(ValueError, match="only special token"):
        gpt2.encode("a", allowed_special=("<|startoftext|>",))


def _write_files(tmp_path, encoder: dict, merge_lines: list[str]):
    (tmp_path / "encoder.json").write_text(json.dumps(encoder), encoding="utf-8")
    (tmp_path / "vocab.bpe").write_text("\n".join(merge_lines) + "\n", encoding="utf-8")
    return tmp_path / "encoder.json", tmp_path / "vocab.bpe"


def test_gpt2_files_that_do_not_match_are_refused(tmp_path):
    encoder_json, vocab_bpe = gpt2_files()
    encoder = json.loads(encoder_json.read_text(encoding="utf-8"))
    lines = vocab_bpe.read_text(encoding="utf-8").split("\n")[:-1]
    assert lines[0].startswith("#version") and len(lines) == 50_001
    e, v = _write_files(tmp_path, encoder, lines[1:])  # header missing
    with pytest.raises(ValueError, match="#version"):
        GPT2Tokenizer.from_files(e, v)
    e, v = _write_files(tmp_path, encoder, lines[:10] + ["Ġ t h"])  # malformed line
    with pytest.raises(ValueError, match="line 11.*two tokens"):
        GPT2Tokenizer.from_files(e, v)
    chars = list(bytes_to_unicode().values())
    a, b = next((a, b) for a in chars for b in chars if a + b not in encoder)
    e, v = _write_files(tmp_path, encoder, lines[:10] + [f"{a} {b}"])  # result not in the encoder
    with pytest.raises(ValueError, match=f"uses '{a + b}'.*do not match"):
        GPT2Tokenizer.from_files(e, v)
    del encoder["Ġ"]
    e, v = _write_files(tmp_path, encoder, lines[:10])
    with pytest.raises(ValueError, match="byte tokens"):
        GPT2Tokenizer.from_files(e, v)


def test_gpt2_bad_input_is_refused(gpt2):
    with pytest.raises(TypeError, match="expected a str"):
        gpt2.encode(b"bytes")
    with pytest.raises(ValueError, match="id 50257 .*vocabulary size 50257"):
        gpt2.decode([15496, 50257])
    with pytest.raises(ValueError, match="id -1"):
        gpt2.decode([-1])


def test_missing_gpt2_files_say_what_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m course_lib.data fetch"):
        gpt2_files(tmp_path)


def test_altered_gpt2_file_is_refused(tmp_path):
    for path in gpt2_files():
        shutil.copy(path, tmp_path / path.name)
    with open(tmp_path / "vocab.bpe", "ab") as f:
        f.write(b"x")
    with pytest.raises(ValueError, match="sha256.*Delete it and run"):
        gpt2_files(tmp_path)


def test_fetch_is_a_no_op_when_the_files_are_there(tmp_path, monkeypatch):
    for path in gpt2_files():
        shutil.copy(path, tmp_path / path.name)

    def no_network(*args, **kwargs):
        raise AssertionError("fetch_gpt2_files downloaded although the files were there")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    assert fetch_gpt2_files(tmp_path) == (tmp_path / "encoder.json", tmp_path / "vocab.bpe")
    assert gpt2_bpe.gpt2_dir().parent == files.data_dir()


# ---------------------------------------------------------------------------------------------
# WordPiece
# ---------------------------------------------------------------------------------------------

def test_wordpiece_equals_minilms_fast_tokenizer(sampled_lines):
    from course_lib.pretrained import load_tokenizer

    ours, bert = WordPieceTokenizer.from_vocab(), load_tokenizer()
    assert len(ours) == bert.vocab_size == 30522
    cases = sampled_lines + WORDPIECE_HARD
    mine = [ours.encode(s) for s in cases]
    theirs = bert(cases)["input_ids"]  # with [CLS] ... [SEP]
    differ = [s for s, a, b in zip(cases, mine, theirs) if a != b]
    assert differ == [], f"{len(differ)} of {len(cases)} differ, e.g. {differ[:3]}"
    print(f"\nWordPiece: {len(cases):,} cases ({len(sampled_lines):,} corpus lines + "
          f"{len(WORDPIECE_HARD)} hard strings) give the same ids as MiniLM's BertTokenizer")
    assert mine[0][0] == ours.vocab["[CLS]"] and mine[0][-1] == ours.vocab["[SEP]"]


def test_wordpiece_pieces_unknowns_and_decode():
    wp = WordPieceTokenizer.from_vocab()
    assert wp.tokenize("Hello, [SEP] WORLD!") == ["hello", ",", "[SEP]", "world", "!"]
    assert wp.tokenize("x" * 101) == ["[UNK]"]
    assert wp.tokenize("café") == ["cafe"]
    pieces = wp.tokenize("tokenization")
    assert len(pieces) > 1 and all(p.startswith("##") for p in pieces[1:])
    assert wp.decode(wp.encode("tokenization", add_special_tokens=False)) == "tokenization"
    assert wp.decode(wp.encode("hi there"), skip_special_tokens=True) == "hi there"
    with pytest.raises(ValueError, match="id 30522 .*vocabulary size 30522"):
        wp.decode([30522])
    with pytest.raises(TypeError, match="expected a str"):
        wp.encode(["a list"])


# ---------------------------------------------------------------------------------------------
# Byte-level BPE
# ---------------------------------------------------------------------------------------------

def test_helpers_pair_counts_merge_and_pre_tokenize():
    assert pair_counts([[1, 2, 1, 2]]) == {(1, 2): 2, (2, 1): 1}
    assert pair_counts({(1, 2): 3, (2, 1, 2): 1}) == {(1, 2): 4, (2, 1): 1}
    assert merge([5, 5, 5], (5, 5), 9) == [9, 5]
    assert merge([1, 2, 3, 1, 2], (1, 2), 7) == [7, 3, 7]
    assert pre_tokenize("Hello  world's 2024!") == ["Hello", " ", " world", "'s", " 2024", "!"]


def test_naive_and_incremental_training_give_identical_merges():
    play = next(p for p in ShakespeareCorpus().train_plays if p.title == "Hamlet")
    text = play.text[: len(play.text) // 2]  # half the play: the naive method's time is in its length
    naive = BPETokenizer.train(text, 256 + 300, method="naive")
    fast = BPETokenizer.train(text, 256 + 300, method="incremental")
    assert len(fast.merges) == 300
    assert list(naive.merges.items()) == list(fast.merges.items())
    # the first merge is the most frequent byte pair inside GPT-2's chunks, counted directly
    counts = Counter(pair for chunk in regex.findall(GPT2_SPLIT_PATTERN, text)
                     for pair in zip(chunk.encode(), chunk.encode()[1:]))
    assert next(iter(fast.merges)) == counts.most_common(1)[0][0]


def test_ties_go_to_the_smallest_pair_and_training_stops_when_no_pair_repeats():
    for method in ("naive", "incremental"):
        tok = BPETokenizer.train("ab" * 3 + " " + "ba" * 3, 258, method=method, pattern=r"\S+|\s")
        # "ababab" and "bababa": (97, 98) and (98, 97) both occur 5 times: the smaller pair wins
        assert next(iter(tok.merges)) == (97, 98)
        with pytest.warns(UserWarning, match="stopped after 1 of 3"):
            short = BPETokenizer.train("abab", 259, method=method)  # then (X, X) occurs once
        assert list(short.merges) == [(97, 98)]


def test_round_trip_on_random_unicode(small_bpe):
    rng = random.Random(0)
    pools = [
        lambda: chr(rng.randrange(0x20, 0x7F)),  # ASCII
        lambda: rng.choice(" \t\n\r\x0b\x0c\xa0\u3000"),  # whitespace runs
        lambda: chr(rng.randrange(0x300, 0x370)),  # combining marks
        lambda: chr(rng.randrange(0x4E00, 0x9FFF)),  # CJK
        lambda: chr(rng.randrange(0x1F300, 0x1FAFF)),  # emoji
        lambda: "\u200d",  # zero-width joiner
        lambda: chr(rng.choice([rng.randrange(0, 0xD800), rng.randrange(0xE000, 0x110000)])),
    ]
    strings = ["", " ", "   ", "\n\n\n", "👨‍👩‍👧"]
    for _ in range(1500):
        n = rng.randrange(0, 30)
        strings.append("".join(rng.choice(pools)() for _ in range(n)))
    for s in strings:
        assert small_bpe.decode(small_bpe.encode(s)) == s, repr(s)
    assert len(strings) >= 1000


def test_decode_never_raises_on_arbitrary_ids(small_bpe):
    rng = random.Random(1)
    for _ in range(1000):
        ids = [rng.randrange(len(small_bpe)) for _ in range(rng.randrange(0, 12))]
        assert isinstance(small_bpe.decode(ids), str)
    assert small_bpe.decode([0x80]) == "\ufffd"  # a lone continuation byte
    e_acute = list("é".encode("utf-8"))
    assert small_bpe.decode(e_acute[:1]) == "\ufffd" and small_bpe.decode(e_acute) == "é"


def test_encode_applies_merges_by_rank_within_chunks(small_bpe):
    ids = small_bpe.encode("the king")
    assert len(ids) < len("the king")
    assert small_bpe.decode_bytes(ids) == b"the king"
    chunks = pre_tokenize("the king")
    assert sum(len(small_bpe.encode(c)) for c in chunks) == len(ids)  # merges never cross chunks


def test_save_and_load_round_trip(small_bpe, tmp_path):
    path = tmp_path / "bpe.json"
    small_bpe.save(path)
    loaded = BPETokenizer.load(path)
    assert loaded.merges == small_bpe.merges and list(loaded.merges) == list(small_bpe.merges)
    assert loaded.vocab == small_bpe.vocab and loaded.pattern == small_bpe.pattern
    text = "To be, or not to be: that is the question. 😀"
    assert loaded.encode(text) == small_bpe.encode(text)
    (tmp_path / "other.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ValueError, match="not a file written by BPETokenizer.save"):
        BPETokenizer.load(tmp_path / "other.json")


def test_bpe_bad_input_is_refused(small_bpe):
    with pytest.raises(ValueError, match="vocab_size must be an int >= 256"):
        BPETokenizer.train("some text", 255)
    with pytest.raises(ValueError, match="method must be"):
        BPETokenizer.train("some text", 300, method="fast")
    with pytest.raises(TypeError, match="expected a str"):
        small_bpe.encode(None)
    with pytest.raises(ValueError, match="id 556 .*vocabulary size 556"):
        small_bpe.decode([1, 556])
    with pytest.raises(ValueError, match="out of order"):
        BPETokenizer({(1, 2): 257})
    with pytest.raises(ValueError, match="out of order"):
        BPETokenizer({(1, 300): 256})


def test_the_benchmark_runs_on_a_tiny_budget():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "tokenization.py"
    spec = importlib.util.spec_from_file_location("benchmark_tokenizers", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    text = next(p for p in ShakespeareCorpus().train_plays if p.title == "Hamlet").text
    t = bench.time_training(text, merges=20, naive_merges=6)
    assert t["merges"] == 20 and t["naive_done"] == 6 and t["half"] == 3
    assert t["naive_estimate"] > t["naive_first_half"] > 0
    assert "".join(bench.lines_with_ends("a\n\nb\n")) == "a\n\nb\n"


# ---------------------------------------------------------------------------------------------
# Special tokens, GPT-2's merges as byte ids, unassigned code points, bad input (issue 25)
# ---------------------------------------------------------------------------------------------

def _tiktoken_gpt2():
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    encoder_json, vocab_bpe = gpt2_files()
    return tiktoken.Encoding(
        name="gpt2_local", pat_str=GPT2_SPLIT_PATTERN,
        mergeable_ranks=data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=str(vocab_bpe), encoder_json_file=str(encoder_json)),
        special_tokens={"<|endoftext|>": 50256})


SPECIAL_CASES = ["<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>", " <|endoftext|> ",
                 "<|endoftext", "endoftext|>", "x <|ENDOFTEXT|> y", "plain text", ""]


@pytest.mark.parametrize("mode", ["allowed", "all", "as text", "refused"])
def test_special_token_modes_equal_tiktokens(gpt2, mode):
    """allowed_special / disallowed_special as tiktoken's: the same ids, or both refuse."""
    enc = _tiktoken_gpt2()
    kwargs = {"allowed": {"allowed_special": {"<|endoftext|>"}},
              "all": {"allowed_special": "all"},
              "as text": {"allowed_special": set(), "disallowed_special": ()},
              "refused": {}}[mode]
    ours_kwargs = dict(kwargs) if mode != "refused" else {"allowed_special": ()}
    for text in SPECIAL_CASES:
        try:
            theirs = enc.encode(text, **kwargs)
        except ValueError:
            with pytest.raises(ValueError, match="contains the special token"):
                gpt2.encode(text, **ours_kwargs)
            continue
        assert gpt2.encode(text, **ours_kwargs) == theirs, (mode, text)
    assert gpt2.encode("a<|endoftext|>b", allowed_special=(), disallowed_special=()) == [
        64, 27, 91, 437, 1659, 5239, 91, 29, 65]


def test_special_token_arguments_are_checked(gpt2):
    with pytest.raises(TypeError, match="allowed_special is 'all' or a set"):
        gpt2.encode("a", allowed_special="<|endoftext|>")
    with pytest.raises(TypeError, match="disallowed_special is 'all' or a set"):
        gpt2.encode("a", disallowed_special=5)
    with pytest.raises(ValueError, match="only special token"):
        gpt2.encode("a", disallowed_special={"<|fim|>"})


def test_byte_level_merges_encode_as_gpt2(gpt2, corpus_lines):
    """GPT-2's merges renumbered by byte (BPETokenizer's ids) give GPT-2's ids after mapping."""
    bpe = BPETokenizer(gpt2.byte_level_merges())
    assert len(bpe) == len(gpt2) - 1  # all but <|endoftext|>
    rng = random.Random(0)
    cases = rng.sample(corpus_lines, 2000) + [s for s in GPT2_HARD if "<|endoftext|>" not in s]
    for s in cases:
        assert gpt2.from_byte_level(bpe.encode(s)) == gpt2.encode(s), s
        assert bpe.decode(bpe.encode(s)) == s


def test_wordpiece_unassigned_code_points_become_unk_as_the_fast_tokenizer():
    """Unassigned code points (Cn in Python's tables) stay in their word, which becomes [UNK]:
    checked on a sample of 20,000 of them, in and around words; 'new 🫨' keeps its emoji."""
    import unicodedata

    from course_lib.pretrained import load_tokenizer

    ours, bert = WordPieceTokenizer.from_vocab(), load_tokenizer()
    rng = random.Random(0)
    unassigned = [c for c in range(0x110000) if unicodedata.category(chr(c)) == "Cn"]
    sample = rng.sample(unassigned, 20_000)
    cases = [f"a{chr(c)}b" if k % 2 else f"new {chr(c)} word" for k, c in enumerate(sample)]
    cases += ["new \U0001FAE8", "\U000E0080"]
    mine = [ours.encode(s) for s in cases]
    theirs = bert(cases)["input_ids"]
    differ = [s for s, a, b in zip(cases, mine, theirs) if a != b]
    assert differ == [], f"{len(differ)} differ, e.g. {differ[:3]!r}"
    assert ours.tokenize("new \U0001FAE8") == ["new", "[UNK]"]


@pytest.mark.parametrize("tokenize", ["bpe", "gpt2", "wordpiece"])
def test_lone_surrogates_are_refused_with_a_fix(tokenize, small_bpe, gpt2):
    wp = WordPieceTokenizer.from_vocab()
    fn = {"bpe": small_bpe.encode, "gpt2": gpt2.encode, "wordpiece": wp.tokenize}[tokenize]
    with pytest.raises(ValueError, match=r"lone surrogate '\\ud83d' at position 2.*surrogatepass"):
        fn("ab\ud83d")
    with pytest.raises(ValueError, match="lone surrogate"):
        BPETokenizer.train("x\udc00y", 300)
    assert fn("") == []


def test_more_bad_input_is_refused(small_bpe, gpt2):
    import numpy as np
    import torch

    with pytest.raises(TypeError, match="flat sequence"):
        small_bpe.decode(torch.tensor([[1, 2], [3, 4]]))
    with pytest.raises(TypeError, match="token ids must be ints, got 1.0"):
        gpt2.decode(torch.tensor([1.0, 2.0]))
    assert gpt2.decode(np.array([15496, 995])) == "Hello world"
    assert gpt2.decode(torch.tensor([15496, 995], dtype=torch.int16)) == "Hello world"
    with pytest.raises(TypeError, match="expected a list of token ids, got a str"):
        gpt2.decode("15496")
    with pytest.raises(TypeError, match="expected a str, got bytes"):
        small_bpe.encode(b"bytes")
    with pytest.raises(TypeError, match="expected a str, got int"):
        WordPieceTokenizer.from_vocab().tokenize(5)
    with pytest.raises(ValueError, match="id -3"):
        WordPieceTokenizer.from_vocab().decode([-3])
    with pytest.raises(ValueError, match="vocab_size must be an int"):
        BPETokenizer.train("text", 300.0)
