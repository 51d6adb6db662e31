"""Loss, learning-rate schedule, training loop, greedy decoding and the copy task end to end."""

import math

import pytest
import torch
import torch.nn.functional as F
from _helpers import seeded  # noqa: F401  (autouse fixture)

from course_lib import CopyTask, Transformer, TransformerConfig, greedy_decode
from course_lib.training import (
    ExactMatchTracker,
    LabelSmoothingLoss,
    cooldown_factor,
    copy_task_config,
    exact_match,
    noam_lr,
    noam_scheduler,
    train,
    train_copy_task,
)

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


def test_label_smoothing_entropy_floor_is_the_lowest_loss():
    loss_fn = LabelSmoothingLoss(11, PAD, smoothing=0.1)
    expected = -(0.9 * math.log(0.9) + 9 * (0.1 / 9) * math.log(0.1 / 9))
    assert loss_fn.entropy_floor() == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(0.5448, abs=1e-4)
    labels = torch.arange(1, 11)
    best = torch.log(loss_fn.target_distribution(labels).clamp_min(1e-30))  # softmax = target
    assert float(loss_fn(best, labels)) == pytest.approx(expected, abs=1e-5)
    assert float(loss_fn(best + torch.randn_like(best), labels)) > expected
    assert LabelSmoothingLoss(11, PAD, smoothing=0.0).entropy_floor() == 0.0


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


def test_cooldown_factor():
    assert [cooldown_factor(s, 10, 4) for s in (0, 5, 6, 7, 8, 9, 10, 12)] == [1, 1, 1, 0.75, 0.5, 0.25, 0, 0]
    assert cooldown_factor(3, 10, 0) == 1.0
    with pytest.raises(ValueError, match="cooldown must be in"):
        cooldown_factor(0, 10, 11)


def test_noam_scheduler_with_cooldown_ends_at_zero():
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.Adam([param], lr=1.0)
    scheduler = noam_scheduler(optimizer, d_model=64, warmup=10, num_steps=40, cooldown=20)
    for step in range(41):
        expected = noam_lr(step, 64, 10) * min(1.0, (40 - step) / 20)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected)
        optimizer.step()
        scheduler.step()
    with pytest.raises(ValueError, match="needs num_steps"):
        noam_scheduler(optimizer, d_model=64, warmup=10, cooldown=20)


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


def test_train_calls_the_callback_in_training_mode_and_prints_progress_to_stdout(capsys):
    task = CopyTask(vocab_size=6, seq_len=4, num_heldout=10)
    model = Transformer(TINY)
    gen = torch.Generator().manual_seed(0)
    seen = []

    def next_batch(step):
        assert model.training  # the callback's evaluation must not leave the model in eval mode
        b = task.train_batch(8, gen)
        return b.src, b.tgt_in, b.tgt_out

    def callback(step, m):
        seen.append(step)
        m.eval()

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train(model, next_batch, 20, optimizer, LabelSmoothingLoss(6, 0, 0.0), callback=callback)
    assert seen == list(range(1, 21))
    out = capsys.readouterr()
    assert "training: 100%" in out.out and "20/20 steps" in out.out and out.err == ""
    assert "it/s" not in out.out and "<" not in out.out  # no times: the stored text is deterministic


def test_exact_match_by_teacher_forcing_equals_greedy_on_a_half_trained_model():
    task = CopyTask()
    model, _ = train_copy_task(task=task, num_steps=100, cooldown=0, progress=False)
    greedy = exact_match(model, task)
    assert 0.0 < greedy < 1.0  # a case where the two could disagree
    assert exact_match(model, task, method="teacher_forcing") == greedy
    with pytest.raises(ValueError, match="method must be"):
        exact_match(model, task, method="beam")


def test_exact_match_tracker_records_every_n_steps(monkeypatch):
    import course_lib.training as training

    values = iter([0.1, 1.0, 0.99, 1.0])
    monkeypatch.setattr(training, "exact_match", lambda model, task, method: next(values))
    tracker = ExactMatchTracker(CopyTask(num_heldout=10), every=25)
    for step in range(1, 101):
        tracker(step, None)
    assert tracker.steps == [25, 50, 75, 100] and tracker.scores == [0.1, 1.0, 0.99, 1.0]
    assert tracker.first_perfect() == 50 and not tracker.stayed_perfect()  # 99% at step 75
    tracker.scores[2] = 1.0
    assert tracker.stayed_perfect()
    tracker.scores = [0.1, 1.0, 0.995, 1.0, 1.0]
    tracker.steps = [25, 50, 75, 100, 125]
    assert not tracker.stayed_perfect() and tracker.settled(last=2) and not tracker.settled(last=4)
    assert not tracker.settled(floor=0.999, last=2)
    tracker.scores = [0.1, 0.5, 0.9, 0.99, 0.999]
    assert not tracker.settled(floor=0.0, last=1)  # never 100%
    with pytest.raises(ValueError, match="every must be"):
        ExactMatchTracker(CopyTask(num_heldout=10), every=0)


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


@pytest.mark.parametrize("seed", range(10))
def test_copy_task_recipe_reaches_100_percent_and_keeps_it(seed):
    """Issues 7, 9 and 14: course_lib's defaults copy every held-out sequence exactly, stay at 99%
    or more at every later evaluation (every 25 steps), are at 100% over the last 100 steps, and
    run >= 1.5x the steps they needed, for seeds 0-9. `make test-portability` runs this on every
    float path, with 1 and 2 threads. (100% at every later evaluation held on the paths of an AVX2
    CPU; with AVX2 kernels on an AVX-512 CPU and 2 threads, seed 9 let 1, then 4 of 1,000 slip.)"""
    task = CopyTask()
    tracker = ExactMatchTracker(task, every=25)
    model, history = train_copy_task(task=task, seed=seed, progress=False, callback=tracker)
    assert model.config == copy_task_config() and not model.training
    first = tracker.first_perfect()
    assert first is not None, f"seed {seed}: never 100%: {tracker.scores}"
    assert tracker.settled(), f"seed {seed}: fell back after step {first}: {tracker.scores}"
    assert tracker.steps[-1] == len(history) and len(history) >= 1.5 * first
    assert exact_match(model, task) == 1.0  # greedy decoding, token by token
    assert model.decoder.layers[0].cross_attn.fused is False  # weights are stored again after training
