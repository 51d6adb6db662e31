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
