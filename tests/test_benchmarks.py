"""The benchmarks' building blocks still run against course_lib (timings themselves are not tested:
they belong to `make benchmark`, on a quiet machine). A change of course_lib's API, such as the
source mask becoming a required argument of ``Transformer.decode``, fails here instead of in the
next benchmark run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from course_lib import Transformer, TransformerConfig

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


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
    from course_lib.tasks import ShakespeareCorpus

    gpt = load("gpt")
    corpus = ShakespeareCorpus()
    recipe = replace(NANOGPT_CPU, num_layers=1, num_steps=4, warmup=1)
    run = gpt.run_recipe(corpus, recipe, eval_every=2)
    assert [s for s, _, _ in run.curve] == [0, 2, 4]
    assert "1 layer, d_model 128" in gpt.describe("tiny", recipe, run)
