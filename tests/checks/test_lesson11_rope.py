"""Lesson-11 RoPE checkers (course_lib/checks/lesson11_rope.py: apply_rope, the layout port): right
answers pass, each named mistake is caught."""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import passes, solution_namespace

from course_lib.checks import CheckFailure, check_apply_rope, check_rope_layout
from course_lib.rope import apply_rotary, rotate_half


# ----------------------------------------------------------------------------------------------
# debug: the rotary layout (pairs against Hugging Face's halves)
# ----------------------------------------------------------------------------------------------


def apply_rotary_ported(x, cos, sin):
    """The lesson's broken function, as the learner finds it (without the stub's raise)."""
    a, b = x[..., 0::2], x[..., 1::2]  # (B, h, L, hd/2) each
    turned = torch.stack([-b, a], dim=-1).flatten(-2)  # (B, h, L, hd)
    return x * cos + turned * sin


def _rope(first="-x2", second="x1", split="halves", swap=False, unrotated=True, rotated=True):
    """A learner's fix with one chosen mistake (the defaults are right)."""

    def apply_rotary_fixed(x, cos, sin):
        if split == "halves":
            x1, x2 = x.chunk(2, dim=-1)
        elif split == "interleaved":
            x1, x2 = x[..., ::2], x[..., 1::2]
        elif split == "heads":
            x1, x2 = x.chunk(2, dim=1)
        else:  # along the positions
            x1, x2 = x.chunk(2, dim=-2)
        parts = {"x1": x1, "-x1": -x1, "x2": x2, "-x2": -x2}
        axis = {"positions": -2, "heads": 1}.get(split, -1)
        turned = torch.cat([parts[first], parts[second]], dim=axis)
        c, s = (sin, cos) if swap else (cos, sin)
        out = torch.zeros_like(x)
        if unrotated:
            out = out + x * c
        if rotated:
            out = out + turned * s
        return out

    return apply_rotary_fixed


def test_rope_solution_passes(capsys):
    assert passes(check_rope_layout, solution_namespace("11.rope_layout")["apply_rotary_fixed"])
    assert "check_rope_layout: right" in capsys.readouterr().out


def _by_complex(x, cos, sin):
    half = x.size(-1) // 2
    z = torch.complex(x[..., :half], x[..., half:])  # plane i: number i + i * number (i + hd/2)
    turned = z * torch.complex(cos[..., :half], sin[..., :half])
    return torch.cat([turned.real, turned.imag], dim=-1)


def _by_library_rotate_half(x, cos, sin):
    return x * cos + rotate_half(x) * sin


def _by_hf_rotate_half(x, cos, sin):
    from transformers.models.llama.modeling_llama import rotate_half as hf_rotate_half

    return (x * cos) + (hf_rotate_half(x) * sin)


def _by_flip_and_sign(x, cos, sin):
    half = x.shape[-1] // 2
    sign = torch.cat([-torch.ones(half), torch.ones(half)])
    return x * cos + torch.roll(x, half, dims=-1) * sign * sin


@pytest.mark.parametrize("fn", [_rope(), _by_complex, _by_library_rotate_half, _by_hf_rotate_half,
                                _by_flip_and_sign])
def test_rope_other_styles_pass(fn):
    assert passes(check_rope_layout, fn)


def test_rope_the_broken_function_is_named():
    with pytest.raises(CheckFailure, match="the port's, unchanged"):
        check_rope_layout(apply_rotary_ported)


def test_rope_layout_first_message_says_what_is_observed_not_the_fix():
    """Issue 38: the untouched stub (raise removed) is told what its numbers show, not the fix;
    a second failed attempt gets one more look, and the fix stays behind show_solution."""
    check_rope_layout(solution_namespace("11.rope_layout")["apply_rotary_fixed"])  # a clean count
    messages = []
    for _ in range(2):
        with pytest.raises(CheckFailure) as failure:
            check_rope_layout(apply_rotary_ported)
        messages.append(str(failure.value))
    for n, message in enumerate(messages):
        assert "differs from Hugging Face's" in message and "keep lengths" in message
        assert "show_solution" in message
        for fix in ("rotate_half", "-x2", "x1, x2", "x[..., :", "i + head_dim/2", "cat"):
            assert fix not in message, fix
        assert n == 1 or "halves" not in message  # the second look may name the layout to print
    assert "find the columns" in messages[1] and "find the columns" not in messages[0]


def _pairs_with_reordered_tables(x, cos, sin):
    half = x.size(-1) // 2
    cos_p, sin_p = cos[..., :half].repeat_interleave(2, -1), sin[..., :half].repeat_interleave(2, -1)
    a, b = x[..., 0::2], x[..., 1::2]
    return x * cos_p + torch.stack([-b, a], dim=-1).flatten(-2) * sin_p


@pytest.mark.parametrize(
    "fn, words",
    [
        (_pairs_with_reordered_tables, "pairs layout with the tables reordered"),
        (_rope(first="x2", second="-x1"), "each plane turns backwards"),
        (_rope(first="x2", second="x1"), "not a rotation: lengths change"),
        (_rope(first="-x1", second="x2"), "each number stays in its half"),
        (_rope(swap=True), "position 0 is not left alone"),
        (_rope(split="interleaved"), "paired with the wrong partners"),
        (_rope(split="positions"), "mixed across positions"),
        (_rope(split="heads"), "mixed across heads"),
        (_rope(rotated=False), "only scaled"),
        (_rope(unrotated=False), "x itself is missing"),
    ],
)
def test_rope_mistakes(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_rope_layout(fn)


def test_rope_in_place_is_caught():
    def apply_rotary_fixed(x, cos, sin):
        turned = torch.cat([-x[..., x.size(-1) // 2:], x[..., : x.size(-1) // 2]], dim=-1)
        x.mul_(cos)  # right numbers, but the caller's x is overwritten
        return x.add_(turned * sin)

    with pytest.raises(CheckFailure, match="changes its input in place"):
        check_rope_layout(apply_rotary_fixed)

    def by_slices(x, cos, sin):
        out = x * cos + rotate_half(x) * sin
        x[...] = out
        return x

    with pytest.raises(CheckFailure, match="in place"):
        check_rope_layout(by_slices)


@pytest.mark.parametrize("half", [4, 8])
def test_rope_hard_coded_head_dim_is_caught(half):
    def apply_rotary_fixed(x, cos, sin):
        x1, x2 = x[..., :half], x[..., half:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    with pytest.raises(CheckFailure, match="Only works for one head_dim"):
        check_rope_layout(apply_rotary_fixed)


def test_rope_reshaped_tables_are_caught():
    def apply_rotary_fixed(x, cos, sin):
        return x * cos[None, None] + rotate_half(x) * sin[None, None]  # only right for (L, hd)

    with pytest.raises(CheckFailure, match="works with \\(L, head_dim\\) tables but"):
        check_rope_layout(apply_rotary_fixed)

    def by_view(x, cos, sin):
        cos, sin = cos.view(1, 1, *cos.shape[-2:]), sin.view(1, 1, *sin.shape[-2:])
        return x * cos + rotate_half(x) * sin

    with pytest.raises(CheckFailure, match="Do not reshape cos and sin"):
        check_rope_layout(by_view)


def test_rope_wrong_shape_is_caught():
    with pytest.raises(CheckFailure, match="Wrong output shape"):
        check_rope_layout(lambda x, cos, sin: (x * cos + rotate_half(x) * sin)[..., : x.size(-1) // 2])


def test_rope_refuses_the_references():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    with pytest.raises(CheckFailure, match="handed in a library's rotary function"):
        check_rope_layout(apply_rotary)
    with pytest.raises(CheckFailure, match="handed in a library's rotary function"):
        check_rope_layout(apply_rotary_pos_emb)

    def by_course_lib(x, cos, sin):
        return apply_rotary(x, cos, sin, "halves")

    def by_hf(x, cos, sin):
        return apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=0)[0]

    for fn in (by_course_lib, by_hf):
        with pytest.raises(CheckFailure, match="calls a library's rotary function"):
            check_rope_layout(fn)


def test_rope_stub(capsys):
    def apply_rotary_fixed(x, cos, sin):
        raise NotImplementedError

    check_rope_layout(apply_rotary_fixed)
    assert "not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# debug: the checker's tables are Hugging Face's
# ----------------------------------------------------------------------------------------------


def test_rope_checker_tables_are_hugging_faces():
    """The checker's cos/sin at random positions are what LlamaRotaryEmbedding gives."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from course_lib.checks.lesson11_rope import rope_tables

    for head_dim, base in ((8, 10000.0), (12, 500.0)):
        config = LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, rope_theta=base,
                             max_position_embeddings=256)
        positions = torch.randint(0, 200, (3, 7), generator=torch.Generator().manual_seed(0))
        cos, sin = LlamaRotaryEmbedding(config)(torch.zeros(1), positions)  # (3, 7, head_dim)
        ours_cos, ours_sin = rope_tables(positions, head_dim, base)
        torch.testing.assert_close(ours_cos, cos, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours_sin, sin, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------------------------
# debug: float64 answers are compared, not refused (issue #24)
# ----------------------------------------------------------------------------------------------


def test_rope_layout_float64_answers_are_compared_not_refused():
    right = solution_namespace("11.rope_layout")["apply_rotary_fixed"]
    assert passes(check_rope_layout, lambda x, c, s: right(x.double(), c.double(), s.double()))
    with pytest.raises(CheckFailure, match="the port's, unchanged"):
        check_rope_layout(lambda x, c, s: apply_rotary_ported(x.double(), c.double(), s.double()))


# ----------------------------------------------------------------------------------------------
# check_apply_rope
# ----------------------------------------------------------------------------------------------


def _rope_by_complex(x, positions, base=10000.0):
    half = x.size(-1) // 2
    theta = 1.0 / base ** (torch.arange(0, x.size(-1), 2).double() / x.size(-1))
    turn = torch.polar(torch.ones(len(positions), half, dtype=torch.float64),
                       positions[:, None].double() * theta)  # (L, hd/2) unit complex numbers
    z = torch.complex(x[..., :half].double(), x[..., half:].double()) * turn
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)


def _rope_by_loops(x, positions, base=10000.0):
    out = x.clone()
    hd = x.size(-1)
    for j, m in enumerate(positions.tolist()):
        for i in range(hd // 2):
            a = m * base ** (-2 * i / hd)
            u, v = x[..., j, i], x[..., j, i + hd // 2]
            out[..., j, i] = u * math.cos(a) - v * math.sin(a)
            out[..., j, i + hd // 2] = u * math.sin(a) + v * math.cos(a)
    return out


def _rope_by_rotate_half_float32(x, positions, base=10000.0):
    hd = x.size(-1)
    theta = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    angles = positions[:, None].float() * theta
    angles = torch.cat([angles, angles], dim=-1)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * angles.cos() + torch.cat([-x2, x1], dim=-1) * angles.sin()  # float64 in: float64 out


def test_apply_rope_solution_passes(capsys):
    assert passes(check_apply_rope, solution_namespace("11.apply_rope")["apply_rope"])
    assert "check_apply_rope: right" in capsys.readouterr().out


def _rope_by_einsum(x, positions, base=10000.0):
    hd = x.size(-1)
    theta = base ** (-2 * torch.arange(hd // 2, dtype=torch.float64) / hd)
    angles = torch.einsum("l,i->li", positions.double(), theta)  # the outer product, by einsum
    c, s_ = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return torch.cat([x1 * c - x2 * s_, x1 * s_ + x2 * c], dim=-1)


def _rope_decorated(decorator):
    right = solution_namespace("11.apply_rope")["apply_rope"]

    @decorator
    def apply_rope(x, positions, base=10000.0):
        return right(x, positions, base)

    return apply_rope


@pytest.mark.parametrize("fn", [_rope_by_complex, _rope_by_loops, _rope_by_rotate_half_float32,
                                _rope_by_einsum, _rope_decorated(torch.no_grad()),
                                _rope_decorated(torch.inference_mode())])
def test_apply_rope_other_styles_pass(fn):
    """Issue 38: code under @torch.no_grad() or @torch.inference_mode() shares the decorator's
    wrapper code with Hugging Face's decorated LlamaRotaryEmbedding.forward, and passes."""
    assert passes(check_apply_rope, fn)


def test_apply_rope_still_refuses_hugging_faces_decorated_rotary():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    @torch.no_grad()
    def apply_rope(x, positions, base=10000.0):
        config = LlamaConfig(hidden_size=2 * x.size(-1), num_attention_heads=2, rope_theta=base,
                             max_position_embeddings=64)
        cos, sin = LlamaRotaryEmbedding(config)(x, positions[None])  # (1, L, hd)
        x1, x2 = x[..., : x.size(-1) // 2], x[..., x.size(-1) // 2:]
        return x * cos[0].to(x.dtype) + torch.cat([-x2, x1], -1) * sin[0].to(x.dtype)

    with pytest.raises(CheckFailure, match="library's rotary code"):
        check_apply_rope(apply_rope)


def _rope_table_variant(table="cat", rotation="halves", outer=True, exponent=lambda i, hd: -2 * i / hd):
    """A learner's apply_rope building the (L, hd) table first, then ``x cos + rotate(x) sin``."""

    def apply_rope(x, positions, base=10000.0):
        hd = x.size(-1)
        theta = base ** exponent(torch.arange(hd // 2), hd)
        angles = positions[:, None] * theta[None, :] if outer else positions * theta
        angles = torch.cat([angles, angles], -1) if table == "cat" else angles.repeat_interleave(2, -1)
        if rotation == "halves":
            turned = torch.cat([-x[..., hd // 2:], x[..., : hd // 2]], dim=-1)
        else:
            turned = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
        return x * angles.cos().to(x.dtype) + turned * angles.sin().to(x.dtype)

    return apply_rope


def _rope_variant(shift=0, two=2.0, sign=-1.0, flip=1.0, layout="halves", swap=False,
                  own_positions=False, first_half_only=False, head_dim=None):
    def apply_rope(x, positions, base=10000.0):
        hd = head_dim or x.size(-1)
        p = torch.arange(len(positions)) if own_positions else positions
        i = torch.arange(hd // 2, dtype=torch.float64)
        angles = (p.double() + shift)[:, None] * base ** (sign * two * i / hd)
        c, s = angles.cos().to(x.dtype), (flip * angles).sin().to(x.dtype)
        if swap:
            c, s = s, c
        if layout == "pairs":
            a, b = x[..., 0::2], x[..., 1::2]
            return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        if first_half_only:
            return torch.cat([x1 * c - x2 * s, x2], dim=-1)
        return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)

    return apply_rope


@pytest.mark.parametrize("fn, words", [
    (_rope_variant(shift=1), "1-based positions"),
    (_rope_variant(own_positions=True), "0..L-1 instead of the positions given"),
    (_rope_variant(layout="pairs"), "pairs layout"),
    (_rope_variant(flip=-1.0), "sign is flipped"),
    (_rope_variant(two=1.0), "the 2 is missing"),
    (_rope_variant(sign=1.0), "the minus is missing"),
    (_rope_variant(two=4.0), "-4i"),
    (_rope_variant(swap=True), "cos and sin swapped"),
    (_rope_variant(first_half_only=True), "only the first half"),
    (_rope_variant(head_dim=8), "Only right for another head_dim"),
    # issue 38: a raw size error before; the interleaved table; floor division in the exponent
    (_rope_table_variant(outer=False), "without an outer product"),
    (_rope_table_variant(table="interleave"), "an interleaved table with the halves rotation"),
    (_rope_table_variant(rotation="pairs"), "the halves table with the pairs rotation"),
    (_rope_table_variant(exponent=lambda i, hd: -(2 * i // hd)), "every plane turns at 1 radian"),
    (_rope_table_variant(exponent=lambda i, hd: -2 * i // hd), "rounded down to -1"),
    (_rope_table_variant(exponent=lambda i, hd: -torch.arange(0, hd, 2) // hd), "rounded down to -1"),
    (_rope_table_variant(exponent=lambda i, hd: -(torch.arange(0, hd, 2) // hd)),
     "every plane turns at 1 radian"),
])
def test_apply_rope_mistakes_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_apply_rope(fn)


def test_apply_rope_refuses_the_library():
    with pytest.raises(CheckFailure, match="library's rotary"):
        check_apply_rope(lambda x, p, base=10000.0: apply_rotary(x, torch.ones(x.size(-1)),
                                                                  torch.zeros(x.size(-1))))


# ----------------------------------------------------------------------------------------------
# issue 38, h11's learner tryout: the attempts that got a generic line, a raw error or a wrong name
# ----------------------------------------------------------------------------------------------


def _rope_unpacks_4_dims(x, positions, base=10000.0):
    B, h, L, hd = x.shape  # only right when x has a heads dim
    return solution_namespace("11.apply_rope")["apply_rope"](x, positions, base)


@pytest.mark.parametrize("fn, words", [
    (_rope_table_variant(outer=False), "without an outer product"),  # again, as found
    (lambda x, p, base=10000.0: _rope_transposed(x, p, base), r"the angle table transposed, \(head_dim/2, L\)"),
    (_rope_unpacks_4_dims, "Only right for x with 4 dims"),
])
def test_apply_rope_tryout_mistakes_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_apply_rope(fn)


def _rope_transposed(x, positions, base=10000.0):
    hd = x.size(-1)
    theta = 1.0 / base ** (torch.arange(0, hd, 2).float() / hd)
    angles = (positions[None, :].float() * theta[:, None])  # (hd/2, L): the transpose
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return torch.cat([x1 * angles.cos() - x2 * angles.sin(), x1 * angles.sin() + x2 * angles.cos()], -1)


def test_rope_layout_tryout_mistake_is_named():
    def apply_rotary_fixed(x, cos, sin):  # the halves split, stacked back in pairs
        half = x.size(-1) // 2
        a, b = x[..., :half], x[..., half:]
        return x * cos + torch.stack([-b, a], dim=-1).flatten(-2) * sin

    with pytest.raises(CheckFailure, match="the turned numbers land in the wrong places"):
        check_rope_layout(apply_rotary_fixed)


@pytest.mark.parametrize("turn, theta, words", [
    (None, lambda hd, b: b ** (-2 * torch.arange(1, hd // 2 + 1).float() / hd), "counted from i = 1"),
    (lambda x1, x2, c, s: torch.cat([x1 * c - x2 * s] * 2, -1), None, "the first half's formula"),
])
def test_apply_rope_second_tryout_mistakes_are_named(turn, theta, words):
    def apply_rope(x, positions, base=10000.0):
        hd = x.size(-1)
        th = theta(hd, base) if theta else base ** (-torch.arange(0, hd, 2).float() / hd)
        a = torch.outer(positions.float(), th)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        if turn:
            return turn(x1, x2, a.cos(), a.sin())
        return torch.cat([x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()], -1)

    with pytest.raises(CheckFailure, match=words):
        check_apply_rope(apply_rope)


def test_rope_layout_halves_joined_along_another_dim_is_named():
    def apply_rotary_fixed(x, cos, sin):
        half = x.size(-1) // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-2) * sin

    with pytest.raises(CheckFailure, match="joined along another dim than the last") as failure:
        check_rope_layout(apply_rotary_fixed)
    assert "x[..., :" not in str(failure.value)  # the shapes observed, not the fix
