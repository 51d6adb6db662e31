"""Lesson 13's checkers: every solution passes, other correct styles pass, each usual mistake is
named, ready-made attention is refused kindly, and the Debug exercise's untouched code gets what is
observed, never the fix."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from course_lib import flash
from course_lib.checks import lesson13_scale as scale
from course_lib.checks import CheckFailure
from course_lib.solutions import solution_source


def _solution(key: str, name: str):
    """The solution as the notebook runs it (the lesson's imports, then the block)."""
    namespace: dict = {"torch": torch, "math": math}
    exec(solution_source(key), namespace)
    return namespace[name]


def _passes(check, fn, capsys) -> str:
    check(fn)
    out = capsys.readouterr().out
    assert "right" in out or "Well done" in out, out
    return out


def _fails(check, fn, *words) -> str:
    with pytest.raises(CheckFailure) as info:
        check(fn)
    message = str(info.value)
    for word in words:
        assert word in message, message
    return message


# --- the solutions, and a stub -----------------------------------------------------------------

@pytest.mark.parametrize("key, name, check", [
    ("13.score_bytes", "predicted_score_bytes", scale.check_score_bytes),
    ("13.merge", "merge_states", scale.check_merge_states),
    ("13.flash_fix", "flash_one_head", scale.check_flash_fix),
    ("13.flash_forward", "my_flash_forward", scale.check_flash_forward),
    ("13.locate", "locate", scale.check_locate),
])
def test_every_solution_passes(key, name, check, capsys):
    _passes(check, _solution(key, name), capsys)


def test_a_stub_gets_a_reminder(capsys):
    def merge_states(*args):
        raise NotImplementedError

    scale.check_merge_states(merge_states)
    assert "not implemented yet" in capsys.readouterr().out


# --- Predict ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value, words", [
    (12 * 32768 * 32768, "not bytes"),
    (32768 * 32768 * 4, "one head"),
    (12 * 32768 * 32768 * 2, "float16"),
    (12 * 32000 * 32000 * 4, "32,768"),
    (12 * 32768 * 4, "L^2"),
    (12 * 32768 * 32768 * 4 / 2**30, "GiB"),
    (-5, "too small"),
    ("a lot", "Return one number"),
])
def test_score_bytes_names_the_miscount(value, words):
    _fails(scale.check_score_bytes, lambda: value, words)


# --- the merge ---------------------------------------------------------------------------------

def _merge_variant(kind):
    def merge(m_a, ell_a, o_a, m_b, ell_b, o_b):
        m = torch.maximum(m_a, m_b)
        if kind == "nan":
            a, b = torch.exp(m_a - m), torch.exp(m_b - m)
        else:
            ref = torch.where(torch.isinf(m), 0.0, m)
            a, b = torch.exp(m_a - ref), torch.exp(m_b - ref)
        if kind == "o":
            return m, a * ell_a + b * ell_b, o_a + o_b
        if kind == "inverted":
            a, b = 1 / a, 1 / b
        o = a[..., None] * o_a + b[..., None] * o_b
        ell = a * ell_a + b * ell_b
        if kind == "normalised":
            o = o / ell[..., None]
        return m, ell, o
    return merge


@pytest.mark.parametrize("kind, words", [
    ("o", "o not rescaled"), ("nan", "NaN"), ("normalised", "o divided by ell"),
    ("inverted", "the wrong way"),
])
def test_merge_mistakes_are_named(kind, words):
    _fails(scale.check_merge_states, _merge_variant(kind), words)


def test_merge_in_another_style_passes(capsys):
    """float32 inside, a loop over rows would be slow: stack, logsumexp-based weights."""
    def merge_states(m_a, ell_a, o_a, m_b, ell_b, o_b):
        m = torch.stack([m_a, m_b]).amax(0)
        safe = torch.nan_to_num(m, neginf=0.0)
        w = torch.exp(torch.stack([m_a, m_b]) - safe)  # (2, ...)
        return m, (w * torch.stack([ell_a, ell_b])).sum(0), (w[..., None] * torch.stack([o_a, o_b])).sum(0)
    _passes(scale.check_merge_states, merge_states, capsys)


def test_merge_refuses_course_lib(capsys):
    _fails(scale.check_merge_states, flash.merge_softmax_states, "ready-made")

    def merge_states(*s):
        return flash.merge_softmax_states(*s)
    _fails(scale.check_merge_states, merge_states, "course_lib's merge_softmax_states")


# --- the Debug exercise --------------------------------------------------------------------------

def flash_one_head_buggy(q, k, v, block_k=16):
    scale_ = 1.0 / math.sqrt(q.size(-1))
    m = torch.full((q.size(0),), float("-inf"), dtype=q.dtype)
    ell = torch.zeros(q.size(0), dtype=q.dtype)
    o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
    for start in range(0, k.size(0), block_k):
        s = q @ k[start:start + block_k].T * scale_
        m_new = torch.maximum(m, s.amax(dim=-1))
        p = torch.exp(s - m_new[:, None])
        ell = torch.exp(m - m_new) * ell + p.sum(dim=-1)
        o = o + p @ v[start:start + block_k]
        m = m_new
    return o / ell[:, None]


def test_the_untouched_debug_code_gets_what_is_observed_then_more():
    scale._FIX_SEEN["o"] = 0
    first = _fails(scale.check_flash_fix, flash_one_head_buggy, "differs from exact attention",
                   "add up to 1", "by hand")
    assert "alpha" not in first and "rescal" not in first and "show_solution" not in first
    second = _fails(scale.check_flash_fix, flash_one_head_buggy, "show_solution")
    assert "o * alpha" not in second  # a question, not the code


def test_debug_refuses_sdpa_and_names_a_dropped_block(capsys):
    def flash_one_head(q, k, v, block_k=16):
        return F.scaled_dot_product_attention(q, k, v)
    _fails(scale.check_flash_fix, flash_one_head, "ready-made attention")

    def dropped(q, k, v, block_k=16):
        return scale._one_head(q, k, v, block_k, "last block dropped")
    _fails(scale.check_flash_fix, dropped, "last, shorter block")


def test_debug_in_float32_and_a_decorator_pass(capsys):
    fixed = _solution("13.flash_fix", "flash_one_head")

    @torch.no_grad()
    def flash_one_head(q, k, v, block_k=16):
        return fixed(q.float(), k.float(), v.float(), block_k).double()

    _passes(scale.check_flash_fix, flash_one_head, capsys)  # float32 inside: within 2e-5

    @torch.no_grad()
    def flash_one_head_64(q, k, v, block_k=16):
        return fixed(q, k, v, block_k)
    _passes(scale.check_flash_fix, flash_one_head_64, capsys)


# --- the ★★★ tiled forward -------------------------------------------------------------------------

def _knob_forward(knob):
    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        if knob in ("o not rescaled", "lse too early", "last tile dropped", "not divided"):
            return scale._tiled_knob(q.double(), k.double(), v.double(), is_causal, block_q, block_k, knob)
        return scale._ref_forward(q.double(), k.double(), v.double(), is_causal, knob)
    return my_flash_forward


@pytest.mark.parametrize("knob, words", [
    ("o not rescaled", "not rescaled"), ("lse too early", "after the first tile"),
    ("last tile dropped", "shorter tile"), ("not divided", "not divided by ell"),
    ("no scale", "sqrt(head_dim)"), ("no diagonal", "hides the diagonal"),
    ("lse without m", "without the running maximum"),
])
def test_forward_mistakes_are_named(knob, words):
    # the whole-matrix variants are refused for their size first; run them on tiles of the full size
    fn = _knob_forward(knob)

    def tiled_sized(q, k, v, is_causal=False, block_q=32, block_k=32):
        return fn(q, k, v, is_causal, block_q, block_k)
    message = _fails(scale.check_flash_forward, tiled_sized)
    assert words in message or "makes a tensor" in message, message


def test_whole_score_matrix_is_refused():
    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        return scale._ref_forward(q.double(), k.double(), v.double(), is_causal)
    _fails(scale.check_flash_forward, my_flash_forward, "makes a tensor", "(L_q, L_k)")


def test_sdpa_and_course_lib_are_refused():
    def with_sdpa(q, k, v, is_causal=False, block_q=32, block_k=32):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        return out, torch.zeros(q.shape[:-1], dtype=q.dtype)
    _fails(scale.check_flash_forward, with_sdpa, "PyTorch's attention")

    def with_course_lib(q, k, v, is_causal=False, block_q=32, block_k=32):
        return flash.flash_attention_forward(q, k, v, is_causal=is_causal, block_q=block_q, block_k=block_k)
    _fails(scale.check_flash_forward, with_course_lib, "course_lib")


def test_no_causal_skipping_is_named():
    solution = _solution("13.flash_forward", "my_flash_forward")

    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        """Masks every tile but computes all of them."""
        B, h, L_q, d = q.shape
        L_k = k.size(2)
        out = torch.zeros(B, h, L_q, v.size(-1), dtype=q.dtype)
        lse = torch.zeros(B, h, L_q, dtype=q.dtype)
        for i0 in range(0, L_q, block_q):
            i1 = min(i0 + block_q, L_q)
            m = torch.full((B, h, i1 - i0), float("-inf"), dtype=q.dtype)
            ell = torch.zeros_like(m)
            o = torch.zeros(B, h, i1 - i0, v.size(-1), dtype=q.dtype)
            for j0 in range(0, L_k, block_k):
                j1 = min(j0 + block_k, L_k)
                s = q[:, :, i0:i1] @ k[:, :, j0:j1].transpose(-2, -1) / math.sqrt(d)
                if is_causal:
                    s = s.masked_fill(torch.arange(j0, j1)[None] > torch.arange(i0, i1)[:, None], -math.inf)
                m_new = torch.maximum(m, s.amax(-1))
                safe = torch.where(torch.isinf(m_new), 0.0, m_new)
                p = torch.exp(s - safe[..., None])
                alpha = torch.exp(m - safe)
                ell, o, m = alpha * ell + p.sum(-1), alpha[..., None] * o + p @ v[:, :, j0:j1], m_new
            out[:, :, i0:i1], lse[:, :, i0:i1] = o / ell[..., None], m + torch.log(ell)
        return out, lse
    assert solution is not None
    _fails(scale.check_flash_forward, my_flash_forward, "every tile is computed", "skip")


def test_forward_in_another_style_passes(capsys):
    """einsum, float64 inside, tiles as lists merged with the online softmax at the end."""
    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        q64, k64, v64 = q.double(), k.double(), v.double()
        L_q, L_k = q.size(2), k.size(2)
        outs, lses = [], []
        for i0 in range(0, L_q, block_q):
            i1 = min(i0 + block_q, L_q)
            state = None
            for j0 in range(0, min(L_k, i1) if is_causal else L_k, block_k):
                j1 = min(j0 + block_k, L_k)
                s = torch.einsum("bhqd,bhkd->bhqk", q64[:, :, i0:i1], k64[:, :, j0:j1]) / q.size(-1) ** 0.5
                if is_causal:
                    s = s.masked_fill(torch.arange(j0, j1)[None] > torch.arange(i0, i1)[:, None], -math.inf)
                m = s.amax(-1)
                p = torch.exp(s - torch.nan_to_num(m, neginf=0.0)[..., None])  # a row may see nothing
                new = (m, p.sum(-1), torch.einsum("bhqk,bhkd->bhqd", p, v64[:, :, j0:j1]))
                if state is None:
                    state = new
                else:
                    mm = torch.maximum(state[0], new[0])
                    a, b = torch.exp(state[0] - mm), torch.exp(new[0] - mm)  # mm is finite here
                    state = (mm, a * state[1] + b * new[1], a[..., None] * state[2] + b[..., None] * new[2])
            outs.append(state[2] / state[1][..., None])
            lses.append(state[0] + state[1].log())
        return torch.cat(outs, 2).to(q.dtype), torch.cat(lses, 2).to(q.dtype)
    _passes(scale.check_flash_forward, my_flash_forward, capsys)


def test_a_loop_that_never_ends_is_stopped(monkeypatch):
    monkeypatch.setattr(scale, "TIME_LIMIT", 1.0)

    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        while True:
            pass
    _fails(scale.check_flash_forward, my_flash_forward, "was stopped")


# --- the block table ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fn, words", [
    (lambda table, position, size: divmod(position, size), "logical block"),
    (lambda table, position, size: (position % size, table[position // size]), "swapped"),
    (lambda table, position, size: (table[max(position // size - 1, 0)], position % size), "too early"),
    (lambda table, position, size: None, "Return a pair"),
])
def test_locate_mistakes_are_named(fn, words):
    _fails(scale.check_locate, fn, words)


def test_locate_with_a_tensor_table_result_passes(capsys):
    def locate(block_table, position, block_size):
        table = torch.tensor(block_table)
        return table[position // block_size], torch.tensor(position % block_size)
    _passes(scale.check_locate, locate, capsys)


# --- issue #48: wrong attempts that were accepted -----------------------------------------------

def _tiled_forward(stop_late=False):
    """A tiled causal forward; with stop_late its stop test is one tile late (the extra tile masked)."""
    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        B, h, L_q, d = q.shape
        L_k = k.size(2)
        out = torch.zeros(B, h, L_q, v.size(-1), dtype=q.dtype)
        lse = torch.zeros(B, h, L_q, dtype=q.dtype)
        for i0 in range(0, L_q, block_q):
            i1 = min(i0 + block_q, L_q)
            m = torch.full((B, h, i1 - i0), float("-inf"), dtype=q.dtype)
            ell = torch.zeros_like(m)
            o = torch.zeros(B, h, i1 - i0, v.size(-1), dtype=q.dtype)
            for j0 in range(0, L_k, block_k):
                if is_causal and (j0 > i1 if stop_late else j0 > i1 - 1):
                    break
                j1 = min(j0 + block_k, L_k)
                s = q[:, :, i0:i1] @ k[:, :, j0:j1].transpose(-2, -1) / math.sqrt(d)
                if is_causal:
                    s = s.masked_fill(torch.arange(j0, j1)[None] > torch.arange(i0, i1)[:, None], -math.inf)
                m_new = torch.maximum(m, s.amax(-1))
                p = torch.exp(s - m_new[..., None])
                alpha = torch.exp(m - m_new)
                ell, o, m = alpha * ell + p.sum(-1), alpha[..., None] * o + p @ v[:, :, j0:j1], m_new
            out[:, :, i0:i1], lse[:, :, i0:i1] = o / ell[..., None], m + torch.log(ell)
        return out, lse
    return my_flash_forward


def test_a_causal_loop_one_tile_late_is_refused(capsys):
    _passes(scale.check_flash_forward, _tiled_forward(), capsys)
    _fails(scale.check_flash_forward, _tiled_forward(stop_late=True),
           "33 tiles computed, 29 needed at L=70 with 16x8 blocks")


def test_the_forward_names_o_not_rescaled_without_the_fix():
    message = _fails(scale.check_flash_forward, _knob_forward("o not rescaled"), "not rescaled",
                     "lse is right")
    assert "exp(m - m_new)" not in message and "multiply" not in message, message


def _no_running_max(q, k, v, block_k=16):
    """The Debug 'fix' that drops the running maximum: exact until exp overflows."""
    scale_ = 1.0 / math.sqrt(q.size(-1))
    ell = torch.zeros(q.size(0), dtype=q.dtype)
    o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
    for start in range(0, k.size(0), block_k):
        p = torch.exp(q @ k[start:start + block_k].T * scale_)
        ell = ell + p.sum(dim=-1)
        o = o + p @ v[start:start + block_k]
    return o / ell[:, None]


def test_debug_without_a_running_maximum_is_refused_on_large_scores():
    message = _fails(scale.check_flash_fix, _no_running_max, "NaN/inf", "float32", "~88")
    assert message.index("observed") < message.index("~88")
    assert "show_solution" not in message and "subtract" not in message


def _absolute_exp_merge(m_a, ell_a, o_a, m_b, ell_b, o_b):
    """exp(m_a) and exp(m_b), guarded against the empty state: overflows on large scores."""
    m = torch.maximum(m_a, m_b)
    a, b = torch.exp(m_a), torch.exp(m_b)
    back = torch.where(torch.isinf(m), torch.zeros_like(m), torch.exp(-m))
    return m, (a * ell_a + b * ell_b) * back, (a[..., None] * o_a + b[..., None] * o_b) * back[..., None]


def test_merge_with_absolute_exponentials_is_refused_on_large_scores():
    message = _fails(scale.check_merge_states, _absolute_exp_merge, "large scores", "NaN or inf",
                     "exp(m_a)")
    assert message.startswith("Observed")


# --- issue #48: mistakes named (observed first) ---------------------------------------------------

def _one_head_variant(knob):
    def flash_one_head(q, k, v, block_k=16):
        return scale._one_head(q, k, v, block_k, knob)
    return flash_one_head


def test_debug_names_o_rescaled_upside_down_without_the_fix():
    message = _fails(scale.check_flash_fix, _one_head_variant("o inverted"), "observed", "NaN or inf",
                     "exp(m_new - m)")
    assert message.index("observed") < message.index("exp(m_new - m)")
    assert "show_solution" not in message and "should" not in message


@pytest.mark.parametrize("knob, words", [
    ("o inverted", "upside down"),
    ("divided every tile", "divided by the running sum ell in every tile"),
    ("divided every tile and at the end", "divided by the running sum ell in every tile"),
])
def test_forward_tile_mistakes_are_named(knob, words):
    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        return scale._tiled_knob(q.double(), k.double(), v.double(), is_causal, block_q, block_k, knob)
    _fails(scale.check_flash_forward, my_flash_forward, words)


def _tiled_with(lse_without_log=False, no_diagonal=False):
    """A real tiled loop (no whole score matrix) with one of two bugs."""
    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        B, h, L_q, d = q.shape
        L_k = k.size(2)
        out = torch.zeros(B, h, L_q, v.size(-1), dtype=q.dtype)
        lse = torch.zeros(B, h, L_q, dtype=q.dtype)
        for i0 in range(0, L_q, block_q):
            i1 = min(i0 + block_q, L_q)
            m = torch.full((B, h, i1 - i0), float("-inf"), dtype=q.dtype)
            ell = torch.zeros_like(m)
            o = torch.zeros(B, h, i1 - i0, v.size(-1), dtype=q.dtype)
            for j0 in range(0, min(L_k, i1) if is_causal else L_k, block_k):
                j1 = min(j0 + block_k, L_k)
                s = q[:, :, i0:i1] @ k[:, :, j0:j1].transpose(-2, -1) / math.sqrt(d)
                if is_causal:
                    keys, queries = torch.arange(j0, j1)[None], torch.arange(i0, i1)[:, None]
                    s = s.masked_fill(keys >= queries if no_diagonal else keys > queries, -math.inf)
                m_new = torch.maximum(m, s.amax(-1))
                safe = torch.where(torch.isinf(m_new), 0.0, m_new)
                p = torch.exp(s - safe[..., None])
                alpha = torch.exp(m - safe)
                ell, o, m = alpha * ell + p.sum(-1), alpha[..., None] * o + p @ v[:, :, j0:j1], m_new
            out[:, :, i0:i1] = o / ell[..., None]
            lse[:, :, i0:i1] = m + (ell if lse_without_log else torch.log(ell))
        return out, lse
    return my_flash_forward


def test_forward_names_lse_without_log_and_the_diagonal_excluded():
    _fails(scale.check_flash_forward, _tiled_with(lse_without_log=True), "without the log")
    message = _fails(scale.check_flash_forward, _tiled_with(no_diagonal=True), "hides the diagonal",
                     "observed NaN or inf in query 0's row")
    assert message.index("observed") < message.index("hides the diagonal")


@pytest.mark.parametrize("value, words", [
    (12 * 32768 * 32768 * 4 / 1000, "in kB"), (12 * 32768 * 32768 * 4 / 1024, "in KiB"),
])
def test_score_bytes_in_kilobytes_is_named(value, words):
    message = _fails(scale.check_score_bytes, lambda: value, "Observed", words)
    assert message.startswith("Observed")


@pytest.mark.parametrize("fn, words", [
    (lambda table, position, size: (table[(position - 1) // size], (position - 1) % size), "position - 1"),
    (lambda table, position, size: (table[position // size] * size + position % size, position % size),
     "flat array"),
    (lambda table, position, size: table[position // size] * size + position % size, "flat array"),
    (lambda table, position, size: (table[position // len(table)], position % len(table)),
     "divides by the table's length"),
    (lambda table, position, size: (table[position // size], position % len(table)),
     "divides by the table's length"),
])
def test_locate_more_mistakes_are_named(fn, words):
    message = _fails(scale.check_locate, fn, "observed", words)
    assert message.index("observed") < message.index(words)
