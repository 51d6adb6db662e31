"""Checkers for the exercises of lesson 05 (the decoder): the decoder's mask and the decoder layer."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..layers import DecoderLayer
from ..masks import decoder_self_attention_mask, padding_mask
from ._common import (
    CheckFailure, Mistake, broadcasts_to, checker, compare, expect_bool_mask, expect_shape, load_reference_weights,
    passed, run_learner,
)

__all__ = ["check_decoder_masks", "check_decoder_layer"]


# --------------------------------------------------------------------------------------------------
# Exercise 1: the decoder self-attention mask (padding AND causal)
# --------------------------------------------------------------------------------------------------

def _mask_cases() -> list[tuple[str, torch.Tensor, int]]:
    """(description, tgt ids (B, L), pad_id). Left padding makes the padding part visible on real rows."""
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

    def mk(f: Callable[[torch.Tensor, int], torch.Tensor]) -> Callable[[torch.Tensor, int], torch.Tensor]:
        return lambda ids, pad_id: f(ids, pad_id).expand(shape)

    return [
        Mistake(  # first: with pad_id=0 it equals the reference, so it only ever matches when pad_id != 0
            "pad id hard-coded as 0",
            "Compare with the `pad_id` argument, not with 0.",
            mk(lambda ids, p: (ids != 0).unsqueeze(1) & causal(ids.size(1))),
        ),
        Mistake(
            "causal only, padding ignored",
            "Queries can attend to padding keys. Combine both: `padding_mask(tgt, pad_id) & causal_mask(L)`.",
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
            "`triu` keeps keys s >= t; the decoder may see s <= t, which is `tril` (row = query, column = key).",
            mk(lambda ids, p: key_pad(ids, p) & causal(ids.size(1)).T),
        ),
        Mistake(
            "upper triangle: the future instead of the past",
            "`triu` keeps keys s >= t; the decoder may see s <= t, which is `tril` (row = query, column = key).",
            mk(lambda ids, p: key_pad(ids, p) & causal(ids.size(1)).T.triu(1)),
        ),
        Mistake(
            "diagonal excluded",
            "A position may attend to itself: use `tril()` (diagonal=0), not `tril(-1)`; otherwise the first "
            "position sees nothing at all.",
            mk(lambda ids, p: key_pad(ids, p) & causal(ids.size(1)).tril(-1)),
        ),
        Mistake(
            "inverted mask (True where attention is forbidden)",
            "In this course True means 'may attend'. You built the opposite convention "
            "(the one of torch.nn.MultiheadAttention); negate it with `~`.",
            mk(lambda ids, p: ~(key_pad(ids, p) & causal(ids.size(1)))),
        ),
        Mistake(
            "padding applied on the query axis instead of the key axis",
            "The padding mask hides padding *keys* (columns): `(tgt != pad_id).unsqueeze(1)` -> (B, 1, L), "
            "not `.unsqueeze(2)` -> (B, L, 1), which blanks whole rows.",
            mk(lambda ids, p: (ids != p).unsqueeze(2) & causal(ids.size(1))),
        ),
    ]


@checker
def check_decoder_masks(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
    """``fn(tgt (B, L), pad_id) -> bool mask`` broadcastable to ``(B, L, L)``, True = may attend.

    Must equal ``course_lib.masks.decoder_self_attention_mask``: padding AND causal.
    """
    cases = _mask_cases()
    for case, ids, pad_id in cases:
        B, L = ids.shape
        got = run_learner(fn, ids.clone(), pad_id, case=case,
                          hint="Build the mask from (tgt != pad_id).unsqueeze(1) and a (L, L) tril, combined with &.")
        expect_bool_mask(got, case, "Build it with comparisons and `&`, or "
                                    "`torch.ones(L, L, dtype=torch.bool).tril()`.")
        if not broadcasts_to(got, (B, L, L), same_rank=False):  # an (L, L) causal-only mask is named below
            raise CheckFailure(
                f"Wrong mask shape ({case}): {tuple(got.shape)} does not broadcast to (B, L, L) = {(B, L, L)}. "
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
) -> Callable[..., torch.Tensor]:
    """A (possibly wrong) decoder layer forward built from the reference's submodules."""

    def forward(x: torch.Tensor, memory: torch.Tensor, tgt_mask, memory_mask) -> torch.Tensor:
        masks = {"tgt": tgt_mask, "memory": memory_mask, None: None}

        def self_block(h):
            return ref.self_attn(h, h, h, masks[self_mask])

        def cross_block(h):
            q = memory if q_from_memory else h
            kv = h if kv_from_decoder else memory
            return ref.cross_attn(q, kv, kv, masks[cross_mask])

        blocks = [
            ("self", self_block, ref.norm1),
            ("cross", cross_block, ref.norm2),
            ("ff", ref.feed_forward, ref.norm3),
        ]
        if cross_first:  # the sublayers in the wrong order; each keeps its own norm
            blocks[0], blocks[1] = blocks[1], blocks[0]
        for name, block, norm in blocks:
            if pre_ln:
                x = x + block(norm(x))
            elif drop_residual == name:
                x = norm(block(x))
            else:
                x = norm(x + block(x))
        return x

    return forward


def _layer_mistakes(ref: DecoderLayer) -> list[Mistake]:
    residual_hint = (
        "Each sublayer is wrapped as `x = norm(x + sublayer(x))`: keep x in the sum, otherwise the "
        "layer forgets its input."
    )
    return [
        Mistake(
            "cross-attention keys and values come from the decoder instead of memory",
            "In cross-attention the queries come from the decoder (x) and the keys and values from the "
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
            "Pass memory_mask to the cross-attention: `self.cross_attn(x, memory, memory, memory_mask)`.",
            _variant(ref, cross_mask=None),
        ),
        Mistake(
            "tgt_mask and memory_mask swapped",
            "Self-attention over the target uses tgt_mask; cross-attention over the source uses memory_mask.",
            _variant(ref, self_mask="memory", cross_mask="tgt"),
        ),
        Mistake(
            "cross-attention given tgt_mask instead of memory_mask",
            "Cross-attention looks at source positions, so it needs the source padding mask memory_mask.",
            _variant(ref, cross_mask="tgt"),
        ),
        Mistake(
            "sublayers in the wrong order (cross-attention before self-attention)",
            "The order is: masked self-attention (norm1), cross-attention (norm2), feed-forward (norm3).",
            _variant(ref, cross_first=True),
        ),
        Mistake("residual dropped around the self-attention", residual_hint, _variant(ref, drop_residual="self")),
        Mistake("residual dropped around the cross-attention", residual_hint, _variant(ref, drop_residual="cross")),
        Mistake("residual dropped around the feed-forward", residual_hint, _variant(ref, drop_residual="ff")),
        Mistake(
            "pre-LN instead of post-LN",
            "This exercise builds the paper's post-LN layer: `x = norm(x + sublayer(x))`, not "
            "`x = x + sublayer(norm(x))`.",
            _variant(ref, pre_ln=True),
        ),
    ]


def _layer_cases() -> list[tuple[str, int, int, int]]:
    """(description, B, L_t, L_s)."""
    return [
        ("L_t == L_s, both masks", 2, 5, 5),
        ("L_t=4 != L_s=7, both masks", 3, 4, 7),
        ("masks None", 2, 3, 6),
    ]


@checker
def check_decoder_layer(cls: type[nn.Module]) -> None:
    """``cls(d_model, num_heads, d_ff, dropout=0.0)``, ``forward(x, memory, tgt_mask=None, memory_mask=None)``.

    Compared with ``course_lib.DecoderLayer`` (post-LN) after copying its weights into yours.
    """
    d_model, num_heads, d_ff = 16, 4, 32
    cases = _layer_cases()
    for i, (case, B, L_t, L_s) in enumerate(cases):
        torch.manual_seed(100 + i)
        mine = cls(d_model, num_heads, d_ff, dropout=0.0)
        ref = DecoderLayer(d_model, num_heads, d_ff, dropout=0.0)
        load_reference_weights(
            mine, ref.state_dict(), "Your decoder layer",
            "Name the submodules self_attn, cross_attn (MultiHeadAttention), feed_forward (FeedForward with "
            "linear1/linear2), norm1, norm2, norm3.",
        )
        mine.eval()
        ref.eval()
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
        with torch.no_grad():
            got = run_learner(
                mine, x.clone(), memory.clone(), tgt_mask, memory_mask,
                case=f"{case}, x {tuple(x.shape)}, memory {tuple(memory.shape)}",
                hint="If it is a shape error in cross-attention, check that keys and values come from memory "
                "and the query from x.",
            )
            expect_shape(
                got, (B, L_t, d_model), f"DecoderLayer output ({case})",
                "A decoder layer returns one vector per target position: (B, L_t, d_model), like x.",
            )
            expected = ref(x, memory, tgt_mask, memory_mask)
            compare(got, expected, inputs, _layer_mistakes(ref), case)
    passed("check_decoder_layer", len(cases))
