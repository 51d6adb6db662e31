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
from course_lib.checks import lesson13_scale_mistakes as mistakes
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
        return mistakes.one_head_loop(q, k, v, block_k, "last block dropped")
    _fails(scale.check_flash_fix, dropped, "last, shorter block")


def test_debug_in_float32_is_named_and_a_decorator_passes(capsys):
    fixed = _solution("13.flash_fix", "flash_one_head")

    @torch.no_grad()
    def flash_one_head(q, k, v, block_k=16):
        return fixed(q.float(), k.float(), v.float(), block_k).double()

    # float32 inside: a float64 case is compared to 1e-9, and float32's round-off is named
    _fails(scale.check_flash_fix, flash_one_head, "float32 round-off", "float64")

    @torch.no_grad()
    def flash_one_head_64(q, k, v, block_k=16):
        return fixed(q, k, v, block_k)
    _passes(scale.check_flash_fix, flash_one_head_64, capsys)


# --- the ★★★ tiled forward -------------------------------------------------------------------------

def _knob_forward(knob):
    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        if knob in ("o not rescaled", "lse too early", "last tile dropped", "not divided"):
            return mistakes.tiled_forward_variant(q.double(), k.double(), v.double(), is_causal, block_q, block_k, knob)
        return mistakes.ref_forward(q.double(), k.double(), v.double(), is_causal, knob)
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
        return mistakes.ref_forward(q.double(), k.double(), v.double(), is_causal)
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

def _tiled_forward(stop_late=False, lse_is_max=False):
    """A tiled causal forward; with stop_late its stop test is one tile late (the extra tile masked);
    with lse_is_max it saves the running maximum m as the log-sum-exp."""
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
            out[:, :, i0:i1] = o / ell[..., None]
            lse[:, :, i0:i1] = m if lse_is_max else m + torch.log(ell)
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
        return mistakes.one_head_loop(q, k, v, block_k, knob)
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
        return mistakes.tiled_forward_variant(q.double(), k.double(), v.double(), is_causal, block_q, block_k, knob)
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
     "the table's length"),
    (lambda table, position, size: (table[position // size], position % len(table)),
     "the table's length"),
])
def test_locate_more_mistakes_are_named(fn, words):
    message = _fails(scale.check_locate, fn, words)
    assert "observed" in message.lower()
    assert message.lower().index("observed") < message.index(words)


# --- the blind tryout: more mistakes named by what is observed --------------------------------------

@pytest.mark.parametrize("value, words", [
    (12 * 32768 * 32768 * 32, "8 times too large: that counts bits"),
    (32768 * 32768 * 32, "8/12"),
    (12 * 768 * 32768 * 4, "768/32,768"),
    (768 * 32768 * 4, "size of Q"),
    (12 * 32768 * 32768 * 4 * 64, "64 times"),
    (32768 * 32768 * 4 / 1e9, "in GB"),
    (12 * 32768 * 32768 * 4 * 5, "between 1 and 10 times"),
])
def test_score_bytes_names_more_miscounts(value, words):
    _fails(scale.check_score_bytes, lambda: value, words)


def test_score_bytes_as_a_float_or_a_tensor_passes(capsys):
    _passes(scale.check_score_bytes, lambda: float(12 * 32768 ** 2 * 4), capsys)
    _passes(scale.check_score_bytes, lambda: torch.tensor(12 * 32768 ** 2 * 4), capsys)


def _merge_weights(fa, fb, unsqueeze=True):
    """A merge whose ell and o take factors ``fa`` and ``fb`` (names: "a", "b", "1")."""
    def merge_states(m_a, ell_a, o_a, m_b, ell_b, o_b):
        m = torch.maximum(m_a, m_b)
        ref = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        pick = {"a": torch.exp(m_a - ref), "b": torch.exp(m_b - ref), "1": torch.ones_like(m)}
        a, b = pick[fa], pick[fb]
        o = a[..., None] * o_a + b[..., None] * o_b if unsqueeze else a * o_a + b * o_b
        return m, a * ell_a + b * ell_b, o
    return merge_states


@pytest.mark.parametrize("fa, fb, unsqueeze, words", [
    ("b", "a", True, "the factors are swapped"),
    ("a", "1", True, "only state a is rescaled"),
    ("1", "b", True, "only state b is rescaled"),
    ("a", "b", False, "one per row"),
])
def test_merge_more_mistakes_are_named(fa, fb, unsqueeze, words):
    _fails(scale.check_merge_states, _merge_weights(fa, fb, unsqueeze), words)


def test_merge_one_row_at_a_time_passes(capsys):
    def merge_states(m_a, ell_a, o_a, m_b, ell_b, o_b):
        m, ell, o = torch.empty_like(m_a), torch.empty_like(ell_a), torch.empty_like(o_a)
        for i in range(m_a.numel()):
            idx = torch.unravel_index(torch.tensor(i), m_a.shape)
            ma, mb = float(m_a[idx]), float(m_b[idx])
            top = max(ma, mb)
            fa = 0.0 if ma == -math.inf else math.exp(ma - top)
            fb = 0.0 if mb == -math.inf else math.exp(mb - top)
            m[idx], ell[idx] = top, fa * ell_a[idx] + fb * ell_b[idx]
            o[idx] = fa * o_a[idx] + fb * o_b[idx]
        return m, ell, o
    _passes(scale.check_merge_states, merge_states, capsys)


def _first_block_max(q, k, v, block_k=16):
    """Every block measured from the first block's maximum, never rescaled: exact until a later
    block's scores exceed the first block's by ~88 in float32."""
    m = None
    ell = torch.zeros(q.size(0), dtype=q.dtype)
    o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
    for start in range(0, k.size(0), block_k):
        s = q @ k[start:start + block_k].T / math.sqrt(q.size(-1))
        m = s.amax(-1) if m is None else m
        p = torch.exp(s - m[:, None])
        ell, o = ell + p.sum(-1), o + p @ v[start:start + block_k]
    return o / ell[:, None]


def test_debug_measured_from_the_first_block_is_refused_by_what_is_observed():
    message = _fails(scale.check_flash_fix, _first_block_max, "observed NaN/inf", "above it",
                     "first block")
    assert "show_solution" not in message and "rescale" not in message


@pytest.mark.parametrize("knob, words", [
    ("block max", "own maximum"), ("ell twice", "ell is multiplied by exp(m - m_new) twice"),
    ("o twice", "o is multiplied by exp(m - m_new) twice"), ("ell", "but ell is not"),
    ("divided every block", "divided by ell in every block"),
    ("new terms rescaled", "new block's terms"), ("m never updated", "last block's keys only"),
])
def test_debug_more_mistakes_are_named(knob, words):
    message = _fails(scale.check_flash_fix, _one_head_variant(knob), "Not yet", words)
    assert "show_solution" not in message


def test_debug_without_unsqueeze_says_the_factor_is_per_row():
    def flash_one_head(q, k, v, block_k=16):
        m = torch.full((q.size(0),), float("-inf"), dtype=q.dtype)
        ell = torch.zeros(q.size(0), dtype=q.dtype)
        o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
        for start in range(0, k.size(0), block_k):
            s = q @ k[start:start + block_k].T / math.sqrt(q.size(-1))
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[:, None])
            ell = torch.exp(m - m_new) * ell + p.sum(-1)
            o = torch.exp(m - m_new) * o + p @ v[start:start + block_k]
            m = m_new
        return o / ell[:, None]
    message = _fails(scale.check_flash_fix, flash_one_head, "one per row", "(..., 12, 1)")
    assert message.startswith("Observed")


def test_debug_float64_einsum_and_row_loop_styles_pass(capsys):
    def flash_one_head(q, k, v, block_k=16):
        q, k, v = q.double(), k.double(), v.double()
        m = torch.full((q.size(0), 1), -math.inf, dtype=torch.float64)
        ell, o = torch.zeros_like(m), torch.zeros(q.size(0), v.size(-1), dtype=torch.float64)
        for start in range(0, k.size(0), block_k):
            s = torch.einsum("qd,kd->qk", q, k[start:start + block_k]) / math.sqrt(q.size(-1))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p, alpha = torch.exp(s - m_new), torch.exp(m - m_new)
            ell, o, m = alpha * ell + p.sum(-1, keepdim=True), alpha * o + p @ v[start:start + block_k], m_new
        return o / ell
    _passes(scale.check_flash_fix, flash_one_head, capsys)

    @torch.no_grad()
    def rows(q, k, v, block_k=16):
        out = []
        for qi in q:
            m, ell, o = -math.inf, 0.0, torch.zeros(v.size(-1), dtype=q.dtype)
            for start in range(0, k.size(0), block_k):
                s = k[start:start + block_k] @ qi / math.sqrt(q.size(-1))
                m_new = max(m, s.max().item())
                p, alpha = torch.exp(s - m_new), math.exp(m - m_new)
                ell, o, m = alpha * ell + p.sum(), alpha * o + p @ v[start:start + block_k], m_new
            out.append(o / ell)
        return torch.stack(out)
    _passes(scale.check_flash_fix, rows, capsys)


@pytest.mark.parametrize("knob, words", [
    ("skip by tile index", "compare positions, not tile indices"),
    ("skip from the first query", "FIRST query"),
    ("skip one tile early", "diagonal key"),
])
def test_forward_skip_mistakes_are_named(knob, words):
    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        return mistakes.tiled_forward_variant(q.double(), k.double(), v.double(), is_causal, block_q,
                                              block_k, knob)
    _fails(scale.check_flash_forward, my_flash_forward, words)


@pytest.mark.parametrize("fn, words", [
    (lambda t, p, s: (t[p % s], p // s), "swapped: block_table[position % block_size]"),
    (lambda t, p, s: (t[round(p / s)], p % s), "round(position / block_size)"),
    (lambda t, p, s: (t[math.ceil(p / s)], p % s), "ceil("),
    (lambda t, p, s: (t.index(p // s), p % s), "inverse map"),
    (lambda t, p, s: (t[p / s], p % s), "true division"),
    (lambda t, p, s: (t[p // s + 1], p % s), "one too large"),
    (lambda t, p, s: (t[p // len(t)], p % s), "divided by the table's length"),
])
def test_locate_errors_and_mixups_are_named_by_what_is_observed(fn, words):
    message = _fails(scale.check_locate, fn, "Observed: position", "cases match", words)
    assert "Traceback" not in message


def test_locate_index_error_says_the_block_index_and_the_table_length():
    message = _fails(scale.check_locate, lambda t, p, s: (t[p % s], p // s), "raised IndexError",
                     "it asked for block index 3 of a table with 3 blocks")
    assert message.index("Observed") < message.index("cases match")


def test_locate_in_other_styles_passes(capsys):
    def locate(block_table, position, block_size):
        n, slot = divmod(position, block_size)
        return block_table[n], slot
    _passes(scale.check_locate, locate, capsys)

    def counting(block_table, position, block_size):
        n = 0
        while (n + 1) * block_size <= position:
            n += 1
        return [block_table[n], position - n * block_size]
    _passes(scale.check_locate, counting, capsys)


def test_merge_with_the_smaller_maximum_is_named():
    def merge_states(m_a, ell_a, o_a, m_b, ell_b, o_b):
        m = torch.minimum(m_a, m_b)
        ref = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        a, b = torch.exp(m_a - ref), torch.exp(m_b - ref)
        return m, a * ell_a + b * ell_b, a[..., None] * o_a + b[..., None] * o_b
    _fails(scale.check_merge_states, merge_states, "observed m = min(m_a, m_b)")


@pytest.mark.parametrize("value, words", [
    (32000 * 32000 * 4, "two things at once"), (768 * 32768 * 32, "size of Q"),
])
def test_score_bytes_names_two_miscounts_at_once(value, words):
    _fails(scale.check_score_bytes, lambda: value, "two things at once", words)


def test_forward_names_ell_rescaled_twice_and_a_missing_unsqueeze():
    def twice(q, k, v, is_causal=False, block_q=32, block_k=32):
        return mistakes.tiled_forward_variant(q.double(), k.double(), v.double(), is_causal, block_q,
                                              block_k, "ell twice")
    _fails(scale.check_flash_forward, twice, "ell is multiplied by exp(m - m_new) twice")

    def flat(q, k, v, is_causal=False, block_q=32, block_k=32):
        o = torch.zeros(q.shape[0], q.shape[1], block_q, v.size(-1), dtype=q.dtype)
        alpha = torch.ones(q.shape[0], q.shape[1], block_q, dtype=q.dtype)
        return alpha * o, None
    _fails(scale.check_flash_forward, flat, "one per row", "(..., 16, 1)")


def test_debug_measured_from_each_block_max_alone_is_refused_in_float32():
    """alpha = exp(m - block max), which grows past float32 when a block's maximum drops by ~100."""
    def flash_one_head(q, k, v, block_k=16):
        m = torch.full((q.size(0),), float("-inf"), dtype=q.dtype)
        ell = torch.zeros(q.size(0), dtype=q.dtype)
        o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
        for start in range(0, k.size(0), block_k):
            s = q @ k[start:start + block_k].T / math.sqrt(q.size(-1))
            top = s.amax(-1)
            p, alpha = torch.exp(s - top[:, None]), torch.exp(m - top)
            ell, o, m = alpha * ell + p.sum(-1), alpha[:, None] * o + p @ v[start:start + block_k], top
        return o / ell[:, None]
    _fails(scale.check_flash_fix, flash_one_head, "observed NaN/inf", "below an earlier block's")


# --- held-out attempts (fix13d): more mistakes named by what is observed ------------------------

def _min_ref_merge(m_a, ell_a, o_a, m_b, ell_b, o_b):
    """Measured from the smaller maximum: exact on moderate scores, overflows when the maxima are far."""
    m, lo = torch.maximum(m_a, m_b), torch.minimum(m_a, m_b)
    ref = torch.where(torch.isinf(lo), m, lo)
    ref = torch.where(torch.isinf(ref), torch.zeros_like(ref), ref)
    a, b = torch.exp(m_a - ref), torch.exp(m_b - ref)
    back = torch.exp(ref - torch.where(torch.isinf(m), torch.zeros_like(m), m))
    return m, (a * ell_a + b * ell_b) * back, (a[..., None] * o_a + b[..., None] * o_b) * back[..., None]


def test_merge_from_the_smaller_maximum_is_refused_where_the_maxima_are_far_apart():
    message = _fails(scale.check_merge_states, _min_ref_merge, "Observed", "NaN or inf", "apart",
                     "709")
    assert "minimum" not in message and "max(" not in message


def test_merge_with_ell_in_log_space_is_named():
    def merge_states(m_a, ell_a, o_a, m_b, ell_b, o_b):
        m = torch.maximum(m_a, m_b)
        ref = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        a, b = torch.exp(m_a - ref), torch.exp(m_b - ref)
        ell = torch.logaddexp(torch.log(a * ell_a), torch.log(b * ell_b))
        return m, ell, a[..., None] * o_a + b[..., None] * o_b
    _fails(scale.check_merge_states, merge_states, "natural log of the merged sum")


def test_merge_guarded_in_loops_and_float32_inside_far_maxima_pass(capsys):
    def merge_states(m_a, ell_a, o_a, m_b, ell_b, o_b):  # one row at a time, math.exp
        m, ell, o = torch.empty_like(m_a), torch.empty_like(ell_a), torch.empty_like(o_a)
        for i in range(m_a.numel()):
            ma, mb = m_a.reshape(-1)[i].item(), m_b.reshape(-1)[i].item()
            top = max(ma, mb)
            fa = 0.0 if ma == -math.inf else math.exp(ma - top)
            fb = 0.0 if mb == -math.inf else math.exp(mb - top)
            m.view(-1)[i] = top
            ell.view(-1)[i] = fa * ell_a.reshape(-1)[i] + fb * ell_b.reshape(-1)[i]
            rows_a, rows_b = o_a.reshape(-1, o.size(-1)), o_b.reshape(-1, o.size(-1))
            o.view(-1, o.size(-1))[i] = fa * rows_a[i] + fb * rows_b[i]
        return m, ell, o
    _passes(scale.check_merge_states, merge_states, capsys)


@pytest.mark.parametrize("knob, words", [
    ("o rescaled after adding", "o = exp(m - m_new) * (o + the new block's p @ v)"),
    ("p from old max", "measured from the previous maximum m"),
    ("block normalised", "divided by that block's own sum"),
    ("scale from v", "sqrt(d_v), the width of v"),
])
def test_debug_held_out_mistakes_are_named(knob, words):
    message = _fails(scale.check_flash_fix, _one_head_variant(knob), "Not yet", "your output equals",
                     words)
    assert "show_solution" not in message


def test_debug_m_updated_before_the_rescale_is_named_by_its_factor_of_one():
    def flash_one_head(q, k, v, block_k=16):
        m = torch.full((q.size(0),), float("-inf"), dtype=q.dtype)
        ell = torch.zeros(q.size(0), dtype=q.dtype)
        o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
        for start in range(0, k.size(0), block_k):
            s = q @ k[start:start + block_k].T / math.sqrt(q.size(-1))
            m_new = torch.maximum(m, s.amax(dim=-1))
            p = torch.exp(s - m_new[:, None])
            ell = torch.exp(m - m_new) * ell + p.sum(dim=-1)
            m = m_new
            o = torch.exp(m - m_new)[:, None] * o + p @ v[start:start + block_k]
        return o / ell[:, None]
    message = _fails(scale.check_flash_fix, flash_one_head, "exactly 1", "print m and m_new")
    assert "show_solution" not in message
    # the untouched loop (no factor on o at all) still gets the first, observed message
    _fails(scale.check_flash_fix, flash_one_head_buggy, "differs from exact attention")


def test_debug_float32_round_off_in_a_float64_case_is_said():
    def flash_one_head(q, k, v, block_k=16):
        out = mistakes.one_head_loop(q.float(), k.float(), v.float(), block_k).to(q.dtype)
        return out + 3e-5 * (q.dtype == torch.float64)  # a float32-sized error, above 2e-5
    _fails(scale.check_flash_fix, flash_one_head, "float32 round-off")


@pytest.mark.parametrize("knob, words", [
    ("both inverted", "exp(m_new - m) >= 1"), ("lse last tile", "last tile of keys alone"),
    ("lse is max", "largest score"),
])
def test_forward_held_out_mistakes_are_named(knob, words):
    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        if knob == "lse is max":
            return _tiled_forward(lse_is_max=True)(q, k, v, is_causal, block_q, block_k)
        return mistakes.tiled_forward_variant(q.double(), k.double(), v.double(), is_causal, block_q,
                                              block_k, knob)
    _fails(scale.check_flash_forward, my_flash_forward, "Likely mistake", words)


def _forward_dropping(queries: bool, keys: bool):
    """The tiled loop whose ranges stop before the partial query and/or key tile (torch.empty out)."""
    inner = _tiled_forward()

    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        L_q, L_k = q.size(2), k.size(2)
        full_q = L_q - L_q % block_q if queries else L_q
        full_k = L_k - L_k % block_k if keys else L_k
        out, lse = inner(q[:, :, :full_q], k[:, :, :full_k], v[:, :, :full_k], is_causal, block_q,
                         block_k)
        whole_out = torch.full((*q.shape[:3], v.size(-1)), float("nan"), dtype=q.dtype)
        whole_lse = torch.zeros(q.shape[:3], dtype=q.dtype)
        whole_out[:, :, :full_q], whole_lse[:, :, :full_q] = out, lse
        return whole_out, whole_lse
    return my_flash_forward


@pytest.mark.parametrize("queries, keys, words", [
    (True, True, ["never read", "partial query tile, queries 32..36", "NaN or inf"]),
    (False, True, ["keys 0..47 only", "never read"]),
    (True, False, ["partial query tile", "rows before them are right"]),
])
def test_forward_partial_tiles_left_out_are_named(queries, keys, words):
    _fails(scale.check_flash_forward, _forward_dropping(queries, keys), "observed", *words)


def test_forward_float32_round_off_is_said_and_float64_styles_pass(capsys):
    inner = _tiled_forward()

    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        out, lse = inner(q.float(), k.float(), v.float(), is_causal, block_q, block_k)
        return out.to(q.dtype), lse.to(q.dtype)
    message = _fails(scale.check_flash_forward, my_flash_forward, "float32 round-off",
                     "come back as float64")
    assert "Likely mistake" not in message

    def returns_float32(q, k, v, is_causal=False, block_q=32, block_k=32):
        return inner(q.float(), k.float(), v.float(), is_causal, block_q, block_k)
    _fails(scale.check_flash_forward, returns_float32, "out is returned as torch.float32")


# --- the previous tryout's weak classes (issue #48): the attempts' code, each named ---------------

def _fixed_loop(p_ref="m_new", scale_of=lambda d: 1 / math.sqrt(d), return_in_loop=False):
    """The Debug exercise's loop with o rescaled (the fix), and one other change."""
    def flash_one_head(q, k, v, block_k=16):
        scale = scale_of(q.size(-1))
        m = torch.full((q.size(0),), float("-inf"), dtype=q.dtype)
        ell = torch.zeros(q.size(0), dtype=q.dtype)
        o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
        for start in range(0, k.size(0), block_k):
            s = q @ k[start:start + block_k].T * scale
            m_new = torch.maximum(m, s.amax(dim=-1))
            ref = {"m_new": m_new, "block": s.amax(dim=-1),
                   "old, 0 first": torch.nan_to_num(m, neginf=0.0)}[p_ref]
            p = torch.exp(s - ref[:, None])
            ell = torch.exp(m - m_new) * ell + p.sum(dim=-1)
            o = torch.exp(m - m_new)[:, None] * o + p @ v[start:start + block_k]
            m = m_new
            if return_in_loop:
                return o / ell[:, None]
        return o / ell[:, None]
    return flash_one_head


@pytest.mark.parametrize("fn, words", [
    (_fixed_loop(p_ref="block"), "that block's own maximum"),
    (_fixed_loop(p_ref="old, 0 first"), "measured from the previous maximum m"),
    (_fixed_loop(scale_of=lambda d: 1 / d), "multiplied by 1/d, not by 1/sqrt(d)"),
    (_fixed_loop(return_in_loop=True), "first block of keys alone"),
])
def test_debug_tryout_mistakes_are_named_by_what_is_observed(fn, words):
    message = _fails(scale.check_flash_fix, fn, "Not yet", "your output equals", words)
    assert "show_solution" not in message


def test_debug_m_updated_before_both_factors_is_named_by_its_factors_of_one():
    def flash_one_head(q, k, v, block_k=16):
        scale = 1.0 / math.sqrt(q.size(-1))
        m = torch.full((q.size(0),), float("-inf"), dtype=q.dtype)
        ell = torch.zeros(q.size(0), dtype=q.dtype)
        o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
        for start in range(0, k.size(0), block_k):
            s = q @ k[start:start + block_k].T * scale
            m_new = torch.maximum(m, s.amax(dim=-1))
            p = torch.exp(s - m_new[:, None])
            m = m_new
            ell = torch.exp(m - m_new) * ell + p.sum(dim=-1)
            o = torch.exp(m - m_new)[:, None] * o + p @ v[start:start + block_k]
        return o / ell[:, None]
    _fails(scale.check_flash_fix, flash_one_head, "neither ell nor o", "exactly 1",
           "print m and m_new")


def test_debug_fixed_loop_behind_the_stubs_raise_is_named_and_the_stub_is_not(capsys):
    def flash_one_head(q, k, v, block_k=16):
        raise NotImplementedError
        scale = 1.0 / math.sqrt(q.size(-1))
        m = torch.full((q.size(0),), float("-inf"), dtype=q.dtype)
        ell = torch.zeros(q.size(0), dtype=q.dtype)
        o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
        for start in range(0, k.size(0), block_k):
            s = q @ k[start:start + block_k].T * scale
            m_new = torch.maximum(m, s.amax(dim=-1))
            p = torch.exp(s - m_new[:, None])
            ell = torch.exp(m - m_new) * ell + p.sum(dim=-1)
            o = torch.exp(m - m_new)[:, None] * o + p @ v[start:start + block_k]
            m = m_new
        return o / ell[:, None]
    message = _fails(scale.check_flash_fix, flash_one_head, "Observed", "raises NotImplementedError",
                     "never run")
    assert "show_solution" not in message and "rescale" not in message
    # the stub as the notebook gives it (its source readable, as in a notebook) gets the reminder
    import linecache
    name = "<lesson13 stub>"
    linecache.cache[name] = (len(mistakes.FIX_STUB), None, mistakes.FIX_STUB.splitlines(True), name)
    namespace = {"torch": torch, "math": math}
    exec(compile(mistakes.FIX_STUB, name, "exec"), namespace)
    scale.check_flash_fix(namespace["flash_one_head"])
    assert "not implemented yet" in capsys.readouterr().out
    del linecache.cache[name]


def test_the_stored_debug_stub_is_the_notebooks():
    import json
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "notebooks" / "13_attention_at_scale.ipynb"
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    stub = next(c for c in cells if c.get("metadata", {}).get("exercise") == "13.flash_fix")
    assert mistakes.FIX_STUB.strip() == "".join(stub["source"]).strip()


def test_merge_keeping_the_larger_state_or_weighting_by_ell_is_named():
    def keep_larger(m_a, ell_a, o_a, m_b, ell_b, o_b):
        pick = m_a >= m_b
        return (torch.where(pick, m_a, m_b), torch.where(pick, ell_a, ell_b),
                torch.where(pick[..., None], o_a, o_b))

    def weighted_by_ell(m_a, ell_a, o_a, m_b, ell_b, o_b):
        m = torch.maximum(m_a, m_b)
        ell = ell_a + ell_b
        o = (ell_a[..., None] * o_a + ell_b[..., None] * o_b) / ell[..., None].clamp_min(1e-300)
        return m, ell, o
    _fails(scale.check_merge_states, keep_larger, "observed", "the state with the larger maximum",
           "dropped")
    _fails(scale.check_merge_states, weighted_by_ell, "observed", "weighted by ell",
           "maxima m_a and m_b are not used")


@pytest.mark.parametrize("fn, words", [
    (lambda table, position, size: (table[-1], position % size), "the table's last entry"),
    (lambda table, position, size: (table[position // len(table) % len(table)], position % size),
     "position // len(table) % len(table)"),
    (lambda table, position, size: (table[0], position % size), "the table's first entry"),
])
def test_locate_tryout_mistakes_are_named(fn, words):
    message = _fails(scale.check_locate, fn, "Observed", words)
    assert message.index("Observed") < message.index(words)


def test_forward_p_from_the_old_maximum_and_scale_1_over_d_are_named():
    def forward(p_from_old=False, scale_of=lambda d: 1 / math.sqrt(d)):
        def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
            B, h, L_q, d = q.shape
            L_k = k.size(-2)
            out = torch.empty(B, h, L_q, v.size(-1), dtype=q.dtype)
            lse = torch.empty(B, h, L_q, dtype=q.dtype)
            for i0 in range(0, L_q, block_q):
                i1 = min(i0 + block_q, L_q)
                m = torch.full((B, h, i1 - i0), -math.inf, dtype=q.dtype)
                ell = torch.zeros(B, h, i1 - i0, dtype=q.dtype)
                o = torch.zeros(B, h, i1 - i0, v.size(-1), dtype=q.dtype)
                for j0 in range(0, L_k, block_k):
                    if is_causal and j0 > i1 - 1:
                        break
                    j1 = min(j0 + block_k, L_k)
                    s = q[:, :, i0:i1] @ k[:, :, j0:j1].transpose(-2, -1) * scale_of(d)
                    if is_causal:
                        s = s.masked_fill(torch.arange(j0, j1)[None] > torch.arange(i0, i1)[:, None],
                                          -math.inf)
                    m_new = torch.maximum(m, s.amax(dim=-1))
                    p = torch.exp(s - m_new[..., None])
                    alpha = torch.exp(m - m_new)
                    ell = alpha * ell + p.sum(dim=-1)
                    p_o = torch.exp(s - torch.nan_to_num(m, neginf=0.0)[..., None]) if p_from_old else p
                    o = alpha[..., None] * o + p_o @ v[:, :, j0:j1]
                    m = m_new
                out[:, :, i0:i1] = o / ell[..., None]
                lse[:, :, i0:i1] = m + torch.log(ell)
            return out, lse
        return my_flash_forward
    _fails(scale.check_flash_forward, forward(p_from_old=True), "Likely mistake", "lse is right",
           "the running maximum before this tile")
    _fails(scale.check_flash_forward, forward(scale_of=lambda d: 1 / d), "Likely mistake",
           "multiplied by 1/head_dim")


def test_debug_scale_changed_instead_of_the_bug_is_named():
    def flash_one_head(q, k, v, block_k=16):
        scale = 1.0 / math.sqrt(block_k)
        m = torch.full((q.size(0),), float("-inf"), dtype=q.dtype)
        ell = torch.zeros(q.size(0), dtype=q.dtype)
        o = torch.zeros(q.size(0), v.size(-1), dtype=q.dtype)
        for start in range(0, k.size(0), block_k):
            s = q @ k[start:start + block_k].T * scale
            m_new = torch.maximum(m, s.amax(dim=-1))
            p = torch.exp(s - m_new[:, None])
            ell = torch.exp(m - m_new) * ell + p.sum(dim=-1)
            o = o + p @ v[start:start + block_k]
            m = m_new
        return o / ell[:, None]
    message = _fails(scale.check_flash_fix, flash_one_head, "your output equals the loop as given",
                     "1/sqrt(block_k)")
    assert "show_solution" not in message


def test_merge_in_float32_is_named_by_its_round_off():
    def merge_states(m_a, ell_a, o_a, m_b, ell_b, o_b):
        dt = o_a.dtype
        m_a, ell_a, o_a, m_b, ell_b, o_b = (t.float() for t in (m_a, ell_a, o_a, m_b, ell_b, o_b))
        m = torch.maximum(m_a, m_b)
        ref = torch.where(m == -math.inf, 0.0, m)
        a, b = torch.exp(m_a - ref), torch.exp(m_b - ref)
        return m.to(dt), (a * ell_a + b * ell_b).to(dt), (a[..., None] * o_a + b[..., None] * o_b).to(dt)
    message = _fails(scale.check_merge_states, merge_states, "float32 round-off", "float64")
    assert "not the larger of m_a and m_b" not in message


@pytest.mark.parametrize("fn, words", [
    (lambda t, p, s: (t[p // s], t[p // s] * s + p % s), "slot given as an address in the pool"),
    (lambda t, p, s: (t[p // s], p // s * s), "slot given as the block's first position"),
    (lambda t, p, s: (t[-1 - p // s], p % s), "the table read from its end"),
    (lambda t, p, s: (t[p // s], s - 1 - p % s), "slot counted from the block's end"),
])
def test_locate_second_tryout_mistakes_are_named(fn, words):
    message = _fails(scale.check_locate, fn, "Observed", words)
    assert message.index("Observed") < message.index(words)


@pytest.mark.parametrize("knob, words", [
    ("o inverted, inf zeroed", "exp(m_new - m) >= 1 (its inf at the first tile made 0)"),
    ("mask with 0", "sets the hidden scores to 0, not −inf"),
])
def test_forward_second_tryout_mistakes_are_named(knob, words):
    def my_flash_forward(q, k, v, is_causal=False, block_q=32, block_k=32):
        return mistakes.tiled_forward_variant(q.double(), k.double(), v.double(), is_causal, block_q,
                                              block_k, knob)
    _fails(scale.check_flash_forward, my_flash_forward, "Likely mistake", words)
