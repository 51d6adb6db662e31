"""Checkers for lesson 16's supervised fine-tuning exercises: which positions carry loss, the labels,
and the sequence log-probability DPO needs.

* ``check_label_count(fn)`` (Predict): ``fn() -> int``, how many label positions of one rendered
  example (``LABEL_INSTRUCTION`` answered with ``LABEL_ANSWER``, the character tokenizer: one id per
  character) carry loss: the answer's characters and ``<|end|>``. Each usual miscount is named.
* ``check_sft_labels(fn)`` (Build): ``fn(prompt_ids, answer_ids, end_id) -> (input_ids, labels)``:
  ``input_ids`` = prompt + answer + ``[end_id]``, ``labels`` the same with every prompt position
  (``<|assistant|>`` included) set to -100. Lists or 1-D integer tensors. Tried on prompts of
  several lengths with multi-digit ids.
* ``check_sequence_log_probs(fn)`` (Build): ``fn(logits (N, T, V), labels (N, T)) -> (N,)``, each row's
  sum over labelled positions of ``log softmax(logits[:, t])[labels[:, t + 1]]`` (labels lie under
  the inputs, Hugging Face's convention; -100 adds nothing), with gradients. Tried on several N, T
  and V, prompts of different lengths, right padding, float32 and float64.

course_lib's ``sft_example``, ``sft_batch``, ``sequence_log_probs`` and ``chosen_rejected_log_probs``
are refused where they are the very thing built (the lesson uses them once yours has passed); torch's
building blocks (``log_softmax``, ``gather``, ``F.cross_entropy(..., reduction="none")``, loops,
einsum, float64 inside) are welcome.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .common import CheckFailure, calls_to, checker, is_course_lib, plain, run_learner, time_limit
from .lesson11_modern import f64, no_raw_errors

__all__ = ["check_label_count", "check_sft_labels", "check_sequence_log_probs", "LABEL_INSTRUCTION",
           "LABEL_ANSWER", "label_count_answer", "is_trl", "LIMIT_SECONDS"]

LIMIT_SECONDS = 30  # the learner's code on one case: a loop that never ends stops here
IGNORE = -100
LABEL_INSTRUCTION = "A line with the word 'crown'."
LABEL_ANSWER = "Uneasy lies the head that wears a crown."


def is_trl(obj: Any) -> bool:
    """True for an object, class or module from TRL."""
    kind = obj if isinstance(obj, type) else type(obj)
    module = getattr(obj, "__module__", None) if callable(obj) else None
    if isinstance(module, str) and module.split(".")[0] == "trl":
        return True
    return any((getattr(k, "__module__", "") or "").split(".")[0] == "trl" for k in kind.__mro__)


def _refused() -> list[Callable[..., Any]]:
    from .. import dpo, sft

    return [sft.sft_example, sft.sft_batch, dpo.sequence_log_probs, dpo.chosen_rejected_log_probs,
            dpo.preference_batch]


def _call(fn: Callable[..., Any], *args: Any, case: str, hint: str, what: str) -> Any:
    """The learner's call, watched for course_lib's own version, stopped after LIMIT_SECONDS."""
    with calls_to(_refused()) as seen, time_limit(
            LIMIT_SECONDS, f"Your code ran for more than {LIMIT_SECONDS} s ({case}): a loop that never "
                           "ends? One call on these small inputs takes milliseconds."):
        out = run_learner(fn, *args, case=case, hint=hint)
    if seen:
        raise CheckFailure(f"Your code calls course_lib's {seen[0].__name__}, the very thing this "
                           f"exercise builds ({what}): right, and the lesson uses it once yours has "
                           "passed. Here, write it yourself with torch's building blocks.")
    return out


def _refuse_handed_in(fn: Any, what: str) -> None:
    if is_course_lib(fn) or is_trl(fn):
        raise CheckFailure(f"You handed in a library's function ({getattr(fn, '__name__', fn)!r}), the "
                           f"very thing this exercise builds ({what}): right, and the lesson uses "
                           "course_lib's once yours has passed. Here, write it yourself.")


# --------------------------------------------------------------------------------------------------
# Exercise 1 (Predict): how many positions carry loss
# --------------------------------------------------------------------------------------------------

def label_count_answer() -> int:
    """The answer's characters and ``<|end|>``: the positions whose label is not -100."""
    return len(LABEL_ANSWER) + 1


@checker
@no_raw_errors
def check_label_count(fn: Callable[[], Any]) -> None:
    """Check ``fn() -> int``: the label positions of the lesson's rendered example that carry loss."""
    _refuse_handed_in(fn, "the count")
    raw = _call(fn, case="your prediction", hint="Return one number.", what="the labels")
    value = plain(raw, "your count")
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value):
        raise CheckFailure(f"Return one whole number (a count of positions), got {type(raw).__name__}: "
                           f"{raw!r}.")
    got = int(value)
    a, p = len(LABEL_ANSWER), len(LABEL_INSTRUCTION) + 3  # <|user|> instruction <|end|> <|assistant|>
    right, total = a + 1, p + a + 1
    if got == right:
        print(f"check_label_count: right, {right}: the {a} characters of the answer and the <|end|> "
              "that closes it. The prompt's positions carry -100.")
        return
    mistakes = [
        (a, "the end token forgotten (or one taken off for the shift)",
         "the answer's <|end|> is a label too: it is how the model learns to stop. The shift needs "
         "no correction here: the labels lie under the inputs, and the loss shifts them"),
        (a + 2, "<|assistant|> counted",
         "<|assistant|> is the prompt's last token, given to the model, never predicted"),
        (p, "the prompt counted",
         "the prompt's positions are the ones set to -100; the rest carry loss"),
        (p - 1, "the prompt counted (without <|assistant|>)",
         "the prompt's positions are the ones set to -100; the rest carry loss"),
        (total, "the whole length",
         "with the loss on the answer only, the prompt's positions carry -100"),
        (total - 1, "every next-token prediction counted, the prompt's too",
         "T - 1 positions predict a next token, but the prompt's labels are -100"),
        (len(LABEL_INSTRUCTION), "the instruction's characters counted",
         "the instruction is the prompt: its labels are -100"),
        (a + 3, "the prompt's <|end|> and <|assistant|> counted with the answer",
         "both close the prompt: given to the model, never predicted, so their labels are -100"),
        (total + 1, "one more than the whole sequence",
         "there is one label per input position, and with the loss on the answer only the prompt's "
         "positions carry -100"),
        (len(LABEL_ANSWER.split()), "the answer's words counted",
         "the tokenizer here gives one id per character: count characters"),
        (len(LABEL_ANSWER.split()) + 1, "the answer's words (and <|end|>) counted",
         "the tokenizer here gives one id per character: count characters"),
        (a - 1, "one taken off for the shift, and the end token forgotten",
         "the labels lie under the inputs and the loss shifts them, so nothing is taken off; and the "
         "answer's <|end|> is a label too: it is how the model learns to stop"),
        (1, "only <|end|> counted", "every character of the answer carries loss too: SFT teaches the "
         "answer, and <|end|> after it"),
        (len(LABEL_INSTRUCTION) + 1, "the instruction and an <|end|> counted",
         "the instruction is the prompt, whose labels are -100; the answer's characters and its <|end|> "
         "carry loss"),
        (total - 2, "the whole length less two",
         "with the loss on the answer only, every prompt position carries -100: count the answer's "
         "positions, not the sequence's"),
        (len(LABEL_INSTRUCTION) + a + 1, "the instruction and the answer (and <|end|>) counted",
         "the instruction is the prompt: its labels are -100; only the answer's characters and its "
         "<|end|> carry loss"),
        (a + 7, "<|end|> counted as its 7 characters",
         "<|end|> is one token, one id (the template adds it to the vocabulary): the answer's characters "
         "and that one id carry loss"),
        (a + 4, "the answer and all four special tokens counted",
         "<|user|>, the prompt's <|end|> and <|assistant|> belong to the prompt (-100); only the "
         "answer's <|end|> carries loss"),
    ]
    for value, name, reason in mistakes:
        if got == value:
            raise CheckFailure(f"Not quite: {name}. {reason}.", mistake=name)
    raise CheckFailure("Not quite. Write the rendered ids in two parts, the prompt (<|user|> ... "
                       "<|assistant|>) and the answer, and count the positions whose label is not -100.")


# --------------------------------------------------------------------------------------------------
# Exercise 2 (Build): sft_labels
# --------------------------------------------------------------------------------------------------

# (case, prompt, answer, end_id): multi-digit ids, prompts of several lengths, an answer that
# repeats a prompt id, a one-token answer
_LABEL_CASES = [  # the first: answer ids that also stand in the prompt (so do the end id's)
    ("a prompt of 12 ids, an answer of 9", [120, 7, 99, 45, 13, 13, 61, 34, 76, 118, 122, 121],
     [50, 51, 13, 99, 17, 101, 8, 30, 44], 122),
    ("a prompt of 7 ids, an answer of 5", [86, 12, 40, 33, 57, 88, 87], [21, 64, 5, 71, 19], 88),
    ("a prompt of 4 ids, an answer of 1", [300, 250, 302, 301], [251], 302),
    ("a prompt of 5 ids, an answer of 14",
     [1000, 314, 159, 1002, 1001], [265, 358, 979, 323, 846, 264, 338, 327, 950, 288, 419, 716, 939, 937], 1002),
]


def _as_ids(value: Any, what: str, case: str) -> list[int]:
    value = plain(value, what)
    if isinstance(value, torch.Tensor):
        if value.dim() == 2 and value.size(0) == 1:
            raise CheckFailure(f"{what} has shape {tuple(value.shape)} ({case}): return one sequence, "
                               "a list or a 1-D tensor, not a batch of one.")
        if value.dim() != 1 or value.is_floating_point() or value.dtype == torch.bool:
            raise CheckFailure(f"{what} should be a list of ints or a 1-D integer tensor ({case}), got a "
                               f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}.")
        return [int(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, torch.Tensor) and v.numel() == 1 for v in value):
        return [int(v.item()) for v in value]
    raise CheckFailure(f"{what} should be a list of ints or a 1-D integer tensor ({case}), got "
                       f"{type(value).__name__}.")


@checker
@no_raw_errors
def check_sft_labels(fn: Callable[..., Any]) -> None:
    """Check ``fn(prompt_ids, answer_ids, end_id) -> (input_ids, labels)``."""
    _refuse_handed_in(fn, "the labels")
    for case, prompt, answer, end in _LABEL_CASES:
        got = _call(fn, list(prompt), list(answer), end, case=case, what="the labels",
                    hint=f"It was given prompt_ids (a list of {len(prompt)} ints), answer_ids (a list of "
                         f"{len(answer)}) and end_id {end}.")
        got = plain(got, "your result")
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise CheckFailure(f"Return two sequences, (input_ids, labels), got {type(got).__name__} "
                               f"({case}).")
        ids, labels = _as_ids(got[0], "input_ids", case), _as_ids(got[1], "labels", case)
        want_ids = prompt + answer + [end]
        want = [IGNORE] * len(prompt) + answer + [end]
        if ids == want and labels == want_ids:
            name = "input_ids and labels returned in the other order"
            raise CheckFailure(f"Likely mistake ({case}): {name}. The first sequence you return holds -100 "
                               "over the prompt, and the second the prompt's ids: the function returns "
                               "(input_ids, labels).", mistake=name)
        if ids != want_ids:
            if ids == prompt + answer:
                raise CheckFailure(f"Likely mistake ({case}): the end token not appended. input_ids end "
                                   "with the answer's last id; append end_id after the answer, so the "
                                   "model sees where an answer stops and learns to write <|end|>.",
                                   mistake="the end token not appended")
            P = len(prompt)
            shapes = [
                (prompt + answer + [end, end], "the end token twice",
                 f"input_ids end with end_id ({end}) twice: answer_ids come without it, and it is appended once"),
                (prompt + [end] + answer, "the end token before the answer",
                 f"end_id ({end}) sits at position {P}, right after the prompt, where the answer's first "
                 "id belongs; input_ids are the prompt, then the answer, then end_id"),
                (prompt + [end] + answer + [end], "the end token also after the prompt",
                 f"end_id ({end}) appears at position {P}, between the prompt and the answer, and again "
                 "at the end; the prompt already ends with <|assistant|>"),
                (answer + [end], "the prompt left out of input_ids",
                 "input_ids start with the answer: the model must see the prompt it answers"),
                (prompt + [end], "the answer left out of input_ids", "input_ids hold no answer ids"),
            ]
            for wrong, name, hint in shapes:
                if ids == wrong:
                    raise CheckFailure(f"Likely mistake ({case}): {name}. {hint}.", mistake=name)
            if len(ids) == len(want_ids) and ids[:-1] == want_ids[:-1]:
                name = "another end id than end_id"
                raise CheckFailure(f"Likely mistake ({case}): {name}. input_ids end with {ids[-1]}, but the "
                                   f"end_id given is {end}: use the argument (each tokenizer has its own id).",
                                   mistake=name)
            first = next((i for i, (x, y) in enumerate(zip(ids, want_ids)) if x != y),
                         min(len(ids), len(want_ids)))
            at = (f" (got {ids[first]}, expected {want_ids[first]})" if first < min(len(ids), len(want_ids))
                  else "")
            raise CheckFailure(f"input_ids are not prompt + answer + [end_id] ({case}): got {len(ids)} ids, "
                               f"expected {len(want_ids)}; first difference at position {first}{at}; the "
                               f"prompt is positions 0-{P - 1}, the answer {P}-{P + len(answer) - 1}.")
        if labels == want:
            continue
        P = len(prompt)
        variants = [
            ("the end token not labelled", [IGNORE] * P + answer + [IGNORE],
             "the last label is -100: the model never learns to write <|end|>, so it never stops. "
             "Label the end token with its id"),
            ("the prompt not masked", list(want_ids),
             "every label is the input id: the loss also trains the model to predict the instruction. "
             "Set the prompt's positions to -100"),
            ("the labels shifted by hand", want[1:] + [IGNORE],
             "labels lie under input_ids, position for position: the loss shifts them itself "
             "(logits[:, t] is scored on labels[:, t + 1]); shifted here too, every label is one "
             "position early"),
            ("<|assistant|> labelled", [IGNORE] * (P - 1) + [prompt[-1]] + answer + [end],
             "<|assistant|>, the prompt's last id, is given to the model, never predicted: mask all "
             "of the prompt"),
            ("the mask value 0 instead of -100", [0] * P + answer + [end],
             "0 is a real token id (the loss would train the model to predict it); -100 is the index "
             "F.cross_entropy ignores"),
            ("the answer masked and the prompt labelled", prompt + [IGNORE] * (len(answer) + 1),
             "the loss goes on the answer (and its end), the prompt gets -100"),
        ]
        variants += [
            ("the labels shifted right (each position labelled with the token before it)",
             [IGNORE] * (P + 1) + answer,
             "labels lie under input_ids, position for position: the label of position t is input_ids[t] "
             "itself (the loss does the shift)"),
            ("the answer's first token masked too", [IGNORE] * (P + 1) + answer[1:] + [end],
             f"position {P}, the answer's first token, holds -100: the model is never taught the first "
             "token of an answer. Only the prompt's positions are -100"),
        ]
        if len(labels) != len(want):
            short = [
                ("the labels shifted by hand (and one shorter)", want[1:]),
                ("the end token left without a label", want[:-1]),
                ("only the answer's labels returned", answer + [end]),
            ]
            for name, wrong in short:
                if labels == wrong:
                    raise CheckFailure(f"Likely mistake ({case}): {name}. labels has {len(labels)} positions, "
                                       f"input_ids {len(ids)}: labels lie under input_ids, one label per "
                                       "position, and the loss does the shift.", mistake=name)
            raise CheckFailure(f"labels has {len(labels)} positions, input_ids {len(ids)} ({case}): "
                               "labels lie under input_ids, one label per position.")
        in_prompt = set(prompt)
        by_value = [IGNORE if t in in_prompt else t for t in want_ids]
        if labels == by_value:
            name = "tokens masked by their id, not by their position"
            again = [i for i in range(P, len(want)) if want_ids[i] in in_prompt]
            raise CheckFailure(f"Likely mistake ({case}): {name}. Positions {again} of the answer (and its end) "
                               f"hold ids that also stand in the prompt ({[want_ids[i] for i in again]}) and got "
                               "-100. The prompt's positions are masked, whatever ids they hold; an answer "
                               "may repeat any of them.", mistake=name)
        for name, wrong, hint in variants:
            if labels == wrong:
                raise CheckFailure(f"Likely mistake ({case}): {name}. {hint}.", mistake=name)
        masked = labels[:P]
        if labels[P:] == want[P:] and len(set(masked)) == 1 and masked[0] != IGNORE:
            name = f"the prompt's positions set to {masked[0]}, not -100"
            raise CheckFailure(f"Likely mistake ({case}): {name}. The loss skips only the label -100 "
                               f"(F.cross_entropy's ignore_index); {masked[0]} would be read as a token id "
                               "to predict (or raise).", mistake="another mask value than -100")
        first = next(i for i, (x, y) in enumerate(zip(labels, want)) if x != y)
        where = ("in the prompt" if first < P else "the end token" if first == len(want) - 1
                 else "in the answer")
        raise CheckFailure(f"labels differ from the expected ones ({case}) first at position {first}, "
                           f"{where} (the prompt is positions 0-{P - 1}): got {labels[first]}, expected "
                           f"{want[first]}. Print both for this small input.")
    print(f"check_sft_labels: right on all {len(_LABEL_CASES)} examples: input_ids are prompt + answer "
          "+ <|end|>, and only the answer and its end carry a label. Well done!")


# --------------------------------------------------------------------------------------------------
# Exercise 3 (Build): sequence_log_probs
# --------------------------------------------------------------------------------------------------

# (case, N, prompt lengths, answer lengths (end included), V, dtype)
_LOGP_CASES = [
    ("N=2, V=13, prompts of 3 and 5, float64", 2, (3, 5), (4, 2), 13, torch.float64),
    ("N=3, V=37, prompts of 2, 6 and 4, right padding, float32", 3, (2, 6, 4), (5, 3, 7), 37, torch.float32),
    ("N=5, V=120, prompts of 1 to 8, right padding, float64", 5, (8, 1, 4, 2, 6), (2, 9, 1, 5, 3), 120,
     torch.float64),
    ("N=1, V=300, float32", 1, (4,), (6,), 300, torch.float32),
    ("N=2, V=300, answers of 90 and 70 tokens, float32", 2, (3, 5), (90, 70), 300, torch.float32),
]


def _logp_inputs(n: int, N: int, prompts: tuple, answers: tuple, V: int,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(500 + n)
    T = max(p + a for p, a in zip(prompts, answers)) + 1  # at least one padded position in some row
    logits = (torch.randn(N, T, V, generator=gen, dtype=torch.float64) * 2.0).to(dtype)
    labels = torch.full((N, T), IGNORE, dtype=torch.long)
    for i, (p, a) in enumerate(zip(prompts, answers)):
        labels[i, p:p + a] = torch.randint(10 if V > 20 else 1, V, (a,), generator=gen)
    if N > 1:
        labels[1, prompts[1]] = 0  # a real token of id 0 (an answer's first token), to be counted
    return logits, labels


def _logp_reference(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    lp = logits.to(torch.float64)[:, :-1].log_softmax(-1)  # (N, T-1, V), in the graph if logits are
    t = labels[:, 1:]
    keep = t != IGNORE
    return torch.where(keep, lp.gather(-1, t.clamp(min=0).unsqueeze(-1)).squeeze(-1), 0.0).sum(1)


def _last_labelled(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """(N,): each row's value at its last kept position (0 where a row keeps none)."""
    idx = torch.arange(keep.size(1)).expand_as(keep)
    last = torch.where(keep, idx, -1).max(1).values
    return torch.where(last >= 0, values.gather(1, last.clamp(min=0).unsqueeze(1)).squeeze(1), 0.0)


def _first_labelled(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """(N,): each row's value at its first kept position (0 where a row keeps none)."""
    idx = torch.arange(keep.size(1)).expand_as(keep)
    first = torch.where(keep, idx, keep.size(1)).min(1).values
    ok = first < keep.size(1)
    return torch.where(ok, values.gather(1, first.clamp(max=keep.size(1) - 1).unsqueeze(1)).squeeze(1), 0.0)


def _logp_variants(logits: torch.Tensor, labels: torch.Tensor) -> list[tuple[str, str, Callable[[], Any]]]:
    x = f64(logits)
    lp = x.log_softmax(-1)  # (N, T, V)

    def picked(values: torch.Tensor, shift: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        v = values[:, :-1] if shift else values
        t = labels[:, 1:] if shift else labels
        keep = t != IGNORE
        return torch.where(keep, v.gather(-1, t.clamp(min=0).unsqueeze(-1)).squeeze(-1), 0.0), keep

    right, keep = picked(lp)
    t1 = labels[:, 1:]
    early = labels[:, :-1] != IGNORE  # the mask read one position early, from the unshifted labels
    lp_short = x[:, :-1]
    return [
        ("the answer's tokens of id 0 left out (a mask such as labels > 0)",
         "id 0 is a real token; only the label -100 marks a position without loss",
         lambda: torch.where(t1 > 0, lp[:, :-1].gather(-1, t1.clamp(min=0).unsqueeze(-1)).squeeze(-1),
                             0.0).sum(1)),
        ("the shift the wrong way (logits[:, 1:] scored on labels[:, :-1])",
         "position t's logits predict the token at t + 1: score logits[:, :-1] on labels[:, 1:]",
         lambda: torch.where(labels[:, :-1] != IGNORE, lp[:, 1:].gather(
             -1, labels[:, :-1].clamp(min=0).unsqueeze(-1)).squeeze(-1), 0.0).sum(1)),
        ("the mask taken from the unshifted labels (one position early)",
         "the labels were shifted for the gather, but the mask that says which positions count was "
         "not: it leaves out the answer's first token (predicted at <|assistant|>) and adds the "
         "prediction made at <|end|> of whatever follows it",
         lambda: torch.where(early, lp[:, :-1].gather(-1, t1.clamp(min=0).unsqueeze(-1)).squeeze(-1),
                             0.0).sum(1)),
        ("log_softmax over the positions (dim 1), after the shift",
         "normalise over the vocabulary, the last dim: log_softmax(dim=-1)",
         lambda: torch.where(t1 != IGNORE, lp_short.log_softmax(1).gather(
             -1, t1.clamp(min=0).unsqueeze(-1)).squeeze(-1), 0.0).sum(1)),
        ("the positions labelled -100 summed instead of the answer's",
         "the mask keeps the positions whose label is -100 (the prompt, the padding): keep those whose "
         "label is not -100",
         lambda: torch.where(t1 == IGNORE, lp[:, :-1].gather(-1, t1.clamp(min=0).unsqueeze(-1)).squeeze(-1),
                             0.0).sum(1)),
        ("the answer's last token (<|end|>) left out",
         "every labelled position counts, <|end|> included: log π(y|x) is the probability of the whole "
         "answer, its stop too",
         lambda: (right * keep).sum(1) - _last_labelled(right, keep)),
        ("the answer's first token left out",
         "every labelled position counts, the first answer token (predicted at <|assistant|>) included",
         lambda: (right * keep).sum(1) - _first_labelled(right, keep)),
        ("log_softmax over the batch (dim 0)",
         "normalise over the vocabulary, the last dim: log_softmax(dim=-1)",
         lambda: picked(x.log_softmax(0))[0].sum(1)),
        ("no shift (logits[:, t] scored on labels[:, t])",
         "position t's logits predict the NEXT token: score logits[:, :-1] on labels[:, 1:]",
         lambda: picked(lp, shift=False)[0].sum(1)),
        ("the mean over every position (the prompt's and the padding's too) instead of the sum",
         "log π(y|x) is the SUM of the answer's tokens' log p; the positions labelled -100 add nothing "
         "and count for nothing",
         lambda: right.sum(1) / right.size(1)),
        ("the mean over tokens instead of the sum",
         "log π(y|x) is the log-probability of the whole answer: the SUM of its tokens' log p",
         lambda: right.sum(1) / keep.sum(1)),
        ("the -100 positions counted (as token 0)",
         "positions labelled -100 (the prompt, the padding) must add nothing: mask them out after "
         "the gather",
         lambda: lp[:, :-1].gather(-1, labels[:, 1:].clamp(min=0).unsqueeze(-1)).squeeze(-1).sum(1)),
        ("the -100 positions counted (as the last token, index -100 wrapping around)",
         "positions labelled -100 must add nothing: mask them out",
         lambda: lp[:, :-1].gather(-1, (labels[:, 1:] % x.size(-1)).unsqueeze(-1)).squeeze(-1).sum(1)),
        ("softmax without log: probabilities summed",
         "sum log-probabilities (log_softmax), not probabilities",
         lambda: picked(x.softmax(-1))[0].sum(1)),
        ("the log of the summed probabilities",
         "take the log of each token's probability, then sum",
         lambda: picked(x.softmax(-1))[0].sum(1).log()),
        ("log_softmax over the wrong dim (the positions, dim 1)",
         "normalise over the vocabulary, the last dim: log_softmax(dim=-1)",
         lambda: picked(x.log_softmax(1))[0].sum(1)),
        ("the probabilities of the argmax, not of the label",
         "gather at the label's id, the token that was written, not the most likely one",
         lambda: torch.where(keep, lp[:, :-1].max(-1).values, 0.0).sum(1)),
        ("raw logits summed (no log_softmax)",
         "a logit is not a log-probability until it is normalised: log_softmax first",
         lambda: picked(x)[0].sum(1)),
        ("the sum of -log p (the loss), not of log p",
         "a log-probability is negative; the loss is its negative",
         lambda: -right.sum(1)),
        ("one number for the batch (the sum over every row)",
         "return one log-probability per row, shape (N,)", lambda: right.sum()),
    ]


@checker
@no_raw_errors
def check_sequence_log_probs(fn: Callable[..., Any]) -> None:
    """Check ``fn(logits (N, T, V), labels (N, T)) -> (N,)``, with gradients."""
    _refuse_handed_in(fn, "the sequence log-probabilities")
    for n, (case, N, prompts, answers, V, dtype) in enumerate(_LOGP_CASES):
        logits, labels = _logp_inputs(n, N, prompts, answers, V, dtype)
        leaf = logits.clone().requires_grad_(True)
        try:
            out = _call(fn, leaf, labels.clone(), case=case, what="the sequence log-probabilities",
                        hint=f"It was given logits {tuple(logits.shape)} ({dtype}) and labels "
                             f"{tuple(labels.shape)} (int64, -100 outside the answers).")
        except CheckFailure as err:
            if "Expected target size" not in str(err):
                raise
            name = "F.cross_entropy given the classes in the last dim"
            raise CheckFailure(f"Likely mistake ({case}): {name}. {err} F.cross_entropy reads the classes "
                               "(here the vocabulary) from dim 1 of a 3-D input; these logits have them "
                               "last.", mistake=name) from None
        expected = _logp_reference(logits, labels).detach()
        if not isinstance(out, torch.Tensor):
            raise CheckFailure(f"Your function returns a {type(out).__name__} ({case}), expected a tensor "
                               f"of shape ({N},).")
        value = plain(out, "your log-probabilities")
        if not value.is_floating_point():
            raise CheckFailure(f"Your result has dtype {value.dtype} ({case}): log-probabilities are "
                               "floats.")
        if value.shape == expected.shape and not torch.isfinite(value).all():
            rows = [i for i in range(N) if not torch.isfinite(value[i])]
            if float(expected[rows[0]]) > -80:
                raise CheckFailure(f"Your log-probabilities hold {float(value[rows[0]])} for row {rows[0]} "
                                   f"({case}), where the sum of its answer's log-probabilities is "
                                   f"{float(expected[rows[0]]):.3g}. Print the per-token values of that row.")
            name = "a product of probabilities, then the log"
            raise CheckFailure(f"Likely mistake ({case}): {name}? Your log-probabilities are "
                               f"{float(value[rows[0]])} for row {rows[0]}, whose answer's log-probability is "
                               f"{float(expected[rows[0]]):.0f}: e to that power is below the smallest float32, so "
                               "a product of the tokens' probabilities rounds to 0 on long answers. Sum the "
                               "tokens' log-probabilities.", mistake=name)
        if value.shape != expected.shape or not torch.allclose(f64(value), expected, atol=1e-4, rtol=1e-5):
            for name, hint, compute in _logp_variants(logits, labels):
                try:
                    wrong = compute()
                except Exception:  # noqa: BLE001 (a variant that cannot exist for this case)
                    continue
                if wrong.shape == value.shape and torch.allclose(f64(value), wrong, atol=1e-4, rtol=1e-5):
                    raise CheckFailure(f"Likely mistake ({case}): {name}. {hint}.", mistake=name)
            if value.shape != expected.shape:
                raise CheckFailure(f"Your result has shape {tuple(value.shape)} ({case}), expected ({N},): "
                                   "one log-probability per row.")
            diff = (f64(value) - expected).abs()
            rows = [i for i in range(N) if diff[i] > 1e-4 + 1e-5 * float(expected[i].abs())]
            raise CheckFailure(f"Your log-probabilities differ from the sum over each answer's tokens of "
                               f"log p(label | before) ({case}): rows {rows} of {N} differ, by up to "
                               f"{float(diff.max()):.3g} (you give {float(value[rows[0]]):.4g} for row "
                               f"{rows[0]}, the sum gives {float(expected[rows[0]]):.4g}). Print both for "
                               "that row.")
        if out.grad_fn is None or not out.requires_grad:
            raise CheckFailure(f"Your result carries no gradient ({case}): DPO trains through it, so the "
                               "log-probabilities must stay in the autograd graph of the logits (no "
                               "torch.no_grad(), .detach() or .item() here).")
        weights = torch.linspace(0.5, 1.5, N, dtype=out.dtype)
        (out * weights).sum().backward()
        ref_leaf = f64(logits).requires_grad_(True)
        (_logp_reference(ref_leaf, labels) * weights.double()).sum().backward()
        if leaf.grad is None or not torch.allclose(f64(leaf.grad), ref_leaf.grad, atol=1e-5, rtol=1e-4):
            raise CheckFailure(f"Your values are right but their gradient with respect to the logits "
                               f"is not ({case}): is part of the computation done outside autograd?")
    print(f"check_sequence_log_probs: right on all {len(_LOGP_CASES)} batches (several N, T, V, prompts "
          "of different lengths, padding, float32 and float64), values and gradients. Well done!")
