"""Tests for the lesson-06 checkers: a correct answer passes, each named mistake is caught with its own
words, and an exercise that is not done yet prints one friendly line.

The wrong answers below are written the way a learner would write them, independently of the variants
the checker builds, so these tests show that the checker recognises real code.
"""

from __future__ import annotations

import math

import pytest
from _helpers import passes
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.checks import (
    check_greedy_decode, check_label_smoothing, check_shift, check_smoothing_floor, check_train_step,
)
from course_lib.masks import padding_mask


# ----------------------------------------------------------------------------------------------
# label smoothing
# ----------------------------------------------------------------------------------------------

def make_loss(divisor=lambda V: V - 2, zero_pad_class=True, ignore_pad=True, mean_over="non-pad",
              log_fn=lambda x: F.log_softmax(x, dim=-1), cross_entropy_style=False, transpose=False,
              label="1 - eps", pad_fixed=None):
    """A learner's label-smoothing loss with the given choices."""

    def loss(logits, labels, pad_id, smoothing):
        if pad_fixed is not None:
            pad_id = pad_fixed  # hard-coded
        V = logits.size(-1)
        if transpose and logits.dim() == 3:
            logits = logits.transpose(0, 1)
        logp = log_fn(logits).reshape(-1, V)
        labels = labels.reshape(-1)
        if cross_entropy_style:
            target = torch.full_like(logp, smoothing / V) + (1 - smoothing) * F.one_hot(labels, V)
        else:
            target = torch.full_like(logp, smoothing / divisor(V))
            if label == "added":
                target[torch.arange(labels.numel()), labels] += 1 - smoothing
            else:
                target[torch.arange(labels.numel()), labels] = 1.0 if label == 1.0 else 1 - smoothing
        if zero_pad_class:
            target[:, pad_id] = 0
        if ignore_pad:
            target[labels == pad_id] = 0
        total = -(target * logp).sum()
        if mean_over == "non-pad":
            return total / (labels != pad_id).sum()
        if mean_over == "all":
            return total / labels.numel()
        if mean_over == "classes too":
            return total / V / (labels != pad_id).sum()
        return total

    return loss


def test_label_smoothing_correct_function_passes(capsys):
    assert passes(check_label_smoothing, make_loss())
    assert "check_label_smoothing: all 4 cases match" in capsys.readouterr().out


def test_label_smoothing_says_when_course_lib_is_handed_in():
    from course_lib.training import LabelSmoothingLoss

    class Mine(LabelSmoothingLoss):
        pass

    def wrapper(logits, labels, pad_id, smoothing):
        return LabelSmoothingLoss(logits.size(-1), pad_id, smoothing)(logits, labels)

    for handed_in in (LabelSmoothingLoss, Mine, wrapper):
        with pytest.raises(AssertionError, match=r"You handed in course_lib's `LabelSmoothingLoss`"):
            check_label_smoothing(handed_in)


def test_label_smoothing_accepts_a_learner_class(capsys):
    class MyLoss(nn.Module):
        def __init__(self, vocab_size, pad_id, smoothing):
            super().__init__()
            self.pad_id, self.smoothing = pad_id, smoothing
            self.fn = make_loss()

        def forward(self, logits, labels):
            return self.fn(logits, labels, self.pad_id, self.smoothing)

    assert passes(check_label_smoothing, MyLoss)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (make_loss(ignore_pad=False), "pad positions not ignored"),
        (make_loss(mean_over="all"), "averaged over ALL positions"),
        (make_loss(zero_pad_class=False), "smoothing mass put on the pad class"),
        (make_loss(cross_entropy_style=True, zero_pad_class=False), r"eps/V instead of eps/\(V-2\).*nn.CrossEntropyLoss"),
        (make_loss(divisor=lambda V: V), r"eps/V instead of eps/\(V-2\)"),
        (make_loss(mean_over="sum"), "summed instead of averaged"),
        (make_loss(log_fn=lambda x: x.softmax(-1)), "no log_softmax: you used probabilities"),
        (make_loss(log_fn=lambda x: x), "no log_softmax: you used the raw logits"),
        (make_loss(log_fn=lambda x: F.log_softmax(x, dim=1)), "wrong shape handling: log_softmax over the wrong axis"),
        (make_loss(transpose=True), "wrong shape handling: logits and labels flattened in different orders"),
        (make_loss(zero_pad_class=False, ignore_pad=False),
         "pad not zeroed: neither the pad column nor the pad-label rows"),
        (make_loss(label=1.0), r"the label keeps 1 instead of 1 - eps"),
        (make_loss(label="added"), r"the label gets 1 - eps on top of its share"),
        (make_loss(mean_over="classes too"), "averaged over the classes too"),
        (make_loss(pad_fixed=0), r"pad id hard-coded as 0"),
    ],
)
def test_label_smoothing_names_each_mistake(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_label_smoothing(wrong)


def test_label_smoothing_nn_cross_entropy_is_named():
    def with_torch(logits, labels, pad_id, smoothing):
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1),
                               ignore_index=pad_id, label_smoothing=smoothing)

    with pytest.raises(AssertionError, match="nn.CrossEntropyLoss"):
        check_label_smoothing(with_torch)


def test_label_smoothing_kl_divergence_is_named():
    def kl_div(logits, labels, pad_id, smoothing):
        V = logits.size(-1)
        logp = F.log_softmax(logits.reshape(-1, V), dim=-1)
        labels = labels.reshape(-1)
        target = torch.full_like(logp, smoothing / (V - 2))
        target.scatter_(1, labels[:, None], 1 - smoothing)
        target[:, pad_id] = 0
        target[labels == pad_id] = 0
        return nn.KLDivLoss(reduction="sum")(logp, target) / (labels != pad_id).sum()

    with pytest.raises(AssertionError, match="KL divergence instead of cross-entropy"):
        check_label_smoothing(kl_div)


def test_label_smoothing_per_token_losses_are_not_a_scalar():
    def per_token(logits, labels, pad_id, smoothing):
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), reduction="none")

    with pytest.raises(AssertionError, match="wrong shape handling: the loss is not a scalar"):
        check_label_smoothing(per_token)


def test_label_smoothing_unimplemented_prints_friendly_line(capsys):
    def label_smoothing_loss(logits, labels, pad_id, smoothing):
        raise NotImplementedError

    assert check_label_smoothing(label_smoothing_loss) is None
    assert "`label_smoothing_loss` is not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# greedy decoding
# ----------------------------------------------------------------------------------------------

def make_decode(feed_prefix=True, keep_start=False, steps_delta=0, pick="last", return_logits=False,
                reencode=False):
    @torch.no_grad()
    def decode(model, src, max_len, start_id):
        src_mask = padding_mask(src, model.config.pad_id)
        memory = model.encode(src, src_mask)
        ys = torch.full((src.size(0), 1), start_id, dtype=torch.long)
        all_logits = []
        for _ in range(max_len + steps_delta):
            if reencode:
                memory = model.encode(src, src_mask)
            logits = model.generator(model.decode(ys if feed_prefix else ys[:, -1:], memory, src_mask))
            all_logits.append(logits[:, -1])
            if pick == "last":
                next_id = logits[:, -1].argmax(-1)
            else:  # argmax over the position axis
                next_id = logits.argmax(1)[:, -1]
            ys = torch.cat([ys, next_id[:, None]], dim=1)
        if return_logits:
            return torch.stack(all_logits, dim=1)
        return ys if keep_start else ys[:, 1:]

    return decode


def test_greedy_correct_passes(capsys):
    assert passes(check_greedy_decode, make_decode())
    assert "check_greedy_decode: all 4 cases match" in capsys.readouterr().out


def test_greedy_reencoding_the_source_each_step_is_fine():
    assert passes(check_greedy_decode, make_decode(reencode=True))


def test_greedy_reference_passes():
    from course_lib.decoding import greedy_decode

    assert passes(check_greedy_decode, lambda m, s, n, st: greedy_decode(m, s, max_len=n, start_id=st))


@pytest.mark.parametrize(
    "wrong, words",
    [
        (make_decode(keep_start=True), "start symbol included in the output"),
        (make_decode(feed_prefix=False), "decoder fed only the last token"),
        (make_decode(pick="axis"), "argmax over the wrong axis"),
        (make_decode(return_logits=True), "returning logits instead of ids"),
        (make_decode(steps_delta=1), "off-by-one length: one token too many"),
        (make_decode(steps_delta=-1), "off-by-one length: one token too few"),
    ],
)
def test_greedy_names_each_mistake(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_greedy_decode(wrong)


def test_greedy_start_kept_but_length_right_is_named():
    full = make_decode(keep_start=True)
    with pytest.raises(AssertionError, match="start symbol included in the output"):
        check_greedy_decode(lambda m, s, n, st: full(m, s, n, st)[:, :n])


def test_greedy_unimplemented_prints_friendly_line(capsys):
    def my_greedy_decode(model, src, max_len, start_id):
        raise NotImplementedError

    assert check_greedy_decode(my_greedy_decode) is None
    assert "`my_greedy_decode` is not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# the shift
# ----------------------------------------------------------------------------------------------

def sos_column(tgt, sos_id):
    return torch.full((tgt.size(0), 1), sos_id, dtype=tgt.dtype)


def test_shift_correct_passes(capsys):
    def shift(tgt, sos_id):
        return torch.cat([sos_column(tgt, sos_id), tgt[:, :-1]], dim=1), tgt

    assert passes(check_shift, shift)
    assert "check_shift: all 3 cases match" in capsys.readouterr().out


def test_shift_other_correct_styles_pass():
    def with_pad(tgt, sos_id):
        return F.pad(tgt[:, :-1], (1, 0), value=sos_id), tgt.clone()

    def with_roll(tgt, sos_id):
        tgt_in = tgt.roll(1, dims=1)
        tgt_in[:, 0] = sos_id
        return tgt_in, tgt

    def solution(tgt, sos_id):
        from course_lib.solutions import solution_source

        namespace = {}
        exec(solution_source("06.shift"), {"torch": torch}, namespace)
        return namespace["make_decoder_io"](tgt, sos_id)

    for fn in (with_pad, with_roll, solution):
        assert passes(check_shift, fn)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda tgt, sos: (tgt, tgt), "no shift"),
        (lambda tgt, sos: (torch.cat([sos_column(tgt, sos), tgt[:, :-1]], 1),
                           torch.cat([tgt[:, 1:], torch.zeros_like(tgt[:, :1])], 1)), "double shift"),
        (lambda tgt, sos: (tgt, torch.cat([tgt[:, 1:], torch.zeros_like(tgt[:, :1])], 1)),
         "labels shifted instead of inputs"),
        (lambda tgt, sos: (tgt[:, :-1], tgt[:, 1:]), "labels shifted instead of inputs"),
        (lambda tgt, sos: (torch.cat([sos_column(tgt, sos), tgt[:, :-1]], 1),) * 2, "start symbol in the labels"),
    ],
)
def test_shift_names_each_mistake(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_shift(wrong)


@pytest.mark.parametrize("wrong, words", [
    (lambda tgt, sos: (torch.cat([sos_column(tgt, sos), tgt], 1), tgt),
     r"Wrong shape.*tgt_in is \(3, 7\), expected \(3, 6\): the start symbol was put in front of the WHOLE"),
    (lambda tgt, sos: (torch.cat([sos_column(tgt, sos), tgt], 1),
                       torch.cat([tgt, torch.zeros_like(tgt[:, :1])], 1)),
     r"Wrong shape.*tgt_in is \(3, 7\)"),
    (lambda tgt, sos: (torch.cat([sos_column(tgt, sos), tgt[:, :-1]], 1), tgt[:, :-1]),
     r"Wrong shape.*tgt_out is \(3, 5\), expected \(3, 6\)"),
])
def test_shift_wrong_shapes_are_named_before_values(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_shift(wrong)


def test_shift_unimplemented_prints_friendly_line(capsys):
    def make_decoder_io(tgt, sos_id):
        raise NotImplementedError

    assert check_shift(make_decoder_io) is None
    assert "`make_decoder_io` is not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# greedy decoding with padded sources (the debug exercise)
# ----------------------------------------------------------------------------------------------

def test_greedy_without_the_source_mask_in_decode_is_named():
    @torch.no_grad()
    def my_greedy_decode(model, src, max_len, start_id):
        src_mask = padding_mask(src, model.config.pad_id)
        memory = model.encode(src, src_mask)
        ys = torch.full((src.size(0), 1), start_id, dtype=torch.long)
        for _ in range(max_len):
            next_id = model.generator(model.decode(ys, memory, None)[:, -1]).argmax(-1)  # the bug
            ys = torch.cat([ys, next_id[:, None]], dim=1)
        return ys[:, 1:]

    with pytest.raises(AssertionError, match="source mask not passed to model.decode"):
        check_greedy_decode(my_greedy_decode)


def test_greedy_with_a_4d_source_mask_passes():
    @torch.no_grad()
    def decode(model, src, max_len, start_id):
        mask = (src != model.config.pad_id)[:, None, None, :]  # (B, 1, 1, L_s)
        memory = model.encode(src, mask)
        ys = torch.full((src.size(0), 1), start_id, dtype=torch.long)
        for _ in range(max_len):
            next_id = model.generator(model.decode(ys, memory, mask)[:, -1]).argmax(-1)
            ys = torch.cat([ys, next_id[:, None]], dim=1)
        return ys[:, 1:]

    assert passes(check_greedy_decode, decode)


def test_greedy_with_the_full_forward_pass_each_step_passes():
    @torch.no_grad()
    def decode(model, src, max_len, start_id):
        ys = torch.full((src.size(0), 1), start_id, dtype=torch.long)
        for _ in range(max_len):
            ys = torch.cat([ys, model(src, ys)[:, -1].argmax(-1, keepdim=True)], dim=1)
        return ys[:, 1:]

    assert passes(check_greedy_decode, decode)


@pytest.mark.parametrize("where", ["both", "decode"])
def test_greedy_inverted_source_mask_is_named(where):
    words = r"source mask inverted \(True on the <pad> positions\)"

    @torch.no_grad()
    def my_greedy_decode(model, src, max_len, start_id):
        wrong = (src == model.config.pad_id).unsqueeze(1)  # True on padding: the opposite convention
        memory = model.encode(src, wrong if where == "both" else padding_mask(src, 0))
        ys = torch.full((src.size(0), 1), start_id, dtype=torch.long)
        for _ in range(max_len):
            next_id = model.generator(model.decode(ys, memory, wrong)[:, -1]).argmax(-1)
            ys = torch.cat([ys, next_id[:, None]], dim=1)
        return ys[:, 1:]

    with pytest.raises(AssertionError, match=words):
        check_greedy_decode(my_greedy_decode)


# ----------------------------------------------------------------------------------------------
# predict: the entropy floor of label smoothing
# ----------------------------------------------------------------------------------------------

FLOOR = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1 / 9))


@pytest.mark.parametrize("answer", [lambda: FLOOR, lambda: round(FLOOR, 3), lambda: torch.tensor(FLOOR),
                                    lambda: 0.9 * math.log(1 / 0.9) + 0.1 * math.log(90)])
def test_smoothing_floor_right_answers_pass(answer, capsys):
    assert passes(check_smoothing_floor, answer)
    assert "check_smoothing_floor: right, 0.545" in capsys.readouterr().out


@pytest.mark.parametrize(
    "value, words",
    [
        (0.0, "floor WITHOUT smoothing"),
        (math.log(11), "uniform distribution"),
        (math.log(10), "uniform prediction over the non-pad classes"),
        (-(0.909 * math.log(0.90909) + 10 * 0.00909 * math.log(0.00909)), "nn.CrossEntropyLoss"),
        (-(0.9 * math.log(0.9) + 0.1 * math.log(0.01)), "V-1 = 10 classes"),
        (-0.9 * math.log(0.9), "only the label's term"),
        (-0.1 * math.log(0.1 / 9), "only the other classes' terms"),
        (1.0, "give three decimals"),
    ],
)
def test_smoothing_floor_names_each_confusion(value, words):
    with pytest.raises(AssertionError, match=words):
        check_smoothing_floor(lambda: value)


def test_smoothing_floor_needs_a_number():
    with pytest.raises(AssertionError, match="Return one number"):
        check_smoothing_floor(lambda: "0.545")


def test_smoothing_floor_unimplemented_prints_friendly_line(capsys):
    def predicted_floor():
        raise NotImplementedError

    assert check_smoothing_floor(predicted_floor) is None
    assert "`predicted_floor` is not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# the training step (the debug exercise)
# ----------------------------------------------------------------------------------------------

def make_step(zero="before", mode="train", decoder_input="tgt_in", labels="tgt_out", ret="item",
              step=True, step_first=False):
    """A learner's training step with the given choices."""

    def train_step(model, batch, optimizer, loss_fn):
        src, tgt_in, tgt_out = batch
        named = {"tgt_in": tgt_in, "tgt_out": tgt_out}
        if mode == "eval":
            model.eval()
        if zero == "before":
            optimizer.zero_grad()
        elif zero == "model":
            model.zero_grad(set_to_none=False)
        loss = loss_fn(model(src, named[decoder_input]), named[labels])
        if step_first:
            optimizer.step()
        loss.backward()
        if zero == "between":
            optimizer.zero_grad()
        if step and not step_first:
            optimizer.step()
        if zero == "after":
            optimizer.zero_grad()
        return {"item": loss.item(), "tensor": loss, "float": float(loss)}[ret]

    return train_step


def test_train_step_correct_styles_pass(capsys):
    assert passes(check_train_step, make_step())
    assert "check_train_step: all 3 steps match" in capsys.readouterr().out
    for style in (make_step(zero="after"), make_step(zero="model"), make_step(ret="float")):
        assert passes(check_train_step, style)


def test_train_step_solution_passes():
    from course_lib.solutions import solution_source

    namespace = {}
    exec(solution_source("06.train_step"), {"torch": torch}, namespace)
    assert passes(check_train_step, namespace["train_step"])


@pytest.mark.parametrize("wrong, words", [
    (make_step(zero=None), r"step 2 of 3.*the gradients are never zeroed"),
    (make_step(zero="between"), r"the weights never change"),
    (make_step(step=False), r"the weights never change"),
    (make_step(step_first=True), r"the weights never change"),
    (make_step(mode="eval"), r"the step runs the model in eval mode: dropout is off"),
    (make_step(decoder_input="tgt_out"), r"the decoder reads the labels"),
    (make_step(labels="tgt_in"), r"the loss compares with the decoder input tgt_in"),
    (make_step(ret="tensor"), r"returns the loss tensor, not a number"),
])
def test_train_step_names_each_mistake(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_train_step(wrong)


def test_train_step_unimplemented_prints_friendly_line(capsys):
    def train_step(model, batch, optimizer, loss_fn):
        raise NotImplementedError

    assert check_train_step(train_step) is None
    assert "`train_step` is not implemented yet" in capsys.readouterr().out
