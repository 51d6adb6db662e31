"""The stored bases of lessons 15 and 16 (``make bases``), trained again on the float path this runs on:
the lessons load them instead of training them live, so this is where the training is repeated.

Marked ``float_path``: CI runs it on the second float path (scripts/float_paths.py), and `make
test-portability` on every path. One thread, as the stored files. On the file's own float path and
torch, training and writing (``save_base``, ``save_chat_base``: what `make bases` runs) give the
stored file bit for bit, and training leaves torch's global generator where the loader leaves it. On
any path, the held-out plays' loss lies within ``MARGIN`` of the stored model's. A few minutes on one
core (two trainings of 700 steps).

The margin, measured (seed 0, 1 thread, on an AVX-512 CPU, 2026-12-07): the held-out plays' loss of
the model trained again against the stored one's, lesson 15's base / lesson 16's base:

- ``ATEN_CPU_CAPABILITY=avx2``: 1.84799 against 1.84820 (-0.0002) / 1.78691 against 1.78734 (-0.0004);
- ``ATEN_CPU_CAPABILITY=default``: 1.84777 against 1.84820 (-0.0004) / 1.79061 against 1.78734 (+0.0033);
  the weights themselves differ by up to 0.05 / 0.20.

So ``MARGIN`` = 0.02 nats leaves six times the largest measured difference.
"""

from __future__ import annotations

import pytest
import torch

from course_lib.lm_training import evaluate_lm
from course_lib.studies.finetuning import (BASE_FILE, BASE_SHA256, load_base, load_model_file, save_base,
                                           validation_batches)
from course_lib.studies.instruct import CHAT_BASE_FILE, CHAT_BASE_SHA256, load_chat_base, plays_loss, save_chat_base
from course_lib.studies.stored import float_path

pytestmark = pytest.mark.float_path

MARGIN = 0.02  # nats per character on the held-out plays (measured: at most 0.0033)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the stored files' setting: training repeats exactly on one float path
    yield
    torch.set_num_threads(threads)


def stored_here(path, sha) -> bool:
    """Whether this process runs on the float path and torch the file was trained on."""
    _, _, meta = load_model_file(path, sha, "bases", "test")
    return meta["float_path"] == float_path() and meta["torch"] == torch.__version__


def test_lesson_15s_base_trains_again_to_the_stored_file(one_thread, tmp_path):
    path, sha = save_base(tmp_path / "base.pt")  # train_base(seed=0), written as `make bases` writes it
    after_training = torch.get_rng_state()
    stored, _ = load_base()
    if stored_here(BASE_FILE, BASE_SHA256):
        assert sha == BASE_SHA256, "train_base(seed=0) no longer gives the stored file: run `make bases`"
        assert torch.equal(torch.get_rng_state(), after_training)  # the loader draws as training does
    trained, _ = load_base(path, sha)
    val = validation_batches()["plays"]
    ours, theirs = evaluate_lm(trained, val), evaluate_lm(stored, val)
    assert abs(ours - theirs) < MARGIN, (ours, theirs)


def test_lesson_16s_base_trains_again_to_the_stored_file(one_thread, tmp_path):
    path, sha = save_chat_base(tmp_path / "chat_base.pt")  # train_chat_base(seed=0), as `make bases` writes it
    after_training = torch.get_rng_state()
    stored = load_chat_base()
    if stored_here(CHAT_BASE_FILE, CHAT_BASE_SHA256):
        assert sha == CHAT_BASE_SHA256, "train_chat_base(seed=0) no longer gives the stored file: run `make bases`"
        assert torch.equal(torch.get_rng_state(), after_training)  # the loader draws as training does
    trained = load_chat_base(path, sha)
    ours, theirs = plays_loss(trained), plays_loss(stored)
    assert abs(ours - theirs) < MARGIN, (ours, theirs)
