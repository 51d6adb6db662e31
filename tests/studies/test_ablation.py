"""Lesson 11's ablation (course_lib.studies.ablation): cumulative rows (each adds one change to the row
above), equal parameter counts
(matched_d_ff), the runner's output on a tiny corpus, the results files, bad input."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from course_lib.studies.ablation import (ROWS, ablation_table, load_ablation, matched_d_ff, row_config, run_ablation, save_ablation)
from course_lib.gpt import GPT
from course_lib.lm_training import COURSE, LMRecipe
from course_lib.model import count_parameters
from course_lib.data.shakespeare import Play, ShakespeareCorpus

V = 83  # Shakespeare's characters


def params(config, d_ff):
    return count_parameters(GPT(replace(config, d_ff=d_ff)))


def test_each_row_adds_one_change_and_keeps_the_embeddings_tied():
    configs = [row_config(COURSE, V, changes) for _, changes in ROWS]
    assert all(c.tie_embeddings for c in configs)
    for before, after in zip(configs, configs[1:]):
        changed = {k for k, v in vars(after).items() if vars(before)[k] != v} - {"d_ff"}
        assert len(changed) == 1, changed
    last = configs[-1]
    assert (last.norm, last.positional, last.activation, last.num_kv_heads, last.bias) == (
        "rmsnorm", "rope", "swiglu", 2, False)


@pytest.mark.parametrize("name, changes", ROWS)
def test_matched_d_ff_is_the_closest_count(name, changes):
    target = count_parameters(GPT(row_config(COURSE, V, {})))
    config = row_config(COURSE, V, changes)
    d_ff = matched_d_ff(config, target)
    best = abs(params(config, d_ff) - target)
    assert best <= abs(params(config, d_ff - 1) - target)
    assert best <= abs(params(config, d_ff + 1) - target)
    assert best / target < 0.001, name
    if not changes:
        assert d_ff == 4 * 128


def test_matched_d_ff_bad_input():
    config = row_config(COURSE, V, {})
    with pytest.raises(ValueError, match="target"):
        matched_d_ff(config, 0)
    with pytest.raises(ValueError, match="even d_ff=1"):
        matched_d_ff(config, 1000)
    with pytest.raises(ValueError, match="unknown change"):
        row_config(COURSE, V, {"dropout": 0.5})


@pytest.fixture(scope="module")
def tiny():
    text = "to be, or not to be, that is the question:\n" * 40
    corpus = ShakespeareCorpus(validation_plays=("B",), plays=[Play("A", "a", text), Play("B", "b", text)])
    recipe = LMRecipe(num_layers=1, num_heads=4, d_model=16, block_size=16, batch_size=4, num_steps=6,
                      warmup=2)
    return run_ablation(corpus, [ROWS[0], ROWS[-1]], seeds=(0, 1), recipe=recipe, val_windows=8,
                        progress=False)


def test_the_runner_reports_every_row_and_seed(tiny):
    assert [r["name"] for r in tiny["rows"]] == [ROWS[0][0], ROWS[-1][0]]
    for row in tiny["rows"]:
        assert len(row["bpc"]) == len(row["ms_per_step"]) == 2
        assert row["bpc_min"] <= row["bpc_mean"] <= row["bpc_max"]
        assert all(ms > 0 for ms in row["ms_per_step"])
    first, last = tiny["rows"]
    assert last["d_ff"] != first["d_ff"] and abs(last["params"] - first["params"]) / first["params"] < 0.01
    for key in ("seeds", "recipe", "torch", "cpu_capability", "date", "threads"):
        assert key in tiny


def test_the_files_round_trip(tiny, tmp_path):
    json_path, md_path = save_ablation(tiny, tmp_path)
    assert load_ablation(json_path) == json.loads(json.dumps(tiny))  # tuples come back as lists
    table = md_path.read_text()
    assert ablation_table(tiny) in table
    assert sum(line.startswith("|") for line in table.splitlines()) == 4  # header, rule, 2 rows
    with pytest.raises(FileNotFoundError, match="make ablation"):
        load_ablation(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="at least one row"):
        run_ablation(None, [], seeds=(0,))


def test_the_stored_results_load_and_have_every_row():
    results = load_ablation()
    assert [r["name"] for r in results["rows"]] == [name for name, _ in ROWS]
    assert len(results["seeds"]) >= 3
    target = results["rows"][0]["params"]
    for row in results["rows"]:
        assert len(row["bpc"]) == len(results["seeds"])
        assert abs(row["params"] - target) / target < 0.001
        assert 1.0 < row["bpc_mean"] < 5.0
