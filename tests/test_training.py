"""Loss, learning-rate schedule, training loop, greedy decoding and the copy task end to end."""

import pytest
import torch
import torch.nn.functional as F
from _helpers import seeded  # noqa: F401  (autouse fixture)

from course_lib import CopyTask, Transformer, TransformerConfig, greedy_decode
from course_lib.training import LabelSmoothingLoss, exact_match, noam_lr, noam_scheduler, train, train_copy_task

V, PAD = 7, 0

# --------------------------------------------------------------------------------------------
# LabelSmoothingLoss
# --------------------------------------------------------------------------------------------


def _logits_labels():
    logits = torch.randn(3, 5, V)
    labels = torch.tensor([[2, 3, 4, 0, 0], [5, 6, 1, 2, 0], [3, 3, 3, 3, 3]])
    return logits, labels


def test_label_smoothing_zero_equals_cross_entropy_ignoring_pad():
    logits, labels = _logits_labels()
    loss = LabelSmoothingLoss(V, PAD, smoothing=0.0)(logits, labels)
    expected = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=PAD)
    torch.testing.assert_close(loss, expected)


def test_label_smoothing_ignores_logits_at_pad_positions():
    logits, labels = _logits_labels()
    loss_fn = LabelSmoothingLoss(V, PAD, smoothing=0.1)
    changed = logits.clone()
    changed[labels == PAD] = torch.randn(int((labels == PAD).sum()), V) * 10
    torch.testing.assert_close(loss_fn(changed, labels), loss_fn(logits, labels))
    changed[0, 0, 4] += 5.0  # a real position does count (so the test can fail)
    assert not torch.allclose(loss_fn(changed, labels), loss_fn(logits, labels))


def test_label_smoothing_target_distribution():
    loss_fn = LabelSmoothingLoss(V, PAD, smoothing=0.2)
    labels = torch.tensor([3, 0, 6])
    dist = loss_fn.target_distribution(labels)
    assert dist.shape == (3, V)
    torch.testing.assert_close(dist.sum(dim=1), torch.tensor([1.0, 0.0, 1.0]))
    assert (dist[:, PAD] == 0).all() and (dist[1] == 0).all()
    assert dist[0, 3] == pytest.approx(0.8) and dist[0, 2] == pytest.approx(0.2 / (V - 2))


def test_label_smoothing_value_matches_formula():
    logits, labels = _logits_labels()
    s = 0.1
    log_p = logits.log_softmax(-1)
    total, count = 0.0, 0
    for b in range(3):
        for t in range(5):
            y = int(labels[b, t])
            if y == PAD:
                continue
            count += 1
            for c in range(V):
                q = 1 - s if c == y else (0.0 if c == PAD else s / (V - 2))
                total -= q * float(log_p[b, t, c])
    got = LabelSmoothingLoss(V, PAD, s)(logits, labels)
    assert float(got) == pytest.approx(total / count, abs=1e-5)


def test_label_smoothing_flattened_input():
    logits, labels = _logits_labels()
    loss_fn = LabelSmoothingLoss(V, PAD)
    torch.testing.assert_close(loss_fn(logits.reshape(-1, V), labels.reshape(-1)), loss_fn(logits, labels))


# --------------------------------------------------------------------------------------------
# Learning-rate schedule
# --------------------------------------------------------------------------------------------


def test_noam_lr_formula_and_step_zero():
    assert noam_lr(0, 512, 4000) == noam_lr(1, 512, 4000) > 0  # no division by zero at step 0
    for step in (1, 10, 3999, 4000, 4001, 10000, 100000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert noam_lr(step, 512, 4000) == pytest.approx(expected, rel=1e-12)
    assert noam_lr(100, 64, 10, factor=2.0) == pytest.approx(2 * noam_lr(100, 64, 10))


def test_noam_lr_peaks_at_warmup():
    lrs = [noam_lr(s, 512, 4000) for s in range(1, 20001)]
    assert max(range(len(lrs)), key=lrs.__getitem__) + 1 == 4000
    assert lrs[3999] == pytest.approx(512**-0.5 * 4000**-0.5)
    assert all(a < b for a, b in zip(lrs[:3999], lrs[1:4000]))  # rising during warm-up
    assert all(a > b for a, b in zip(lrs[4000:-1], lrs[4001:]))  # then decaying


def test_noam_scheduler_sets_optimizer_lr():
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.Adam([param], lr=1.0)
    scheduler = noam_scheduler(optimizer, d_model=64, warmup=10)
    for step in range(25):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(noam_lr(step, 64, 10))
        optimizer.step()
        scheduler.step()


# --------------------------------------------------------------------------------------------
# Training loop and decoding
# --------------------------------------------------------------------------------------------

TINY = TransformerConfig(src_vocab_size=6, tgt_vocab_size=6, d_model=32, num_heads=2, d_ff=64,
                         num_encoder_layers=1, num_decoder_layers=1, max_len=16)


def test_train_returns_float_losses_and_the_loss_decreases():
    task = CopyTask(vocab_size=6, seq_len=4, num_heldout=10)
    model = Transformer(TINY)
    gen = torch.Generator().manual_seed(0)

    def next_batch(step):
        b = task.train_batch(32, gen)
        return b.src, b.tgt_in, b.tgt_out

    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    history = train(model, next_batch, 60, optimizer, LabelSmoothingLoss(6, 0, 0.0), progress=False)
    assert len(history) == 60 and all(type(x) is float for x in history)
    assert sum(history[-10:]) / 10 < 0.7 * sum(history[:10]) / 10
    assert not model.training  # train() hands back the model in eval mode


def test_greedy_decode_equals_argmax_step_by_step():
    model = Transformer(TransformerConfig()).eval()
    src = torch.randint(2, 11, (3, 6))
    out = greedy_decode(model, src, max_len=5, start_id=1)
    assert out.shape == (3, 5) and out.dtype == torch.long
    ys = torch.full((3, 1), 1)
    with torch.no_grad():
        for _ in range(5):
            next_id = model(src, ys)[:, -1].argmax(-1)  # full forward pass, last position
            ys = torch.cat([ys, next_id[:, None]], dim=1)
    assert torch.equal(out, ys[:, 1:])


def test_greedy_decode_pads_after_end_symbol():
    model = Transformer(TransformerConfig()).eval()
    src = torch.randint(2, 11, (4, 6))
    free = greedy_decode(model, src, max_len=6, start_id=1)
    end = int(free[0, 0])  # pretend the first produced token of row 0 is the end symbol
    out = greedy_decode(model, src, max_len=6, start_id=1, end_id=end)
    assert (out[0] == end).all()
    for b in range(4):
        hits = (free[b] == end).nonzero()
        stop = int(hits[0]) if len(hits) else 6
        assert torch.equal(out[b, : stop + 1], free[b, : stop + 1])
        assert (out[b, stop:] == end).all()


def test_exact_match_of_an_untrained_model_is_low():
    model = Transformer(TransformerConfig())
    assert exact_match(model, CopyTask(num_heldout=50)) < 0.2


def test_copy_task_trained_with_defaults_is_solved():
    """The issue's end-to-end check: course_lib's defaults copy every held-out sequence exactly."""
    model, history = train_copy_task(progress=False)
    assert len(history) > 0 and history[-1] < history[0]
    assert exact_match(model, CopyTask()) == 1.0
