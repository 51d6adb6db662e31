"""The date corpus, the character vocabularies, padded pair batches and the TSV reader (lesson
08)."""

import calendar
import datetime

import pytest
import torch
from _helpers import seeded  # noqa: F401  (autouse fixture)

from course_lib.data.dates import DATE_FORMATS, TRAIN_FORMATS, DatesCorpus, ordinal, render_date
from course_lib.data.translation import CharVocab, make_translation_batch, read_tsv_pairs, write_tsv_pairs
from course_lib.masks import decoder_self_attention_mask, padding_mask


@pytest.fixture(scope="module")
def corpus():
    return DatesCorpus()


# --------------------------------------------------------------------------------------------
# Surface forms
# --------------------------------------------------------------------------------------------


def test_every_format_of_one_date():
    d = datetime.date(2024, 3, 3)  # a Sunday
    expected = {
        "en day month": "3 March 2024",
        "en month day": "March 3, 2024",
        "en ordinal": "3rd of March 2024",
        "en weekday": "Sunday, March 3, 2024",
        "en abbreviated": "Sun 3 Mar 2024",
        "de day month": "3. März 2024",
        "de weekday": "Sonntag, 3. März 2024",
        "de abbreviated": "So, 03. Mär 2024",
        "numeric m/d/y": "3/3/2024",
        "numeric d.m.y": "03.03.2024",
        "numeric y/m/d": "2024/03/03",
    }
    assert {f: render_date(d, f) for f in DATE_FORMATS} == expected
    assert len(TRAIN_FORMATS) >= 8 and "numeric y/m/d" not in TRAIN_FORMATS


def test_ordinals_against_the_english_rules():
    cases = {
        1: "1st",
        2: "2nd",
        3: "3rd",
        4: "4th",
        11: "11th",
        12: "12th",
        13: "13th",
        21: "21st",
        22: "22nd",
        23: "23rd",
        24: "24th",
        30: "30th",
        31: "31st",
    }
    assert {n: ordinal(n) for n in cases} == cases


def test_weekdays_match_the_calendar_module():
    # calendar.day_name is an independent source (locale C: English names, Monday first)
    g = torch.Generator().manual_seed(0)
    for offset in torch.randint(0, 73049, (200,), generator=g).tolist():
        d = datetime.date(1900, 1, 1) + datetime.timedelta(days=offset)
        name = calendar.day_name[calendar.weekday(d.year, d.month, d.day)]
        assert render_date(d, "en weekday").startswith(name + ", ")
        assert render_date(d, "en abbreviated").startswith(name[:3] + " ")
    assert render_date(datetime.date(1900, 1, 1), "de weekday").startswith("Montag, ")  # a Monday
    assert render_date(datetime.date(2099, 12, 31), "en weekday") == "Thursday, December 31, 2099"


def test_unknown_format_is_an_error():
    with pytest.raises(ValueError, match="unknown format"):
        render_date(datetime.date(2000, 1, 1), "klingon")


# --------------------------------------------------------------------------------------------
# The corpus and its held-out split
# --------------------------------------------------------------------------------------------


def test_heldout_is_2000_distinct_dates_in_range_and_balanced_over_formats(corpus):
    assert len(corpus.heldout) == 2000 and len(set(corpus.heldout_dates)) == 2000
    assert min(corpus.heldout_dates) >= datetime.date(1900, 1, 1)
    assert max(corpus.heldout_dates) <= datetime.date(2099, 12, 31)
    counts = {f: sum(p.format == f for p in corpus.heldout) for f in TRAIN_FORMATS}
    assert set(counts.values()) == {2000 // len(TRAIN_FORMATS)}
    for p in corpus.heldout:
        assert p.source == render_date(p.date, p.format) and p.target == p.date.isoformat()


def test_training_never_sees_a_heldout_date_in_any_format(corpus):
    heldout = set(corpus.heldout_dates)
    g = torch.Generator().manual_seed(1)
    pairs = [p for _ in range(20) for p in corpus.sample_pairs(500, g)]
    assert not any(p.date in heldout for p in pairs)
    assert not {p.target for p in pairs} & {d.isoformat() for d in heldout}
    assert {p.format for p in pairs} == set(TRAIN_FORMATS)  # every training format is used
    assert corpus.num_days == 73049 and len(corpus._train_days) == 73049 - 2000


def test_corpus_is_reproducible_and_seed_dependent():
    assert DatesCorpus(seed=3).heldout == DatesCorpus(seed=3).heldout
    assert DatesCorpus(seed=3).heldout_dates != DatesCorpus(seed=4).heldout_dates


def test_heldout_dates_do_not_depend_on_the_training_formats(corpus):
    every_format = DatesCorpus(formats=list(DATE_FORMATS))  # lesson 08's remedy adds y/m/d
    assert every_format.heldout_dates == corpus.heldout_dates
    assert "numeric y/m/d" in {p.format for p in every_format.heldout}
    g = torch.Generator().manual_seed(0)
    drawn = every_format.sample_pairs(4000, g)
    assert not any(every_format.is_heldout(p.date) for p in drawn)
    assert {p.format for p in drawn} == set(DATE_FORMATS)


def test_heldout_pairs_in_one_format(corpus):
    pairs = corpus.heldout_pairs("numeric y/m/d")
    assert [p.date for p in pairs] == corpus.heldout_dates
    assert all(p.format == "numeric y/m/d" for p in pairs)


def test_vocabularies_are_separate_and_cover_every_format(corpus):
    assert corpus.tgt_vocab.chars == list("-0123456789")
    assert "ä" in corpus.src_vocab and "-" not in corpus.src_vocab
    g = torch.Generator().manual_seed(2)
    for offset in torch.randint(0, corpus.num_days, (300,), generator=g).tolist():
        d = corpus.first + datetime.timedelta(days=offset)
        for f in DATE_FORMATS:
            assert not corpus.src_vocab.unknown(render_date(d, f))


def test_corpus_bad_arguments():
    with pytest.raises(ValueError, match="num_heldout"):
        DatesCorpus(num_heldout=0)
    with pytest.raises(ValueError, match="formats"):
        DatesCorpus(formats=["nope"])
    with pytest.raises(ValueError, match="first_year"):
        DatesCorpus(first_year=2000, last_year=1999)


# --------------------------------------------------------------------------------------------
# Character vocabulary and padded batches
# --------------------------------------------------------------------------------------------


def test_char_vocab_round_trip_and_specials():
    v = CharVocab.build(["März", "May"])
    assert v.itos[:3] == ["<pad>", "<sos>", "<eos>"] and v.unk_id is None
    assert v.chars == sorted(set("MärzMay"))
    ids = v.encode("Mäy")
    assert v.decode(ids) == "Mäy"
    assert v.decode([v.sos_id, *ids, v.eos_id, v.pad_id, ids[0]]) == "Mäy"  # stops at <eos>


def test_char_vocab_unknown_character_is_an_error_naming_it():
    v = CharVocab.build(["March"])
    with pytest.raises(ValueError, match=r"'ä' \(U\+00E4\).*no <unk>"):
        v.encode("März")
    with_unk = CharVocab.build(["March"], unk=True)
    assert with_unk.encode("Mä") == [with_unk.stoi["M"], with_unk.unk_id]


def test_translation_batch_pads_both_sides_with_independent_masks():
    src_v, tgt_v = CharVocab.build(["abc", "de"]), CharVocab.build(["xy", "z"])
    pairs = [("abc", "z"), ("d", "xyzx")]
    b = make_translation_batch(pairs, src_v, tgt_v)
    assert b.src.shape == (2, 3) and b.tgt_in.shape == b.tgt_out.shape == (2, 5)
    assert b.src[1].tolist() == [src_v.stoi["d"], 0, 0]
    assert b.tgt_in[0].tolist() == [tgt_v.sos_id, tgt_v.stoi["z"], 0, 0, 0]
    assert b.tgt_out[0].tolist() == [tgt_v.stoi["z"], tgt_v.eos_id, 0, 0, 0]
    for row_in, row_out, (_, tgt) in zip(b.tgt_in, b.tgt_out, pairs):  # shifted by exactly one
        assert (
            row_in[1 : len(tgt) + 1].tolist() == row_out[: len(tgt)].tolist() == tgt_v.encode(tgt)
        )
    assert torch.equal(b.src_mask, padding_mask(b.src, 0))  # against course_lib.masks
    assert torch.equal(b.tgt_mask, decoder_self_attention_mask(b.tgt_in, 0))
    assert torch.equal(
        b.label_mask, torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    )


def test_train_batch_shapes(corpus):
    b = corpus.train_batch(16, torch.Generator().manual_seed(0))
    assert b.src.size(0) == 16 and b.tgt_in.shape == (16, 11)  # <sos> + 10 characters of ISO
    assert (b.tgt_out[:, -1] == corpus.tgt_vocab.eos_id).all()
    lengths = (b.src != 0).sum(1)
    assert lengths.max() == b.src.size(1) and lengths.min() < lengths.max()  # really padded


def test_batch_unknown_character_is_named():
    v = CharVocab.build(["abc"])
    with pytest.raises(ValueError, match="pair 1, target"):
        make_translation_batch([("a", "b"), ("a", "q")], v, v)
    with pytest.raises(ValueError, match="no pairs"):
        make_translation_batch([], v, v)


# --------------------------------------------------------------------------------------------
# TSV files
# --------------------------------------------------------------------------------------------


def test_tsv_round_trip_of_generated_pairs(corpus, tmp_path):
    path = write_tsv_pairs(corpus.heldout, tmp_path / "dates.tsv")
    pairs = read_tsv_pairs(path, corpus.src_vocab, corpus.tgt_vocab)
    assert pairs == [(p.source, p.target) for p in corpus.heldout]
    assert torch.equal(corpus.batch(pairs).src, corpus.batch(corpus.heldout).src)


def test_tsv_reads_any_pairs_and_windows_line_ends(tmp_path):
    path = tmp_path / "de_en.tsv"
    path.write_bytes("Guten Morgen\tGood morning\r\nzwei Hunde\ttwo dogs\r\n".encode())
    assert read_tsv_pairs(path) == [("Guten Morgen", "Good morning"), ("zwei Hunde", "two dogs")]


@pytest.mark.parametrize(
    "text, message",
    [
        ("a\tb\n\nc\td\n", r"line 2 is empty"),
        ("a\tb\nc d\n", r"line 2 has 1 column \(0 tabs\), expected 2"),
        ("a\tb\tc\n", r"line 1 has 3 columns \(2 tabs\), expected 2"),
        ("a\t\n", r"line 1 has an empty target"),
        ("", r"is empty; expected lines"),
    ],
)
def test_tsv_bad_lines(tmp_path, text, message):
    path = tmp_path / "bad.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_tsv_pairs(path)


def test_tsv_unknown_character_without_unk(corpus, tmp_path):
    path = tmp_path / "accent.tsv"
    path.write_text("3 March 2024\t2024-03-03\n3 Décembre 2024\t2024-12-03\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 2: the source .* 'é' \(U\+00E9\)"):
        read_tsv_pairs(path, corpus.src_vocab, corpus.tgt_vocab)
    assert len(read_tsv_pairs(path, CharVocab.build("x", unk=True))) == 2  # with <unk> it is fine


def test_write_tsv_refuses_tabs(tmp_path):
    with pytest.raises(ValueError, match="tab or newline"):
        write_tsv_pairs([("a\tb", "c")], tmp_path / "x.tsv")


# --------------------------------------------------------------------------------------------
# The lesson-08 recipe's helpers (course_lib.training, lesson 08 section)
# --------------------------------------------------------------------------------------------


def test_train_dates_short_run_and_teacher_forced_exact_match_equals_greedy(corpus):
    from course_lib.training import dates_exact_match, dates_lr, train_dates, translate

    run = train_dates(corpus, num_steps=80, cooldown=20, eval_every=40, progress=False)
    assert len(run.losses) == 80 and [s for s, _ in run.curve] == [40, 80] and run.train_seconds > 0
    assert not run.model.training
    assert all(not getattr(m, "fused", False) for m in run.model.modules())  # readable path again
    pairs = corpus.heldout[:300]
    greedy = dates_exact_match(run.model, corpus, pairs)
    assert 0.0 < greedy < 1.0  # partly trained: the comparison below is not trivial
    assert dates_exact_match(run.model, corpus, pairs, method="teacher_forcing") == pytest.approx(
        greedy
    )
    texts = translate(run.model, [p.source for p in pairs[:5]], corpus.src_vocab, corpus.tgt_vocab)
    assert all(isinstance(t, str) and len(t) <= 11 for t in texts)
    assert dates_lr(600, 64, 100, 1.0, 600, 240) == 0.0 and dates_lr(1, 64, 100, 1.0, 600, 240) > 0
    with pytest.raises(ValueError, match="method"):
        dates_exact_match(run.model, corpus, pairs, method="sampling")
