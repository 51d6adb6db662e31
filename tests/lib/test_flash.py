"""course_lib.flash against PyTorch: FlashAttention-2's tiled forward and backward equal
``F.scaled_dot_product_attention`` (outputs, log-sum-exp, dQ dK dV), in float64 to 1e-10.

float32: over seeds 0-2, L = 256 and 1024, causal, head_dim 64, the tiled pass and SDPA both differ
from the float64 result by at most 6e-6 (outputs and gradients, measured on this AVX2 machine); the
tests allow 2e-5, and require the tiled pass to be no further from float64 than SDPA's float32 kernel
is, times 3.

bfloat16 (issue #48): the tiles are computed and m, ell, O, D, dQ, dK, dV accumulated in float32, as
real kernels do. Over seeds 0-3, L = 512, causal, 4 query heads on 2 KV heads, head_dim 64, the mean
absolute error against float64 is 0.97-0.98x SDPA's bf16 kernel's on the output, 0.95x on dQ, 0.75x
on dK, 0.69x on dV (measured on this AVX2 machine; with m, ell, O kept in bf16 it was 1.9x, 2.8x,
2.3x, 2.1x). The test allows 1.2x. Against float32 attention on the bf16-rounded inputs (the best a
bf16-in, float32-inside kernel can do) it is 1.00x on the output and dV, 1.01x on dK, 1.03x on dQ on
the AVX-512, AVX2-forced and portable kernels (seeds 0-1); the test allows 1.1x.
"""

from __future__ import annotations

import math

import os

import pytest
import torch
import torch.nn.functional as F

from course_lib.flash import (FlashAttention, flash_attention, flash_attention_backward,
                              flash_attention_forward, merge_softmax_states, naive_attention)

F64_TOL = 1e-10
F32_TOL = 2e-5


def _full_mask(B, h, L_q, L_k, mask, is_causal):
    full = torch.ones(B, h, L_q, L_k, dtype=torch.bool)
    if mask is not None:
        full = full & mask
    if is_causal:
        full = full & torch.ones(L_q, L_k, dtype=torch.bool).tril()  # SDPA's top-left alignment
    return full


def _sdpa(q, k, v, mask, is_causal):
    """PyTorch's attention with the same (combined) mask: the independent reference."""
    if mask is None and is_causal:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.size(1) != k.size(1))
    full = None if mask is None and not is_causal else _full_mask(
        q.size(0), q.size(1), q.size(2), k.size(2), mask, is_causal)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=full, enable_gqa=q.size(1) != k.size(1))


def _lse_reference(q, k, mask, is_causal):
    """logsumexp of the scaled, masked scores (B, h, L_q), from the whole score matrix."""
    group = q.size(1) // k.size(1)
    k = k.repeat_interleave(group, dim=1)  # (B, h, L_k, d)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    full = _full_mask(q.size(0), q.size(1), q.size(2), k.size(2), mask, is_causal)
    return scores.masked_fill(~full, float("-inf")).logsumexp(dim=-1)


def _inputs(B, h, kv, L_q, L_k, d, d_v, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, h, L_q, d, generator=gen, dtype=dtype)
    k = 2 * torch.randn(B, kv, L_k, d, generator=gen, dtype=dtype)  # larger scores: rescaling matters
    v = torch.randn(B, kv, L_k, d_v, generator=gen, dtype=dtype)
    return [t.requires_grad_() for t in (q, k, v)]


def _mask(kind, B, h, L_q, L_k, seed):
    gen = torch.Generator().manual_seed(100 + seed)
    if kind is None:
        return None
    if kind == "padding":  # each sequence's keys beyond its length are padding: (B, 1, 1, L_k)
        lengths = torch.randint(1, L_k + 1, (B,), generator=gen)
        lengths[0] = L_k - 1 if L_k > 1 else 1
        return (torch.arange(L_k)[None] < lengths[:, None])[:, None, None, :]
    mask = torch.rand(B, h, L_q, L_k, generator=gen) < 0.5  # random, per head
    mask[..., 0] = True
    return mask


CASES = [  # (B, h, kv, L_q, L_k, d, d_v, causal, block_q, block_k, mask)
    (2, 4, 4, 64, 64, 16, 16, False, 16, 16, None),  # blocks divide L
    (2, 4, 4, 37, 53, 16, 16, False, 8, 16, "padding"),  # L_q != L_k, blocks do not divide
    (1, 6, 3, 50, 50, 8, 12, True, 7, 9, "padding"),  # grouped-query, d_v != d, causal + padding
    (2, 2, 2, 20, 13, 8, 8, True, 5, 4, None),  # causal with L_q > L_k (top-left, as SDPA)
    (1, 2, 2, 9, 30, 8, 8, True, 4, 8, None),  # causal with L_q < L_k
    (1, 8, 2, 33, 33, 8, 8, True, 64, 64, "random"),  # one tile holds everything
    (1, 4, 1, 40, 40, 8, 8, False, 1, 1, "random"),  # multi-query, one score per tile
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_forward_and_backward_equal_sdpa_in_float64(case):
    B, h, kv, L_q, L_k, d, d_v, causal, bq, bk, kind = case
    q, k, v = _inputs(B, h, kv, L_q, L_k, d, d_v, seed=len(kind or "") + L_q)
    mask = _mask(kind, B, h, L_q, L_k, L_q)
    out, lse = flash_attention(q, k, v, mask, causal, block_q=bq, block_k=bk, return_lse=True)
    expected = _sdpa(q, k, v, mask, causal)
    assert out.shape == expected.shape and lse.shape == (B, h, L_q)
    assert (out - expected).abs().max() <= F64_TOL
    lse_expected = _lse_reference(q.detach(), k.detach(), mask, causal)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_expected))
    finite = torch.isfinite(lse_expected)
    assert (lse[finite] - lse_expected[finite]).abs().max() <= F64_TOL
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    ours = torch.autograd.grad(out, (q, k, v), d_out)
    theirs = torch.autograd.grad(expected, (q, k, v), d_out)
    for name, a, b in zip("qkv", ours, theirs):
        assert (a - b).abs().max() <= F64_TOL, f"d{name}: {(a - b).abs().max():.3g}"


def test_the_default_blocks_and_a_custom_scale():
    q, k, v = _inputs(1, 2, 2, 150, 130, 16, 16, seed=3)
    out = flash_attention(q, k, v, scale=0.3)
    expected = F.scaled_dot_product_attention(q, k, v, scale=0.3)
    assert (out - expected).abs().max() <= F64_TOL


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float32_within_the_measured_tolerance(seed):
    q, k, v = _inputs(2, 4, 2, 256, 256, 64, 64, seed=seed)
    d_out = torch.randn(2, 4, 256, 64, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    exact = _sdpa(q, k, v, None, True)
    exact_grads = torch.autograd.grad(exact, (q, k, v), d_out)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    out = flash_attention(q32, k32, v32, is_causal=True)
    grads = torch.autograd.grad(out, (q32, k32, v32), d_out.float())
    sdpa = F.scaled_dot_product_attention(q32, k32, v32, is_causal=True, enable_gqa=True)
    sdpa_grads = torch.autograd.grad(sdpa, (q32, k32, v32), d_out.float())
    assert out.dtype == torch.float32
    for ours, pytorchs, truth in zip((out, *grads), (sdpa, *sdpa_grads), (exact, *exact_grads)):
        error = (ours.double() - truth).abs().max().item()
        sdpa_error = (pytorchs.double() - truth).abs().max().item()
        assert error <= F32_TOL
        assert error <= 3 * sdpa_error + 1e-6


BF16_MARGIN = 1.2  # measured: at most 0.98 (see the module's docstring)
EMULATED_MARGIN = 1.1  # measured: at most 1.03 (dQ), on the AVX-512, AVX2-forced and portable kernels


def _bf16_float32_inside(q, k, v, d_out):
    """What "bf16 in, float32 inside, bf16 out" can reach at best: attention in float32 on the inputs
    rounded to bf16, its output and gradients rounded to bf16."""
    qf, kf, vf = (t.detach().bfloat16().float().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(qf, kf, vf, is_causal=True, enable_gqa=True)
    grads = torch.autograd.grad(out, (qf, kf, vf), d_out.bfloat16().float())
    return tuple(t.bfloat16() for t in (out, *grads))


@pytest.mark.parametrize("seed", [0, 1])
def test_bfloat16_accumulates_in_float32_as_sdpa_does(seed):
    """bf16 inputs, L = 512, causal: the mean error of the output and of dQ, dK, dV against float64
    is within 1.1x of float32 attention on the bf16-rounded inputs and within 1.2x of SDPA's bf16
    kernel's; the results come back in bf16, the log-sum-exp in float32.

    PyTorch 2.13's bf16 SDPA kernel raises "pack_vnni2 is only supported when avx512 is supported"
    when ATEN_CPU_CAPABILITY forces kernels below AVX-512 on an AVX-512 CPU; there the comparison
    with float32 inside still holds, and the one with SDPA is left out."""
    q, k, v = _inputs(1, 4, 2, 512, 512, 64, 64, seed=seed)
    d_out = torch.randn(1, 4, 512, 64, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    exact = _sdpa(q, k, v, None, True)
    truth = (exact, *torch.autograd.grad(exact, (q, k, v), d_out))
    results = {"float32 inside": _bf16_float32_inside(q, k, v, d_out)}
    for name in ("ours", "sdpa"):
        qb, kb, vb = (t.detach().bfloat16().requires_grad_() for t in (q, k, v))
        if name == "ours":
            out, lse = flash_attention(qb, kb, vb, is_causal=True, return_lse=True)
            assert lse.dtype == torch.float32
        else:
            try:
                out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=True)
            except RuntimeError as err:
                assert "pack_vnni2" in str(err) and "ATEN_CPU_CAPABILITY" in os.environ, err
                continue
        results[name] = (out, *torch.autograd.grad(out, (qb, kb, vb), d_out.bfloat16()))
    margins = {"float32 inside": EMULATED_MARGIN, "sdpa": BF16_MARGIN}
    for i, what in enumerate(("out", "dq", "dk", "dv")):
        ours = results["ours"][i]
        assert ours.dtype == torch.bfloat16, what
        error = (ours.double() - truth[i]).abs().mean().item()
        for name, margin in margins.items():
            if name in results:
                other = (results[name][i].double() - truth[i]).abs().mean().item()
                assert error <= margin * other, f"{what}: {error:.3g} vs {name}'s {other:.3g}"


def test_gradcheck():
    q, k, v = _inputs(1, 4, 2, 9, 7, 4, 3, seed=0)
    mask = torch.rand(1, 1, 9, 7, generator=torch.Generator().manual_seed(0)) < 0.7
    mask[..., 0] = True
    assert torch.autograd.gradcheck(
        lambda a, b, c: flash_attention(a, b, c, mask, True, block_q=4, block_k=3), (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: flash_attention(a, b, c, block_q=2, block_k=5),
                                    (q, k, v))


def test_the_functions_and_the_autograd_function_agree():
    q, k, v = _inputs(1, 2, 1, 12, 10, 8, 8, seed=4)
    out, lse = flash_attention_forward(q, k, v, None, True, None, 4, 4)
    out2, lse2 = FlashAttention.apply(q, k, v, None, True, None, 4, 4)
    assert torch.equal(out, out2.detach()) and torch.equal(lse, lse2)
    d_out = torch.ones_like(out)
    dq, dk, dv = flash_attention_backward(d_out, q, k, v, out, lse, None, True, None, 4, 4)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert all(torch.equal(a, b) for a, b in zip((dq, dk, dv), torch.autograd.grad(out2, (q, k, v), d_out)))


def test_a_fully_masked_row_gives_zeros_and_minus_infinity_never_nan():
    q, k, v = _inputs(2, 2, 2, 6, 5, 4, 4, seed=5)
    mask = torch.ones(2, 2, 6, 5, dtype=torch.bool)
    mask[0, 1, 3] = False  # query 3 of head 1 of sequence 0 may attend to nothing
    out, lse = flash_attention(q, k, v, mask, block_q=4, block_k=2, return_lse=True)
    assert torch.isfinite(out).all()
    assert torch.equal(out[0, 1, 3], torch.zeros(4, dtype=out.dtype))
    assert lse[0, 1, 3] == float("-inf") and torch.isfinite(lse[~(lse == float("-inf"))]).all()
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # PyTorch: zeros too
    assert (out - expected).abs().max() <= F64_TOL
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.equal(grads[0][0, 1, 3], torch.zeros(4, dtype=out.dtype))


def test_merge_of_two_partial_states_is_the_softmax_of_all_keys():
    gen = torch.Generator().manual_seed(0)
    scores = 5 * torch.randn(3, 10, generator=gen, dtype=torch.float64)  # 3 rows, 10 keys
    values = torch.randn(10, 4, generator=gen, dtype=torch.float64)

    def state(cols):
        s = scores[:, cols]
        m = s.amax(dim=-1)
        p = torch.exp(s - m[:, None])
        return m, p.sum(-1), p @ values[cols]

    m, ell, o = merge_softmax_states(*state(slice(0, 4)), *state(slice(4, 10)))
    assert (o / ell[:, None] - scores.softmax(-1) @ values).abs().max() <= 1e-12
    assert (m + ell.log() - scores.logsumexp(-1)).abs().max() <= 1e-12
    empty = (torch.full((3,), float("-inf"), dtype=torch.float64), torch.zeros(3, dtype=torch.float64),
             torch.zeros(3, 4, dtype=torch.float64))
    for merged in (merge_softmax_states(*empty, m, ell, o), merge_softmax_states(m, ell, o, *empty)):
        assert all(torch.equal(a, b) for a, b in zip(merged, (m, ell, o)))
    nothing = merge_softmax_states(*empty, *empty)
    assert not any(torch.isnan(t).any() for t in nothing)


def test_causal_tiles_above_the_diagonal_are_skipped(monkeypatch):
    """Count the score tiles computed: causal attention over 4 x 4 tiles needs 10 of the 16."""
    import course_lib.flash as flash

    computed = []
    original = flash._allowed
    monkeypatch.setattr(flash, "_allowed", lambda *a: computed.append(a[2:6]) or original(*a))
    q, k, v = _inputs(1, 1, 1, 64, 64, 8, 8, seed=0)
    flash.flash_attention_forward(q, k, v, is_causal=True, block_q=16, block_k=16)
    assert len(computed) == 10
    assert all(j0 <= i1 - 1 for i0, i1, j0, j1 in computed)


def test_naive_attention_is_sdpa():
    q, k, v = _inputs(1, 2, 2, 20, 20, 8, 8, seed=1)
    assert (naive_attention(q, k, v, True) - F.scaled_dot_product_attention(q, k, v, is_causal=True)
            ).abs().max() <= F64_TOL


@pytest.mark.parametrize("change, error, words", [
    (dict(q=torch.zeros(2, 8, 4)), ValueError, "must be 4-D"),
    (dict(k=torch.zeros(1, 3, 6, 8), v=torch.zeros(1, 3, 6, 8)), ValueError, "multiple of the number of KV heads"),
    (dict(k=torch.zeros(1, 2, 6, 4)), ValueError, "share head_dim"),
    (dict(v=torch.zeros(1, 2, 5, 8)), ValueError, "same heads and length"),
    (dict(q=torch.zeros(1, 4, 5, 8, dtype=torch.int64)), TypeError, "floating-point"),
    (dict(q=torch.zeros(1, 4, 5, 8, dtype=torch.float64)), TypeError, "share dtype"),
    (dict(q=torch.full((1, 4, 5, 8), float("nan"))), ValueError, "NaN or inf"),
    (dict(q=torch.zeros(1, 4, 0, 8)), ValueError, "is empty"),
    (dict(mask=torch.ones(5, 6)), TypeError, "bool tensor"),
    (dict(mask=torch.ones(1, 1, 5, 7, dtype=torch.bool)), ValueError, "does not broadcast"),
    (dict(block_q=0), ValueError, "block_q must be an int >= 1"),
    (dict(block_k=2.5), ValueError, "block_k must be an int >= 1"),
    (dict(scale=float("inf")), ValueError, "scale must be a finite number"),
    (dict(is_causal="False"), TypeError, r"is_causal must be True or False, got 'False' \(str\)"),
    (dict(is_causal=1), TypeError, "is_causal must be True or False, got 1"),
    (dict(is_causal=None), TypeError, "is_causal must be True or False, got None"),
])
def test_bad_input_gets_a_clear_error(change, error, words):
    args = dict(q=torch.zeros(1, 4, 5, 8), k=torch.zeros(1, 2, 6, 8), v=torch.zeros(1, 2, 6, 8))
    args.update(change)
    with pytest.raises(error, match=words):
        flash_attention(**args)


def test_naive_attention_refuses_a_non_bool_is_causal():
    q = torch.zeros(1, 2, 5, 8)
    with pytest.raises(TypeError, match="naive_attention: is_causal must be True or False, got 'False'"):
        naive_attention(q, q, q, "False")


@pytest.mark.parametrize("which, bad, error, words", [
    ("d_out", torch.zeros(1, 4, 5, 7), ValueError,
     r"d_out must be \(B, h, L_q, d_v\) = \(1, 4, 5, 8\), the gradient of the output.*got \(1, 4, 5, 7\)"),
    ("d_out", torch.zeros(4, 5, 8), ValueError, r"d_out must be .* got \(4, 5, 8\)"),
    ("d_out", [[0.0]], TypeError, "d_out must be a torch.Tensor of shape"),
    ("d_out", torch.zeros(1, 4, 5, 8, dtype=torch.float64), TypeError, "d_out must have the inputs' dtype"),
    ("out", torch.zeros(1, 4, 6, 8), ValueError, r"out must be \(B, h, L_q, d_v\) = \(1, 4, 5, 8\), what "
                                                 "flash_attention_forward returned"),
    ("lse", torch.zeros(1, 4, 5, 1), ValueError, r"lse must be \(B, h, L_q\) = \(1, 4, 5\)"),
    ("is_causal", "True", TypeError, "is_causal must be True or False"),
])
def test_the_backward_names_a_wrong_gradient_or_saved_tensor(which, bad, error, words):
    q, k, v = (torch.randn(1, 4, 5, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    k, v = k[:, :2], v[:, :2]
    out, lse = flash_attention_forward(q, k, v, is_causal=True)
    args = dict(d_out=torch.ones_like(out), q=q, k=k, v=v, out=out, lse=lse, is_causal=True)
    args[which] = bad
    with pytest.raises(error, match=words):
        flash_attention_backward(**args)


def test_the_measurement_script_keeps_what_it_did_not_measure_again(tmp_path, monkeypatch):
    """scripts/flash_memory.py: a partial run (--extras, or fewer lengths) keeps the stored runs of
    the (version, L) and kinds it did not measure, and replaces the others."""
    import importlib.util
    import json
    from pathlib import Path

    import course_lib.studies.stored as stored

    script = Path(__file__).resolve().parents[2] / "scripts" / "flash_memory.py"
    spec = importlib.util.spec_from_file_location("flash_memory", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(stored, "RESULTS_DIR", tmp_path)
    old = [{"version": "naive", "L": 1024, "peak_bytes": 1}, {"version": "tiled", "L": 1024, "peak_bytes": 2},
           {"kind": "profile", "shares": {"matmul": 0.5}}, {"kind": "flex", "flex": {"L": 1}}]
    stored.save_runs("flash_memory", old, folder=tmp_path)
    new = [{"version": "tiled", "L": 1024, "peak_bytes": 3}, {"kind": "flex", "flex": {"L": 2}}]
    merged = module.keep_earlier(new)
    assert merged == [old[0], new[0], old[2], new[1]]
    one = module.measure_one("tiled", 256)  # in this process: the fields the lesson reads
    assert set(one) == {"version", "L", "peak_bytes", "forward_s", "backward_s"}
    assert json.loads(json.dumps(one)) == one


def test_backward_tiles_summed_over_a_tiling_are_autograd():
    """``flash_backward_tile`` over every tile (causal: the mask from the tile's positions) adds up
    to autograd's dQ, dK, dV through SDPA, float64, with a custom scale and d_v != d."""
    from course_lib.flash import flash_backward_tile

    gen = torch.Generator().manual_seed(5)
    L, d, d_v, bq, bk, scale = 13, 4, 3, 5, 3, 0.3
    q, k = (torch.randn(L, d, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(L, d_v, generator=gen, dtype=torch.float64, requires_grad=True)
    d_out = torch.randn(L, d_v, generator=gen, dtype=torch.float64)
    for causal in (False, True):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        expected = torch.autograd.grad(out, (q, k, v), d_out)
        keep = torch.ones(L, L, dtype=torch.bool).tril() if causal else torch.ones(L, L, dtype=torch.bool)
        lse = torch.logsumexp((q @ k.T * scale).masked_fill(~keep, -math.inf), dim=-1).detach()
        D = (d_out * out.detach()).sum(-1)
        dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
        for i0 in range(0, L, bq):
            for j0 in range(0, L, bk):
                i, j = slice(i0, i0 + bq), slice(j0, j0 + bk)
                got = flash_backward_tile(q[i].detach(), k[j].detach(), v[j].detach(), d_out[i],
                                          lse[i], D[i], scale, keep[i, j] if causal else None)
                dq[i] += got[0]
                dk[j] += got[1]
                dv[j] += got[2]
        for ours, theirs in zip((dq, dk, dv), expected):
            assert (ours - theirs).abs().max() <= F64_TOL


def test_attention_io_bytes_follows_the_papers_counts():
    from course_lib.flash import attention_io_bytes

    L, d = 4096, 64
    assert attention_io_bytes(L, d, "standard") == 4 * (4 * L * d + 4 * L * L)
    assert attention_io_bytes(L, d, "flash", block=256) == 4 * (2 * L * d + 16 * 2 * L * d + L)
    assert attention_io_bytes(300, 8, "flash", block=256, bytes_per_number=2) == 2 * (
        2 * 300 * 8 + 2 * 2 * 300 * 8 + 300)  # 2 query tiles, the last one short
    # Theorem 2's shapes: standard grows as L² (x4 per doubling), flash as L²d²/M, M fixed
    ratio = attention_io_bytes(2 * L, d, "standard") / attention_io_bytes(L, d, "standard")
    assert 3.9 < ratio <= 4
    four = attention_io_bytes(2 * L, d, "flash", block=64) / attention_io_bytes(L, d, "flash", block=64)
    assert 3.9 < four <= 4
    d_squared = (attention_io_bytes(L, 2 * d, "flash", block=64)  # M fixed: d doubles, block halves
                 / attention_io_bytes(L, d, "flash", block=128))
    assert 3.9 < d_squared <= 4
    for bad, words in ((dict(method="tiled"), "'standard' or 'flash'"), (dict(block=0), "block"),
                       (dict(L=2.5), "L must be an int")):
        args = dict(L=L, head_dim=d, method="flash") | bad
        with pytest.raises(ValueError, match=words):
            attention_io_bytes(**args)
