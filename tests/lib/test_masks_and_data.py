"""Masks (True = may attend), the copy task, Vocab and pad_sequences."""

import torch
from _helpers import seeded  # noqa: F401  (autouse fixture)

from course_lib import CopyTask, Vocab, causal_mask, decoder_self_attention_mask, pad_sequences, padding_mask
from course_lib.data.copy_task import EOS, PAD, SOS, UNK

# --------------------------------------------------------------------------------------------
# Masks
# --------------------------------------------------------------------------------------------


def test_padding_mask_shape_and_values():
    ids = torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0], [1, 2, 3, 4]])
    mask = padding_mask(ids, pad_id=0)
    assert mask.shape == (3, 1, 4) and mask.dtype == torch.bool
    expected = torch.tensor([[True, True, False, False], [True, False, False, False], [True] * 4])
    assert torch.equal(mask[:, 0], expected)
    assert torch.equal(padding_mask(ids, pad_id=5)[0, 0], torch.tensor([False, True, True, True]))


def test_causal_mask_is_lower_triangular_with_diagonal():
    mask = causal_mask(4)
    assert mask.shape == (4, 4) and mask.dtype == torch.bool
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(mask, expected)
    for t in range(4):  # position t sees 0..t
        assert mask[t].nonzero().flatten().tolist() == list(range(t + 1))


def test_causal_mask_device_argument():
    assert causal_mask(3, device="meta").device.type == "meta"


def test_decoder_self_attention_mask_is_padding_and_causal():
    tgt = torch.tensor([[1, 5, 6, 0], [1, 7, 0, 0]])
    mask = decoder_self_attention_mask(tgt, pad_id=0)
    assert mask.shape == (2, 4, 4) and mask.dtype == torch.bool
    for b in range(2):
        for t in range(4):
            for s in range(4):
                assert mask[b, t, s] == (s <= t and tgt[b, s] != 0)


# --------------------------------------------------------------------------------------------
# Copy task
# --------------------------------------------------------------------------------------------


def test_copy_task_special_ids_differ_and_data_avoids_them():
    task = CopyTask()
    assert task.sos_id != task.pad_id
    assert task.heldout.min() >= 2 and task.heldout.max() <= task.vocab_size - 1
    batch = task.train_batch(32, torch.Generator().manual_seed(0))
    assert batch.src.min() >= 2  # no pad or sos inside the data


def test_copy_task_batch_is_shifted_right_once():
    task = CopyTask(vocab_size=11, seq_len=6)
    batch = task.train_batch(16, torch.Generator().manual_seed(3))
    assert batch.src.shape == batch.tgt_in.shape == batch.tgt_out.shape == (16, 6)
    assert (batch.tgt_in[:, 0] == task.sos_id).all()
    assert torch.equal(batch.tgt_in[:, 1:], batch.src[:, :-1])
    assert torch.equal(batch.tgt_out, batch.src)
    assert batch.tgt_out.data_ptr() != batch.src.data_ptr()  # a copy, not a view


def test_copy_task_training_batches_never_contain_heldout_rows():
    task = CopyTask(vocab_size=4, seq_len=3, num_heldout=12)  # only 8 possible sequences: collisions certain
    assert task.heldout.size(0) == len({tuple(r.tolist()) for r in task.heldout})  # unique rows
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        batch = task.train_batch(16, gen)
        assert not any(task.is_heldout(row) for row in batch.src)
    assert task.is_heldout(task.heldout[0])


def test_copy_task_heldout_is_reproducible():
    assert torch.equal(CopyTask(seed=7).heldout, CopyTask(seed=7).heldout)
    assert not torch.equal(CopyTask(seed=7).heldout, CopyTask(seed=8).heldout)
    assert CopyTask().heldout.shape[1] == 10


# --------------------------------------------------------------------------------------------
# Vocab and padding
# --------------------------------------------------------------------------------------------

SENTENCES = ["The cat sat", "the dog sat down"]


def test_vocab_specials_come_first():
    vocab = Vocab.build(SENTENCES)
    assert vocab.itos[:4] == [PAD, SOS, EOS, UNK]
    assert (vocab.pad_id, vocab.sos_id, vocab.eos_id) == (0, 1, 2)
    assert len(vocab) == 4 + len({"the", "cat", "sat", "dog", "down"})


def test_vocab_round_trip_with_specials_and_unknown_words():
    vocab = Vocab.build(SENTENCES)
    ids = vocab.encode("the dog sat")
    assert ids[0] == vocab.sos_id and ids[-1] == vocab.eos_id and len(ids) == 5
    assert vocab.decode(ids) == "the dog sat"
    unknown = vocab.encode("The zebra sat", add_special=False)
    assert unknown[1] == vocab.stoi[UNK]
    assert vocab.decode(unknown) == "the sat"  # <unk> is a special: dropped
    assert vocab.decode(unknown, skip_special=False) == "the <unk> sat"
    assert vocab.decode([vocab.sos_id, vocab.stoi["cat"], vocab.eos_id, vocab.stoi["dog"]]) == "cat"


def test_vocab_encode_batch_pads_with_pad_id():
    vocab = Vocab.build(SENTENCES)
    batch = vocab.encode_batch(["the cat", "the dog sat down"])
    assert batch.shape == (2, 6) and batch.dtype == torch.long
    assert batch[0].tolist()[-2:] == [vocab.pad_id, vocab.pad_id]
    assert vocab.decode(batch[0]) == "the cat"


def test_pad_sequences():
    out = pad_sequences([[3, 4, 5], [6], []], pad_id=0)
    assert torch.equal(out, torch.tensor([[3, 4, 5], [6, 0, 0], [0, 0, 0]]))
    assert pad_sequences([[3]], pad_id=9, length=3).tolist() == [[3, 9, 9]]
