"""Lesson 11's stored RoPE runs (``make length-rope``), trained again on the float path this runs on:
the lesson loads them instead of training live, so this is where the run is repeated.

Marked ``float_path``: CI runs it on the second float path (scripts/float_paths.py), and `make
test-portability` on every path. One thread, as the stored runs: where this path and this torch
are stored, the run must equal the stored one to the last digit; on any path, it must show what the
lesson asserts.
"""

from __future__ import annotations

import pytest
import torch

from course_lib.studies.extrapolation import TRAIN_MAX_LEN, load_rope_lengths, run_rope_lengths
from course_lib.studies.stored import float_path

pytestmark = pytest.mark.float_path


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the stored runs' setting: a run repeats exactly on one float path
    yield
    torch.set_num_threads(threads)


def test_the_rope_run_of_seed_0_repeats_on_this_float_path(one_thread):
    (run,) = run_rope_lengths(seeds=[0])
    match = run["exact_match"]  # lengths 1..40
    assert min(match[:TRAIN_MAX_LEN]) >= 0.8 and max(match[TRAIN_MAX_LEN + 2:]) <= 0.02, match
    stored = load_rope_lengths()["paths"].get(float_path())
    if stored is not None and stored["torch"] == torch.__version__:
        assert run == stored["runs"][0], "the stored run no longer repeats: run `make length-rope`"
