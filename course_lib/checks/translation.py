"""Checkers for the exercises of lesson 08 (translating dates).

* ``check_make_batch(fn)``: ``fn(pairs, src_vocab, tgt_vocab) -> (src, tgt_in, tgt_out)`` (a tuple,
  or an object with those attributes such as ``course_lib.data.TranslationBatch``) for a list of
  ``(source, target)`` texts and two ``CharVocab``: source ids right-padded, decoder input ``<sos>``
  + target, labels target + ``<eos>``, both right-padded with the pad id. Reference:
  ``course_lib.data.make_translation_batch``.
* ``check_batch_shapes(predicted_shapes, pairs)``: a prediction ``predicted_shapes() -> dict`` of
  the shapes of ``src``, ``src_mask``, ``tgt_in``, ``tgt_mask`` and ``label_mask`` of
  ``make_translation_batch(pairs, ...)``.
* ``check_translate(fn, model, corpus)``: ``fn(model, src (B, L_s), max_len, start_id, end_id) ->
  ids (B, <= max_len)``, greedy decoding of a padded batch; compared as texts (up to ``<eos>``) with
  ``course_lib.greedy_decode`` given the source padding mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..data import CharVocab, DatesCorpus, make_translation_batch, pad_sequences
from ..decoding import greedy_decode
from ..masks import padding_mask
from ._common import CheckFailure, checker, expect_shape, run_learner

__all__ = ["check_make_batch", "check_batch_shapes", "check_translate"]


# ----------------------------------------------------------------------------------------------
# check_make_batch
# ----------------------------------------------------------------------------------------------


def _unpack_batch(out: Any, case: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if all(hasattr(out, name) for name in ("src", "tgt_in", "tgt_out")):
        return out.src, out.tgt_in, out.tgt_out
    if isinstance(out, (tuple, list)) and len(out) == 3:
        return tuple(out)  # type: ignore[return-value]
    raise CheckFailure(
        f"Wrong return value ({case}): return the three tensors (src, tgt_in, tgt_out), got "
        f"{type(out).__name__}."
    )


def _batch_variant(pairs, sv: CharVocab, tv: CharVocab, kind: str):
    """Reference batch with one thing changed, to name a likely mistake."""
    src = [sv.encode(p[0]) for p in pairs]
    tgt = [tv.encode(p[1]) for p in pairs]
    s, e, pad = tv.sos_id, tv.eos_id, sv.pad_id
    tin = [[s, *t] for t in tgt]
    tout = [[*t, e] for t in tgt]
    if kind == "no eos":
        tout = [list(t) for t in tgt]
    elif kind == "no shift":
        tin = [[s, *t] for t in tgt]
        tout = [[s, *t] for t in tgt]
    elif kind == "eos in input":
        tin = [[s, *t, e] for t in tgt]
        tout = [[*t, e] for t in tgt]
    elif kind == "both specials":
        tin = tout = [[s, *t, e] for t in tgt]
    elif kind == "labels shifted twice":
        tout = [[*t[1:], e] for t in tgt]
    elif kind == "source specials":
        src = [[s, *x, e] for x in src]
    elif kind == "source eos":
        src = [[*x, e] for x in src]

    def pad_all(seqs, left=False):
        if not left:
            return pad_sequences(seqs, pad)
        width = max(len(x) for x in seqs)
        return torch.tensor([[pad] * (width - len(x)) + list(x) for x in seqs])

    left = kind == "left padding"
    return pad_all(src, left), pad_all(tin, left), pad_all(tout, left)


_BATCH_MISTAKES = [
    (
        "no shift",
        "the labels equal the decoder input (<sos> + target)",
        "Then position t is scored on the token it already sees. The labels are the target "
        "followed by <eos>: "
        "tgt_out = target + [eos_id], one position ahead of tgt_in = [sos_id] + target.",
    ),
    (
        "no eos",
        "the labels have no <eos> at the end",
        "Without <eos> in the labels the model never learns to stop, and decoding runs to max_len. "
        "tgt_out = target + [eos_id].",
    ),
    (
        "eos in input",
        "<eos> was added to the decoder input too",
        "The decoder input is [sos_id] + target only: it never needs to read <eos>, and then "
        "tgt_in and "
        "tgt_out have the same length, target + 1.",
    ),
    (
        "both specials",
        "<sos> and <eos> on both sides",
        "That is the usual way to *store* a target; for teacher forcing split it once: tgt_in "
        "drops the last "
        "token ([sos] + target), tgt_out drops the first (target + [eos]).",
    ),
    (
        "labels shifted twice",
        "the labels are shifted twice (target[1:] + <eos>)",
        "Shift once: tgt_out = target + [eos_id], starting with the target's FIRST character.",
    ),
    (
        "source specials",
        "the source got <sos> and <eos>",
        "The source ids are the characters only, with the source vocabulary: no specials.",
    ),
    (
        "source eos",
        "the source got an <eos>",
        "The source ids are the characters only, with the source vocabulary: no specials.",
    ),
    (
        "left padding",
        "padded on the left",
        "Pad on the right (as pad_sequences does): the first token sits at position 0 in every "
        "row, which is "
        "what the sinusoidal positions and <sos> at position 0 expect.",
    ),
]


def _batch_cases() -> list[tuple[str, list[tuple[str, str]]]]:
    corpus = DatesCorpus(num_heldout=24, seed=8)
    dates = [(p.source, p.target) for p in corpus.heldout[:6]]
    phrases = [
        ("drei Hunde", "three dogs"),
        ("ja", "yes"),
        ("Guten Morgen", "good morning"),
        ("Montag", "Monday"),
    ]
    return [
        ("six held-out dates in different formats", dates),
        ("phrases of different lengths on both sides", phrases),
        ("a single pair", [("März", "March")]),
    ]


@checker
def check_make_batch(fn: Callable[..., Any]) -> None:
    """``fn(pairs, src_vocab, tgt_vocab) -> (src, tgt_in, tgt_out)``, all right-padded with the pad
    id."""
    cases = _batch_cases()
    for case, pairs in cases:
        sv = CharVocab.build(p[0] for p in pairs)
        tv = CharVocab.build(p[1] for p in pairs)
        got = _unpack_batch(run_learner(fn, pairs, sv, tv, case=case), case)
        ref = make_translation_batch(pairs, sv, tv)
        expected = (ref.src, ref.tgt_in, ref.tgt_out)
        for name, g, e in zip(("src", "tgt_in", "tgt_out"), got, expected):
            if not isinstance(g, torch.Tensor):
                raise CheckFailure(
                    f"Wrong type ({case}): {name} should be a torch.Tensor, got {type(g).__name__}."
                )
        if all(g.shape == e.shape and torch.equal(g.long(), e) for g, e in zip(got, expected)):
            continue
        for kind, name, hint in _BATCH_MISTAKES:
            wrong = _batch_variant(pairs, sv, tv, kind)
            if all(g.shape == w.shape and torch.equal(g.long(), w) for g, w in zip(got, wrong)):
                raise CheckFailure(f"Likely mistake ({case}): {name}. {hint}")
        for name, g, e in zip(("src", "tgt_in", "tgt_out"), got, expected):
            expect_shape(
                g,
                tuple(e.shape),
                f"{name} ({case})",
                "src: (B, longest source in characters); tgt_in and tgt_out: (B, longest target + "
                "1).",
            )
            if not torch.equal(g.long(), e):
                row = int((g.long() != e).any(dim=1).nonzero()[0])
                raise CheckFailure(
                    f"{name} differs from course_lib's ({case}), first in row {row} "
                    f"{pairs[row]!r}: got "
                    f"{g[row].tolist()}, expected {e[row].tolist()}. Ids: <pad>=0, <sos>=1, "
                    f"<eos>=2."
                )
    print(
        f"check_make_batch: all {len(cases)} cases match course_lib's make_translation_batch. "
        f"Well done!"
    )


# ----------------------------------------------------------------------------------------------
# check_batch_shapes (a prediction)
# ----------------------------------------------------------------------------------------------

_SHAPE_KEYS = ("src", "src_mask", "tgt_in", "tgt_mask", "label_mask")


def _as_shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, torch.Size):
        return tuple(value)
    if isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value):
        return tuple(value)
    return None


@checker
def check_batch_shapes(
    predicted_shapes: Callable[[], dict], pairs: Sequence[Sequence[str]]
) -> None:
    """Compare a predicted ``{name: shape}`` with the shapes of ``make_translation_batch(pairs,
    ...)``."""
    prediction = predicted_shapes()
    if not isinstance(prediction, dict) or set(prediction) != set(_SHAPE_KEYS):
        raise CheckFailure(
            f"Return a dict with exactly the keys {list(_SHAPE_KEYS)}, each a shape tuple; got "
            f"{prediction if not isinstance(prediction, dict) else sorted(prediction)}."
        )
    B = len(pairs)
    L_s = max(len(p[0]) for p in pairs)
    L_t = max(len(p[1]) for p in pairs) + 1
    truth = {
        "src": (B, L_s),
        "src_mask": (B, 1, L_s),
        "tgt_in": (B, L_t),
        "tgt_mask": (B, L_t, L_t),
        "label_mask": (B, L_t),
    }
    sv = CharVocab.build(p[0] for p in pairs)
    tv = CharVocab.build(p[1] for p in pairs)
    batch = make_translation_batch(pairs, sv, tv)
    assert truth == {k: tuple(getattr(batch, k).shape) for k in _SHAPE_KEYS}  # the truth, measured
    longest = max(pairs, key=lambda p: len(p[1]))[1]
    explain = {
        "src": f"B = {B} pairs, and L_s = {L_s} is the longest source in CHARACTERS (spaces and "
            f"punctuation "
        "count: the vocabulary is character-level); shorter rows are padded up to it.",
        "src_mask": f"The source padding mask is (B, 1, L_s) = {truth['src_mask']}: it depends "
            f"only on the key "
        "(which source positions are real), so it has ONE row that broadcasts over every query, "
        "in the encoder and in cross-attention alike.",
        "tgt_in": f"L_t = {L_t}: the longest target ({longest!r}, {len(longest)} characters) plus "
            f"one, because "
        "the decoder input is <sos> + target.",
        "tgt_mask": f"The decoder mask is padding AND causal: one (L_t, L_t) lower triangle per "
            f"row, (B, L_t, L_t) "
        f"= {truth['tgt_mask']}. Padding differs per row, so it keeps the batch axis.",
        "label_mask": f"The label mask marks which labels count in the loss: one flag per label, "
            f"(B, L_t) = "
        f"{truth['label_mask']}, the same shape as tgt_out (target + <eos>).",
    }
    wrong = []
    for key in _SHAPE_KEYS:
        got = _as_shape(prediction[key])
        if got != truth[key]:
            wrong.append(f"{key}: you said {prediction[key]!r}, it is {truth[key]}. {explain[key]}")
    if wrong:
        raise CheckFailure("Not quite:\n- " + "\n- ".join(wrong))
    print(
        f"check_batch_shapes: all {len(_SHAPE_KEYS)} shapes right, L_s = {L_s} and L_t = {L_t}. "
        f"Well done!"
    )


# ----------------------------------------------------------------------------------------------
# check_translate (debug: the source padding mask)
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def _decode_variant(model, src, max_len, start_id, end_id, kind: str) -> torch.Tensor:
    mask = padding_mask(src, model.config.pad_id)
    full = torch.ones_like(mask)
    enc_mask, dec_mask = {
        "right": (mask, mask),
        "no decoder mask": (mask, None),
        "no masks": (full, None),
    }[kind]
    memory = model.encode(src, enc_mask)
    ys = torch.full((src.size(0), 1), start_id, dtype=torch.long)
    for _ in range(max_len):
        next_id = model.generator(model.decode(ys, memory, dec_mask)[:, -1]).argmax(-1)
        ys = torch.cat([ys, next_id[:, None]], dim=1)
    return ys[:, 1:]


@checker
def check_translate(fn: Callable[..., Any], model: torch.nn.Module, corpus: DatesCorpus) -> None:
    """``fn(model, src, max_len, start_id, end_id)`` must translate padded batches as course_lib
    does."""
    model.eval()
    tv = corpus.tgt_vocab
    pairs = corpus.heldout[:300]
    cases = [
        ("300 held-out dates, padded to the longest", pairs),
        (
            "one short date next to one long one",
            [min(pairs, key=lambda p: len(p.source)), max(pairs, key=lambda p: len(p.source))],
        ),
    ]
    for case, ps in cases:
        src = pad_sequences(
            [corpus.src_vocab.encode(p.source) for p in ps], corpus.src_vocab.pad_id
        )
        with torch.no_grad():
            got = run_learner(fn, model, src, 11, tv.sos_id, tv.eos_id, case=case)
        if not isinstance(got, torch.Tensor) or got.dim() != 2 or got.size(0) != src.size(0):
            raise CheckFailure(
                f"Wrong output ({case}): expected ids of shape (B={src.size(0)}, up to 11), got "
                f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}."
            )
        texts = [tv.decode(row) for row in got.tolist()]
        ref = greedy_decode(
            model, src, 11, tv.sos_id, end_id=tv.eos_id, src_mask=padding_mask(src, 0)
        )
        expected = [tv.decode(row) for row in ref.tolist()]
        if texts == expected:
            continue
        for kind, hint in (
            (
                "no decoder mask",
                "Cross-attention still reads the padding: the decoder gets no source mask, so "
                "every decoder step attends to the <pad> positions of shorter sources. Pass "
                "src_mask to model.decode, the same mask the encoder got.",
            ),
            (
                "no masks",
                "No source padding mask at all: the encoder and cross-attention both read <pad>. "
                "Build "
                "src_mask = padding_mask(src, pad_id) and pass it to model.encode AND "
                "model.decode.",
            ),
        ):
            variant = _decode_variant(model, src, 11, tv.sos_id, tv.eos_id, kind)
            if texts == [tv.decode(row) for row in variant.tolist()]:
                raise CheckFailure(f"Still the bug ({case}): {hint}")
        bad = next(i for i, (a, b) in enumerate(zip(texts, expected)) if a != b)
        raise CheckFailure(
            f"Translations differ from course_lib's greedy_decode ({case}): row {bad} "
            f"{ps[bad].source!r} gives {texts[bad]!r}, expected {expected[bad]!r}."
        )
    print(
        f"check_translate: all {len(cases)} cases translate exactly as course_lib's greedy_decode "
        "with the source mask. Well done!"
    )
