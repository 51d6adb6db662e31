"""Lesson 13's checker of one tile of FlashAttention's backward pass: the solution and other correct
styles pass, each usual mistake (made in the solution's own source) is named, course_lib's
reference, SDPA and autograd are refused kindly, bad answers get messages, a loop is stopped."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _helpers import as_library, assert_checkers_keep_random_state, passes, solution_namespace

from course_lib import flash
from course_lib.checks import CheckFailure
from course_lib.checks import lesson13_flash_backward as backward
from course_lib.solutions import solution_source

check = backward.check_flash_backward_tile
KEY = "13.flash_backward_tile"


def _solution():
    return solution_namespace(KEY)["my_backward_tile"]


def _edited(*replacements):
    """The solution with its source edited: a learner's version with one mistake in it."""
    source = solution_source(KEY)
    for old, new in replacements:
        assert old in source, old
        source = source.replace(old, new)
    namespace = {"torch": torch, "math": math}
    exec(source, namespace)  # noqa: S102  (our own solution, edited)
    return namespace["my_backward_tile"]


def _fails(fn, *words):
    with pytest.raises(CheckFailure) as info:
        check(fn)
    for word in words:
        assert word in str(info.value), str(info.value)
    return info.value


def test_the_solution_passes_and_keeps_the_random_state():
    assert passes(check, _solution())
    assert_checkers_keep_random_state([(check, _solution())])


def test_other_correct_styles_pass():
    def my_backward_tile(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0, is_causal=False):
        """einsum, a boolean 'may attend' mask and torch.where, one row of queries at a time."""
        dq = torch.zeros_like(q_i)
        dk, dv = torch.zeros_like(k_j), torch.zeros_like(v_j)
        for r in range(q_i.size(0)):
            s = torch.einsum("d,kd->k", q_i[r], k_j) * scale
            keep = (torch.arange(k_j.size(0)) + j0 <= i0 + r) if is_causal else torch.ones_like(s).bool()
            p = torch.where(keep, torch.exp(s - lse_i[r]), torch.zeros_like(s))
            dv += torch.outer(p, d_out_i[r])
            ds = p * (v_j @ d_out_i[r] - D_i[r])
            dq[r] = scale * ds @ k_j
            dk += scale * torch.outer(ds, q_i[r])
        return dq, dk, dv

    assert passes(check, my_backward_tile)

    @torch.no_grad()
    def in_float32_inside(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0, is_causal=False):
        """Transposes with .transpose and a list result; float64 kept."""
        s = q_i @ k_j.transpose(0, 1) * scale
        if is_causal:
            s = s + torch.full_like(s, -math.inf).triu(i0 - j0 + 1)  # key j0 + c > query i0 + r
        p = (s - lse_i.unsqueeze(1)).exp()
        ds = p * (d_out_i @ v_j.transpose(0, 1) - D_i.unsqueeze(1))
        return [scale * ds @ k_j, scale * ds.transpose(0, 1) @ q_i, p.transpose(0, 1) @ d_out_i]

    assert passes(check, in_float32_inside)


MISTAKES = [  # (the edit of the solution's source, the mistake the checker names)
    ([("ds = p * (dp - D_i[:, None])", "ds = p * dp")], "no D"),
    ([("ds = p * (dp - D_i[:, None])", "ds = p * (dp - (p * dp).sum(-1, keepdim=True))")],
     "D from the tile"),
    ([("p = torch.exp(s - lse_i[:, None])", "p = torch.exp(s)")], "exp(S)"),
    ([("p = torch.exp(s - lse_i[:, None])", "p = s.softmax(-1)")], "softmax of the tile"),
    ([("p = torch.exp(s - lse_i[:, None])", "p = torch.exp(s - lse_i)")], "lse along keys"),
    ([("ds = p * (dp - D_i[:, None])", "ds = p * (dp - D_i)")], "D along keys"),
    ([("s = q_i @ k_j.T * scale", "s = q_i @ k_j.T")], "no scale in S"),
    ([("s = q_i @ k_j.T * scale", "s = q_i @ k_j.T / math.sqrt(q_i.size(-1))")],
     "scale from head_dim"),
    ([("dq_i = ds @ k_j * scale", "dq_i = ds @ k_j"), ("dk_j = ds.T @ q_i * scale", "dk_j = ds.T @ q_i")],
     "no scale in dQ dK"),
    ([("dq_i = ds @ k_j * scale", "dq_i = ds @ k_j")], "no scale in dQ"),
    ([("dk_j = ds.T @ q_i * scale", "dk_j = ds.T @ q_i")], "no scale in dK"),
    ([("dq_i = ds @ k_j * scale", "dq_i = ds @ k_j * scale**2"),
      ("dk_j = ds.T @ q_i * scale", "dk_j = ds.T @ q_i * scale**2")], "scale twice"),
    ([("dv_j = p.T @ d_out_i", "dv_j = p @ d_out_i")], "dV = P dO"),
    ([("dv_j = p.T @ d_out_i", "dv_j = p.T @ v_j")], "dV = P^T V"),  # tryout 13f
    ([("dp = d_out_i @ v_j.T", "dp = v_j @ d_out_i.T")], "dP transposed"),
    ([("dq_i = ds @ k_j * scale", "dq_i = ds.T @ k_j * scale")], "dQ = dS^T K"),
    ([("dk_j = ds.T @ q_i * scale", "dk_j = ds @ q_i * scale")], "dK = dS Q"),
    ([("if is_causal:", "if False:")], "no causal mask"),
    ([("torch.arange(i0, i0 + q_i.size(0))", "torch.arange(q_i.size(0))"),
      ("torch.arange(j0, j0 + k_j.size(0))", "torch.arange(k_j.size(0))")], "mask in tile coordinates"),
    ([("cols > rows", "cols >= rows")], "diagonal hidden"),
    ([("ds = p * (dp - D_i[:, None])", "ds = p * (dp + D_i[:, None])")], "D with the wrong sign"),
    ([("ds = p * (dp - D_i[:, None])", "ds = dp - D_i[:, None]")], "dS without P"),
    ([("ds = p * (dp - D_i[:, None])", "ds = p * (D_i[:, None] - dp)")], "dS negated"),
    ([("dq_i = ds @ k_j * scale", "dq_i = ds @ k_j * scale**2")], "scale twice in dQ"),
    ([("dk_j = ds.T @ q_i * scale", "dk_j = ds.T @ q_i * scale**2")], "scale twice in dK"),
    ([("if is_causal:", "if True:")], "causal mask always"),
    ([("torch.arange(i0, i0 + q_i.size(0))", "torch.arange(q_i.size(0))")], "mask ignores i0"),
    ([("torch.arange(j0, j0 + k_j.size(0))", "torch.arange(k_j.size(0))")], "mask ignores j0"),
    ([("ds = p * (dp - D_i[:, None])", "ds = p * dp - D_i[:, None]")], "D outside P"),
    ([("p = torch.exp(s - lse_i[:, None])", "p = torch.exp(s + lse_i[:, None])")], "exp(S + L)"),
    ([("    s = q_i @ k_j.T * scale",
       "    scale = 1 / math.sqrt(q_i.size(-1))\n    s = q_i @ k_j.T * scale")], "1/sqrt(d) everywhere"),
    ([("dq_i = ds @ k_j * scale", "dq_i = ds @ k_j / math.sqrt(k_j.size(-1))"),
      ("dk_j = ds.T @ q_i * scale", "dk_j = ds.T @ q_i / math.sqrt(q_i.size(-1))")], "1/sqrt(d) in dQ dK"),
    ([("dq_i = ds @ k_j * scale", "dq_i = ds @ k_j / scale"),
      ("dk_j = ds.T @ q_i * scale", "dk_j = ds.T @ q_i / scale")], "scale divided"),
    ([("dv_j = p.T @ d_out_i", "dv_j = p.T @ d_out_i * scale")], "dV scaled"),
    ([("return dq_i, dk_j, dv_j", "return dq_i, dk_j, ds.T @ d_out_i")], "dV from dS"),
    ([("dq_i = ds @ k_j * scale", "dq_i = p @ k_j * scale")], "dQ from P"),
    ([("dk_j = ds.T @ q_i * scale", "dk_j = p.T @ q_i * scale")], "dK from P"),
    ([("return dq_i, dk_j, dv_j", "return dq_i, dv_j, dk_j")], "returns (dq, dv, dk)"),
    ([("return dq_i, dk_j, dv_j", "return dv_j, dq_i, dk_j")], "returns (dv, dq, dk)"),
    ([("return dq_i, dk_j, dv_j", "return dk_j, dq_i, dv_j")], "returns (dk, dq, dv)"),
    ([("return dq_i, dk_j, dv_j", "return dv_j, dk_j, dq_i")], "returns (dv, dk, dq)"),
    ([("return dq_i, dk_j, dv_j", "return dk_j, dv_j, dq_i")], "returns (dk, dv, dq)"),
    ([('float("-inf")', "0.0")], "mask S with 0"),
    ([('s = s.masked_fill(cols > rows, float("-inf"))', "hide = cols > rows"),
      ("dv_j = p.T @ d_out_i", "dv_j = (p.masked_fill(hide, 0.0) if is_causal else p).T @ d_out_i")],
     "mask on dV's P only"),
    ([('s = s.masked_fill(cols > rows, float("-inf"))', "hide = cols > rows"),
      ("ds = p * (dp - D_i[:, None])",
       "ds = p * (dp - D_i[:, None])\n    if is_causal:\n        ds = ds.masked_fill(hide, 0.0)")],
     "mask on dS only"),
    ([("torch.arange(i0, i0 + q_i.size(0))", "torch.arange(j0, j0 + q_i.size(0))"),
      ("torch.arange(j0, j0 + k_j.size(0))", "torch.arange(i0, i0 + k_j.size(0))")], "mask offset reversed"),
    ([("cols > rows", "cols > rows + 1")], "mask one key late"),
    ([("cols > rows", "cols > rows + (k_j.size(0) - q_i.size(0))")], "mask bottom-right in the tile"),
    ([("cols > rows", "cols < rows")], "mask transposed"),
    ([("dk_j = ds.T @ q_i * scale", "dk_j = ds.T @ k_j * scale")], "dK from K"),
    ([("dq_i = ds @ k_j * scale", "dq_i = ds @ q_i * scale")], "dQ from Q"),
    ([("dq_i = ds @ k_j * scale", "dq_i = ds @ v_j * scale")], "dQ = dS V"),
]


def test_an_unknown_constant_factor_is_observed():
    wrong = _edited(("dk_j = ds.T @ q_i * scale", "dk_j = ds.T @ q_i * scale * 3"))
    failure = _fails(wrong, "Not yet", "dK is 3 times autograd's")
    assert failure.mistake is None


def test_float32_inside_is_named_and_float64_inside_passes():
    def in_float32(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0, is_causal=False):
        args = (t.float() for t in (q_i, k_j, v_j, d_out_i, lse_i, D_i))
        return tuple(g.to(q_i.dtype) for g in _solution()(*args, scale, i0, j0, is_causal))

    failure = _fails(in_float32, "float32", "inputs' dtype")
    assert failure.mistake == "float32"

    def float32_and_no_d(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0, is_causal=False):
        args = (t.float() for t in (q_i, k_j, v_j, d_out_i, lse_i, torch.zeros_like(D_i)))
        return tuple(g.to(q_i.dtype) for g in _solution()(*args, scale, i0, j0, is_causal))

    assert _fails(float32_and_no_d, "Likely mistake").mistake == "no D"  # the logic first

    def cast_to_float64(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0, is_causal=False):
        """A float64 copy inside, the result cast back; a mask from tril(diagonal=i0 - j0)."""
        q, k, v, do, lse, D = (t.double() for t in (q_i, k_j, v_j, d_out_i, lse_i, D_i))
        p = (q @ k.transpose(0, 1) * scale - lse[:, None]).exp()
        if is_causal:
            p = p * torch.ones(len(q), len(k), dtype=torch.bool).tril(diagonal=i0 - j0)
        ds = p * (do @ v.transpose(0, 1) - D[:, None])
        return ((ds @ k) * scale).to(q_i.dtype), (ds.T @ q * scale).to(q_i.dtype), (p.T @ do).to(q_i.dtype)

    assert passes(check, cast_to_float64)


@pytest.mark.parametrize("edits, mistake", MISTAKES, ids=[m for _, m in MISTAKES])
def test_each_mistake_is_named(edits, mistake):
    failure = _fails(_edited(*edits), "Likely mistake")
    assert failure.mistake == mistake, str(failure)


def test_every_named_mistake_is_tested():
    assert {m for _, m in MISTAKES} == {knob for knob, _ in backward.MISTAKES}


def test_course_lib_sdpa_and_autograd_are_refused():
    def with_course_lib(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0, is_causal=False):
        keep = (torch.arange(j0, j0 + k_j.size(0))[None] <= torch.arange(i0, i0 + q_i.size(0))[:, None]
                if is_causal else None)
        return flash.flash_backward_tile(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, keep)

    _fails(with_course_lib, "course_lib", "flash_backward_tile")

    def imports_it_inside(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0, is_causal=False):
        from course_lib.flash import flash_attention_backward  # seen only when it runs

        out = torch.zeros(1, 1, q_i.size(0), v_j.size(1), dtype=q_i.dtype)
        flash_attention_backward(out, q_i[None, None], k_j[None, None], v_j[None, None], out,
                                 lse_i[None, None])
        return _solution()(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0, j0, is_causal)

    _fails(imports_it_inside, "calls course_lib's FlashAttention")
    _fails(flash.flash_backward_tile, "course_lib")
    hidden = as_library(_solution(), "course_lib.flash")  # course_lib's code under another name
    _fails(hidden, "course_lib")

    def with_sdpa(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0, is_causal=False):
        F.scaled_dot_product_attention(q_i[None], k_j[None], v_j[None], scale=scale)
        return _solution()(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0, j0, is_causal)

    _fails(with_sdpa, "PyTorch's attention")

    def with_autograd(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0, is_causal=False):
        q, k, v = (t.clone().requires_grad_() for t in (q_i, k_j, v_j))
        s = q @ k.T * scale
        if is_causal:
            s = s.masked_fill(torch.arange(j0, j0 + k.size(0))[None]
                              > torch.arange(i0, i0 + q.size(0))[:, None], -math.inf)
        p = torch.exp(s - lse_i[:, None])
        # O = P V and D = rowsum(P * dP): a loss whose gradients are the tile's, through autograd
        loss = (d_out_i * (p @ v)).sum() - (D_i * p.sum(-1)).sum()
        return torch.autograd.grad(loss, (q, k, v))

    _fails(with_autograd, "autograd")


@pytest.mark.parametrize("answer, words", [
    (lambda *a, **kw: None, "Return three tensors"),
    (lambda *a, **kw: (a[0], a[1]), "Return three tensors"),
    (lambda q_i, k_j, v_j, *a, **kw: (torch.zeros_like(q_i), torch.zeros_like(k_j),
                                      torch.zeros(1, v_j.size(1), dtype=q_i.dtype)),
     "dv_j is (1, 6), expected (4, 6)"),
    (lambda q_i, k_j, v_j, *a, **kw: (torch.zeros(q_i.shape), torch.zeros(k_j.shape),
                                      torch.zeros(v_j.shape)), "float32"),
    (lambda q_i, k_j, v_j, d_out_i, lse_i, D_i, scale: None, "i0"),
])
def test_bad_answers_get_a_message(answer, words):
    _fails(answer, words)


def test_not_a_function_and_a_stub(capsys):
    _fails(None, "Hand in your function itself")

    def my_backward_tile(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0, is_causal=False):
        raise NotImplementedError

    check(my_backward_tile)
    assert "not implemented yet" in capsys.readouterr().out


def test_in_place_changes_and_an_endless_loop(monkeypatch):
    def in_place(q_i, k_j, v_j, d_out_i, lse_i, D_i, scale, i0=0, j0=0, is_causal=False):
        q_i.mul_(scale)
        return _solution()(q_i / scale, k_j, v_j, d_out_i, lse_i, D_i, scale, i0, j0, is_causal)

    _fails(in_place, "in place")
    monkeypatch.setattr(backward, "TIME_LIMIT", 1.0)

    def endless(*args, **kwargs):
        while True:
            pass

    _fails(endless, "was stopped")


# --- the Predict exercise on bytes: two counts, each judged by itself -----------------------------

_L, _D, _T = 16384, 64, 64
_LD, _L2 = _L * _D, _L * _L
_STANDARD, _FLASH = 4 * (4 * _LD + 4 * _L2), 4 * (2 * _LD + 2 * _T * _LD + _L)


def _flash_bytes(tiles, d=_D):
    return 4 * (2 * _L * d + 2 * tiles * _L * d + _L)


def _io_message(value):
    with pytest.raises(CheckFailure) as info:
        backward.check_io_ratio(lambda: value)
    return info.value


def test_the_io_prediction_passes_exact_rounded_and_in_other_types(capsys):
    predicted = solution_namespace("13.io_ratio")["predicted_io_bytes"]
    assert passes(backward.check_io_ratio, predicted)
    assert predicted() == (flash.attention_io_bytes(16384, 64, "standard"),
                           flash.attention_io_bytes(16384, 64, "flash", block=256))
    assert passes(backward.check_io_ratio, lambda: (4 * 4 * _L2, 4 * 2 * _L2 * _D / 256))  # Θ terms
    assert passes(backward.check_io_ratio, lambda: [torch.tensor(_STANDARD), float(_FLASH)])
    assert passes(backward.check_io_ratio, lambda: torch.tensor([_STANDARD, _FLASH], dtype=torch.float64))
    assert passes(backward.check_io_ratio, lambda: (_STANDARD, _FLASH - 4 * _LD))  # O forgotten: 5%
    assert "0.51 GiB" in capsys.readouterr().out


@pytest.mark.parametrize("value, words", [
    ((4 * (4 * _LD + 2 * _L2), _FLASH), ["standard-attention count", "two L x L transfers",
                                          "written but not read back", "P left out",
                                          "FlashAttention-2's count is right"]),
    ((4 * (4 * _LD + 3 * _L2), _FLASH), ["three L x L transfers"]),
    ((4 * (4 * _LD + _L2), _FLASH), ["one L x L transfer"]),
    ((_STANDARD / 4, _FLASH), ["standard-attention count", "numbers, not bytes"]),
    ((_STANDARD, _FLASH / 4), ["FlashAttention-2 count", "numbers, not bytes",
                               "standard attention's count is right"]),
    ((_STANDARD, _flash_bytes(1)), ["K and V read once in all"]),
    ((_STANDARD, 4 * (2 * _LD + _T * _LD + _L)), ["K and V counted as L d numbers together",
                                                  "tiles of 512 queries"]),
    ((_STANDARD, 4 * (3 * _LD + _T * _LD + _L)), ["only one of K and V read once per query tile"]),
    ((_STANDARD, _flash_bytes(128)), ["tiles of 128 queries", "head_dim 128"]),
    ((_STANDARD, _flash_bytes(86)), ["tiles of 192 queries", "M / (4d)"]),
    ((_STANDARD, _flash_bytes(_L / 192)), ["tiles of 192 queries"]),
    ((_STANDARD, _flash_bytes(_T, 128)), ["head_dim 128, not 64"]),
    ((_STANDARD, _flash_bytes(256)), ["tiles of 64 queries", "L / head_dim"]),
    ((_STANDARD, _flash_bytes(100)), ["K and V read 100 times"]),
    ((_STANDARD, 4 * (_LD + 3 * _T * _LD + _LD + _L)), ["Q read again with K and V"]),
    ((_STANDARD, _FLASH + 4 * 4 * _L2), ["S and P written and read back"]),
    ((_STANDARD, 4 * _L2 * _D * _D / (192 * 1024 / 4)), ["Theorem 2's bound", "192 KB of float32"]),
    ((_STANDARD, _FLASH * 8), ["bits, not bytes"]),
    ((_FLASH, _STANDARD), ["swapped"]),
    ((_STANDARD / 4, _FLASH / 4), ["both counts", "numbers, not bytes"]),
    ((_STANDARD * 8, _FLASH * 8), ["both counts", "bits"]),
    ((_STANDARD * 2, _FLASH * 2), ["both counts", "float64"]),
    ((_STANDARD / 2, _FLASH / 2), ["both counts", "float16"]),
    ((_STANDARD / 2**30, _FLASH / 2**30), ["both counts", "GiB"]),
    (_STANDARD / _FLASH, ["one number", "the ratio of the two counts", "(standard_bytes, flash_bytes)"]),
    (8, ["the ratio of the two counts"]),
    (_FLASH / _STANDARD, ["FlashAttention-2's count over standard attention's"]),
    (_STANDARD, ["one number", "standard attention's count"]),
])
def test_the_io_miscounts_are_named(value, words):
    message = str(_io_message(value))
    assert message.startswith("Observed"), message
    for word in words:
        assert word in message, message


def test_both_counts_wrong_get_both_names():
    message = str(_io_message((4 * (4 * _LD + 2 * _L2), _flash_bytes(1))))
    assert "two L x L transfers" in message and "K and V read once in all" in message, message


@pytest.mark.parametrize("value, words", [
    ((4 * (4 * _LD + 4 * _L2 * _D), _FLASH), ["each score counted as head_dim = 64 numbers"]),
    ((_STANDARD, 12345.0), ["FlashAttention-2 count", "once per query tile"]),
    ((-2, _FLASH), ["positive"]), ((0, 0), ["positive"]),
    ("8", ["Return a tuple of two numbers"]), (None, ["Return a tuple of two numbers"]),
    ((1, 2, 3), ["tuple of 3"]), ((_STANDARD, None), ["FlashAttention-2's count is NoneType"]),
    ((float("nan"), _FLASH), ["Return two numbers"]), (-1.0, ["one number"]),
])
def test_other_io_answers_get_a_message(value, words):
    message = str(_io_message(value))
    for word in words:
        assert word in message, message


def test_the_io_checker_refuses_attention_io_bytes_and_errors():
    def ready_made():
        return (flash.attention_io_bytes(16384, 64, "standard"),
                flash.attention_io_bytes(16384, 64, "flash", block=256))

    with pytest.raises(CheckFailure, match="attention_io_bytes"):
        backward.check_io_ratio(ready_made)
    with pytest.raises(CheckFailure, match="ZeroDivisionError"):
        backward.check_io_ratio(lambda: 1 / 0)
    with pytest.raises(CheckFailure, match="without parentheses"):
        backward.check_io_ratio((_STANDARD, _FLASH))


def test_no_io_miscount_is_near_a_right_count():
    standard, tiled = backward.io_bytes_answer()
    assert all(abs(value - standard) > 0.1 * standard for value, _, _ in backward._standard_miscounts())
    assert all(abs(value - tiled) > 0.1 * tiled for value, _, _ in backward._flash_miscounts())


# --- the previous tryout's weak classes (issue #48): each named by what is observed ---------------

def test_a_mask_aligned_to_the_tiles_bottom_right_is_named():
    wrong = _edited(("s = s.masked_fill(cols > rows, float(\"-inf\"))",
                     "s = s.masked_fill(cols > rows + (k_j.size(0) - q_i.size(0)), float(\"-inf\"))"))
    failure = _fails(wrong, "Likely mistake", "bottom-right corner", "top-left")
    assert failure.mistake and "bottom-right" in failure.mistake


def test_dk_from_k_and_dq_from_q_are_named():
    _fails(_edited(("dk_j = ds.T @ q_i * scale", "dk_j = ds.T @ k_j * scale")), "Likely mistake",
           "dK is what dSᵀ K_j · scale gives")
    _fails(_edited(("dq_i = ds @ k_j * scale", "dq_i = ds @ q_i * scale")), "Likely mistake",
           "dQ is what dS Q_i · scale gives")
