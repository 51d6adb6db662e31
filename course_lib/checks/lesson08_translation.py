"""Checkers for the exercises of lesson 08 (translating dates).

* ``check_make_batch(fn)``: ``fn(pairs, src_vocab, tgt_vocab) -> (src, tgt_in, tgt_out)`` (a tuple,
  or an object with those attributes such as ``course_lib.data.translation.TranslationBatch``) for a list of
  ``(source, target)`` texts and two ``CharVocab``: source ids right-padded, decoder input ``<sos>``
  + target, labels target + ``<eos>``, both right-padded with the pad id. Reference:
  ``course_lib.data.translation.make_translation_batch``.
* ``check_batch_shapes(predicted_shapes, pairs)``: a prediction ``predicted_shapes() -> dict`` of
  the shapes of ``src``, ``src_mask``, ``tgt_in``, ``tgt_mask`` and ``label_mask`` of
  ``make_translation_batch(pairs, ...)``.
* ``check_translate(fn, model, corpus)``: ``fn(model, src (B, L_s), max_len, start_id, end_id) ->
  ids (B, <= max_len)``, greedy decoding of a padded batch; compared as texts (up to ``<eos>``) with
  ``course_lib.greedy_decode`` given the source padding mask, on padded batches, on year-first
  dates (whose outputs end at different steps) and with a short ``max_len``.

Each checker says so when it is handed course_lib's own function instead of the learner's, and
names the likely mistake when the answer is wrong (``BATCH_MISTAKES``, the shape mistakes in
``check_batch_shapes``, ``TRANSLATE_MISTAKES``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..data.copy_task import pad_sequences
from ..data.dates import DatesCorpus
from ..data.translation import CharVocab, make_translation_batch
from ..decoding import greedy_decode
from ..masks import padding_mask
from .common import CheckFailure, checker, expect_shape, is_course_lib, run_learner

__all__ = ["check_make_batch", "check_batch_shapes", "check_translate"]


# ----------------------------------------------------------------------------------------------
# Handing in course_lib's own function instead of writing one
# ----------------------------------------------------------------------------------------------


def _course_lib_name(fn: Any, references: Sequence[Any]) -> str | None:
    """The name of the course_lib function ``fn`` is, or calls by a global name, or None.

    Catches ``check(make_translation_batch)``, ``check(course_lib.training.translate)`` and a
    one-line wrapper ``def make_batch(...): return make_translation_batch(...)``.
    """
    if fn in references or is_course_lib(fn):
        return getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    code, glob = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
    for name in getattr(code, "co_names", ()):
        if any(glob.get(name) is ref for ref in references):
            return name
    return None


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


def batch_variant(pairs, sv: CharVocab, tv: CharVocab, kind: str):
    """Reference batch with one thing changed, to name a likely mistake (None: cannot be built)."""
    src = [sv.encode(p[0]) for p in pairs]
    tgt = [tv.encode(p[1]) for p in pairs]
    s, e, pad = tv.sos_id, tv.eos_id, sv.pad_id
    tin = [[s, *t] for t in tgt]
    tout = [[*t, e] for t in tgt]
    if kind == "no eos":
        tout = [list(t) for t in tgt]
    elif kind == "no sos":
        tin = [list(t) for t in tgt]
    elif kind == "no shift":
        tin = [[s, *t] for t in tgt]
        tout = [[s, *t] for t in tgt]
    elif kind == "swapped":
        tin, tout = tout, tin
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
    elif kind == "source sos":
        src = [[s, *x] for x in src]
    elif kind == "eos after padding":
        width = max(len(t) for t in tgt)
        padded = [[*t, *[pad] * (width - len(t))] for t in tgt]
        return pad_sequences(src, pad), torch.tensor([[s, *t] for t in padded]), torch.tensor(
            [[*t, e] for t in padded]
        )
    elif kind == "one length":
        width = max(max(len(x) for x in src), max(len(t) for t in tin))
        return tuple(pad_sequences(x, pad, width) for x in (src, tin, tout))

    def pad_all(seqs, left=False):
        if not left:
            return pad_sequences(seqs, pad)
        width = max(len(x) for x in seqs)
        return torch.tensor([[pad] * (width - len(x)) + list(x) for x in seqs])

    left = kind == "left padding"
    return pad_all(src, left), pad_all(tin, left), pad_all(tout, left)


_SHIFT = "tgt_in = [sos_id] + target, tgt_out = target + [eos_id]"
BATCH_MISTAKES = [
    (
        "no shift",
        "the labels equal the decoder input (<sos> + target)",
        "Then position t is scored on the token it already sees. The labels are the target "
        f"followed by <eos>, one position ahead of the decoder input: {_SHIFT}.",
    ),
    (
        "swapped",
        "tgt_in and tgt_out are swapped",
        "The decoder READS <sos> + target and is SCORED on target + <eos>: return "
        "(src, tgt_in, tgt_out) in that order.",
    ),
    (
        "no eos",
        "the labels have no <eos> at the end",
        "Without <eos> in the labels the model never learns to stop, and decoding runs to max_len. "
        "tgt_out = target + [eos_id].",
    ),
    (
        "no sos",
        "the decoder input has no <sos> in front",
        "The decoder's first input is the start symbol, which the first label is predicted from: "
        "tgt_in = [sos_id] + target. Without it tgt_in is not shifted against tgt_out.",
    ),
    (
        "eos in input",
        "<eos> was added to the decoder input too",
        "The decoder input is [sos_id] + target only: it never needs to read <eos>, and then "
        "tgt_in and tgt_out have the same length, target + 1.",
    ),
    (
        "both specials",
        "<sos> and <eos> on both sides",
        "That is the usual way to *store* a target; for teacher forcing split it once: tgt_in "
        "drops the last token ([sos] + target), tgt_out drops the first (target + [eos]).",
    ),
    (
        "labels shifted twice",
        "the labels are shifted twice (target[1:] + <eos>)",
        "Shift once: tgt_out = target + [eos_id], starting with the target's FIRST character.",
    ),
    (
        "eos after padding",
        "<eos> comes after the padding in the shorter targets",
        "You padded the targets first and added <sos>/<eos> afterwards, so a short target reads "
        "'yes <pad> <pad> ... <eos>': the model would learn to emit <pad> before stopping. Add the "
        "specials to each target's ids, then pad: tgt_out = pad(target + [eos_id]).",
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
        "source sos",
        "the source got a <sos>",
        "The source ids are the characters only, with the source vocabulary: no specials.",
    ),
    (
        "one length",
        "source and targets were padded to one common length",
        "Each side is padded to ITS longest member: src to the longest source, tgt_in and tgt_out "
        "to the longest target + 1. Extra padding costs work and changes nothing else.",
    ),
    (
        "left padding",
        "padded on the left",
        "Pad on the right (as pad_sequences does): the first token sits at position 0 in every "
        "row, which is what the sinusoidal positions and <sos> at position 0 expect.",
    ),
]


def _batch_cases() -> list[tuple[str, list[tuple[str, str]]]]:
    corpus = DatesCorpus(num_heldout=24, seed=8)
    dates = [(p.source, p.target) for p in corpus.heldout[:6]]
    phrases = [
        ("drei Hunde", "three dogs"),
        ("ja", "yes"),
        ("Entschuldigung", "excuse me"),
        ("Montag", "Monday"),
    ]
    return [
        ("six held-out dates in different formats", dates),
        ("phrases of different lengths on both sides", phrases),
        ("a single pair", [("März", "March")]),
    ]


def _wrong_pad_value(got, expected, pad_id: int) -> str | None:
    """Name the tensor padded with another value than ``pad_id`` (right everywhere else)."""
    for name, g, e in zip(("src", "tgt_in", "tgt_out"), got, expected):
        if g.shape != e.shape:
            return None
        pads = e == pad_id
        values = g[pads].unique().tolist() if pads.any() else []
        if torch.equal(g[~pads].long(), e[~pads]) and values and values != [pad_id]:
            return f"{name} is padded with {values[0]!r}"
    return None


@checker
def check_make_batch(fn: Callable[..., Any]) -> None:
    """``fn(pairs, src_vocab, tgt_vocab) -> (src, tgt_in, tgt_out)``, all right-padded with the pad
    id."""
    used = _course_lib_name(fn, (make_translation_batch,))
    if used is not None:
        raise CheckFailure(
            f"That is course_lib's own `{used}` (or a function that calls it), the reference this "
            "checker compares with, so it proves nothing. Write make_batch yourself: encode, add "
            "<sos>/<eos>, and pad with pad_sequences."
        )
    cases = _batch_cases()
    for case, pairs in cases:
        sv = CharVocab.build(p[0] for p in pairs)
        tv = CharVocab.build(p[1] for p in pairs)
        got = _unpack_batch(
            run_learner(
                fn, pairs, sv, tv, case=case,
                hint="Encode each source with src_vocab and each target with tgt_vocab.",
            ),
            case,
        )
        ref = make_translation_batch(pairs, sv, tv)
        expected = (ref.src, ref.tgt_in, ref.tgt_out)
        for name, g, e in zip(("src", "tgt_in", "tgt_out"), got, expected):
            if not isinstance(g, torch.Tensor):
                raise CheckFailure(
                    f"Wrong type ({case}): {name} should be a torch.Tensor, got {type(g).__name__}."
                )
            if g.is_floating_point() or g.dtype == torch.bool:
                raise CheckFailure(
                    f"Wrong dtype ({case}): {name} has dtype {g.dtype}; ids index the embedding "
                    "table, so they must be integers (torch.long, what pad_sequences returns)."
                )
        if all(g.shape == e.shape and torch.equal(g.long(), e) for g, e in zip(got, expected)):
            continue
        for kind, name, hint in BATCH_MISTAKES:
            wrong = batch_variant(pairs, sv, tv, kind)
            if wrong is not None and all(
                g.shape == w.shape and torch.equal(g.long(), w) for g, w in zip(got, wrong)
            ):
                raise CheckFailure(f"Likely mistake ({case}): {name}. {hint}", mistake=name)
        padded_with = _wrong_pad_value(got, expected, sv.pad_id)
        if padded_with is not None:
            raise CheckFailure(
                f"Likely mistake ({case}): {padded_with}, not the pad id {sv.pad_id}. Every "
                "padded position holds pad_id: the masks find padding by it (src != pad_id), and "
                "nn.Embedding cannot look up a negative id such as -100 (that is the ignore_index "
                "convention of some libraries' losses, not an id)."
            )
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
    T = L_t - 1  # the longest target, in characters
    words = max(len(p[0].split()) for p in pairs)
    named = {  # (key, wrong shape) -> the mistake that gives it
        ("src", (B, words)): "You counted words; the vocabulary is character-level.",
        ("src", (B, L_s + 1)): "The source has no <sos> or <eos>: its characters only.",
        ("src", (B, L_s + 2)): "The source has no <sos> or <eos>: its characters only.",
        ("src", (L_s, B)): "Batch first: (B, L_s).",
        ("src", (B, L_t)): "That is the target side's length; the source is padded to ITS "
            "longest member.",
        ("src_mask", (B, L_s)): "That has no query axis: the mask is (B, 1, L_s), so that it "
            "broadcasts over the queries' axis of the (B, L_q, L_s) scores.",
        ("src_mask", (B, L_s, L_s)): "A full square is not needed: whether a key is padding "
            "does not depend on the query.",
        ("src_mask", (B, L_t, L_s)): "One row per decoder query is not needed: whether a key is "
            "padding does not depend on the query.",
        ("src_mask", (B, 1, 1, L_s)): "course_lib's masks have 3 axes; attention adds the head "
            "axis itself (mask.unsqueeze(1)).",
        ("tgt_in", (B, T)): "You forgot <sos>, which the decoder input starts with.",
        ("tgt_in", (B, T + 2)): "The decoder input has <sos> but not <eos> (<eos> is only in "
            "the labels).",
        ("tgt_in", (B, L_s)): "That is the source's length; the target side is padded to its "
            "own longest member.",
        ("tgt_mask", (L_t, L_t)): "That is one causal square; the padding part differs per row, "
            "so the mask keeps the batch axis.",
        ("tgt_mask", (B, 1, L_t)): "That is the target PADDING mask alone; the causal part "
            "depends on the query, so the decoder mask is a square per row.",
        ("tgt_mask", (B, 1, L_t, L_t)): "course_lib's masks have 3 axes; attention adds the head "
            "axis itself.",
        ("tgt_mask", (B, T, T)): "You forgot <sos>: L_t = longest target + 1.",
        ("tgt_mask", (B, T + 2, T + 2)): "L_t = longest target + 1: <sos> in tgt_in, <eos> in "
            "tgt_out, never both in one.",
        ("label_mask", (B, L_t, L_t)): "The loss needs one flag per label, not per pair of "
            "positions.",
        ("label_mask", (B, 1, L_t)): "No query axis: the label mask is not an attention mask, "
            "it selects labels in the loss.",
        ("label_mask", (B, T)): "tgt_out is target + <eos>: L_t = longest target + 1 labels.",
        ("label_mask", (B, T + 2)): "tgt_out is target + <eos> (not <sos> too): L_t = longest "
            "target + 1 labels.",
    }
    wrong = []
    for key in _SHAPE_KEYS:
        got = _as_shape(prediction[key])
        if got != truth[key]:
            mistake = named.get((key, got), "")
            if got is not None and len(got) >= 1 and got[0] != B and (key, got) not in named:
                mistake = f"The first axis is the batch: B = {B} pairs."
            why = f"Likely mistake: {mistake} " if mistake else ""
            wrong.append(
                f"{key}: you said {prediction[key]!r}, it is {truth[key]}. {why}{explain[key]}"
            )
    if wrong:
        raise CheckFailure("Not quite:\n- " + "\n- ".join(wrong))
    print(
        f"check_batch_shapes: all {len(_SHAPE_KEYS)} shapes right, L_s = {L_s} and L_t = {L_t}. "
        f"Well done!"
    )


# ----------------------------------------------------------------------------------------------
# check_translate (debug: the start symbol)
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def _decode_variant(model, src, max_len, start_id, end_id, kind: str) -> torch.Tensor:
    """Greedy decoding of a padded batch with one thing wrong (``kind``), to name a mistake."""
    mask = padding_mask(src, model.config.pad_id)
    enc_mask, dec_mask = mask, mask
    if kind == "no decoder mask":
        dec_mask = None
    elif kind == "no masks":
        enc_mask, dec_mask = torch.ones_like(mask), None
    first = {"pad start": model.config.pad_id, "eos start": end_id}.get(kind, start_id)
    memory = model.encode(src, enc_mask)
    ys = torch.full((src.size(0), 1), first, dtype=torch.long)
    done = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len):
        inputs = ys[:, -1:] if kind == "newest token only" else ys
        hidden = model.decode(inputs, memory, dec_mask)
        next_id = model.generator(hidden[:, 0 if kind == "first position" else -1]).argmax(-1)
        ys = torch.cat([ys, next_id[:, None]], dim=1)
        done |= next_id == end_id
        if kind == "stop at any" and done.any():
            break
    return ys[:, 1:]


TRANSLATE_MISTAKES = [
    (
        "pad start",
        "the decoder starts from <pad> (id 0), not from the start symbol",
        "torch.zeros gives id 0, which is <pad> in this vocabulary, and start_id is never used. "
        "The model was trained with <sos> at position 0 and has never read anything else there: "
        "ys = torch.full((B, 1), start_id).",
    ),
    (
        "eos start",
        "the decoder starts from end_id",
        "start_id and end_id are swapped: the first input is the start symbol, start_id.",
    ),
    (
        "no decoder mask",
        "cross-attention reads the source padding",
        "The decoder gets no source mask (src_mask=None), so every decoder step attends to the "
        "<pad> positions of shorter sources. Pass model.decode the mask the encoder got.",
    ),
    (
        "no masks",
        "no source padding mask at all",
        "The encoder and cross-attention both read <pad>. Build src_mask = padding_mask(src, "
        "pad_id) and pass it to model.encode AND model.decode.",
    ),
    (
        "first position",
        "the next token is taken from the first position",
        "hidden[:, 0] predicts the FIRST output character at every step. The next token comes "
        "from the last position: hidden[:, -1].",
    ),
    (
        "newest token only",
        "the decoder reads only the newest token",
        "Without a cache, model.decode must see the whole prefix ys at every step (the start "
        "symbol and every token so far), not only ys[:, -1:].",
    ),
    (
        "stop at any",
        "decoding stops as soon as ANY row has produced <eos>",
        "In a batch, rows finish at different steps; stopping at the first one truncates all the "
        "others. Stop when EVERY row has finished (done.all()), or run max_len steps.",
    ),
]


def _translate_cases(corpus: DatesCorpus) -> list[tuple[str, list, int]]:
    pairs = corpus.heldout[:200]
    short = min(pairs, key=lambda p: len(p.source))
    long = max(pairs, key=lambda p: len(p.source))
    year_first = corpus.heldout_pairs("numeric y/m/d")[:100]
    return [
        ("200 held-out dates, padded to the longest", pairs, 11),
        ("one short date next to one long one", [short, long], 11),
        (
            "100 year-first dates (a format never trained: the model's outputs end at "
            "different steps)",
            year_first,
            11,
        ),
        ("20 held-out dates with max_len = 6", pairs[:20], 6),
    ]


@checker
def check_translate(fn: Callable[..., Any], model: torch.nn.Module, corpus: DatesCorpus) -> None:
    """``fn(model, src, max_len, start_id, end_id)`` must translate padded batches as course_lib
    does: greedy decoding with the source mask, compared as texts up to ``<eos>``."""
    from ..training import translate as _translate

    if fn in (greedy_decode, _translate) or is_course_lib(fn):
        used = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
        raise CheckFailure(
            f"That is course_lib's own `{used}`, the reference this checker compares with, so it "
            "proves nothing. Find the bug in my_translate and fix it there."
        )
    model.eval()
    tv = corpus.tgt_vocab
    cases = _translate_cases(corpus)
    for case, ps, max_len in cases:
        src = pad_sequences(
            [corpus.src_vocab.encode(p.source) for p in ps], corpus.src_vocab.pad_id
        )
        with torch.no_grad():
            got = run_learner(fn, model, src, max_len, tv.sos_id, tv.eos_id, case=case)
        if not isinstance(got, torch.Tensor) or got.dim() != 2 or got.size(0) != src.size(0):
            raise CheckFailure(
                f"Wrong output ({case}): expected ids of shape (B={src.size(0)}, up to "
                f"{max_len}), got "
                f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}."
            )
        if got.size(1) > max_len:
            starts = got.size(1) == max_len + 1 and bool((got[:, 0] == tv.sos_id).all())
            raise CheckFailure(
                f"Wrong output ({case}): {got.size(1)} columns for max_len = {max_len}. "
                + (
                    "Likely mistake: the output still starts with the start symbol; return the "
                    "generated ids only, ys[:, 1:]."
                    if starts
                    else "Likely mistake: max_len is not respected; generate at most max_len "
                    "tokens (the loop runs max_len times)."
                )
            )
        texts = [tv.decode(row) for row in got.tolist()]
        ref = greedy_decode(
            model, src, max_len, tv.sos_id, end_id=tv.eos_id, src_mask=padding_mask(src, 0)
        )
        expected = [tv.decode(row) for row in ref.tolist()]
        if texts == expected:
            continue
        matches = []  # every named mistake that gives these translations (on a model that
        for kind, name, hint in TRANSLATE_MISTAKES:  # ignores its input, two can coincide)
            variant = _decode_variant(model, src, max_len, tv.sos_id, tv.eos_id, kind)
            if texts == [tv.decode(row) for row in variant.tolist()]:
                matches.append(f"{name}. {hint}")
        if matches:
            raise CheckFailure(f"Likely mistake ({case}): " + " Or: ".join(matches))
        bad = next(i for i, (a, b) in enumerate(zip(texts, expected)) if a != b)
        raise CheckFailure(
            f"Translations differ from course_lib's greedy_decode ({case}): row {bad} "
            f"{ps[bad].source!r} gives {texts[bad]!r}, expected {expected[bad]!r}. None of the "
            "usual mistakes explains it; compare the two step by step on that one row."
        )
    print(
        f"check_translate: all {len(cases)} cases translate exactly as course_lib's greedy_decode "
        "with the source mask. Well done!"
    )
