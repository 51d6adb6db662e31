"""Lesson 16's SFT checkers (course_lib/checks/lesson16_sft.py): check_label_count (Predict),
check_sft_labels and check_sequence_log_probs (Build). Every correct style passes (lists or tensors,
gather or cross_entropy, loops, one row at a time, float64 inside), each named mistake is named,
course_lib's own versions are refused kindly, and no raw error or endless loop leaves a checker."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _helpers import assert_checkers_keep_random_state, failure, passes, solution_namespace

from course_lib.checks import check_label_count, check_sequence_log_probs, check_sft_labels
from course_lib.checks import lesson16_sft
from course_lib.dpo import sequence_log_probs as course_sequence_log_probs

COUNT = solution_namespace("16.label_count")["predicted_label_count"]
LABELS = solution_namespace("16.sft_labels")["sft_labels"]
LOGPS = solution_namespace("16.sequence_log_probs")["my_sequence_log_probs"]


# ---- check_label_count ----------------------------------------------------------------------------

def test_label_count_right_answers_pass():
    assert passes(check_label_count, COUNT)
    assert passes(check_label_count, lambda: 41)
    assert passes(check_label_count, lambda: torch.tensor(41))
    assert passes(check_label_count, lambda: 41.0)


@pytest.mark.parametrize("value, name", [
    (40, "the end token forgotten"), (42, "<|assistant|> counted"), (32, "the prompt counted"),
    (73, "the whole length"), (72, "every next-token prediction counted"),
    (29, "the instruction's characters counted"),
    (43, "the prompt's <|end|> and <|assistant|> counted"), (74, "one more than the whole sequence"),
    (8, "the answer's words counted"), (9, "the answer's words (and <|end|>) counted"),
    (39, "one taken off for the shift, and the end token forgotten"), (1, "only <|end|> counted"),
    (30, "the instruction and an <|end|> counted"), (44, "the answer and all four special tokens counted"),
    (47, "<|end|> counted as its 7 characters"), (71, "the whole length less two"),
    (70, "the instruction and the answer (and <|end|>) counted")])
def test_label_count_mistakes_named(value, name):
    err = failure(check_label_count, lambda: value)
    assert err.mistake is not None and err.mistake.startswith(name)


def test_label_count_bad_input_and_refusal():
    assert "whole number" in str(failure(check_label_count, lambda: "41"))
    assert "whole number" in str(failure(check_label_count, lambda: 41.5))
    assert "Not quite" in str(failure(check_label_count, lambda: 7))
    assert "sft_example" in str(failure(check_label_count, _count_with_course_lib))


def _count_with_course_lib():
    from course_lib.sft import sft_example

    class Vocab:
        def encode(self, text):
            return [ord(c) % 80 for c in text]

        def decode(self, ids):
            return ""

        def __len__(self):
            return 80

    from course_lib.chat import ChatTemplate

    ids, labels = sft_example(ChatTemplate(Vocab()), lesson16_sft.LABEL_INSTRUCTION, lesson16_sft.LABEL_ANSWER)
    return sum(label != -100 for label in labels)


# ---- check_sft_labels -----------------------------------------------------------------------------

def labels_tensors(prompt_ids, answer_ids, end_id):
    ids = torch.tensor(prompt_ids + answer_ids + [end_id])
    labels = ids.clone()
    labels[: len(prompt_ids)] = -100
    return ids, labels


def labels_loop(prompt_ids, answer_ids, end_id):
    ids, labels = [], []
    for i in prompt_ids:
        ids.append(i)
        labels.append(-100)
    for i in answer_ids + [end_id]:
        ids.append(i)
        labels.append(i)
    return tuple(ids), tuple(labels)


def test_sft_labels_correct_styles_pass():
    for fn in (LABELS, labels_tensors, labels_loop):
        assert passes(check_sft_labels, fn)


def _variant(labels_of, ids_of=lambda p, a, e: p + a + [e]):
    return lambda p, a, e: (ids_of(p, a, e), labels_of(p, a, e))


@pytest.mark.parametrize("fn, name", [
    (_variant(lambda p, a, e: [-100] * len(p) + a, lambda p, a, e: p + a), "the end token not appended"),
    (_variant(lambda p, a, e: [-100] * len(p) + a + [-100]), "the end token not labelled"),
    (_variant(lambda p, a, e: p + a + [e]), "the prompt not masked"),
    (_variant(lambda p, a, e: [-100] * (len(p) - 1) + a + [e, -100]), "the labels shifted by hand"),
    (_variant(lambda p, a, e: [-100] * (len(p) - 1) + [p[-1]] + a + [e]), "<|assistant|> labelled"),
    (_variant(lambda p, a, e: [0] * len(p) + a + [e]), "the mask value 0 instead of -100"),
    (_variant(lambda p, a, e: p + [-100] * (len(a) + 1)), "the answer masked and the prompt labelled"),
    # tryout 16a's dev half
    (_variant(lambda p, a, e: [-100] * len(p) + a + [e, e], lambda p, a, e: p + a + [e, e]), "the end token twice"),
    (_variant(lambda p, a, e: [-100] * (len(p) + 1) + a, lambda p, a, e: p + [e] + a),
     "the end token before the answer"),
    (_variant(lambda p, a, e: [-100] * len(p) + a + [7], lambda p, a, e: p + a + [7]), "another end id than end_id"),
    (_variant(lambda p, a, e: [-1] * len(p) + a + [e]), "another mask value than -100"),
    (_variant(lambda p, a, e: [-100] * (len(p) + 1) + a[1:] + [e]), "the answer's first token masked too"),
    (_variant(lambda p, a, e: ([-100] * len(p) + a + [e])[1:]), "the labels shifted by hand (and one shorter)"),
    (_variant(lambda p, a, e: [-100] * len(p) + a), "the end token left without a label"),
    # tryout 16a's held half
    (lambda p, a, e: ([-100] * len(p) + a + [e], p + a + [e]), "input_ids and labels returned in the other order"),
    (_variant(lambda p, a, e: [-100 if t in set(p) else t for t in p + a + [e]]),
     "tokens masked by their id, not by their position"),
    # tryout 16b's held half
    (_variant(lambda p, a, e: [-100] * (len(p) + 1) + a),
     "the labels shifted right (each position labelled with the token before it)"),
])
def test_sft_labels_mistakes_named(fn, name):
    assert failure(check_sft_labels, fn).mistake == name


def test_sft_labels_bad_input_and_refusal():
    assert "two sequences" in str(failure(check_sft_labels, lambda p, a, e: p + a + [e]))
    assert "batch of one" in str(failure(
        check_sft_labels, lambda p, a, e: tuple(t.unsqueeze(0) for t in labels_tensors(p, a, e))))
    assert "list of ints" in str(failure(check_sft_labels, lambda p, a, e: ("x", "y")))
    assert "raised" in str(failure(check_sft_labels, lambda p, a, e: 1 / 0))

    def with_course_lib(p, a, e):
        from course_lib.sft import sft_batch
        sft_batch([(p, p)], e)
        return LABELS(p, a, e)

    assert "very thing" in str(failure(check_sft_labels, with_course_lib))


# ---- check_sequence_log_probs ---------------------------------------------------------------------

def logps_cross_entropy(logits, labels):
    N, T, V = logits.shape
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), reduction="none")
    return -nll.view(N, T - 1).sum(1)  # (N,): ignored positions give 0


def logps_rows_float64(logits, labels):
    out = []
    for row in range(logits.size(0)):  # one sequence at a time, float64 inside
        total = logits.new_zeros((), dtype=torch.float64)
        lp = logits[row].double().log_softmax(-1)
        for t in range(logits.size(1) - 1):
            if labels[row, t + 1] != -100:
                total = total + lp[t, labels[row, t + 1]]
        out.append(total)
    return torch.stack(out).to(logits.dtype)


def test_sequence_log_probs_correct_styles_pass():
    for fn in (LOGPS, logps_cross_entropy, logps_rows_float64):
        assert passes(check_sequence_log_probs, fn)


def _pick(values, labels, shift=True):
    v, t = (values[:, :-1], labels[:, 1:]) if shift else (values, labels)
    keep = t != -100
    return (v.gather(-1, t.clamp(min=0).unsqueeze(-1)).squeeze(-1) * keep), keep


@pytest.mark.parametrize("fn, name", [
    (lambda x, y: _pick(x.log_softmax(-1), y, shift=False)[0].sum(1), "no shift"),
    (lambda x, y: (lambda p, k: p.sum(1) / k.sum(1))(*_pick(x.log_softmax(-1), y)), "the mean over tokens"),
    (lambda x, y: x[:, :-1].log_softmax(-1).gather(-1, y[:, 1:].clamp(min=0).unsqueeze(-1)).squeeze(-1).sum(1),
     "the -100 positions counted (as token 0)"),
    (lambda x, y: _pick(x.softmax(-1), y)[0].sum(1), "softmax without log"),
    (lambda x, y: _pick(x.log_softmax(1), y)[0].sum(1), "log_softmax over the wrong dim"),
    (lambda x, y: (x[:, :-1].log_softmax(-1).max(-1).values * (y[:, 1:] != -100)).sum(1),
     "the probabilities of the argmax"),
    (lambda x, y: _pick(x, y)[0].sum(1), "raw logits summed"),
    (lambda x, y: -_pick(x.log_softmax(-1), y)[0].sum(1), "the sum of -log p"),
])
def test_sequence_log_probs_mistakes_named(fn, name):
    assert failure(check_sequence_log_probs, fn).mistake.startswith(name)


def _masked_sum(logp, target, counted):
    picked = logp.gather(-1, target.clamp(min=0)[..., None])[..., 0]
    return (picked * counted).sum(-1)


@pytest.mark.parametrize("fn, name", [
    (lambda x, y: _masked_sum(x[:, :-1].log_softmax(-1), y[:, 1:], y[:, 1:] > 0), "the answer's tokens of id 0"),
    (lambda x, y: _masked_sum(x[:, 1:].log_softmax(-1), y[:, :-1], y[:, :-1] != -100), "the shift the wrong way"),
    (lambda x, y: _masked_sum(x[:, :-1].log_softmax(-1), y[:, 1:], y[:, :-1] != -100),
     "the mask taken from the unshifted labels"),
    (lambda x, y: _masked_sum(x[:, :-1].log_softmax(1), y[:, 1:], y[:, 1:] != -100),
     "log_softmax over the positions (dim 1), after the shift"),
    (lambda x, y: _masked_sum(x[:, :-1].log_softmax(-1), y[:, 1:], y[:, 1:] != -100) / (y.size(1) - 1),
     "the mean over every position"),
    (lambda x, y: _masked_sum(x[:, :-1].log_softmax(-1), y[:, 1:], y[:, 1:] == -100),
     "the positions labelled -100 summed"),
    (lambda x, y: _masked_sum(x[:, :-1].log_softmax(-1), y[:, 1:],
                              (y[:, 1:] != -100) & (torch.roll(y[:, 1:], -1, 1) != -100)),
     "the answer's last token (<|end|>) left out"),
])
def test_sequence_log_probs_tryout_16a_mistakes_named(fn, name):
    assert failure(check_sequence_log_probs, fn).mistake.startswith(name)


def test_sequence_log_probs_a_product_of_probabilities_underflows_on_long_answers():
    def product_then_log(logits, labels):
        p = logits[:, :-1].softmax(-1)
        y = labels[:, 1:]
        picked = p.gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return torch.where(y != -100, picked, torch.ones_like(picked)).prod(-1).log()

    err = failure(check_sequence_log_probs, product_then_log)
    assert err.mistake == "a product of probabilities, then the log" and "90 and 70 tokens" in str(err)


def test_sequence_log_probs_cross_entropy_with_the_classes_last_is_named():
    def classes_last(logits, labels):
        nll = F.cross_entropy(logits[:, :-1], labels[:, 1:], reduction="none")
        return -nll.sum(1)

    err = failure(check_sequence_log_probs, classes_last)
    assert err.mistake == "F.cross_entropy given the classes in the last dim" and "dim 1" in str(err)


def test_sequence_log_probs_shape_gradient_and_refusal():
    assert "one number for the batch" in str(failure(check_sequence_log_probs, lambda x, y: LOGPS(x, y).sum()))
    assert "no gradient" in str(failure(check_sequence_log_probs, lambda x, y: LOGPS(x.detach(), y)))
    assert "very thing" in str(failure(check_sequence_log_probs, course_sequence_log_probs))
    assert "very thing" in str(failure(check_sequence_log_probs, lambda x, y: course_sequence_log_probs(x, y)))
    assert "raised" in str(failure(check_sequence_log_probs, lambda x, y: x.foo))


def test_sft_checkers_keep_random_state():
    assert_checkers_keep_random_state([(check_label_count, COUNT), (check_sft_labels, LABELS),
                                       (check_sequence_log_probs, LOGPS)])
