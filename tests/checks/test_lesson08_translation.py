"""Lesson 08's checkers: correct solutions in different styles pass, each named mistake is
caught."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _helpers import seeded  # noqa: F401  (autouse fixture)

from course_lib import Transformer, greedy_decode
from course_lib.checks import CheckFailure, check_batch_shapes, check_make_batch, check_translate
from course_lib.checks.lesson08_translation import BATCH_MISTAKES, TRANSLATE_MISTAKES, batch_variant
from course_lib.data.copy_task import pad_sequences
from course_lib.data.dates import DatesCorpus
from course_lib.data.translation import make_translation_batch
from course_lib.masks import padding_mask
from course_lib.solutions import lesson08, solution_source
from course_lib.training import dates_config, translate

PHRASES = [
    ("drei Hunde", "three dogs"),
    ("ja", "yes"),
    ("Entschuldigung", "excuse me"),
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

    def by_hand_int32(pairs, sv, tv):  # tensors filled in a loop, int32 ids
        width_s = max(len(s) for s, _ in pairs)
        width_t = max(len(t) for _, t in pairs) + 1
        src = torch.full((len(pairs), width_s), sv.pad_id, dtype=torch.int32)
        tgt_in = torch.full((len(pairs), width_t), tv.pad_id, dtype=torch.int32)
        tgt_out = torch.full_like(tgt_in, tv.pad_id)
        for row, (s, t) in enumerate(pairs):
            ids = tv.encode(t)
            src[row, : len(s)] = torch.tensor(sv.encode(s))
            tgt_in[row, : len(ids) + 1] = torch.tensor([tv.sos_id] + ids)
            tgt_out[row, : len(ids) + 1] = torch.tensor(ids + [tv.eos_id])
        return src, tgt_in, tgt_out

    passes(check_make_batch, by_hand_int32, capsys=capsys)


def test_make_batch_says_so_when_handed_course_libs_function():
    with pytest.raises(CheckFailure, match="course_lib's own `make_translation_batch`"):
        check_make_batch(make_translation_batch)

    def make_batch(pairs, sv, tv):
        return make_translation_batch(pairs, sv, tv)

    with pytest.raises(CheckFailure, match="course_lib's own `make_translation_batch`"):
        check_make_batch(make_batch)


@pytest.mark.parametrize("kind, name, hint", BATCH_MISTAKES, ids=[m[0] for m in BATCH_MISTAKES])
def test_make_batch_names_each_mistake(kind, name, hint):
    def wrong(pairs, sv, tv):
        return batch_variant(pairs, sv, tv, kind)

    with pytest.raises(CheckFailure, match="Likely mistake .*" + name.split("(")[0][:30]):
        check_make_batch(wrong)


def right_batch(pairs, sv, tv):
    """The solution's batch as an object, so that a wrong attempt can change one tensor."""
    src, tgt_in, tgt_out = solution("08.make_batch")["make_batch"](pairs, sv, tv)
    return SimpleNamespace(src=src, tgt_in=tgt_in, tgt_out=tgt_out)


def test_make_batch_other_errors():
    def pad_with_minus_one(pairs, sv, tv):
        b = right_batch(pairs, sv, tv)
        return b.src.masked_fill(b.src == 0, -1), b.tgt_in, b.tgt_out

    with pytest.raises(CheckFailure, match="Likely mistake .*src is padded with -1, not the pad id 0"):
        check_make_batch(pad_with_minus_one)

    def labels_padded_with_minus_100(pairs, sv, tv):  # the ignore_index habit
        b = right_batch(pairs, sv, tv)
        return b.src, b.tgt_in, b.tgt_out.masked_fill(b.tgt_out == 0, -100)

    with pytest.raises(CheckFailure, match="tgt_out is padded with -100.*ignore_index"):
        check_make_batch(labels_padded_with_minus_100)

    def targets_padded_with_eos(pairs, sv, tv):
        tgt = [tv.encode(t) for _, t in pairs]
        return (
            pad_sequences([sv.encode(s) for s, _ in pairs], sv.pad_id),
            pad_sequences([[tv.sos_id, *t] for t in tgt], tv.eos_id),
            pad_sequences([[*t, tv.eos_id] for t in tgt], tv.eos_id),
        )

    with pytest.raises(CheckFailure, match="tgt_in is padded with 2, not the pad id 0"):
        check_make_batch(targets_padded_with_eos)

    def float_ids(pairs, sv, tv):
        b = right_batch(pairs, sv, tv)
        return b.src.float(), b.tgt_in.float(), b.tgt_out.float()

    with pytest.raises(CheckFailure, match="Wrong dtype .*must be integers"):
        check_make_batch(float_ids)

    def targets_with_the_source_vocab(pairs, sv, tv):
        tgt = [sv.encode(t) for _, t in pairs]
        return (
            pad_sequences([sv.encode(s) for s, _ in pairs], sv.pad_id),
            pad_sequences([[tv.sos_id, *t] for t in tgt], tv.pad_id),
            pad_sequences([[*t, tv.eos_id] for t in tgt], tv.pad_id),
        )

    with pytest.raises(CheckFailure, match="raised ValueError.*each target with tgt_vocab"):
        check_make_batch(targets_with_the_source_vocab)

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
            "src": torch.Size([4, 14]),
            "src_mask": [4, 1, 14],
            "tgt_in": (4, 11),
            "tgt_mask": torch.Size([4, 11, 11]),
            "label_mask": [4, 11],
        }

    passes(check_batch_shapes, with_sizes_and_lists, PHRASES, capsys=capsys)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("src", (4, 3), "longest source in CHARACTERS"),
        ("src_mask", (4, 14), r"ONE row that broadcasts"),
        ("tgt_in", (4, 14), r"plus one, because the decoder input is <sos> \+ target"),
        ("tgt_mask", (11, 11), "keeps the batch axis"),
        ("label_mask", (4, 11, 11), "one flag per label"),
    ],
)
def test_batch_shapes_explains_each_wrong_shape(key, value, message):
    right = solution("08.shapes")["predicted_shapes"]()

    def predicted_shapes():
        return {**right, key: value}

    with pytest.raises(CheckFailure, match=message):
        check_batch_shapes(predicted_shapes, PHRASES)


# B = 4, L_s = 14, the longest target 10, so L_t = 11; the longest source has 2 words
@pytest.mark.parametrize(
    "key, value, message",
    [
        ("src", (4, 2), "You counted words"),
        ("src", (4, 15), "no <sos> or <eos>"),
        ("src", (4, 16), "no <sos> or <eos>"),
        ("src", (14, 4), "Batch first"),
        ("src", (4, 11), "the target side's length"),
        ("src", (1, 14), "The first axis is the batch"),
        ("src_mask", (4, 14), "no query axis"),
        ("src_mask", (4, 14, 14), "A full square is not needed"),
        ("src_mask", (4, 11, 14), "One row per decoder query"),
        ("src_mask", (4, 1, 1, 14), "masks have 3 axes"),
        ("tgt_in", (4, 10), "You forgot <sos>"),
        ("tgt_in", (4, 12), "not <eos>"),
        ("tgt_in", (4, 14), "the source's length"),
        ("tgt_mask", (11, 11), "one causal square"),
        ("tgt_mask", (4, 1, 11), "target PADDING mask alone"),
        ("tgt_mask", (4, 1, 11, 11), "masks have 3 axes"),
        ("tgt_mask", (4, 10, 10), "You forgot <sos>"),
        ("tgt_mask", (4, 12, 12), "never both in one"),
        ("label_mask", (4, 11, 11), "not per pair of positions"),
        ("label_mask", (4, 1, 11), "not an attention mask"),
        ("label_mask", (4, 10), r"target \+ <eos>"),
        ("label_mask", (4, 12), "not <sos> too"),
    ],
)
def test_batch_shapes_names_each_mistake(key, value, message):
    right = solution("08.shapes")["predicted_shapes"]()

    def predicted_shapes():
        return {**right, key: value}

    with pytest.raises(CheckFailure, match="Likely mistake: [^\n]*" + message):
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
    model = Transformer(dates_config(corpus)).eval()  # random weights: masks still change outputs
    with torch.no_grad():  # <eos> made likelier, so that rows end at different steps (at 1 to 10)
        model.generator.bias[corpus.tgt_vocab.eos_id] += 2.0
    return corpus, model


def test_translate_solution_and_alternatives_pass(corpus_and_model, capsys):
    corpus, model = corpus_and_model
    passes(check_translate, solution("08.translate")["my_translate"], model, corpus, capsys=capsys)

    def with_course_lib(model, src, max_len, start_id, end_id):  # stops early once every row ended
        return greedy_decode(
            model, src, max_len, start_id, end_id=end_id, src_mask=padding_mask(src, 0)
        )

    passes(check_translate, with_course_lib, model, corpus, capsys=capsys)

    def four_d_mask_no_early_stop(model, src, max_len, start_id, end_id):
        mask = (src != 0)[:, None, None, :]  # (B, 1, 1, L_s): MultiHeadAttention accepts it
        memory = model.encode(src, mask)
        ys = torch.ones(src.size(0), 1, dtype=torch.long)  # <sos> is id 1
        for _ in range(max_len):
            ys = torch.cat(
                [ys, model.generator(model.decode(ys, memory, mask)[:, -1]).argmax(-1)[:, None]], 1
            )
        return ys[:, 1:]

    passes(check_translate, four_d_mask_no_early_stop, model, corpus, capsys=capsys)

    def with_the_cache(model, src, max_len, start_id, end_id):
        mask = padding_mask(src, 0)
        cache = model.start_cache(model.encode(src, mask), mask)
        token = torch.full((src.size(0),), start_id)
        out = []
        for _ in range(max_len):
            token = model.decode_step(token, cache).argmax(-1)
            out.append(token)
        return torch.stack(out, dim=1)

    passes(check_translate, with_the_cache, model, corpus, capsys=capsys)


def _loop(start, take=-1, newest_only=False, stop_at_any=False, src_mask_in_decode=True):
    """A learner's greedy loop with the given choices (independent of the checker's variants)."""

    @torch.no_grad()
    def fn(model, src, max_len, start_id, end_id):
        mask = padding_mask(src, 0)
        memory = model.encode(src, mask)
        first = {"sos": start_id, "pad": 0, "eos": end_id}[start]
        ys = torch.full((src.size(0), 1), first)
        for _ in range(max_len):
            inputs = ys[:, -1:] if newest_only else ys
            hidden = model.decode(inputs, memory, mask if src_mask_in_decode else None)
            next_id = model.generator(hidden[:, take]).argmax(-1)
            ys = torch.cat([ys, next_id[:, None]], dim=1)
            if stop_at_any and (next_id == end_id).any():
                break
        return ys[:, 1:]

    return fn


@pytest.mark.parametrize(
    "learner, name",
    [
        (_loop("pad"), "starts from <pad>"),
        (_loop("eos"), "starts from end_id"),
        (_loop("sos", src_mask_in_decode=False), "cross-attention reads the source padding"),
        (_loop("sos", take=0), "taken from the first position"),
        (_loop("sos", newest_only=True), "reads only the newest token"),
        (_loop("sos", stop_at_any=True), "ANY row"),
    ],
    ids=["pad start", "eos start", "no decoder mask", "first position", "newest only", "any"],
)
def test_translate_names_each_mistake(corpus_and_model, learner, name):
    corpus, model = corpus_and_model
    with pytest.raises(CheckFailure, match="Likely mistake .*" + name):
        check_translate(learner, model, corpus)


def test_translate_every_named_mistake_is_tested():
    tested = {"pad start", "eos start", "no decoder mask", "no masks", "first position",
              "newest token only", "stop at any"}
    assert {kind for kind, _, _ in TRANSLATE_MISTAKES} == tested


def test_translate_the_lessons_bug_is_caught(corpus_and_model):
    corpus, model = corpus_and_model
    stub = solution_source("08.translate").replace(
        "torch.full((src.size(0), 1), start_id, dtype=torch.long)", "torch.zeros_like(src[:, :1])"
    )
    assert "zeros_like" in stub
    namespace: dict = {}
    exec(Path(lesson08.__file__).read_text(encoding="utf-8").split("# %% solution")[0] + stub,
         namespace)
    with pytest.raises(CheckFailure, match=r"Likely mistake .*starts from <pad> \(id 0\)"):
        check_translate(namespace["my_translate"], model, corpus)


def test_translate_no_masks_is_named(corpus_and_model):
    corpus, model = corpus_and_model

    def no_masks(model, src, max_len, start_id, end_id):
        return greedy_decode(
            model,
            src,
            max_len,
            start_id,
            src_mask=torch.ones(src.size(0), 1, src.size(1), dtype=torch.bool),
        )

    with pytest.raises(CheckFailure, match="no source padding mask at all"):
        check_translate(no_masks, model, corpus)


def test_translate_says_so_when_handed_course_libs_function(corpus_and_model):
    corpus, model = corpus_and_model
    with pytest.raises(CheckFailure, match="course_lib's own `greedy_decode`"):
        check_translate(greedy_decode, model, corpus)
    with pytest.raises(CheckFailure, match="course_lib's own `translate`"):
        check_translate(translate, model, corpus)


def test_translate_wrong_width(corpus_and_model):
    corpus, model = corpus_and_model

    def keeps_the_start_symbol(model, src, max_len, start_id, end_id):
        out = greedy_decode(model, src, max_len, start_id, end_id, padding_mask(src, 0))
        return torch.cat([torch.full((src.size(0), 1), start_id), out], dim=1)

    with pytest.raises(CheckFailure, match="still starts with the start symbol"):
        check_translate(keeps_the_start_symbol, model, corpus)

    def ignores_max_len(model, src, max_len, start_id, end_id):
        return greedy_decode(model, src, 11, start_id, end_id, padding_mask(src, 0))

    with pytest.raises(CheckFailure, match="max_len = 6.*max_len is not respected"):
        check_translate(ignores_max_len, model, corpus)


def test_translate_wrong_shape_and_other_errors(corpus_and_model):
    corpus, model = corpus_and_model
    with pytest.raises(CheckFailure, match="Wrong output"):
        check_translate(lambda m, src, n, s, e: torch.zeros(n), model, corpus)
    with pytest.raises(CheckFailure, match="differ from course_lib's greedy_decode"):
        check_translate(lambda m, src, n, s, e: torch.full((src.size(0), n), 4), model, corpus)
