"""Lesson 08's checkers: correct solutions in different styles pass, each named mistake is
caught."""

from pathlib import Path

import pytest
import torch
from _helpers import seeded  # noqa: F401  (autouse fixture)

from course_lib import Transformer, greedy_decode
from course_lib.checks import CheckFailure, check_batch_shapes, check_make_batch, check_translate
from course_lib.checks.translation import _BATCH_MISTAKES, _batch_variant
from course_lib.data import DatesCorpus, make_translation_batch
from course_lib.masks import padding_mask
from course_lib.solutions import lesson08, solution_source
from course_lib.training import dates_config

PHRASES = [
    ("drei Hunde", "three dogs"),
    ("ja", "yes"),
    ("Guten Morgen", "good morning"),
    ("Montag", "Monday"),
]


def solution(key: str) -> dict:
    """The solution block run after the file's header imports (as the notebook's imports precede
    it)."""
    header = (Path(lesson08.__file__).read_text(encoding="utf-8")).split("# %% solution")[0]
    namespace: dict = {}
    exec(header + solution_source(key), namespace)
    return namespace


def passes(check, candidate, *args, capsys=None):
    check(candidate, *args)
    if capsys is not None:
        out = capsys.readouterr().out
        assert "Well done" in out and out.count("\n") == 1, out


# --------------------------------------------------------------------------------------------
# check_make_batch
# --------------------------------------------------------------------------------------------


def test_make_batch_solution_and_alternatives_pass(capsys):
    passes(check_make_batch, solution("08.make_batch")["make_batch"], capsys=capsys)
    passes(check_make_batch, make_translation_batch, capsys=capsys)  # returns a TranslationBatch

    def with_nested_tensor(pairs, sv, tv):  # pad with torch's pad_sequence instead
        from torch.nn.utils.rnn import pad_sequence

        def pad(seqs):
            return pad_sequence(
                [torch.tensor(s) for s in seqs], batch_first=True, padding_value=sv.pad_id
            )

        tgt = [tv.encode(t) for _, t in pairs]
        return [
            pad([sv.encode(s) for s, _ in pairs]),
            pad([[tv.sos_id] + t for t in tgt]),
            pad([t + [tv.eos_id] for t in tgt]),
        ]

    passes(check_make_batch, with_nested_tensor, capsys=capsys)


@pytest.mark.parametrize("kind, name, hint", _BATCH_MISTAKES, ids=[m[0] for m in _BATCH_MISTAKES])
def test_make_batch_names_each_mistake(kind, name, hint):
    def wrong(pairs, sv, tv):
        return _batch_variant(pairs, sv, tv, kind)

    with pytest.raises(CheckFailure, match="Likely mistake .*" + name.split("(")[0][:30]):
        check_make_batch(wrong)


def test_make_batch_other_errors():
    def pad_with_minus_one(pairs, sv, tv):
        b = make_translation_batch(pairs, sv, tv)
        return b.src.masked_fill(b.src == 0, -1), b.tgt_in, b.tgt_out

    with pytest.raises(CheckFailure, match="src differs .*row"):
        check_make_batch(pad_with_minus_one)

    def crashes(pairs, sv, tv):
        raise KeyError("x")

    with pytest.raises(CheckFailure, match="raised KeyError"):
        check_make_batch(crashes)


def test_make_batch_stub_prints_a_reminder(capsys):
    def make_batch(pairs, sv, tv):
        raise NotImplementedError

    check_make_batch(make_batch)
    assert "not implemented yet" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# check_batch_shapes
# --------------------------------------------------------------------------------------------


def test_batch_shapes_solution_and_alternatives_pass(capsys):
    passes(check_batch_shapes, solution("08.shapes")["predicted_shapes"], PHRASES, capsys=capsys)

    def with_sizes_and_lists():
        return {
            "src": torch.Size([4, 12]),
            "src_mask": [4, 1, 12],
            "tgt_in": (4, 13),
            "tgt_mask": torch.Size([4, 13, 13]),
            "label_mask": [4, 13],
        }

    passes(check_batch_shapes, with_sizes_and_lists, PHRASES, capsys=capsys)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("src", (4, 3), "longest source in CHARACTERS"),
        ("src_mask", (4, 12), r"ONE row that broadcasts"),
        ("tgt_in", (4, 12), r"plus one, because the decoder input is <sos> \+ target"),
        ("tgt_mask", (13, 13), "keeps the batch axis"),
        ("label_mask", (4, 13, 13), "one flag per label"),
    ],
)
def test_batch_shapes_explains_each_wrong_shape(key, value, message):
    right = solution("08.shapes")["predicted_shapes"]()

    def predicted_shapes():
        return {**right, key: value}

    with pytest.raises(CheckFailure, match=message):
        check_batch_shapes(predicted_shapes, PHRASES)


def test_batch_shapes_wrong_keys():
    with pytest.raises(CheckFailure, match="exactly the keys"):
        check_batch_shapes(lambda: {"src": (4, 12)}, PHRASES)


# --------------------------------------------------------------------------------------------
# check_translate
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus_and_model():
    corpus = DatesCorpus(num_heldout=400, seed=5)
    torch.manual_seed(0)
    model = Transformer(
        dates_config(corpus)
    ).eval()  # random weights: masks still change the output
    return corpus, model


def test_translate_solution_and_alternatives_pass(corpus_and_model, capsys):
    corpus, model = corpus_and_model
    passes(check_translate, solution("08.translate")["my_translate"], model, corpus, capsys=capsys)

    def with_course_lib(model, src, max_len, start_id, end_id):  # stops early once every row ended
        return greedy_decode(
            model, src, max_len, start_id, end_id=end_id, src_mask=padding_mask(src, 0)
        )

    passes(check_translate, with_course_lib, model, corpus, capsys=capsys)

    def four_d_mask(model, src, max_len, start_id, end_id):
        mask = (src != 0)[:, None, None, :]  # (B, 1, 1, L_s): MultiHeadAttention accepts it
        memory = model.encode(src, mask)
        ys = torch.full((src.size(0), 1), start_id)
        for _ in range(max_len):
            ys = torch.cat(
                [ys, model.generator(model.decode(ys, memory, mask)[:, -1]).argmax(-1)[:, None]], 1
            )
        return ys[:, 1:]

    passes(check_translate, four_d_mask, model, corpus, capsys=capsys)


def test_translate_catches_the_missing_decoder_mask(corpus_and_model):
    corpus, model = corpus_and_model

    def no_decoder_mask(model, src, max_len, start_id, end_id):
        memory = model.encode(src, padding_mask(src, 0))
        ys = torch.full((src.size(0), 1), start_id)
        for _ in range(max_len):
            ys = torch.cat(
                [ys, model.generator(model.decode(ys, memory, None)[:, -1]).argmax(-1)[:, None]], 1
            )
        return ys[:, 1:]

    with pytest.raises(CheckFailure, match="Cross-attention still reads the padding"):
        check_translate(no_decoder_mask, model, corpus)

    def no_masks(model, src, max_len, start_id, end_id):
        return greedy_decode(
            model,
            src,
            max_len,
            start_id,
            src_mask=torch.ones(src.size(0), 1, src.size(1), dtype=torch.bool),
        )

    with pytest.raises(CheckFailure, match="No source padding mask at all"):
        check_translate(no_masks, model, corpus)


def test_translate_wrong_shape_and_other_errors(corpus_and_model):
    corpus, model = corpus_and_model
    with pytest.raises(CheckFailure, match="Wrong output"):
        check_translate(lambda m, src, n, s, e: torch.zeros(n), model, corpus)
    with pytest.raises(CheckFailure, match="differ from course_lib's greedy_decode"):
        check_translate(lambda m, src, n, s, e: torch.full((src.size(0), n), 4), model, corpus)
