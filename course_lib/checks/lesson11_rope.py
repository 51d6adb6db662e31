"""Checkers for lesson 11's rotary positions (RoPE).

* ``check_apply_rope(fn)``: ``fn(x (..., L, hd), positions (L,), base) -> (..., L, hd)``, from the
  2-D rotation to a whole head: RoPE in the halves layout, plane i = numbers (i, i + hd/2) turned by
  ``positions * base ** (-2i / hd)``, against the formula in float64.
* ``check_rope_layout(fn)``: ``fn(x (B, h, L, hd), cos, sin) -> (B, h, L, hd)``, the fixed
  ``apply_rotary_ported`` (the lesson's debug exercise): Hugging Face's layout ("halves",
  ``rotate_half``). Reference: ``transformers``' ``apply_rotary_pos_emb`` on random inputs and
  random positions, for several head sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..rope import RotaryEmbedding, apply_rotary, rotary_frequencies
from .common import CheckFailure, Mistake, calls_to, checker, expect_shape, is_course_lib
from .lesson11_modern import call_learner, close64, compare64, compare_against, no_raw_errors

__all__ = ["check_apply_rope", "check_rope_layout"]


# ----------------------------------------------------------------------------------------------
# check_rope_layout (debug)
# ----------------------------------------------------------------------------------------------


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    half = x.size(-1) // 2
    return x[..., :half], x[..., half:]


def pairs_layout(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The lesson's broken function: pairs (2i, 2i+1) turned with the halves tables."""
    a, b = x[..., 0::2], x[..., 1::2]
    return x * cos + torch.stack([-b, a], dim=-1).flatten(-2) * sin


def _pairs_consistent(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Pairs turned with the tables reordered for pairs: a correct RoPE, but not Hugging Face's."""
    half = x.size(-1) // 2
    cos_p = cos[..., :half].repeat_interleave(2, dim=-1)
    sin_p = sin[..., :half].repeat_interleave(2, dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return x * cos_p + torch.stack([-b, a], dim=-1).flatten(-2) * sin_p


def _rotate(x: torch.Tensor, first: str, second: str, split: str = "halves") -> torch.Tensor:
    """``cat([first, second])`` of the two parts, each part one of "x1", "-x1", "x2", "-x2"."""
    x1, x2 = _halves(x) if split == "halves" else (x[..., 0::2], x[..., 1::2])
    parts = {"x1": x1, "-x1": -x1, "x2": x2, "-x2": -x2}
    return torch.cat([parts[first], parts[second]], dim=-1)


# The Debug exercise's messages say what is observed (which numbers, which property), never the
# fix: that lives behind show_solution("11.rope_layout").
_ROPE_MISTAKES = [
    Mistake("pairs layout with the tables reordered",
            "your function is a rotation (it keeps lengths, and the score of a query and a key depends "
            "only on their offset), but not Hugging Face's: with the same inputs its numbers differ "
            "from apply_rotary_pos_emb's. Weights trained with Hugging Face's code expect its pairing "
            "of numbers into planes, with the tables as they are given",
            _pairs_consistent),
    Mistake("each plane turns backwards",
            "your output at position m is Hugging Face's output at position -m: every plane turns "
            "by minus its angle",
            lambda x, c, s: x * c + _rotate(x, "x2", "-x1") * s),
    Mistake("not a rotation: lengths change",
            "your output does not keep each vector's length (a rotation does), and at angle 90 "
            "degrees a plane (u, v) comes out as (v, u), a mirror image, not turned",
            lambda x, c, s: x * c + _rotate(x, "x2", "x1") * s),
    Mistake("each number stays in its half",
            "your output's first half depends only on x's first half, and its second half only on "
            "the second: in a turned plane each number takes part of its partner's value",
            lambda x, c, s: x * c + _rotate(x, "-x1", "x2") * s),
    Mistake("position 0 is not left alone",
            "at position 0 (angle 0) a rotation leaves x unchanged, and your output there is not x",
            lambda x, c, s: x * s + _rotate(x, "-x2", "x1") * c),
    Mistake("numbers paired with the wrong partners",
            "your output turns number i together with another number than Hugging Face's does "
            "(compare, for head_dim 8 at position 1, which two outputs change when you change "
            "one input number)",
            lambda x, c, s: x * c + _rotate(x, "-x2", "x1", split="interleaved") * s),
    Mistake("numbers mixed across positions",
            "your output at one position depends on x at other positions (dim 2, L): a rotation "
            "mixes numbers within one head vector only",
            lambda x, c, s: x * c + torch.cat([-x.chunk(2, dim=-2)[1], x.chunk(2, dim=-2)[0]],
                                              dim=-2) * s),
    Mistake("numbers mixed across heads",
            "your output for one head depends on x in other heads (dim 1): a rotation mixes "
            "numbers within one head vector only",
            lambda x, c, s: x * c + torch.cat([-x.chunk(2, dim=1)[1], x.chunk(2, dim=1)[0]],
                                              dim=1) * s),
    Mistake("the turned numbers land in the wrong places",
            "your output's number i is built from x_i and a number that is not its partner: the "
            "rotated part is laid out in another order than x (compare, for head_dim 8 at position "
            "1, which input numbers each output number depends on)",
            lambda x, c, s: x * c + torch.stack([-_halves(x)[1], _halves(x)[0]], -1).flatten(-2) * s),
    Mistake("every number only scaled",
            "each output number is its input number times cos: nothing of the partner number enters, "
            "and lengths shrink",
            lambda x, c, s: x * c),
    Mistake("x itself is missing",
            "at position 0 (angle 0) your output is all zeros, where a rotation leaves x unchanged",
            lambda x, c, s: _rotate(x, "-x2", "x1") * s),
]


# How many times in a row this Python session handed in the port's numbers: a second failed
# attempt gets a question that narrows the search, never the fix.
_LAYOUT_REPEATS: dict[str, int] = {"port": 0}


def _port_observed(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, got: torch.Tensor,
                   expected: torch.Tensor, case: str) -> str:
    """What the untouched port's output shows: where it differs, and the lengths it changes."""
    diff = (got.double() - expected.double()).abs()  # (B, h, L, hd)
    per_position = diff.amax(dim=(0, 1, 3)) if diff.dim() == 4 else diff.amax(-1)
    ratio = (got.double().norm(dim=-1) / x.double().norm(dim=-1)).flatten()
    _LAYOUT_REPEATS["port"] += 1
    message = (
        f"Your output is the port's, unchanged ({case}): it differs from Hugging Face's "
        f"apply_rotary_pos_emb by up to {diff.max().item():.3g} (at {int((per_position > 1e-5).sum())} "
        f"of {per_position.numel()} positions), and it does not keep lengths: each head vector comes "
        f"out {ratio.min().item():.2f} to {ratio.max().item():.2f} times as long as it went in, "
        "where a rotation keeps every length. Which two numbers of a head does each of Hugging "
        "Face's angles belong to, and which two does the port turn together?")
    if _LAYOUT_REPEATS["port"] > 1:
        message += (" A look that helps: print RotaryEmbedding(8, 4, layout='halves').cos_sin(4)[0][1], "
                    "the cos of position 1, and find the columns that hold the same angle.")
    return message + ' The fix itself: show_solution("11.rope_layout").'


def _hf_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face's ``apply_rotary_pos_emb`` on ``x (B, h, L, hd)``; ``cos, sin``: ``(L, hd)`` or
    ``(B, 1, L, hd)``."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]  # (1, L, hd): HF's (batch, seq, head_dim)
    else:
        cos, sin = cos[:, 0], sin[:, 0]  # (B, L, hd)
    out, _ = apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=1)  # (B, h, L, hd)
    return out


def rope_tables(positions: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Halves-layout cos/sin for any positions ``(..., L)``: ``(..., L, head_dim)`` each."""
    angles = positions[..., None].float() * rotary_frequencies(head_dim, base)  # (..., L, hd/2)
    angles = torch.cat([angles, angles], dim=-1)  # (..., L, hd)
    return angles.cos(), angles.sin()


def _rope_refusals(fn: Callable[..., Any]) -> list[Callable[..., Any]]:
    """Refuse a library's rotary function handed in; return those the learner's code may not call."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    if fn is apply_rotary_pos_emb or is_course_lib(fn):
        raise CheckFailure(
            "You handed in a library's rotary function (course_lib's or Hugging Face's, the "
            "reference): fix the body of apply_rotary_ported yourself; the fix is a few lines."
        )
    return [apply_rotary, RotaryEmbedding.forward, apply_rotary_pos_emb]


@checker
def check_rope_layout(fn: Callable[..., Any]) -> None:
    """Check ``fn(x (B, h, L, hd), cos, sin (L, hd)) -> (B, h, L, hd)`` against Hugging Face's
    ``apply_rotary_pos_emb``. The global random state is left as it was."""
    no_raw_errors(_check_rope_layout)(fn)


_ROPE_CASES = [  # (case, B, h, L, head_dim, base, tables with a batch dim)
    ("B=2, 3 heads, L=6, head_dim=8, random positions", 2, 3, 6, 8, 10000.0, False),
    ("B=1, 2 heads, L=4, head_dim=16, random positions", 1, 2, 4, 16, 10000.0, False),
    ("B=2, 4 heads, L=10, head_dim=12, base 500, random positions", 2, 4, 10, 12, 500.0, False),
    ("tables with a batch dim, (B, 1, L, head_dim) as Hugging Face's rotary embedding gives "
     "after cos.unsqueeze(1), each sequence at other positions", 3, 2, 5, 8, 10000.0, True),
]


def _rope_inputs(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Case ``n``: x ``(B, h, L, hd)`` and halves tables at random positions (not 0..L-1)."""
    _, B, h, L, hd, base, batched = _ROPE_CASES[n]
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(B, h, L, hd, generator=gen)
    positions = torch.randint(0, 200, (B, L) if batched else (L,), generator=gen)
    cos, sin = rope_tables(positions, hd, base)  # (L, hd) or (B, L, hd)
    if batched:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, L, hd)
    return x, cos, sin


def _rope_case_ok(fn: Callable[..., Any], n: int) -> bool:
    """True if ``fn`` is right on case ``n`` (used to tell a hard-coded head_dim)."""
    x, cos, sin = _rope_inputs(n)
    try:
        got = fn(x.clone(), cos, sin)
    except Exception:
        return False
    expected = _hf_rotary(x, cos, sin)
    return (isinstance(got, torch.Tensor) and got.shape == expected.shape and got.is_floating_point()
            and torch.allclose(got.detach().double(), expected.double(), atol=1e-5, rtol=1e-4))


def _one_head_dim(fn: Callable[..., Any], n: int) -> str:
    """A sentence if ``fn`` is right for another head_dim than case ``n``'s, else ''."""
    hd = _ROPE_CASES[n][4]
    right = sorted({_ROPE_CASES[m][4] for m in range(len(_ROPE_CASES))
                    if _ROPE_CASES[m][4] != hd and _rope_case_ok(fn, m)})
    if not right:
        return ""
    return (f"Only works for one head_dim: right with head_dim {right}, wrong with head_dim {hd} "
            f"({_ROPE_CASES[n][0]}). Take the half from the input, x.size(-1) // 2, instead of "
            "writing a number.")


def _check_rope_layout(fn: Callable[..., Any]) -> None:
    refused = _rope_refusals(fn)
    for n, (case, B, h, L, hd, _, batched) in enumerate(_ROPE_CASES):
        x, cos, sin = _rope_inputs(n)
        x_before, cos_before, sin_before = x.clone(), cos.clone(), sin.clone()
        got, error = None, None
        with calls_to(refused) as seen:
            try:
                got = fn(x, cos, sin)
            except (NotImplementedError, CheckFailure):
                raise
            except Exception as err:
                error = err
        if seen:
            raise CheckFailure(
                "Your function calls a library's rotary function (course_lib's apply_rotary or "
                "RotaryEmbedding, or Hugging Face's apply_rotary_pos_emb, the reference): write the "
                "rotation yourself."
            )
        if not (torch.equal(x, x_before) and torch.equal(cos, cos_before) and torch.equal(sin, sin_before)):
            raise CheckFailure(
                f"Your function changes its input in place ({case}): x (or cos/sin) is different after "
                "the call. In-place operations (mul_, x[...] = ..., +=) overwrite the queries and keys "
                "that attention still needs; build a new tensor (x * cos + ...)."
            )
        expected = _hf_rotary(x, cos, sin)  # (B, h, L, hd)
        wrong_shape = not isinstance(got, torch.Tensor) or got.shape != expected.shape
        if batched and (error is not None or wrong_shape):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            what = f"raised {type(error).__name__}: {error}" if error is not None else f"returned {shape}"
            raise CheckFailure(
                f"Your function works with (L, head_dim) tables but {what}, with {case}; expected "
                f"{tuple(expected.shape)}. Do not reshape cos and sin: x * cos + ... broadcasts any "
                "table shape that lines up with x's last two dims."
            ) from error
        if error is not None or (not wrong_shape and not (got.is_floating_point() and torch.allclose(
                got.detach().double(), expected.double(), atol=1e-5, rtol=1e-4))):
            hard_coded = _one_head_dim(fn, n)
            if hard_coded:
                raise CheckFailure(hard_coded) from error
        if error is not None:
            if f"({hd // 2})" in str(error) and f"({hd})" in str(error):
                raise CheckFailure(
                    f"Likely mistake ({case}): a tensor of head_dim/2 = {hd // 2} numbers per vector "
                    f"meets one of head_dim = {hd}: {type(error).__name__}: {error}. Two parts of "
                    "head_dim/2 numbers joined along another dim than the last still have "
                    "head_dim/2 numbers in the last dim.") from error
            raise CheckFailure(
                f"Your code raised {type(error).__name__} ({case}): {error}. x is (B, h, L, head_dim) "
                "and cos, sin are (L, head_dim): print the shape of each tensor your function builds."
            ) from error
        expect_shape(got, (B, h, L, hd), f"the turned x ({case})",
                     "RoPE turns x without changing its shape: (B, h, L, head_dim) in and out.")
        if not close64(got, expected) and close64(got, pairs_layout(x.double(), cos.double(),
                                                                      sin.double())):
            raise CheckFailure(_port_observed(x, cos, sin, got.detach(), expected, case))
        _LAYOUT_REPEATS["port"] = 0
        compare_against(got.detach().double(), expected.double(), (x, cos, sin), _ROPE_MISTAKES,
                        case, "Hugging Face's apply_rotary_pos_emb")
    print(f"check_rope_layout: right, equal to Hugging Face's apply_rotary_pos_emb on all "
          f"{len(_ROPE_CASES)} cases (halves layout: rotate_half(x) = (-x2, x1)).")


# ----------------------------------------------------------------------------------------------
# check_apply_rope (build: from the 2-D rotation to a whole head)
# ----------------------------------------------------------------------------------------------


def rope_angles(positions: torch.Tensor, hd: int, base: float, *, two: float = 2.0,
                sign: float = -1.0, shift: int = 0) -> torch.Tensor:
    """``(L, hd/2)`` angles ``(positions + shift) * base ** (sign * two * i / hd)``, in float64."""
    i = torch.arange(hd // 2, dtype=torch.float64)
    return (positions.double() + shift)[:, None] * base ** (sign * two * i / hd)


def turn_halves(x: torch.Tensor, angles: torch.Tensor, flip: float = 1.0) -> torch.Tensor:
    """Plane i = (x_i, x_{i + hd/2}) turned by ``flip * angles[:, i]``: the 2-D rotation."""
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = angles.cos().to(x.dtype), (flip * angles).sin().to(x.dtype)
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)


def _turn_pairs(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)


def _turn_interleaved_table(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """The halves rotation with a pairs-layout table: number j gets plane j // 2's angle."""
    table = angles.repeat_interleave(2, dim=-1)  # (L, hd)
    x1, x2 = x[..., : x.size(-1) // 2], x[..., x.size(-1) // 2:]
    return x * table.cos().to(x.dtype) + torch.cat([-x2, x1], -1) * table.sin().to(x.dtype)


def _cat_table(angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    table = torch.cat([angles, angles], dim=-1)  # (L, hd): Hugging Face's layout
    return table.cos(), table.sin()


def _no_outer_probe(fn: Callable[..., Any], base: float) -> str:
    """After a raised error: a sentence if ``fn``, fed L = head_dim/2 rows (where positions * theta
    still broadcasts), gives what a missing outer product gives; else ''."""
    gen = torch.Generator().manual_seed(5)
    x, positions = torch.randn(2, 6, 12, generator=gen), torch.randperm(30, generator=gen)[:6]
    try:
        got = fn(x.clone(), positions.clone(), base)
    except Exception:
        return ""
    for mistake in _apply_rope_mistakes(base):
        if "outer product" not in mistake.name and "transposed" not in mistake.name:
            continue
        if close64(got, mistake.compute(x.double(), positions)):
            return (f"Likely mistake: {mistake.name}. Your function raises a size error when L "
                    f"differs from head_dim/2, and with L = head_dim/2 = 6 it gives what that "
                    f"mistake gives: {mistake.hint}.")
    return ""


def _apply_rope_mistakes(base: float) -> list[Mistake]:
    def angles(**kw: Any) -> Callable[..., torch.Tensor]:
        return lambda p, hd: rope_angles(p, hd, base, **kw)

    right = angles()
    return [
        Mistake("1-based positions",
                "the first position is 0 (no turn at all); you turned every vector by one position "
                "too many. Use the positions as given",
                lambda x, p: turn_halves(x, angles(shift=1)(p, x.size(-1)))),
        Mistake("the positions 0..L-1 instead of the positions given",
                "turn row j by the angle of positions[j], not of j: the positions need not start at "
                "0 or be consecutive (a KV cache's new token sits at position t)",
                lambda x, p: turn_halves(x, right(torch.arange(len(p)), x.size(-1)))),
        Mistake("the pairs layout (neighbours 2i, 2i+1)",
                "this exercise uses Hugging Face's layout: plane i is made of numbers i and "
                "i + head_dim/2 (the two halves), not of neighbours",
                lambda x, p: _turn_pairs(x, right(p, x.size(-1)))),
        Mistake("the sine's sign is flipped (turning backwards)",
                "the 2-D rotation by angle a maps (u, v) to (u cos a - v sin a, u sin a + v cos a): "
                "the first number LOSES v sin a",
                lambda x, p: turn_halves(x, right(p, x.size(-1)), flip=-1.0)),
        Mistake("frequencies base ** (-i / head_dim): the 2 is missing",
                "theta_i = base ** (-2 i / head_dim) for i = 0 .. head_dim/2 - 1 (or "
                "base ** (-torch.arange(0, head_dim, 2) / head_dim))",
                lambda x, p: turn_halves(x, angles(two=1.0)(p, x.size(-1)))),
        Mistake("frequencies base ** (+2i / head_dim): the minus is missing",
                "theta_i = base ** (-2 i / head_dim) = 1 / base ** (2 i / head_dim): the first plane "
                "turns fastest (1 radian per position), the last slowest",
                lambda x, p: turn_halves(x, angles(sign=1.0)(p, x.size(-1)))),
        Mistake("frequencies base ** (-4i / head_dim): 2i with i stepping by 2",
                "use i = 0, 1, ..., head_dim/2 - 1 with 2i in the exponent, or torch.arange(0, "
                "head_dim, 2) without another factor 2",
                lambda x, p: turn_halves(x, angles(two=4.0)(p, x.size(-1)))),
        Mistake("cos and sin swapped",
                "at position 0 (angle 0) x must come out unchanged: cos goes with the number "
                "itself, sin with its partner",
                lambda x, p: (lambda a: turn_halves(x, torch.pi / 2 - a))(right(p, x.size(-1)))),
        Mistake("an interleaved table with the halves rotation",
                "your angles are laid out in pairs, each plane's angle twice in a row "
                "(repeat_interleave), while the rotation pairs number i with number "
                "i + head_dim/2: number i then gets the angle of plane i // 2. With the halves "
                "layout, the table repeats the whole list of angles, cat([angles, angles])",
                lambda x, p: _turn_interleaved_table(x, right(p, x.size(-1)))),
        Mistake("the halves table with the pairs rotation",
                "your rotation turns neighbours (2i, 2i+1) while your table holds plane i's angle at "
                "numbers i and i + head_dim/2 (the Debug exercise's bug): this exercise pairs the "
                "halves, number i with number i + head_dim/2",
                lambda x, p: pairs_layout(x, *_cat_table(right(p, x.size(-1))))),
        Mistake("floor division in the frequencies: every plane turns at 1 radian per position",
                "2 * i // head_dim (or torch.arange(0, head_dim, 2) // head_dim) rounds the "
                "exponent down to 0, so every theta_i is 1. The exponent is a fraction, "
                "-2 i / head_dim: true division, /",
                lambda x, p: turn_halves(x, p.double()[:, None] * torch.ones(x.size(-1) // 2,
                                                                             dtype=torch.float64))),
        Mistake("floor division in the frequencies: the exponents rounded down to -1",
                "-2 * i // head_dim rounds -2i/head_dim down to -1 for every plane but the first, "
                "so all planes after the first turn at 1/base per position. The exponent is a "
                "fraction: true division, /",
                lambda x, p: turn_halves(x, p.double()[:, None] * base ** torch.floor(
                    -2 * torch.arange(x.size(-1) // 2, dtype=torch.float64) / x.size(-1)))),
        Mistake("positions times frequencies without an outer product",
                "positions * theta multiplies row j's position by plane j's frequency only (it runs "
                "when L = head_dim/2, and raises a size error otherwise): every row needs every "
                "plane's angle, an (L, head_dim/2) table, positions[:, None] * theta[None, :]",
                lambda x, p: turn_halves(x, (p.double() * right(torch.ones(1), x.size(-1))[0]))),
        Mistake("frequencies counted from i = 1",
                "theta_i = base ** (-2 i / head_dim) for i = 0 .. head_dim/2 - 1: the first plane "
                "turns by 1 radian per position (theta_0 = 1); from i = 1 every plane turns as the "
                "next one should",
                lambda x, p: turn_halves(x, right(p, x.size(-1)) * base ** (-2 / x.size(-1)))),
        Mistake("the second half gets the first half's formula",
                "a plane (u, v) turned by a is (u cos a - v sin a, u sin a + v cos a): the second "
                "number has its own formula",
                lambda x, p: (lambda y: torch.cat([y[..., : x.size(-1) // 2]] * 2, -1))(
                    turn_halves(x, right(p, x.size(-1))))),
        Mistake("base 10000 written in, not the base given",
                "your angles are those of base 10000, but this call passed another base: use the "
                "base argument",
                lambda x, p: turn_halves(x, rope_angles(p, x.size(-1), 10000.0))),
        Mistake("the two halves of the output swapped",
                "your first half holds what belongs in the second (x1 sin + x2 cos) and the other "
                "way round: plane i's first number goes back to place i, its second to i + "
                "head_dim/2",
                lambda x, p: (lambda y: torch.cat([y[..., x.size(-1) // 2:], y[..., : x.size(-1) // 2]],
                                                  -1))(turn_halves(x, right(p, x.size(-1))))),
        Mistake("the halves taken along the positions, not the head dimension",
                "your output at one position depends on x at other positions: x.chunk(2, dim=-2) "
                "splits the L rows; a plane's two numbers are both in one row's head_dim numbers",
                lambda x, p: (lambda c, s_: x * c + torch.cat([-x.chunk(2, -2)[1], x.chunk(2, -2)[0]],
                                                              -2) * s_)(*_cat_table(right(p, x.size(-1))))),
        Mistake("the angle table transposed, (head_dim/2, L)",
                "positions[None, :] * theta[:, None] gives row i = plane i and column j = position "
                "j, the transpose of what x needs (it runs when L = head_dim/2, and raises a size "
                "error otherwise): the table is (L, head_dim/2), positions[:, None] * theta[None, :]",
                lambda x, p: turn_halves(x, right(p, x.size(-1)).T)),
        Mistake("only the first half is turned",
                "a plane's rotation changes BOTH its numbers: (x1 cos - x2 sin, x1 sin + x2 cos)",
                lambda x, p: torch.cat([turn_halves(x, right(p, x.size(-1)))[..., : x.size(-1) // 2],
                                        x[..., x.size(-1) // 2:]], dim=-1)),
    ]


_APPLY_ROPE_CASES = [  # (case, shape of x, base, positions kind, dtype)
    ("x (2, 3, 6, 8), random positions", (2, 3, 6, 8), 10000.0, "random", torch.float32),
    ("x (1, 2, 5, 12), base 500, positions 7..11 (a cache's offset)", (1, 2, 5, 12), 500.0, "offset",
     torch.float32),
    ("x (3, 4, 16) (no heads dim), random positions", (3, 4, 16), 10000.0, "random", torch.float32),
    ("x (1, 1, 6, 10) in float64, random positions", (1, 1, 6, 10), 10000.0, "random", torch.float64),
]


def _apply_rope_inputs(n: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    _, shape, base, kind, dtype = _APPLY_ROPE_CASES[n]
    gen = torch.Generator().manual_seed(100 + n)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
    L = shape[-2]
    positions = (torch.arange(7, 7 + L) if kind == "offset"
                 else torch.randperm(40, generator=gen)[:L])
    return x, positions, base


def _apply_rope_right_on(fn: Callable[..., Any], cases: list[int]) -> list[int]:
    """The cases among ``cases`` that ``fn`` gets right (used to spot a hard-coded head_dim)."""
    ok = []
    for m in cases:
        x, p, base = _apply_rope_inputs(m)
        try:
            got = fn(x.clone(), p.clone(), base)
        except Exception:
            continue
        if close64(got, turn_halves(x.double(), rope_angles(p, x.size(-1), base))):
            ok.append(m)
    return ok


def _one_head_dim_rope(fn: Callable[..., Any], n: int) -> str:
    """A sentence if ``fn`` is right only for x with another number of dims, or another head_dim,
    than case ``n``'s; else ''."""
    shape, base = _APPLY_ROPE_CASES[n][1], _APPLY_ROPE_CASES[n][2]
    hd = shape[-1]
    right = _apply_rope_right_on(fn, list(range(len(_APPLY_ROPE_CASES))))
    if len({_APPLY_ROPE_CASES[m][1][-1] for m in right}) > 1 and all(
            _APPLY_ROPE_CASES[m][2] != base for m in right):
        return ""  # right for several head_dims: not a size written in (another base, named below)
    if right and all(len(_APPLY_ROPE_CASES[m][1]) != len(shape) for m in right):
        dims = sorted({len(_APPLY_ROPE_CASES[m][1]) for m in right})
        return (f"Only right for x with {' or '.join(map(str, dims))} dims: {_APPLY_ROPE_CASES[n][0]} "
                f"has {len(shape)}. x is (..., L, head_dim), any number of leading dims: take the "
                "sizes from the end, x.size(-1) and x.size(-2), not by unpacking x.shape.")
    others = [m for m in right if _APPLY_ROPE_CASES[m][1][-1] != hd]
    if not others:
        return ""
    return (f"Only right for another head_dim ({_APPLY_ROPE_CASES[n][0]} has head_dim {hd}): take "
            "the sizes from x (x.size(-1) // 2), not from a number you wrote.")


@checker
@no_raw_errors
def check_apply_rope(fn: Callable[..., Any]) -> None:
    """Check ``fn(x (..., L, hd), positions (L,), base) -> (..., L, hd)``: RoPE in the halves layout,
    plane i = numbers (i, i + hd/2) turned by ``positions * base ** (-2i / hd)``."""
    from transformers.models.llama import modeling_llama as hf

    from ..rope import rotate_half, rotate_pairs

    if is_course_lib(fn) or fn in (hf.apply_rotary_pos_emb, hf.rotate_half):
        raise CheckFailure("You handed in a library's rotary function: write the rotation yourself.")
    refused = [apply_rotary, RotaryEmbedding.forward, RotaryEmbedding.__init__, rotary_frequencies,
               rotate_half, rotate_pairs, hf.apply_rotary_pos_emb, hf.rotate_half,
               hf.LlamaRotaryEmbedding.forward]
    for n, (case, shape, base, _, dtype) in enumerate(_APPLY_ROPE_CASES):
        x, positions, base = _apply_rope_inputs(n)
        before = (x.clone(), positions.clone())
        with calls_to(refused) as seen:
            try:
                got = call_learner(fn, x, positions, base, case=case,
                            hint="x is (..., L, head_dim), positions an int tensor (L,), base a float.")
            except CheckFailure as failure:
                failed = failure
            else:
                failed = None
        if failed is not None:
            if not seen and _one_head_dim_rope(fn, n):
                raise CheckFailure(_one_head_dim_rope(fn, n)) from failed
            if not seen and _no_outer_probe(fn, base):
                raise CheckFailure(_no_outer_probe(fn, base)) from failed
            hd = shape[-1]
            if f"({hd})" in str(failed) and f"({hd // 2})" in str(failed):
                raise CheckFailure(
                    f"Likely mistake ({case}): a tensor of head_dim = {hd} numbers per row meets one "
                    f"of head_dim/2 = {hd // 2}. {str(failed).split('. x is')[0]}. Parts of head_dim/2 "
                    "numbers joined along another dim than the last (torch.cat's default is dim 0) "
                    "still have head_dim/2 numbers per row.") from failed
            raise failed
        if seen:
            raise CheckFailure("Your function calls a library's rotary code (course_lib's or Hugging "
                               "Face's): build the angles and the rotation yourself.")
        if not (torch.equal(x, before[0]) and torch.equal(positions, before[1])):
            raise CheckFailure(f"Your function changes x or positions in place ({case}).")
        if isinstance(got, tuple):
            raise CheckFailure("Return only the turned x, not a tuple.")
        expect_shape(got, shape, f"the turned x ({case})", "RoPE keeps the shape of x.")
        if not got.is_floating_point() or not torch.isfinite(got).all():
            raise CheckFailure(f"The output ({case}) is not a finite floating-point tensor.")
        x64 = x.double()
        expected = turn_halves(x64, rope_angles(positions, shape[-1], base))
        if not close64(got, expected) and _one_head_dim_rope(fn, n):
            raise CheckFailure(_one_head_dim_rope(fn, n))
        compare64(got, expected, (x64, positions), _apply_rope_mistakes(base), case,
                  "the 2-D rotation of every plane (x_i, x_{i + head_dim/2})")
    print(f"check_apply_rope: right on all {len(_APPLY_ROPE_CASES)} cases (every plane (x_i, "
          "x_{i + head_dim/2}) turned by position * base ** (-2i / head_dim)). Well done!")
