"""Checkers for the exercises of lesson 05 (the decoder): the decoder's mask, the decoder layer, two
predictions (cross-attention shapes, where PyTorch returns NaN) and the next-word function to
debug."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable

import torch
from torch import nn

from ..layers import DecoderLayer
from ..attention import MultiHeadAttention
from ..model import Transformer, TransformerConfig
from ..masks import causal_mask, decoder_self_attention_mask, padding_mask
from .common import (
    CheckFailure, Mistake, broadcasts_to, checker, compare, expect_bool_mask, expect_shape,
    load_reference_weights,
    course_lib_used, passed, run_learner,
)

__all__ = [
    "check_decoder_masks", "check_decoder_layer", "check_cross_attention_shapes",
    "check_nan_positions",
    "check_next_word_logits",
]


# --------------------------------------------------------------------------------------------------
# Exercise 1: the decoder self-attention mask (padding AND causal)
# --------------------------------------------------------------------------------------------------

def _mask_cases() -> list[tuple[str, torch.Tensor, int]]:
    """(description, tgt ids (B, L), pad_id). Left padding makes the padding part visible on real
    rows."""
    g = torch.Generator().manual_seed(5)
    right = torch.randint(3, 9, (3, 6), generator=g)
    right[0, 4:] = 0  # two pads at the end
    right[1, 2:] = 0  # four pads at the end
    left = torch.randint(3, 9, (2, 5), generator=g)
    left[0, :2] = 0  # left padding: real queries must not see the pads before them
    left[1, :1] = 0
    pad3 = torch.randint(4, 9, (2, 5), generator=g)
    pad3[0, 3:] = 3  # pad_id 3: the pad id is an argument, not always 0
    pad3[1, :1] = 3
    return [
        ("right-padded batch, pad_id=0", right, 0),
        ("left-padded batch, pad_id=0", left, 0),
        ("pad_id=3", pad3, 3),
        ("no padding", torch.randint(1, 9, (2, 4), generator=g), 0),
        ("length 1", torch.tensor([[5], [7]]), 0),
    ]


def _mask_mistakes(shape: tuple[int, int, int]) -> list[Mistake]:
    def causal(L: int) -> torch.Tensor:
        return torch.ones(L, L, dtype=torch.bool).tril()

    def key_pad(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
        return (ids != pad_id).unsqueeze(1)  # (B, 1, L): one row of visible keys

    MaskFn = Callable[[torch.Tensor, int], torch.Tensor]

    def mk(f: MaskFn) -> MaskFn:
        return lambda ids, pad_id: f(ids, pad_id).expand(shape)

    return [
        # first: with pad_id=0 it equals the reference, so it only ever matches when pad_id != 0
        Mistake(
            "pad id hard-coded as 0",
            "Compare with the `pad_id` argument, not with 0.",
            mk(lambda ids, p: (ids != 0).unsqueeze(1) & causal(ids.size(1))),
        ),
        Mistake(
            "causal only, padding ignored",
            "Queries can attend to padding keys. Combine both: `padding_mask(tgt, pad_id) & "
            "causal_mask(L)`.",
            mk(lambda ids, p: causal(ids.size(1)).unsqueeze(0)),
        ),
        Mistake(
            "padding only, the future is visible",
            "Position t can see positions after t. AND the padding mask with the lower triangle "
            "`torch.ones(L, L, dtype=torch.bool).tril()`.",
            mk(lambda ids, p: key_pad(ids, p)),
        ),
        Mistake(
            "upper triangle: the future instead of the past",
            "`triu` keeps keys s >= t; the decoder may see s <= t, which is `tril` (row = query, "
            "column = key).",
            mk(lambda ids, p: key_pad(ids, p) & causal(ids.size(1)).T),
        ),
        Mistake(
            "upper triangle: the future instead of the past",
            "`triu` keeps keys s >= t; the decoder may see s <= t, which is `tril` (row = query, "
            "column = key).",
            mk(lambda ids, p: key_pad(ids, p) & causal(ids.size(1)).T.triu(1)),
        ),
        Mistake(
            "diagonal excluded",
            "A position may attend to itself: use `tril()` (diagonal=0), not `tril(-1)`; otherwise "
            "the first "
            "position sees nothing at all.",
            mk(lambda ids, p: key_pad(ids, p) & causal(ids.size(1)).tril(-1)),
        ),
        Mistake(
            "tril(diagonal=1): every position also sees the next one",
            "`tril(diagonal=1)` keeps one diagonal above the main one, so query t sees key t + 1, "
            "the very token it must predict. Use `tril()` (diagonal=0): keys s <= t.",
            mk(lambda ids, p: key_pad(ids, p)
               & torch.ones(ids.size(1), ids.size(1), dtype=torch.bool).tril(1)),
        ),
        Mistake(
            "padding OR causal instead of AND",
            "`|` lets a query see a key that passes EITHER test: every real future token (padding "
            "test) and every past <pad> (causal test). A key must pass both: combine with `&`.",
            mk(lambda ids, p: key_pad(ids, p) | causal(ids.size(1))),
        ),
        Mistake(
            "inverted mask (True where attention is forbidden)",
            "In this course True means 'may attend'. You built the opposite convention "
            "(the one of torch.nn.MultiheadAttention); negate it with `~`.",
            mk(lambda ids, p: ~(key_pad(ids, p) & causal(ids.size(1)))),
        ),
        Mistake(
            "padding applied on the query axis instead of the key axis",
            "The padding mask hides padding *keys* (columns): `(tgt != pad_id).unsqueeze(1)` -> "
            "(B, 1, L), "
            "not `.unsqueeze(2)` -> (B, L, 1), which blanks whole rows.",
            mk(lambda ids, p: (ids != p).unsqueeze(2) & causal(ids.size(1))),
        ),
    ]


@checker
def check_decoder_masks(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
    """``fn(tgt (B, L), pad_id) -> bool mask`` broadcastable to ``(B, L, L)``, True = may attend.

    Must equal ``course_lib.masks.decoder_self_attention_mask``: padding AND causal.
    """
    used = course_lib_used(fn, (decoder_self_attention_mask, causal_mask, padding_mask))
    if used is not None:
        raise CheckFailure(
            f"You handed in course_lib's `{used}` (or a function that calls it). This exercise asks "
            "you to build the mask yourself with plain torch: `(tgt != pad_id).unsqueeze(1)` for "
            "the keys that are real tokens, and `torch.tril` for the past, combined with `&`."
        )
    cases = _mask_cases()
    for case, ids, pad_id in cases:
        B, L = ids.shape
        got = run_learner(fn, ids.clone(), pad_id, case=case,
                          hint="Build the mask from (tgt != pad_id).unsqueeze(1) and a (L, L) "
                               "tril, combined with &.")
        expect_bool_mask(got, case, "Build it with comparisons and `&`, or "
                                    "`torch.ones(L, L, dtype=torch.bool).tril()`.")
        # an (L, L) causal-only mask is named below
        if not broadcasts_to(got, (B, L, L), same_rank=False):
            raise CheckFailure(
                f"Wrong mask shape ({case}): {tuple(got.shape)} does not broadcast to (B, L, L) = "
                f"{(B, L, L)}. "
                "Combine a (B, 1, L) padding mask with an (L, L) causal mask."
            )
        expected = decoder_self_attention_mask(ids, pad_id)
        compare(got.expand(B, L, L), expected, (ids, pad_id), _mask_mistakes((B, L, L)), case)
    passed("check_decoder_masks", len(cases))


# --------------------------------------------------------------------------------------------------
# Exercise 2: the decoder layer
# --------------------------------------------------------------------------------------------------

def _variant(
    ref: DecoderLayer,
    *,
    kv_from_decoder: bool = False,
    q_from_memory: bool = False,
    self_mask: str = "tgt",
    cross_mask: str = "memory",
    cross_first: bool = False,
    drop_residual: str | None = None,
    pre_ln: bool = False,
    norms: tuple[int, int, int] = (0, 1, 2),
    dropout: str = "sublayer",
    no_dropout: tuple[str, ...] = (),
    seed: int | None = None,
    no_norm: str | None = None,
    stale_cross_input: bool = False,
) -> Callable[..., torch.Tensor]:
    """A (possibly wrong) decoder layer forward built from the reference's submodules.

    ``norms``: which of norm1..norm3 (0, 1, 2) each sublayer uses; ``dropout``: where the residual
    dropout goes, "sublayer" (right: on the sublayer's output), "sum" (on x + sublayer(x)) or "after"
    (after the norm); ``no_dropout``: sublayers ("self", "cross", "ff") without residual dropout;
    ``seed``: reseed the global generator first, so dropout draws the learner's masks;
    ``no_norm``: a sublayer whose LayerNorm is left out; ``stale_cross_input``: the cross-attention
    reads the layer's input x, not the output of the self-attention sublayer.
    """
    all_norms = (ref.norm1, ref.norm2, ref.norm3)
    drop = ref.dropout1  # the three residual dropouts have the same p

    def forward(x: torch.Tensor, memory: torch.Tensor, tgt_mask, memory_mask) -> torch.Tensor:
        if seed is not None:
            torch.manual_seed(seed)
        masks = {"tgt": tgt_mask, "memory": memory_mask, None: None}

        def self_block(h):
            return ref.self_attn(h, h, h, masks[self_mask])

        def cross_block(h):
            q = memory if q_from_memory else h
            kv = h if kv_from_decoder else memory
            return ref.cross_attn(q, kv, kv, masks[cross_mask])

        blocks = [
            ("self", self_block, all_norms[norms[0]]),
            ("cross", cross_block, all_norms[norms[1]]),
            ("ff", ref.feed_forward, all_norms[norms[2]]),
        ]
        if cross_first:  # the sublayers in the wrong order; each keeps its own norm
            blocks[0], blocks[1] = blocks[1], blocks[0]
        layer_input = x
        for name, block, norm in blocks:
            d = (lambda t: t) if name in no_dropout else drop
            if name == no_norm:
                norm = (lambda t: t)
            if stale_cross_input and name == "cross":
                x = norm(x + d(cross_block(layer_input)))
                continue
            if pre_ln:
                x = x + d(block(norm(x)))
            elif drop_residual == name:
                x = norm(d(block(x)))
            elif dropout == "sum":
                x = norm(d(x + block(x)))
            elif dropout == "after":
                x = d(norm(x + block(x)))
            else:
                x = norm(x + d(block(x)))
        return x

    return forward


_SUBLAYER_NAMES = ("self-attention", "cross-attention", "feed-forward")


def _norm_mistakes(ref: DecoderLayer) -> list[Mistake]:
    """Every way of giving the three sublayers the wrong LayerNorms (one norm for all, permuted)."""
    mistakes = []
    for order in itertools.product(range(3), repeat=3):
        if order == (0, 1, 2):
            continue
        if len(set(order)) == 1:
            name = f"norm{order[0] + 1} used for all three sublayers"
        else:
            used = ", ".join(f"{s} -> norm{i + 1}" for s, i in zip(_SUBLAYER_NAMES, order))
            name = f"LayerNorms mixed up ({used})"
        mistakes.append(Mistake(
            name,
            "Each sublayer has its own LayerNorm with its own weights: the self-attention's sum "
            "goes through norm1, the cross-attention's through norm2, the feed-forward's through "
            "norm3.",
            _variant(ref, norms=order),
        ))
    return mistakes


def _layer_mistakes(ref: DecoderLayer) -> list[Mistake]:
    residual_hint = (
        "Each sublayer is wrapped as `x = norm(x + sublayer(x))`: keep x in the sum, otherwise the "
        "layer forgets its input."
    )
    return [
        Mistake(
            "cross-attention keys and values come from the decoder instead of memory",
            "In cross-attention the queries come from the decoder (x) and the keys and values from "
            "the "
            "encoder output: `self.cross_attn(x, memory, memory, memory_mask)`.",
            _variant(ref, kv_from_decoder=True),
        ),
        Mistake(
            "cross-attention queries come from memory instead of the decoder",
            "The decoder asks the questions: the query is x, keys and values are memory: "
            "`self.cross_attn(x, memory, memory, memory_mask)`.",
            _variant(ref, q_from_memory=True),
        ),
        Mistake(
            "causal mask ignored in self-attention (tgt_mask not used, the future is visible)",
            "Pass tgt_mask to the masked self-attention: `self.self_attn(x, x, x, tgt_mask)`.",
            _variant(ref, self_mask=None),
        ),
        Mistake(
            "memory mask ignored in cross-attention (source padding is visible)",
            "Pass memory_mask to the cross-attention: `self.cross_attn(x, memory, memory, "
            "memory_mask)`.",
            _variant(ref, cross_mask=None),
        ),
        Mistake(
            "tgt_mask and memory_mask swapped",
            "Self-attention over the target uses tgt_mask; cross-attention over the source uses "
            "memory_mask.",
            _variant(ref, self_mask="memory", cross_mask="tgt"),
        ),
        Mistake(
            "cross-attention given tgt_mask instead of memory_mask",
            "Cross-attention looks at source positions, so it needs the source padding mask "
            "memory_mask.",
            _variant(ref, cross_mask="tgt"),
        ),
        Mistake(
            "sublayers in the wrong order (cross-attention before self-attention)",
            "The order is: masked self-attention (norm1), cross-attention (norm2), feed-forward "
            "(norm3).",
            _variant(ref, cross_first=True),
        ),
        Mistake("residual dropped around the self-attention", residual_hint,
                _variant(ref, drop_residual="self")),
        Mistake("residual dropped around the cross-attention", residual_hint,
                _variant(ref, drop_residual="cross")),
        Mistake("residual dropped around the feed-forward", residual_hint,
                _variant(ref, drop_residual="ff")),
        Mistake(
            "pre-LN instead of post-LN",
            "This exercise builds the paper's post-LN layer: `x = norm(x + sublayer(x))`, not "
            "`x = x + sublayer(norm(x))`.",
            _variant(ref, pre_ln=True),
        ),
        *_norm_mistakes(ref),
        Mistake(
            "cross-attention reads the layer's input x instead of the self-attention sublayer's "
            "output",
            "The sublayers run in sequence: update x after each one (x = norm1(...)), and give the "
            "UPDATED x to the cross-attention as its query.",
            _variant(ref, stale_cross_input=True),
        ),
        *[Mistake(f"LayerNorm missing after the {label} (norm{i + 1} not applied)",
                  "Post-LN normalises after EVERY residual sum: x = norm(x + sublayer(x)), three "
                  "times.", _variant(ref, no_norm=name))
          for i, (name, label) in enumerate(zip(("self", "cross", "ff"), _SUBLAYER_NAMES))],
    ]


def _dropout_mistakes(ref: DecoderLayer, seed: int) -> list[Mistake]:
    """Where the residual dropout goes, in training mode (the global generator reseeded first)."""
    where_hint = (
        "Dropout goes on each sublayer's OUTPUT, before it is added to x: "
        "`x = norm(x + self.dropout(sublayer(x)))` (the paper, section 5.4: 'to the output of each "
        "sub-layer, before it is added to the sub-layer input and normalized')."
    )
    mistakes = [
        Mistake("no dropout on the sublayer outputs (residual dropout missing)", where_hint,
                _variant(ref, no_dropout=("self", "cross", "ff"), seed=seed)),
        Mistake("dropout applied to the residual sum x + sublayer(x) instead of the sublayer output",
                where_hint, _variant(ref, dropout="sum", seed=seed)),
        Mistake("dropout applied after the LayerNorm instead of to the sublayer output",
                where_hint, _variant(ref, dropout="after", seed=seed)),
    ]
    for i, name in enumerate(("self", "cross", "ff")):
        mistakes.append(Mistake(f"no dropout on the {_SUBLAYER_NAMES[i]}'s output", where_hint,
                                _variant(ref, no_dropout=(name,), seed=seed)))
    return mistakes


def _layer_cases() -> list[tuple[str, int, int, int]]:
    """(description, B, L_t, L_s)."""
    return [
        ("L_t == L_s, both masks", 2, 5, 5),
        ("L_t=4 != L_s=7, both masks", 3, 4, 7),
        ("masks None", 2, 3, 6),
        ("training mode, dropout 0.3 (residual dropout only), both masks", 2, 4, 6),
    ]


def _run_layer(mine: nn.Module, x: torch.Tensor, memory: torch.Tensor, tgt_mask, memory_mask,
               case: str, seed: int | None = None):
    """Run the learner's layer; if the 3-D masks make it crash, try them as 4-D (B, 1, L_q, L_k).

    Any mask rank ``MultiHeadAttention`` accepts is correct, so a layer written for 4-D masks (for
    example around ``F.scaled_dot_product_attention``) passes too. ``seed`` reseeds the global
    generator before each attempt (dropout in training mode).
    """
    hint = ("If it is a shape error in cross-attention, check that keys and values come from "
            "memory "
            "and the query from x.")
    if seed is not None:
        torch.manual_seed(seed)
    try:
        return run_learner(mine, x.clone(), memory.clone(), tgt_mask, memory_mask, case=case,
                           hint=hint)
    except CheckFailure as first:
        if tgt_mask is None or tgt_mask.dim() != 3:
            raise
        if seed is not None:
            torch.manual_seed(seed)
        try:
            return run_learner(mine, x.clone(), memory.clone(), tgt_mask.unsqueeze(1),
                               memory_mask.unsqueeze(1),
                               case=case + ", masks given as 4-D", hint=hint)
        except CheckFailure:
            raise CheckFailure(f"{first} (The same masks as 4-D (B, 1, L_q, L_k) failed too.)")


def _randomise_norms(layer: nn.Module, g: torch.Generator) -> None:
    """LayerNorm weights and biases away from their init (ones, zeros) and different per norm, so
    that using the wrong norm changes the output."""
    with torch.no_grad():
        for norm in (layer.norm1, layer.norm2, layer.norm3):
            norm.weight.copy_(0.5 + torch.rand(norm.weight.shape, generator=g))
            norm.bias.copy_(0.5 * torch.randn(norm.bias.shape, generator=g))


def _attention_dropout_off(layer: nn.Module) -> None:
    """p = 0 for the dropouts inside the attention and feed-forward submodules: the training case
    then tests the residual dropout that the learner writes in forward, whatever attention the
    learner's submodules use."""
    for name in ("self_attn", "cross_attn", "feed_forward"):
        for module in getattr(layer, name).modules():
            if isinstance(module, nn.Dropout):
                module.p = 0.0


@checker
def check_decoder_layer(cls: type[nn.Module]) -> None:
    """``cls(d_model, num_heads, d_ff, dropout=0.0)``,
    ``forward(x, memory, tgt_mask=None, memory_mask=None)``.

    Compared with ``course_lib.DecoderLayer`` (post-LN) after copying its weights into yours, the
    LayerNorms randomised; the last case runs in training mode with dropout.
    """
    if inspect.isclass(cls) and issubclass(cls, DecoderLayer) and cls.forward is DecoderLayer.forward:
        raise CheckFailure("You handed in course_lib's `DecoderLayer` (or a subclass that keeps its "
                           "forward). Write the forward of `MyDecoderLayer` yourself.")
    d_model, num_heads, d_ff = 16, 4, 32
    cases = _layer_cases()
    for i, (case, B, L_t, L_s) in enumerate(cases):
        training = case.startswith("training")
        p = 0.3 if training else 0.0
        torch.manual_seed(100 + i)
        mine = cls(d_model, num_heads, d_ff, dropout=p)
        ref = DecoderLayer(d_model, num_heads, d_ff, dropout=p)
        g = torch.Generator().manual_seed(300 + i)
        _randomise_norms(ref, g)
        load_reference_weights(
            mine, ref.state_dict(), "Your decoder layer",
            "Name the submodules self_attn, cross_attn (MultiHeadAttention), feed_forward "
            "(FeedForward with "
            "linear1/linear2), norm1, norm2, norm3.",
        )
        if training:
            _attention_dropout_off(mine)
            _attention_dropout_off(ref)
        mine.train(training)
        ref.train(training)
        g = torch.Generator().manual_seed(200 + i)
        x = torch.randn(B, L_t, d_model, generator=g)
        memory = torch.randn(B, L_s, d_model, generator=g)
        if case == "masks None":
            tgt_mask = memory_mask = None
        else:
            tgt = torch.randint(1, 9, (B, L_t), generator=g)
            tgt[0, -1] = 0  # a padded target position
            src = torch.randint(1, 9, (B, L_s), generator=g)
            src[0, -2:] = 0  # padded source positions
            tgt_mask = decoder_self_attention_mask(tgt, 0)  # (B, L_t, L_t)
            memory_mask = padding_mask(src, 0)  # (B, 1, L_s)
        inputs = (x, memory, tgt_mask, memory_mask)
        seed = 400 + i
        with torch.no_grad():
            got = _run_layer(mine, x, memory, tgt_mask, memory_mask,
                             f"{case}, x {tuple(x.shape)}, memory {tuple(memory.shape)}",
                             seed=seed if training else None)
            expect_shape(
                got, (B, L_t, d_model), f"DecoderLayer output ({case})",
                "A decoder layer returns one vector per target position: (B, L_t, d_model), like "
                "x.",
            )
            if not training:
                again = _run_layer(mine, x, memory, tgt_mask, memory_mask, case)
                if not torch.equal(got, again):
                    raise CheckFailure(
                        f"Likely mistake ({case}): dropout is active in eval mode (two runs of "
                        "the same input differ after .eval()). nn.Dropout follows model.eval() "
                        "by itself; F.dropout(x, p) does not: pass training=self.training, or "
                        "use the nn.Dropout module.")
            if training:
                torch.manual_seed(seed)
                expected = ref(x, memory, tgt_mask, memory_mask)
                mistakes = _dropout_mistakes(ref, seed)
            else:
                expected = ref(x, memory, tgt_mask, memory_mask)
                mistakes = _layer_mistakes(ref)
            compare(got, expected, inputs, mistakes, case)
    passed("check_decoder_layer", len(cases))


# --------------------------------------------------------------------------------------------------
# Predict: the shapes of cross-attention when L_t != L_s
# --------------------------------------------------------------------------------------------------

def _as_shape(value, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value)
    except (TypeError, ValueError) as err:
        raise CheckFailure(f"{what} should be a tuple of ints such as (2, 3), got {value!r}.") \
            from err


@checker
def check_cross_attention_shapes(fn: Callable[[], tuple]) -> None:
    """Predict: ``fn()`` returns ``(output shape, weights shape)`` of
    ``MultiHeadAttention(32, 4)(x, memory, memory, src_mask, return_attention=True)`` with
    x ``(2, 5, 32)`` (B = 2, L_t = 5) and memory ``(2, 6, 32)`` (L_s = 6)."""
    answer = fn()
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        raise CheckFailure(f"Return two shapes, (output shape, weights shape), got {answer!r}.")
    out_shape = _as_shape(answer[0], "The output shape")
    w_shape = _as_shape(answer[1], "The weights shape")
    B, L_t, L_s, d_model, h = 2, 5, 6, 32, 4
    attn = MultiHeadAttention(d_model, h)
    with torch.no_grad():
        out, weights = attn(torch.zeros(B, L_t, d_model), torch.zeros(B, L_s, d_model),
                            torch.zeros(B, L_s, d_model), return_attention=True)
    true_out, true_w = tuple(out.shape), tuple(weights.shape)
    problems = []
    if out_shape != true_out:
        if out_shape == (B, L_s, d_model):
            problems.append(f"output {out_shape}: the output has one vector per QUERY, and the "
                            "queries are the "
                            f"{L_t} target positions; the source length only enters through keys "
                            "and values")
        elif out_shape == (B, h, L_t, d_model // h):
            problems.append(f"output {out_shape}: that is the per-head result before merge_heads "
                            "and out_proj; "
                            "the layer returns (B, L_t, d_model)")
        else:
            problems.append(f"output {out_shape}: expected (B, L_t, d_model)")
    if w_shape != true_w:
        if w_shape == (B, h, L_s, L_t):
            problems.append(f"weights {w_shape}: rows are queries (target positions), columns are "
                            "keys "
                            "(source positions), so (B, h, L_t, L_s)")
        elif w_shape == (B, L_t, L_s):
            problems.append(f"weights {w_shape}: every head has its own weights, so there is a "
                            "head axis: "
                            "(B, h, L_t, L_s)")
        elif w_shape in ((B, h, L_t, L_t), (B, h, L_s, L_s)):
            problems.append(f"weights {w_shape}: cross-attention is rectangular, one row per "
                            "target position "
                            "and one column per source position")
        else:
            problems.append(f"weights {w_shape}: expected (B, num_heads, L_q, L_k)")
    if problems:
        raise CheckFailure("Not quite: " + "; ".join(problems) + ".")
    print(f"check_cross_attention_shapes: right, output {true_out} (one vector per target "
          "position) and "
          f"weights {true_w} (target rows, source columns).")


# --------------------------------------------------------------------------------------------------
# Predict: where PyTorch returns NaN for an unconverted mask
# --------------------------------------------------------------------------------------------------

@checker
def check_nan_positions(fn: Callable[[], list]) -> None:
    """Predict: ``fn()`` lists the query positions (0 ... 4) at which ``nn.MultiheadAttention``
    returns NaN
    when given ``attn_mask=causal_mask(5)`` unconverted (PyTorch reads True as "forbidden")."""
    answer = fn()
    try:
        got = sorted({int(p) for p in answer})
    except (TypeError, ValueError) as err:
        raise CheckFailure(f"Return a list of positions such as [0, 2], got {answer!r}.") from err
    L = 5
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(1, L, 8)
    with torch.no_grad():
        # our convention, read by PyTorch as "forbidden"
        out, _ = mha(x, x, x, attn_mask=causal_mask(L))
    truth = torch.isnan(out[0]).any(-1).nonzero().flatten().tolist()
    assert truth == [L - 1]
    if got == truth:
        print(f"check_nan_positions: right, only position {L - 1}. PyTorch reads True as "
              "'forbidden', so query t "
              "sees only keys after t; the last query has none left, and softmax over all -inf is "
              "0/0 = NaN.")
        return
    hints = {
        (): "Not every library turns a row with no visible key into zeros as course_lib does: "
            "here the softmax "
            "runs over a row of -inf and returns 0/0 = NaN.",
        (0,): "You read the mask in our convention. PyTorch reads True as 'forbidden', so "
              "causal_mask hides "
              "keys s <= t: query 0 still sees keys 1 to 4. Which query is left with no key at "
              "all?",
        tuple(range(L)): "Each query row has its own softmax, so a NaN appears only in the rows "
                         "that have no "
                         "visible key; in one attention layer it does not spread to the other "
                         "rows.",
    }
    raise CheckFailure(f"Not quite ({got}). " + hints.get(tuple(got), (
        "PyTorch reads True as 'forbidden': the lower triangle hides keys s <= t. For each query "
        "t, list the "
        "keys it may still see; a NaN comes out where that list is empty.")))


# --------------------------------------------------------------------------------------------------
# Debug: the next-word scores without the source mask
# --------------------------------------------------------------------------------------------------

def _next_word_model() -> Transformer:
    torch.manual_seed(55)
    config = TransformerConfig(src_vocab_size=12, tgt_vocab_size=12, d_model=16, num_heads=2,
                               num_encoder_layers=1, num_decoder_layers=1, d_ff=32, max_len=16,
                               pad_id=0)
    return Transformer(config).eval()


def _next_word_cases() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(56)
    src = torch.randint(3, 12, (3, 7), generator=g)
    src[1, 4:] = 0  # padded sources
    src[2, 2:] = 0
    tgt = torch.randint(3, 12, (3, 4), generator=g)
    tgt[:, 0] = 1  # start symbol
    unpadded = torch.randint(3, 12, (2, 5), generator=g)
    return [
        ("no source padding", unpadded, tgt[:2, :3]),
        ("padded sources", src, tgt),
        ("padded sources, one target token", src, tgt[:, :1]),
    ]


@checker
def check_next_word_logits(fn: Callable) -> None:
    """Debug: ``fn(model, src (B, L_s), tgt (B, L_t)) -> (B, vocab)``, the scores for the word
    after ``tgt``,
    equal to ``model(src, tgt)[:, -1]`` for a ``course_lib.Transformer``."""
    model = _next_word_model()
    pad = model.config.pad_id

    def without_source_mask(src, tgt, in_encode=False):
        src_mask = padding_mask(src, pad)
        if in_encode:  # an all-True mask: encode's default (None) would be the padding mask
            src_mask = torch.ones_like(src_mask)
        return model.generator(model.decode(tgt, model.encode(src, src_mask), None)[:, -1])

    mistakes = [
        Mistake("the source mask is missing in decode (cross-attention sees the <pad> sources)",
                "Pass the mask you gave encode to decode as well: model.decode(tgt, memory, "
                "src_mask). For decode, None means 'no mask at all', not 'the padding mask' (only "
                "encode builds the padding mask when it gets None). "
                "Cross-attention's keys are the source positions, and without the mask every "
                "target position "
                "attends to the encoder's <pad> vectors.",
                lambda src, tgt: without_source_mask(src, tgt)),
        Mistake("the source mask is missing in encode and in decode",
                "Build src_mask = padding_mask(src, pad_id) and pass it to both encode and decode.",
                lambda src, tgt: without_source_mask(src, tgt, in_encode=True)),
        Mistake("the scores are read at the first position instead of the last",
                "The word after tgt is predicted at the LAST decoder position: hidden[:, -1].",
                lambda src, tgt: model(src, tgt)[:, 0]),
        Mistake("softmax applied (probabilities instead of scores)",
                "Return the generator's logits; the loss or argmax does the rest.",
                lambda src, tgt: model(src, tgt)[:, -1].softmax(-1)),
    ]
    cases = _next_word_cases()
    for case, src, tgt in cases:
        with torch.no_grad():
            got = run_learner(fn, model, src.clone(), tgt.clone(), case=case)
            expected = model(src, tgt)[:, -1]
            expect_shape(got, expected.shape, f"the next-word scores ({case})",
                         "Return one score per vocabulary word for each sentence: (B, vocab).")
            compare(got, expected, (src, tgt), mistakes, case)
    print(f"check_next_word_logits: all {len(cases)} cases match model(src, tgt)[:, -1]. With the "
          "source mask, "
          "padding the source no longer changes the scores. Well done!")
