"""Checkers for the exercises of lesson 06 (training on the copy task).

* ``check_label_smoothing(fn_or_cls)``: either a function ``fn(logits, labels, pad_id, smoothing)
  -> scalar`` or a module class ``cls(vocab_size, pad_id, smoothing)`` called as ``module(logits,
  labels)``; logits ``(B, L, V)`` or ``(N, V)``, labels ``(B, L)`` or ``(N,)``. The reference is
  ``course_lib.LabelSmoothingLoss``: target ``1 - eps`` on the label, ``eps / (V - 2)`` on every class
  except the label and pad, ``0`` on pad; pad labels ignored; mean over the non-pad tokens.
* ``check_greedy_decode(fn)``: ``fn(model, src (B, L_s), max_len, start_id) -> ids (B, max_len)``,
  reference ``course_lib.greedy_decode``; the cases include padded sources, so decoding without the
  source mask is caught. No exercise calls it any more (the missing mask is lesson 05's Debug
  exercise); it stays for learners who write their own greedy loop after lesson 06's section on it.
* ``check_smoothing_floor(fn)``: ``fn() -> float``, the predicted lowest loss of
  ``LabelSmoothingLoss(V=11, pad_id=0, smoothing=0.1)`` (a "predict, then run" question).
* ``check_shift(fn)``: ``fn(tgt (B, L), sos_id) -> (tgt_in, tgt_out)``, both ``(B, L)``: decoder input
  ``<sos> + tgt[:, :-1]`` and labels ``tgt`` (what ``CopyTask.make_batch`` does).
* ``check_train_step(fn)``: ``fn(model, (src, tgt_in, tgt_out), optimizer, loss_fn) -> float``, one
  training step (the lesson's debug exercise: the buggy step never zeroes the gradients).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..decoding import greedy_decode
from ..masks import padding_mask
from ..model import Transformer, TransformerConfig
from ..training import LabelSmoothingLoss
from .common import (CheckFailure, Mistake, checker, compare, course_lib_used, expect_shape, passed,
                     run_learner)

__all__ = [
    "check_label_smoothing", "check_greedy_decode", "check_shift", "check_smoothing_floor",
    "check_train_step",
]


# ----------------------------------------------------------------------------------------------
# check_label_smoothing
# ----------------------------------------------------------------------------------------------

def _smoothed_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    pad_id: int,
    eps: float,
    spread: str = "V-2",
    zero_pad_class: bool = True,
    ignore_pad_rows: bool = True,
    denominator: str = "non-pad",
    log_probs: str = "log_softmax",
    softmax_dim: int = -1,
    flatten: str = "same",
    kl: bool = False,
    label_mass: str = "1-eps",
    class_mean: bool = False,
) -> torch.Tensor:
    """Label-smoothed cross-entropy with one thing changed, to reproduce a learner's likely mistake.

    ``spread``: what ``eps`` is divided by on the other classes ("V-2", "V-1", "V", or "V, label too":
    the label gets ``1 - eps + eps/V``, nn.CrossEntropyLoss's convention); ``denominator``: "non-pad", "all"
    (every position) or "none" (a sum); ``log_probs``: "log_softmax", "softmax" (probabilities) or
    "logits" (raw scores); ``flatten``: "same", or "transposed" (logits flattened position-major);
    ``kl``: the KL divergence sum q (log q - log p) instead of the cross-entropy; ``label_mass``:
    "1-eps" (right), "1" (the label keeps 1, so the row sums to more than 1) or "added" (the label
    gets 1 - eps on top of its share of eps); ``class_mean``: also divided by V (a mean over classes).
    """
    V = logits.size(-1)
    scores = logits
    if log_probs == "log_softmax":
        scores = F.log_softmax(logits, dim=softmax_dim)
    elif log_probs == "softmax":
        scores = logits.softmax(dim=softmax_dim)
    if flatten == "transposed" and scores.dim() == 3:
        scores = scores.transpose(0, 1)  # (B, L, V) -> (L, B, V): flattened in a different order
    scores = scores.reshape(-1, V)
    labels = labels.reshape(-1)
    divisor = {"V-2": V - 2, "V-1": V - 1, "V": V, "V, label too": V}[spread]
    target = torch.full_like(scores, eps / divisor)
    if spread == "V, label too":
        target += F.one_hot(labels, V).to(scores.dtype) * (1.0 - eps)  # nn.CrossEntropyLoss: eps/V everywhere
    elif label_mass == "added":
        target += F.one_hot(labels, V).to(scores.dtype) * (1.0 - eps)
    else:
        target.scatter_(1, labels.unsqueeze(1), 1.0 if label_mass == "1" else 1.0 - eps)
    if zero_pad_class:
        target[:, pad_id] = 0.0
    if ignore_pad_rows:
        target[labels == pad_id] = 0.0
    total = -(target * scores).sum()
    if kl:  # + sum q log q (0 log 0 = 0): the Annotated Transformer's nn.KLDivLoss
        total = total + torch.xlogy(target, target).sum()
    if class_mean:
        total = total / V
    if denominator == "non-pad":
        return total / (labels != pad_id).sum()
    if denominator == "all":
        return total / labels.numel()
    return total


def _label_smoothing_mistakes() -> list[Mistake]:
    def m(name: str, hint: str, **kw: Any) -> Mistake:
        return Mistake(name, hint, lambda lg, lb, pad, eps: _smoothed_loss(lg, lb, pad, eps, **kw))

    pad_hint = (
        "A position whose label is <pad> is not a token to predict: give it an all-zero target row "
        "(target[labels == pad_id] = 0) and divide by the number of non-pad labels, (labels != pad_id).sum()."
    )
    pad_class_hint = (
        "The model should never predict <pad>, so the target puts no mass on it: after filling, set the pad "
        "column to 0 (target[:, pad_id] = 0) and spread eps over the V - 2 classes that are neither the label "
        "nor pad."
    )
    eps_v_hint = (
        "That is nn.CrossEntropyLoss(label_smoothing=eps)'s convention: it spreads eps/V over ALL V classes, "
        "the label and pad included. Here the label gets exactly 1 - eps, pad gets 0 and each of the other "
        "V - 2 classes gets eps / (V - 2)."
    )
    log_hint = (
        "Cross-entropy needs log-probabilities: F.log_softmax(logits, dim=-1) (one stable step; not "
        "torch.log(softmax(...)), which can give -inf)."
    )
    axis_hint = (
        "The classes are the LAST axis of logits, for (B, L, V) and for (N, V): use log_softmax(dim=-1), "
        "not a fixed dim=1 (which is the position axis of a (B, L, V) tensor)."
    )
    flatten_hint = (
        "Flatten both with reshape: logits.reshape(-1, V) and labels.reshape(-1), so row i of the logits "
        "still belongs to label i. Do not transpose one of them first."
    )
    not_zeroed_hint = (
        "<pad> must get nothing twice over: set the pad column to 0 (target[:, pad_id] = 0: the "
        "model should never predict <pad>) and the rows whose label is <pad> to 0 (target[labels == "
        "pad_id] = 0: those positions are not tokens to predict)."
    )
    return [
        m("pad not zeroed: neither the pad column nor the pad-label rows of the target are 0",
          not_zeroed_hint, zero_pad_class=False, ignore_pad_rows=False),
        m("pad not zeroed: neither the pad column nor the pad-label rows of the target are 0",
          not_zeroed_hint, zero_pad_class=False, ignore_pad_rows=False, denominator="all"),
        Mistake("pad id hard-coded as 0 (pad_id not used)",
                "Use the pad_id argument wherever <pad> is meant; the checker also tries pad_id=2.",
                lambda lg, lb, pad, eps: _smoothed_loss(lg, lb, 0, eps)),
        m("the label keeps 1 instead of 1 - eps (the target row sums to more than 1)",
          "Smoothing MOVES eps from the label to the other classes: the label gets 1 - eps, so that "
          "the row still sums to 1.", label_mass="1"),
        m("the label gets 1 - eps on top of its share eps/(V-2) (the row sums to more than 1)",
          "Fill with eps / (V - 2) and then SET the label's entry to 1 - eps (scatter_), rather than "
          "adding 1 - eps to it.", label_mass="added"),
        m("averaged over the classes too (a mean over V where a sum belongs)",
          "The cross-entropy of one token is a SUM over the classes, -sum_v q(v) log p(v); average "
          "only over the non-pad tokens.", class_mean=True),
        m("pad positions not ignored (pad labels still contribute to the loss)", pad_hint, ignore_pad_rows=False),
        m("pad positions not ignored (pad labels still contribute to the loss)", pad_hint,
          ignore_pad_rows=False, denominator="all"),
        m("pad positions not ignored (averaged over ALL positions, pad included)", pad_hint, denominator="all"),
        m("eps/V instead of eps/(V-2) (nn.CrossEntropyLoss's convention)", eps_v_hint, spread="V, label too",
          zero_pad_class=False),
        m("eps/V instead of eps/(V-2) (nn.CrossEntropyLoss's convention)", eps_v_hint, spread="V, label too"),
        m("eps/V instead of eps/(V-2) (nn.CrossEntropyLoss's convention)", eps_v_hint, spread="V"),
        m("eps/V instead of eps/(V-2) (nn.CrossEntropyLoss's convention)", eps_v_hint, spread="V",
          zero_pad_class=False),
        m("smoothing mass put on the pad class", pad_class_hint, zero_pad_class=False),
        m("smoothing mass put on the pad class", pad_class_hint, spread="V-1", zero_pad_class=False),
        m("eps/(V-1) instead of eps/(V-2): the pad column was zeroed but still counted", pad_class_hint,
          spread="V-1"),
        m("summed instead of averaged over the tokens",
          "Divide the summed loss by the number of non-pad labels, so the loss (and the learning rate that "
          "suits it) does not depend on the batch size or the sequence length.", denominator="none"),
        m("no log_softmax: you used probabilities (softmax) instead of log-probabilities", log_hint,
          log_probs="softmax"),
        m("no log_softmax: you used the raw logits instead of log-probabilities", log_hint, log_probs="logits"),
        m("KL divergence instead of cross-entropy (nn.KLDivLoss, as in the Annotated Transformer)",
          "KL(q || p) = cross-entropy - entropy(q): the same gradients, but a different number. This lesson's "
          "loss is the cross-entropy -(target * log_probs).sum() / number of non-pad labels.", kl=True),
        m("wrong shape handling: log_softmax over the wrong axis", axis_hint, softmax_dim=1),
        m("wrong shape handling: log_softmax over the wrong axis", axis_hint, softmax_dim=0),
        m("wrong shape handling: logits and labels flattened in different orders", flatten_hint,
          flatten="transposed"),
    ]


def _label_smoothing_cases() -> list[tuple[str, torch.Tensor, torch.Tensor, int, float]]:
    g = torch.Generator().manual_seed(6)
    cases = []
    # 1. (B, L, V) with some pad labels at the end of the rows; V = 7, so V - 2 = 5 differs from V - 1 and V.
    logits = torch.randn(2, 5, 7, generator=g) * 2
    labels = torch.tensor([[3, 5, 2, 0, 0], [6, 1, 4, 2, 0]])
    cases.append(("logits (2, 5, 7), pad_id=0, smoothing=0.1, three pad labels", logits, labels, 0, 0.1))
    # 2. (B, L, V) with L != B != V and a pad id that is not 0.
    logits = torch.randn(3, 4, 6, generator=g) * 2
    labels = torch.tensor([[1, 5, 2, 2], [4, 0, 3, 2], [5, 5, 1, 2]])
    cases.append(("logits (3, 4, 6), pad_id=2, smoothing=0.2", logits, labels, 2, 0.2))
    # 3. Flat (N, V) logits.
    logits = torch.randn(6, 5, generator=g) * 2
    labels = torch.tensor([2, 0, 4, 3, 0, 1])
    cases.append(("flat logits (6, 5), labels (6,), pad_id=0, smoothing=0.3", logits, labels, 0, 0.3))
    # 4. No smoothing: plain cross-entropy that ignores pad.
    logits = torch.randn(2, 3, 9, generator=g) * 2
    labels = torch.tensor([[7, 8, 0], [2, 3, 4]])
    cases.append(("logits (2, 3, 9), pad_id=0, smoothing=0.0 (plain cross-entropy)", logits, labels, 0, 0.0))
    return cases


def _label_smoothing_runner(candidate: Any) -> Callable[[torch.Tensor, torch.Tensor, int, float], Any]:
    """A class is built as ``cls(vocab_size, pad_id, smoothing)`` and called on (logits, labels)."""
    if inspect.isclass(candidate):
        def run(logits: torch.Tensor, labels: torch.Tensor, pad_id: int, eps: float) -> Any:
            return candidate(logits.size(-1), pad_id, eps)(logits, labels)
        return run
    return candidate


@checker
def check_label_smoothing(candidate: Any) -> None:
    """Check a label-smoothed loss, ``fn(logits, labels, pad_id, smoothing)`` or
    ``cls(vocab_size, pad_id, smoothing)(logits, labels)``, against ``course_lib.LabelSmoothingLoss``."""
    used = course_lib_used(candidate, (LabelSmoothingLoss,))
    if used is not None:
        raise CheckFailure(
            f"You handed in course_lib's `{used}` (or code that calls it). Write the loss yourself: "
            "build the (N, V) target rows, take F.log_softmax(logits, dim=-1), and divide the sum of "
            "-target * log_probs by the number of non-pad labels."
        )
    run = _label_smoothing_runner(candidate)
    mistakes = _label_smoothing_mistakes()
    cases = _label_smoothing_cases()
    fix = ("Flatten logits to (N, V) and labels to (N,) with reshape, build the (N, V) target with "
           "torch.full and scatter_, and keep every step in torch (no .item() or numpy).")
    for case, logits, labels, pad_id, eps in cases:
        got = run_learner(run, logits.clone(), labels.clone(), pad_id, eps, case=case, hint=fix)
        if isinstance(got, (float, int)):
            got = torch.tensor(float(got))
        if not isinstance(got, torch.Tensor):
            raise CheckFailure(f"Return the loss as a torch scalar tensor; got {type(got).__name__} ({case}).")
        if got.dim() != 0:
            if got.numel() == 1:
                got = got.reshape(())
            else:
                raise CheckFailure(
                    f"Likely mistake ({case}): wrong shape handling: the loss is not a scalar, it has shape "
                    f"{tuple(got.shape)}. Return ONE number: the sum over every token and class of "
                    "-target * log_prob, divided by the number of non-pad labels."
                )
        expected = LabelSmoothingLoss(logits.size(-1), pad_id, eps)(logits, labels)
        compare(got.detach(), expected, (logits, labels, pad_id, eps), mistakes, case)
    passed("check_label_smoothing", len(cases))


# ----------------------------------------------------------------------------------------------
# check_greedy_decode
# ----------------------------------------------------------------------------------------------

def _decode_variant(
    model: Transformer,
    src: torch.Tensor,
    max_len: int,
    start_id: int,
    feed: str = "prefix",
    pick: str = "last",
    steps: int | None = None,
    keep_start: bool = False,
    decode_mask: bool = True,
    invert_mask: str | None = None,
) -> torch.Tensor:
    """Greedy decoding with one thing changed. ``feed``: "prefix" or "last" (only the newest token);
    ``pick``: "last" (correct), "first" (first position's logits) or "axis" (argmax over positions);
    ``decode_mask=False``: the source mask is used to encode but not passed to ``model.decode``."""
    with torch.no_grad():
        src_mask = padding_mask(src, model.config.pad_id)
        memory = model.encode(src, ~src_mask if invert_mask == "both" else src_mask)
        if invert_mask:  # True where the source IS padding: the opposite convention
            src_mask = ~src_mask
        ys = torch.full((src.size(0), 1), start_id, dtype=torch.long)
        for _ in range(max_len if steps is None else steps):
            inp = ys if feed == "prefix" else ys[:, -1:]
            logits = model.generator(model.decode(inp, memory, src_mask if decode_mask else None))
            if pick == "last":
                next_id = logits[:, -1].argmax(dim=-1)
            elif pick == "first":
                next_id = logits[:, 0].argmax(dim=-1)
            else:
                next_id = logits.argmax(dim=1)[:, -1]  # over positions, not the vocabulary
            ys = torch.cat([ys, next_id.unsqueeze(1)], dim=1)
    return ys if keep_start else ys[:, 1:]


def _greedy_mistakes() -> list[Mistake]:
    def m(name: str, hint: str, **kw: Any) -> Mistake:
        return Mistake(name, hint, lambda model, src, n, s: _decode_variant(model, src, n, s, **kw))

    start_hint = "The start symbol is only the decoder's first input, not an output: return ys[:, 1:]."
    return [
        m("source mask not passed to model.decode (cross-attention reads the padding)",
          "The encoder used the mask, but at every step cross-attention must hide the <pad> positions of "
          "the memory too: model.decode(ys, memory, src_mask) with src_mask = padding_mask(src, pad_id). "
          "Without it, a row's output changes with the amount of padding after it.", decode_mask=False),
        m("source mask inverted (True on the <pad> positions)",
          "In this course True means 'may attend': padding_mask(src, pad_id) = (src != pad_id)"
          ".unsqueeze(1). A mask built as src == pad_id hides every real source token.",
          invert_mask="both"),
        m("source mask inverted (True on the <pad> positions)",
          "In this course True means 'may attend': pass decode the same mask as encode, "
          "padding_mask(src, pad_id) = (src != pad_id).unsqueeze(1), not its negation.",
          invert_mask="decode"),
        m("start symbol included in the output", start_hint, keep_start=True),
        Mistake("start symbol included in the output (and the last token dropped to keep the length)", start_hint,
                lambda model, src, n, s: _decode_variant(model, src, n, s, keep_start=True)[:, :n]),
        m("decoder fed only the last token (no growing prefix)",
          "At step t the decoder must see the whole prefix <sos>, y_1, ..., y_t (the causal mask keeps it "
          "honest), exactly as in training: decode(ys, ...), not decode(ys[:, -1:], ...).", feed="last"),
        m("argmax over the wrong axis (positions instead of the vocabulary)",
          "Take the logits of the last position, (B, V), and argmax over the vocabulary: "
          "model.generator(hidden[:, -1]).argmax(dim=-1).", pick="axis"),
        m("next token taken from the FIRST position instead of the last",
          "Position t-1's output predicts token t: use hidden[:, -1], the newest position.", pick="first"),
        Mistake("off-by-one length: one token too many",
                "Generate exactly max_len tokens: range(max_len) steps, each appending one token.",
                lambda model, src, n, s: _decode_variant(model, src, n, s, steps=n + 1)),
        Mistake("off-by-one length: one token too few",
                "Generate exactly max_len tokens: range(max_len) steps, each appending one token "
                "(the start symbol does not count).",
                lambda model, src, n, s: _decode_variant(model, src, n, s, steps=n - 1)),
    ]


def _greedy_model() -> Transformer:
    """A small random model whose outputs change with every token of the prefix."""
    torch.manual_seed(6)
    cfg = TransformerConfig(d_model=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=2, d_ff=64)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        model.generator.weight.mul_(4.0)  # sharper, more varied argmax
    return model


def _greedy_cases() -> list[tuple[str, torch.Tensor, int, int]]:
    g = torch.Generator().manual_seed(6)
    return [
        ("src (4, 6), max_len=6, start_id=1", torch.randint(2, 11, (4, 6), generator=g), 6, 1),
        ("src (3, 7), max_len=4 (shorter than the source), start_id=1", torch.randint(2, 11, (3, 7), generator=g), 4, 1),
        ("one sequence, src (1, 5), max_len=8, start_id=1", torch.randint(2, 11, (1, 5), generator=g), 8, 1),
        ("padded sources: src (3, 8) whose rows end in 0, 3 and 5 <pad> ids, max_len=6, start_id=1",
         _padded(torch.randint(2, 11, (3, 8), generator=g), [8, 5, 3]), 6, 1),
    ]


def _padded(src: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Set every id after ``lengths[b]`` in row b to the pad id 0."""
    keep = torch.arange(src.size(1)) < torch.tensor(lengths)[:, None]
    return src.masked_fill(~keep, 0)


@checker
def check_greedy_decode(fn: Callable[..., Any]) -> None:
    """Check ``fn(model, src, max_len, start_id) -> (B, max_len)`` ids against ``course_lib.greedy_decode``."""
    model = _greedy_model()
    mistakes = _greedy_mistakes()
    cases = _greedy_cases()
    fix = ("Encode the source once (model.encode(src)), keep ys (B, t) starting with the start symbol, and at "
           "every step call model.decode(ys, memory, src_mask), then model.generator(...) on the last position.")
    for case, src, max_len, start_id in cases:
        got = run_learner(fn, model, src.clone(), max_len, start_id, case=case, hint=fix)
        if not isinstance(got, torch.Tensor):
            raise CheckFailure(f"Return a (B, max_len) tensor of token ids; got {type(got).__name__} ({case}).")
        if got.is_floating_point():
            raise CheckFailure(
                f"Likely mistake ({case}): returning logits instead of ids: your output is a float tensor of shape "
                f"{tuple(got.shape)}. Take the argmax over the vocabulary at each step and return the chosen ids, "
                "a long tensor (B, max_len)."
            )
        expected = greedy_decode(model, src, max_len=max_len, start_id=start_id)
        try:
            compare(got.long(), expected, (model, src, max_len, start_id), mistakes, case, atol=0)
        except CheckFailure as err:
            if got.shape != expected.shape and not str(err).startswith("Likely mistake"):
                expect_shape(got, expected.shape, "the generated ids",
                             "Return (B, max_len) ids, without the start symbol.")
            raise
    passed("check_greedy_decode", len(cases))


# ----------------------------------------------------------------------------------------------
# check_shift
# ----------------------------------------------------------------------------------------------

def _shift_mistakes() -> list[Mistake]:
    def prepend(x: torch.Tensor, value: int) -> torch.Tensor:
        return torch.cat([torch.full((x.size(0), 1), value, dtype=x.dtype), x], dim=1)

    def append_pad(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, torch.zeros(x.size(0), 1, dtype=x.dtype)], dim=1)

    double_hint = (
        "Shift only ONCE: the decoder input is <sos> + tgt[:, :-1] and the labels are tgt itself. Shifting the "
        "labels as well (tgt[:, 1:]) makes position t predict the token two ahead of its input, and the copy fails."
    )
    labels_hint = (
        "Shift the INPUTS, not the labels: tgt_in = <sos> + tgt[:, :-1], tgt_out = tgt. With tgt_in = tgt and "
        "tgt_out = tgt[:, 1:] the first token is never predicted and generation has no start symbol to begin from."
    )
    return [
        Mistake("no shift: the decoder input equals the labels",
                "Position t would be shown the token it must predict, so the model learns to copy its input and "
                "fails at generation time. Use tgt_in = <sos> + tgt[:, :-1].",
                lambda tgt, sos: (tgt.clone(), tgt.clone())),
        Mistake("double shift: both the decoder input and the labels are shifted", double_hint,
                lambda tgt, sos: (prepend(tgt[:, :-1], sos), append_pad(tgt[:, 1:]))),
        Mistake("double shift: both the decoder input and the labels are shifted", double_hint,
                lambda tgt, sos: (prepend(tgt[:, :-1], sos), tgt[:, 1:])),
        Mistake("double shift: both the decoder input and the labels are shifted", double_hint,
                lambda tgt, sos: (prepend(tgt[:, :-2], sos), tgt[:, 1:])),
        Mistake("labels shifted instead of inputs", labels_hint,
                lambda tgt, sos: (tgt.clone(), append_pad(tgt[:, 1:]))),
        Mistake("labels shifted instead of inputs", labels_hint,
                lambda tgt, sos: (tgt[:, :-1], tgt[:, 1:])),
        Mistake("start symbol in the labels: tgt_out is the decoder input",
                "The labels are the target itself, tgt_out = tgt; the start symbol is never predicted.",
                lambda tgt, sos: (prepend(tgt[:, :-1], sos), prepend(tgt[:, :-1], sos))),
        Mistake("start symbol appended instead of prepended",
                "The start symbol goes FIRST: torch.cat([sos_column, tgt[:, :-1]], dim=1).",
                lambda tgt, sos: (torch.cat([tgt[:, 1:], torch.full((tgt.size(0), 1), sos, dtype=tgt.dtype)], 1),
                                  tgt.clone())),
    ]


def _shift_shapes_first(got: tuple, expected: tuple, inputs: tuple, mistakes: list[Mistake],
                        case: str) -> None:
    """Shapes before values: a known mistake is named, otherwise the wrong shape is."""
    B, L = expected[1].shape
    for what, tensor in zip(("tgt_in", "tgt_out"), got):
        if not isinstance(tensor, torch.Tensor):
            raise CheckFailure(f"Wrong type ({case}): {what} should be a torch.Tensor, got "
                               f"{type(tensor).__name__}.")
    if all(t.shape == e.shape for t, e in zip(got, expected)):
        return
    for mistake in mistakes:  # a known mistake is named first
        try:
            wrong = mistake.compute(*inputs)
        except Exception:
            continue
        if all(g.shape == w.shape and torch.equal(g, w) for g, w in zip(got, wrong)):
            raise CheckFailure(f"Likely mistake ({case}): {mistake.name}. {mistake.hint}", mistake=mistake.name)
    for what, tensor in zip(("tgt_in", "tgt_out"), got):
        if tensor.shape == (B, L + 1) and what == "tgt_in":
            raise CheckFailure(
                f"Wrong shape ({case}): tgt_in is {tuple(tensor.shape)}, expected {(B, L)}: the "
                "start symbol was put in front of the WHOLE target. Drop the last token when you "
                "shift: torch.cat([sos_column, tgt[:, :-1]], dim=1).")
        if tensor.shape != (B, L):
            raise CheckFailure(
                f"Wrong shape ({case}): {what} is {tuple(tensor.shape)}, expected {(B, L)}, the "
                "shape of tgt. Both the decoder input and the labels have one entry per position.")


@checker
def check_shift(fn: Callable[..., Any]) -> None:
    """Check ``fn(tgt (B, L), sos_id) -> (tgt_in, tgt_out)`` against ``CopyTask.make_batch``'s shift."""
    g = torch.Generator().manual_seed(6)
    cases = [
        ("tgt (3, 6), sos_id=1", torch.randint(2, 11, (3, 6), generator=g), 1),
        ("tgt (2, 4), sos_id=7 (a start id that is not 1)", torch.randint(2, 7, (2, 4), generator=g), 7),
        ("one sequence, tgt (1, 10), sos_id=1", torch.randint(2, 11, (1, 10), generator=g), 1),
    ]
    mistakes = _shift_mistakes()
    fix = "Build the start column with torch.full((B, 1), sos_id, dtype=tgt.dtype) and join with torch.cat(..., dim=1)."
    for case, tgt, sos_id in cases:
        got = run_learner(fn, tgt.clone(), sos_id, case=case, hint=fix)
        if isinstance(got, torch.Tensor) or not isinstance(got, (tuple, list)) or len(got) != 2:
            raise CheckFailure(f"Return a pair (tgt_in, tgt_out); got {type(got).__name__} ({case}).")
        sos = torch.full((tgt.size(0), 1), sos_id, dtype=tgt.dtype)
        expected = (torch.cat([sos, tgt[:, :-1]], dim=1), tgt.clone())
        _shift_shapes_first(tuple(got), expected, (tgt, sos_id), mistakes, case)
        compare(tuple(got), expected, (tgt, sos_id), mistakes, case, atol=0)
    passed("check_shift", len(cases))


# ----------------------------------------------------------------------------------------------
# check_smoothing_floor (predict, then run)
# ----------------------------------------------------------------------------------------------

def _entropy(q: torch.Tensor) -> float:
    return float(-torch.xlogy(q, q).sum())


@checker
def check_smoothing_floor(fn: Callable[[], Any]) -> None:
    """Check ``fn() -> float``: the lowest loss ``LabelSmoothingLoss(11, pad_id=0, smoothing=0.1)`` allows."""
    V, eps = 11, 0.1
    got = run_learner(fn, case="your prediction", hint="Return one number, for example 1.234.")
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        raise CheckFailure(f"Return one number (a float such as 1.234), got {type(got).__name__}: {got!r}.")
    truth = LabelSmoothingLoss(V, 0, eps).entropy_floor()
    other = eps / (V - 2)
    why = (f"The cross-entropy -sum q log p is smallest when the model predicts p = q exactly, and then it "
           f"equals the entropy of q: -(0.9 ln 0.9 + 9 x {other:.4f} ln {other:.4f}) = {truth:.3f}.")
    if abs(got - truth) <= 0.002:
        print(f"check_smoothing_floor: right, {truth:.3f}. {why} No model can go lower, however long it trains.")
        return
    torch_q = torch.full((V,), eps / V)
    torch_q[2] += 1 - eps
    v1_q = torch.full((V,), eps / (V - 1))  # eps over V-1 classes (all but the label), label 1 - eps
    v1_q[2] = 1 - eps
    confusions = [
        (0.0, "0 is the floor WITHOUT smoothing (a one-hot target), or of the KL divergence that the Annotated "
              "Transformer computes, which subtracts this very entropy"),
        (float(torch.log(torch.tensor(float(V)))), f"ln {V} is the loss of a model that predicts the uniform "
                                                    "distribution (about where an untrained model starts), not the "
                                                    "lowest loss"),
        (float(torch.log(torch.tensor(float(V - 1)))), f"ln {V - 1} is the loss of a uniform prediction over the "
                                                        "non-pad classes, not the lowest loss"),
        (_entropy(torch_q), "that is the floor of nn.CrossEntropyLoss(label_smoothing=0.1), which spreads eps/V over "
                            "all V classes; course_lib gives pad 0 and eps/(V-2) to each other class"),
        (_entropy(v1_q), "that spreads eps over V-1 = 10 classes; the label and <pad> are excluded, so V-2 = 9"),
        (-0.9 * float(torch.log(torch.tensor(0.9))), "you kept only the label's term; the 9 other classes add "
                                                     "-(eps/9) ln(eps/9) each"),
        (-eps * float(torch.log(torch.tensor(other))), "you kept only the other classes' terms; the label adds "
                                                        "-0.9 ln 0.9"),
    ]
    for value, reason in confusions:
        if abs(got - value) <= 0.002:
            raise CheckFailure(f"Not quite: you predicted {got:.3f}, the floor is {truth:.3f}. Likely mistake: "
                               f"{reason}. {why}", mistake=reason)
    raise CheckFailure(f"Not quite: you predicted {got:.3f}, the floor is {truth:.3f} (give three decimals). {why}")


# ----------------------------------------------------------------------------------------------
# check_train_step (debug: a training step that stalls)
# ----------------------------------------------------------------------------------------------

def _step_variant(kind: str) -> Callable[..., float]:
    """One training step, right (kind "right") or with one mistake."""

    def step(model: torch.nn.Module, batch: tuple, optimizer: torch.optim.Optimizer,
             loss_fn: Callable[..., torch.Tensor]) -> float:
        src, tgt_in, tgt_out = batch
        if kind == "eval":
            model.eval()
        if kind != "never_zeroed":
            optimizer.zero_grad(set_to_none=True)
        decoder_input = tgt_out if kind == "reads_labels" else tgt_in
        labels = tgt_in if kind == "labels_are_inputs" else tgt_out
        loss = loss_fn(model(src, decoder_input), labels)
        loss.backward()
        if kind == "cleared_before_step":
            optimizer.zero_grad(set_to_none=True)
        optimizer.step()
        if kind == "eval":
            model.train()
        return loss.item()

    return step


_STEP_MISTAKES = [
    ("never_zeroed",
     "the gradients are never zeroed: every step adds its batch's gradients to those of all "
     "earlier steps",
     "loss.backward() ADDS to each parameter's .grad. Clear them once per step, before backward: "
     "optimizer.zero_grad() (or model.zero_grad()). Otherwise step k updates with the sum of k "
     "batches' gradients, most of them computed for weights that no longer exist."),
    ("cleared_before_step",
     "the weights never change (optimizer.step() missing, or run before backward(), or the "
     "gradients cleared between backward() and step())",
     "The order is zero_grad, forward, loss, backward, step: optimizer.step() must come after "
     "loss.backward() with nothing clearing the gradients in between, or it finds no gradients "
     "and updates nothing."),
    ("eval",
     "the step runs the model in eval mode: dropout is off while training",
     "Training steps run in training mode (model.train()); eval mode is for measuring."),
    ("reads_labels",
     "the decoder reads the labels: model(src, tgt_out) instead of model(src, tgt_in)",
     "The decoder input is tgt_in (<sos> + the target shifted right); tgt_out are the labels."),
    ("labels_are_inputs",
     "the loss compares with the decoder input tgt_in instead of the labels tgt_out",
     "Score each position on the NEXT token: loss_fn(logits, tgt_out)."),
]


def _train_step_setup(seed: int = 16) -> tuple:
    """A small model with dropout, its Adam optimizer, a loss and three batches of padded data."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(src_vocab_size=11, tgt_vocab_size=11, d_model=16, num_heads=2,
                            num_encoder_layers=1, num_decoder_layers=1, d_ff=32, max_len=16,
                            dropout=0.1, pad_id=0)
    model = Transformer(cfg).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = LabelSmoothingLoss(11, 0, 0.0)
    g = torch.Generator().manual_seed(seed)
    batches = []
    for lengths in ([6, 4, 5], [3, 6, 6], [6, 2, 5]):
        tgt = torch.randint(2, 11, (3, 6), generator=g)
        tgt = tgt.masked_fill(torch.arange(6) >= torch.tensor(lengths)[:, None], 0)
        tgt_in = torch.cat([torch.ones(3, 1, dtype=torch.long), tgt[:, :-1]], dim=1)
        batches.append((tgt.clone(), tgt_in, tgt))
    return model, optimizer, loss_fn, batches


def _trajectory(step_fn: Callable[..., Any], num_steps: int, learner: bool = False
                ) -> list[tuple[Any, list[torch.Tensor]]]:
    """(returned loss, parameters after the step) for each of ``num_steps`` steps."""
    model, optimizer, loss_fn, batches = _train_step_setup()
    out = []
    for k in range(num_steps):
        torch.manual_seed(1000 + k)  # the same dropout masks for every candidate
        batch = tuple(t.clone() for t in batches[k])
        if learner:
            loss = run_learner(step_fn, model, batch, optimizer, loss_fn, case=f"step {k + 1}",
                               hint="The step is: forward, loss, backward, optimizer.step(); "
                                    "return loss.item().")
        else:
            loss = step_fn(model, batch, optimizer, loss_fn)
        out.append((loss, [p.detach().clone() for p in model.parameters()]))
    return out


def _same_step(a: tuple[Any, list[torch.Tensor]], b: tuple[Any, list[torch.Tensor]]) -> bool:
    (loss_a, params_a), (loss_b, params_b) = a, b
    return (abs(float(loss_a) - float(loss_b)) <= 1e-5 * max(1.0, abs(float(loss_b)))
            and all(torch.allclose(p, q, atol=1e-6, rtol=1e-5) for p, q in zip(params_a, params_b)))


@checker
def check_train_step(fn: Callable[..., Any]) -> None:
    """Debug: ``fn(model, (src, tgt_in, tgt_out), optimizer, loss_fn) -> float``, one training
    step. Three steps on a small model with dropout (training mode), Adam, padded batches; the
    returned losses and the weights after each step must match a correct step's."""
    num_steps = 3
    got = _trajectory(fn, num_steps, learner=True)
    for k, (loss, _) in enumerate(got):
        if isinstance(loss, torch.Tensor):
            raise CheckFailure(
                f"Likely mistake (step {k + 1}): the step returns the loss tensor, not a number. "
                "Return loss.item(): a plain float, which does not keep the step's graph alive "
                "(pitfall 2 of this lesson).")
        if isinstance(loss, bool) or not isinstance(loss, (float, int)):
            raise CheckFailure(f"Return the step's loss as a float (loss.item()), got "
                               f"{type(loss).__name__} (step {k + 1}).")
    expected = _trajectory(_step_variant("right"), num_steps)
    for k in range(num_steps):
        if _same_step(got[k], expected[k]):
            continue
        case = f"step {k + 1} of {num_steps}, a model with dropout in training mode"
        for kind, name, hint in _STEP_MISTAKES:
            if _same_step(got[k], _trajectory(_step_variant(kind), k + 1)[k]):
                raise CheckFailure(f"Likely mistake ({case}): {name}. {hint}", mistake=name)
        loss_ok = abs(float(got[k][0]) - float(expected[k][0])) <= 1e-5 * max(1.0, float(expected[k][0]))
        what = ("the loss is right but the weights after the update differ" if loss_ok else
                f"the returned loss is {float(got[k][0]):.4f}, expected {float(expected[k][0]):.4f}")
        raise CheckFailure(f"Output differs from a correct training step ({case}): {what}. None of "
                           "the usual mistakes explains it; compare your step with the order "
                           "zero_grad, forward, loss, backward, step.")
    print(f"check_train_step: all {num_steps} steps match a correct training step (the losses "
          "and the weights after each update). Well done!")
