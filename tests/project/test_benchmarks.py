"""The benchmarks' building blocks still run against course_lib (timings themselves are not tested:
they belong to `make benchmark`, on a quiet machine). A change of course_lib's API, such as the
source mask becoming a required argument of ``Transformer.decode``, fails here instead of in the
next benchmark run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from course_lib import Transformer, TransformerConfig

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kv_cache_benchmark_steps_run_with_and_without_the_cache():
    kv = load("kv_cache")
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(src_vocab_size=20, tgt_vocab_size=20)).eval()
    for use_cache in (False, True):
        assert kv.step_ms(model, batch=2, prefix=4, use_cache=use_cache, repeats=1) > 0
        assert kv.decode_seconds(model, batch=2, new_tokens=3, use_cache=use_cache) > 0
    assert kv.estimated_recompute_seconds(model, batch=2, new_tokens=8) > 0


def test_gpt_benchmark_runs_both_recipes_on_a_tiny_budget():
    from dataclasses import replace

    from course_lib.lm_training import NANOGPT_CPU
    from course_lib.data.shakespeare import ShakespeareCorpus

    gpt = load("gpt")
    corpus = ShakespeareCorpus()
    recipe = replace(NANOGPT_CPU, num_layers=1, num_steps=4, warmup=1)
    run = gpt.run_recipe(corpus, recipe, eval_every=2)
    assert [s for s, _, _ in run.curve] == [0, 2, 4]
    assert "1 layer, d_model 128" in gpt.describe("tiny", recipe, run)


def test_modern_benchmark_cache_bytes_equal_the_formula_and_attention_paths_agree():
    modern = load("modern")
    prompt = torch.randint(0, 20, (3, 4))
    sizes = dict(num_layers=2, d_model=32, num_heads=4, vocab_size=20, max_len=16)
    measured = {}
    for kv in (4, 2, 1):  # MHA, GQA 2:1, MQA
        model = modern.build(kv, fused=True, **sizes)
        measured[kv] = modern.check_cache(model, prompt, new_tokens=5)  # asserts generate's tokens
        # 2 (k, v) * 2 layers * kv heads * head_dim 8 * (4 + 5 - 1) positions * batch 3 * 4 bytes
        assert measured[kv] == 2 * 2 * kv * 8 * 8 * 3 * 4
        readable = modern.build(kv, fused=False, **sizes)
        assert torch.equal(modern.decode_with_cache(readable, prompt, 5)[0],
                           model.generate(prompt, 5, greedy=True))
    assert measured[4] == 2 * measured[2] == 4 * measured[1]
    times, ids = modern.decode_seconds({"MHA": model}, prompt, new_tokens=3, rounds=1)
    assert len(times["MHA"]) == 1 and ids["MHA"].shape == (3, 7)
    calls, x = modern.attention_callables(batch=2, length=6, d_model=16, num_heads=4,
                                          num_kv_heads=2)
    ms = modern.attention_ms(calls, x, rounds=1, repeats=1)  # asserts the three outputs are equal
    assert set(ms) == {"course_lib fused", "PyTorch", "course_lib readable"}


def test_flash_benchmark_measures_in_a_fresh_process_and_the_pages_save():
    flash = load("flash")
    measure = flash._measurements()
    run = measure.run_fresh("tiled", 512)  # a new process: its peak is its own
    assert run["version"] == "tiled" and run["L"] == 512 and run["peak_bytes"] >= 0
    assert run["forward_s"] > 0 and run["backward_s"] > 0
    reserved, held, written = flash.paged_saving([6, 40, 13], block_size=8)  # asserts the tokens
    assert written < held < reserved
    assert held == (1 + 5 + 2) * 2 * 2 * 2 * 16 * 8 * 4  # blocks of 8: 1 + 5 + 2 of them


def test_lora_benchmark_reports_full_and_lora_fine_tuning_on_a_tiny_budget():
    import re

    from course_lib.gpt import GPT, GPTConfig
    from course_lib.studies.finetuning import corpora, finetune

    lora_benchmark = load("lora")
    plays, _ = corpora()
    torch.manual_seed(0)
    base = GPT(GPTConfig(vocab_size=len(plays.vocab), max_len=16, d_model=16, num_heads=2, num_layers=1,
                         d_ff=32)).eval()
    small = dict(eval_every=0, val_windows=8, batch_size=4, block_size=16)
    full = finetune(base, "full", 2, **small)
    lora = finetune(base, "lora", 2, r=2, alpha=4, **small)
    assert "16 held out" in lora_benchmark.describe_data()
    assert lora_benchmark.describe_run(lora).startswith("lora: lr 0.01, ")
    line = lora_benchmark.benchmark_line(full, lora)
    assert re.fullmatch(r"lora: r=2 trains \d+\.\d% of the parameters; poems loss \d\.\d\d vs full fine-tuning "
                        r"\d\.\d\d after 2 steps; optimizer state \d+\.\d× smaller; step time \d+\.\d\d× full",
                        line), line
