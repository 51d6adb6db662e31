"""VariableLengthTask (lesson 07): the held-out set, and training batches that never contain it."""

from __future__ import annotations

import collections

import pytest
import torch

from course_lib.data.variable_length import VariableLengthTask


def _rows(src: torch.Tensor, pad: int) -> list[tuple[int, ...]]:
    return [tuple(row[row != pad].tolist()) for row in src]


def test_heldout_set_is_fixed_distinct_and_of_lengths_4_to_20():
    task = VariableLengthTask()
    keys = [tuple(s.tolist()) for s in task.heldout]
    assert len(keys) == len(set(keys)) == 500
    lengths = collections.Counter(len(k) for k in keys)
    assert min(lengths) == 4 and max(lengths) == 20 and len(lengths) == 17
    assert keys == [tuple(s.tolist()) for s in VariableLengthTask().heldout]  # same seed, same set
    assert _rows(task.heldout_src, task.pad_id) == keys
    assert all(task.is_heldout(s) for s in task.heldout)


def test_training_batches_never_contain_a_heldout_sequence():
    """The lesson's run: 600 batches of 64. Without the exclusion, some draws are held out."""
    task = VariableLengthTask()
    gen = torch.Generator().manual_seed(0)
    trained, lengths = set(), collections.Counter()
    for _ in range(600):
        src, _, _ = task.train_batch(64, gen)
        rows = _rows(src, task.pad_id)
        trained.update(rows)
        lengths.update(len(r) for r in rows)
    assert not any(tuple(s.tolist()) in trained for s in task.heldout)
    assert sorted(lengths) == list(range(1, 21))  # every length is trained on ...
    assert all(30_000 / 20 * 0.8 < n < 38_400 / 20 * 1.2 for n in lengths.values())  # ... evenly
    assert len({r for r in trained if len(r) == 1}) == 10  # all ten one-symbol sequences
    raw = task._draw(64 * 600, torch.Generator().manual_seed(0), 1)  # what plain draws would give
    assert sum(task.is_heldout(s) for s in raw) > 0


def test_exclusion_holds_when_collisions_are_frequent():
    # 2 data symbols, lengths 3..6: 120 sequences, of which 40 are held out
    task = VariableLengthTask(vocab_size=5, min_len=1, max_len=6, num_heldout=40, heldout_min_len=3)
    gen = torch.Generator().manual_seed(1)
    for _ in range(200):
        src, tgt_in, tgt_out = task.train_batch(32, gen)
        assert not any(task.is_heldout(torch.tensor(r)) for r in _rows(src, task.pad_id))
        assert ((tgt_out == task.eos_id).sum(dim=1) == 1).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match="more than half"):
        VariableLengthTask(vocab_size=5, max_len=3, num_heldout=10, heldout_min_len=3)
    with pytest.raises(ValueError, match="heldout_min_len"):
        VariableLengthTask(heldout_min_len=21)
    with pytest.raises(ValueError, match="num_heldout"):
        VariableLengthTask(num_heldout=0)
    with pytest.raises(ValueError, match="batch_size"):
        VariableLengthTask().train_batch(0, torch.Generator())
