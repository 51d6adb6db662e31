"""Lesson 08's stored remedy runs (course_lib.studies.dates_remedy): the file the lesson loads, what the
lesson says of it, the runner on a tiny budget, bad input."""

from __future__ import annotations

import pytest

from course_lib.data.dates import DATE_FORMATS, TRAIN_FORMATS, DatesCorpus
from course_lib.studies.dates_remedy import NEW_FORMAT, load_remedy, run_remedy
from course_lib.training import dates_exact_match, train_dates

SEEDS = [0, 1, 2, 3, 4]


@pytest.fixture(scope="module")
def stored():
    return load_remedy()["paths"]


def test_the_file_holds_both_corpora_and_five_seeds_on_two_paths(stored):
    assert set(stored) == {"avx2", "default"}
    for entry in stored.values():
        assert entry["threads"] == 1
        assert sorted((r["seed"], r["formats"]) for r in entry["runs"]) == [
            (s, n) for s in SEEDS for n in (10, 11)]
        for r in entry["runs"]:
            assert 0 <= r["year_first"] <= 1 and 0 <= r["ten_formats"] <= 1
            assert 0.5 < r["final_loss"] < 0.65  # near the entropy floor of label smoothing (0.574)


def test_what_lesson_08_says_of_the_stored_runs(stored):
    """Cell 54 and the text after it: without the year-first form no run gets a year-first date
    right (0.0% measured); with it every run gets >= 99% of them (100.0%), and >= 98% of the usual
    held-out set (98.95-100%, against 99.85-100% without it)."""
    for path, entry in stored.items():
        for r in entry["runs"]:
            if r["formats"] == 10:
                assert r["year_first"] <= 0.01 and r["ten_formats"] >= 0.99, (path, r)
            else:
                assert r["year_first"] >= 0.99 and r["ten_formats"] >= 0.98, (path, r)


def test_the_new_format_is_the_eleventh():
    assert NEW_FORMAT in DATE_FORMATS and NEW_FORMAT not in TRAIN_FORMATS
    assert set(DATE_FORMATS) == set(TRAIN_FORMATS) | {NEW_FORMAT}


def test_the_runner_is_the_recipe_on_a_tiny_budget():
    runs = run_remedy(seeds=(2,), num_steps=4)
    assert [(r["seed"], r["formats"]) for r in runs] == [(2, 10), (2, 11)]
    corpus, every_format = DatesCorpus(), DatesCorpus(formats=list(DATE_FORMATS))
    for r, trained_on in zip(runs, (corpus, every_format)):
        run = train_dates(trained_on, num_steps=4, cooldown=4, seed=2, progress=False)
        assert r["final_loss"] == round(run.losses[-1], 4)
        year_first = [(p.source, p.target) for p in every_format.heldout_pairs(NEW_FORMAT)]
        score = dates_exact_match(run.model, every_format, year_first, "teacher_forcing")
        assert r["year_first"] == round(score, 4)
        assert r["year_first"] < 0.05 and r["ten_formats"] < 0.05  # 4 steps learn no date


def test_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="make dates-remedy"):
        load_remedy(tmp_path)
    with pytest.raises(ValueError, match="at least one seed"):
        run_remedy(seeds=())
    with pytest.raises(ValueError, match="num_steps must be at least 1"):
        run_remedy(num_steps=0)
