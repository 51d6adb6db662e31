"""course_lib.studies.stored: runs kept per float path (lessons 06 and 10 load them); lesson 10's runs
(course_lib.studies.tokens_vs_chars): the file, what the lesson says of it, the runner on a tiny budget."""

from __future__ import annotations

import json
import math

import pytest
import torch

from course_lib.studies.stored import float_path, load_runs, save_runs
from course_lib.data.shakespeare import ShakespeareCorpus, read_plays
from course_lib.studies.tokens_vs_chars import (CHAR_STEPS, equal_compute_steps, load_tokens_vs_chars, multiply_adds_per_token, run_tokens_vs_chars)

HERE = float_path()


def test_saving_keeps_the_other_paths_and_one_run_per_line(tmp_path):
    (tmp_path / "demo.json").write_text(json.dumps({"paths": {"elsewhere": {"threads": 1, "runs": []}}}))
    runs = [{"seed": 0, "x": [1.5, 2.0]}, {"seed": 1, "x": []}]
    path = save_runs("demo", runs, tmp_path)
    stored = load_runs("demo", tmp_path)["paths"]
    assert set(stored) == {"elsewhere", HERE} and stored[HERE]["runs"] == runs
    assert stored[HERE]["threads"] == torch.get_num_threads()
    assert sum(line.lstrip().startswith('{"seed"') for line in path.read_text().splitlines()) == 2
    save_runs("demo", runs[:1], tmp_path)  # a second run on the same path replaces its runs
    assert load_runs("demo", tmp_path)["paths"][HERE]["runs"] == runs[:1]


def test_loading_says_what_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="make tokens-vs-chars"):
        load_runs("nothing", tmp_path, make="tokens-vs-chars")
    (tmp_path / "empty.json").write_text('{"paths": {}}')
    with pytest.raises(ValueError, match="holds no paths"):
        load_runs("empty", tmp_path)


def test_equal_compute():
    assert multiply_adds_per_token(83) == 12 * 128 * 128 + 2 * 64 * 128 + 128 * 83
    bpe_steps = equal_compute_steps(CHAR_STEPS)
    ratio = bpe_steps * multiply_adds_per_token(1000) / (CHAR_STEPS * multiply_adds_per_token(83))
    assert bpe_steps < CHAR_STEPS and abs(ratio - 1) < 0.005


def test_the_stored_runs_and_what_lesson_10_says_of_them():
    stored = load_tokens_vs_chars()["paths"]
    assert set(stored) == {"avx2", "default"}
    for path, entry in stored.items():
        runs = entry["runs"]
        assert [r["seed"] for r in runs] == [0, 1, 2, 3, 4] and entry["threads"] == 1
        budget = (CHAR_STEPS, equal_compute_steps(CHAR_STEPS))
        assert {(r["char_steps"], r["bpe_steps"]) for r in runs} == {budget}
        chars, bpes = [r["characters"] for r in runs], [r["bpe"] for r in runs]
        assert all(2.9 < v < 3.6 for v in chars + bpes), path
        gap = sum(bpes) / 5 - sum(chars) / 5
        assert gap < -0.1 and -gap > max(max(chars) - min(chars), max(bpes) - min(bpes)), path
        assert runs[0]["bpe"] < runs[0]["characters"], path  # the live seed, in the lesson


def test_the_runner_on_a_tiny_budget():
    plays = read_plays()  # five plays, not 37: the BPE merges and the tokenized corpus cost less
    small = ShakespeareCorpus(plays=plays[:4] + [p for p in plays if p.title == "Macbeth"],
                              validation_plays=("Macbeth",))
    (run,) = run_tokens_vs_chars(seeds=(3,), char_steps=4, warmup=1, corpus=small)
    assert run["seed"] == 3 and run["char_steps"] == 4
    assert run["bpe_steps"] == equal_compute_steps(4, len(small.vocab))
    # a few steps learn little: between the trained runs (3.05-3.35) and a uniform guess, log2(V)
    # bits per token (about 2.3 characters per BPE token)
    assert 3.5 < run["characters"] < math.log2(len(small.vocab)) + 0.5, run
    assert 3.5 < run["bpe"] < math.log2(1000) / 2.3 + 0.5, run
    with pytest.raises(ValueError, match="at least one seed"):
        run_tokens_vs_chars(seeds=())


@pytest.mark.parametrize("machine, kernels, best, name", [
    ("x86_64", "AVX512", "avx512", "avx512"), ("x86_64", "AVX2", "avx2", "avx2"),
    ("x86_64", "DEFAULT", "avx2", "default"), ("x86_64", "AVX2", "avx512", "avx2-on-avx512"),
    ("x86_64", "DEFAULT", "avx512", "default-on-avx512"), ("x86_64", "DEFAULT", "default", "default-on-default"),
    ("AMD64", "AVX2", "avx2", "avx2"), ("arm64", "DEFAULT", "default", "default-arm64"),
    ("aarch64", "SVE256", "sve256", "sve256-aarch64"),
])
def test_a_float_path_names_the_kernels_and_the_cpu_under_them(monkeypatch, machine, kernels, best, name):
    import course_lib.studies.stored as stored

    monkeypatch.setattr(stored.platform, "machine", lambda: machine)
    monkeypatch.setattr(stored.torch.backends.cpu, "get_cpu_capability", lambda: kernels)
    monkeypatch.setattr(stored, "cpu_best_kernels", lambda: best)
    assert stored.float_path() == name


def test_the_cpu_s_best_kernels_are_asked_of_a_fresh_interpreter_when_forced(monkeypatch):
    import course_lib.studies.stored as stored

    stored.cpu_best_kernels.cache_clear()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    try:
        best = stored.cpu_best_kernels()
    finally:
        stored.cpu_best_kernels.cache_clear()
    assert best in ("default", "avx2", "avx512") and torch.backends.cpu.get_cpu_capability() != ""
