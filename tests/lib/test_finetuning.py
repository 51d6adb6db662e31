"""Lesson 15's fine-tuning study (course_lib.studies.finetuning) and the poems' split
(course_lib.data.shakespeare): each mode trains exactly the parameters it names and nothing else
moves, LoRA starts where the base is, the poems split by poem, and the stored results are checked
when loaded. Tiny models and a few steps: the real study is `make finetuning`."""

from __future__ import annotations

import json

import pytest
import torch

from course_lib.data.shakespeare import VALIDATION_POEMS, poems_split, read_poems, roman
from course_lib.gpt import GPT, GPTConfig
from course_lib.lm_training import evaluate_lm
from course_lib.studies.finetuning import (FORMAT_VERSION, MODES, corpora, finetune, load_finetuning_results,
                                           run_finetuning_study, save_finetuning_results)

SMALL = dict(val_windows=8, batch_size=4, block_size=16)


@pytest.fixture(scope="module")
def base() -> GPT:
    """A 2-layer GPT on the plays' characters (untrained: the tests count parameters, not quality)."""
    plays, _ = corpora()
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=len(plays.vocab), max_len=16, d_model=16, num_heads=2, num_layers=2, d_ff=32)
    return GPT(config).eval()


def expected(name: str, mode: str) -> bool:
    """Whether ``mode`` trains the parameter called ``name`` (written from the modes' definitions)."""
    return {"full": True,
            "head": name == "embed.token.embedding.weight",  # lm_head.weight, tied to it
            "last_block": name.startswith("blocks.layers.1."),
            "bitfit": name.endswith(".bias") or "norm" in name.rsplit(".", 1)[0].rsplit(".", 1)[-1],
            "lora": ".lora_A." in name or ".lora_B." in name}[mode]


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_trains_exactly_its_parameters(base, mode):
    before = {n: p.detach().clone() for n, p in base.named_parameters()}
    run = finetune(base, mode, steps=3, eval_every=0, **SMALL)
    trained = {n for n, _ in run.model.named_parameters() if expected(n, mode)}
    assert trained, mode
    assert run.trainable == sum(p.numel() for n, p in run.model.named_parameters() if n in trained)
    assert {n for n, p in run.model.named_parameters() if p.requires_grad} == trained
    for name, p in run.model.named_parameters():
        original = before.get(name.replace(".base_layer", ""))
        if name in trained:
            assert original is None or not torch.equal(p, original), f"{mode}: {name} did not move"
        else:
            assert torch.equal(p, original), f"{mode}: {name} is frozen but moved"
    for name, p in base.named_parameters():  # the base itself is untouched
        assert torch.equal(p, before[name])
    assert run.optimizer_bytes == 2 * 4 * run.trainable + 4 * len(trained)  # exp_avg, exp_avg_sq, step
    assert run.steps == [0, 3] and len(run.poems_val) == len(run.plays_val) == 2


def test_lora_at_step_0_is_the_base(base):
    lora = finetune(base, "lora", steps=2, r=2, eval_every=1, **SMALL)
    full = finetune(base, "full", steps=2, eval_every=1, **SMALL)
    assert lora.steps == full.steps == [0, 1, 2]
    assert lora.poems_val[0] == full.poems_val[0] and lora.plays_val[0] == full.plays_val[0]
    _, poems = corpora()
    own = evaluate_lm(base, poems.fixed_batches("val", 8, 16))
    assert lora.poems_val[0] == pytest.approx(own, abs=1e-5)  # fused attention against readable
    assert lora.poems_val[1] != lora.poems_val[0]  # and it trains
    assert lora.alpha == 4.0 and lora.r == 2 and lora.total == sum(p.numel() for p in base.parameters())


def test_finetune_refuses_bad_input(base):
    with pytest.raises(ValueError, match="mode must be one of"):
        finetune(base, "lora2", steps=1, **SMALL)
    with pytest.raises(ValueError, match="steps"):
        finetune(base, "full", steps=0, **SMALL)
    with pytest.raises(ValueError, match="lr"):
        finetune(base, "full", steps=1, lr=-1.0, **SMALL)
    with pytest.raises(TypeError, match="GPT"):
        finetune(torch.nn.Linear(2, 2), "full", steps=1, **SMALL)


def test_the_poems_split_by_poem():
    poems = read_poems()
    assert len(poems) == 158 and {f"Sonnet {n}" for n in (1, 18, 154)} <= {p.title for p in poems}
    train, val = poems_split()
    held = [p for p in poems if p.title in VALIDATION_POEMS]
    assert len(held) == len(VALIDATION_POEMS) == 16
    for poem in held:
        assert poem.text in val and poem.text not in train
        first_line = poem.text.strip().splitlines()[0].strip()
        assert first_line not in train, poem.title  # not even a line of it
    assert 0.10 < len(val) / (len(train) + len(val)) < 0.13
    assert "*" not in train + val
    _, corpus = corpora()
    assert (corpus.train_text, corpus.val_text) == (train, val)
    assert roman("CXXVIII") == 128 and roman("XLIX") == 49
    with pytest.raises(ValueError, match="Roman numeral"):
        roman("12")


def test_results_round_trip_and_are_checked(base, tmp_path):
    study = run_finetuning_study(seeds=(0,), steps=2, ranks=(1, 4), base=base, progress=False, **SMALL)
    assert [r["mode"] for r in study["modes"]] == list(MODES) and len(study["full"]) == 1
    assert [(r["r"], r["scaling_rule"]) for r in study["ranks"]] == [
        (1, "alpha=2r"), (1, "alpha=8"), (1, "rslora"), (4, "all")]
    lora = next(r for r in study["modes"] if r["mode"] == "lora")
    assert study["ranks"][-1]["poems_val"][-1] == lora["poems_val"][-1]  # r = 4: the same training
    assert study["ranks"][-1]["steps"] == [0, 2] and lora["steps"] == [0, 2]
    path = save_finetuning_results({"ranks": study["ranks"][2:]}, tmp_path)  # by parts, merged
    save_finetuning_results({"ranks": study["ranks"][:2]}, tmp_path)
    with pytest.raises(ValueError, match="lacks"):
        load_finetuning_results(tmp_path)  # no modes yet
    save_finetuning_results({k: study[k] for k in ("modes", "full")}, tmp_path)
    loaded = load_finetuning_results(tmp_path)
    assert next(iter(loaded["paths"].values()))["ranks"] == json.loads(json.dumps(study["ranks"]))
    entry = next(iter(loaded["paths"].values()))
    assert loaded["version"] == FORMAT_VERSION and entry["torch"] == torch.__version__
    assert entry["modes"] == json.loads(json.dumps(study["modes"]))
    with pytest.raises(FileNotFoundError, match="make finetuning"):
        load_finetuning_results(tmp_path / "nowhere")
    for broken in ({"version": 0, "paths": loaded["paths"]}, {"version": FORMAT_VERSION, "paths": {}},
                   {"version": FORMAT_VERSION, "paths": {"avx2": {"torch": "2.13.0"}}},
                   {"version": FORMAT_VERSION, "paths": {"avx2": dict(entry, torch=None)}}):
        path.write_text(json.dumps(broken))
        with pytest.raises(ValueError, match="make finetuning"):
            load_finetuning_results(tmp_path)
    entry["ranks"][0].pop("poems_val")
    path.write_text(json.dumps(loaded))
    with pytest.raises(ValueError, match="malformed"):
        load_finetuning_results(tmp_path)


def test_the_stored_results_load():
    results = load_finetuning_results()
    for entry in results["paths"].values():
        assert sorted({r["seed"] for r in entry["modes"]}) == [0, 1, 2]
        assert {r["mode"] for r in entry["modes"]} == set(MODES)
        assert {r["r"] for r in entry["ranks"]} == {1, 2, 4, 8, 16, 32}
