"""Lesson 12's tools (course_lib.interp, course_lib.induction, course_lib.lens_port): the scores on
hand-made patterns, the hooks against hand-computed forwards, direct logit attribution summing to
the logits, the attention-only GPT (the TransformerLens comparison: tests/lib/test_lens_port.py)."""

from __future__ import annotations

import pytest
import torch

from course_lib import interp
from course_lib.gpt import GPT, GPTConfig
from course_lib.induction import induction_config, repeated_tokens, tiled_batch



def random_model(seed: int = 0, dtype=torch.float32, **changes) -> GPT:
    """An attention-only model with weights far from the initialisation (non-trivial patterns)."""
    torch.manual_seed(seed)
    model = GPT(induction_config(**changes)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model.to(dtype)


def ids(batch=3, n=11, seed=1, vocab=64):
    return repeated_tokens(batch, n, vocab, torch.Generator().manual_seed(seed))


# --- the model and the data ---


def test_attn_only_has_no_feed_forward_parameters_and_adds_nothing():
    full, attn = GPT(induction_config(attn_only=False)), GPT(induction_config())
    assert not any("feed_forward" in n or "norm2" in n for n, _ in attn.named_parameters())
    d = 128
    per_layer = 4 * (d * d + d)  # q, k, v, out projections with biases
    V, layers = 64, 2
    assert sum(p.numel() for p in attn.parameters()) == V * d + layers * (per_layer + 2 * d) + 2 * d
    assert sum(p.numel() for p in full.parameters()) > sum(p.numel() for p in attn.parameters())
    layer = attn.blocks.layers[0]
    x = torch.randn(2, 5, d)
    assert torch.equal(layer(x, None), x + layer.self_attn(*(layer.norm1(x),) * 3))
    with pytest.raises(TypeError, match="attn_only"):
        GPTConfig(attn_only="yes")


def test_repeated_tokens_and_tiled_rows():
    x = ids(4, 7)
    assert x.shape == (4, 14) and torch.equal(x[:, :7], x[:, 7:])
    rows = tiled_batch(50, 49, 64, 8, 24, torch.Generator().manual_seed(0))
    assert rows.shape == (50, 49) and rows.max() < 64
    periods = set()
    for row in rows:  # each row is periodic with its own period in 8..24
        period = next(p for p in range(8, 25) if torch.equal(row[p:], row[:-p]))
        periods.add(period)
    assert len(periods) > 5
    with pytest.raises(ValueError, match="min_period"):
        tiled_batch(2, 10, 5, 9, 8)
    with pytest.raises(ValueError, match="length"):
        repeated_tokens(2, 0, 5)


# --- scores on patterns whose answer is known ---


def one_hot_pattern(T: int, source) -> torch.Tensor:
    """(1, 1, T, T): query i attends only to source(i) (or to itself where that is not allowed)."""
    p = torch.zeros(1, 1, T, T)
    for i in range(T):
        j = source(i)
        p[0, 0, i, j if 0 <= j <= i else i] = 1.0
    return p


def test_scores_of_exact_heads():
    n, T = 6, 12
    prev = one_hot_pattern(T, lambda i: i - 1)
    induction = one_hot_pattern(T, lambda i: i - n + 1 if i >= n else i)
    duplicate = one_hot_pattern(T, lambda i: i - n if i >= n else i)
    x = torch.cat([torch.arange(10, 10 + n)] * 2)[None]  # (1, 12): multi-digit ids, [r, r]
    assert interp.previous_token_score(prev).item() == pytest.approx(1.0)
    assert interp.induction_score(induction, n).item() == pytest.approx(1.0)
    assert interp.induction_score(duplicate, n).item() == pytest.approx(0.0)
    assert interp.induction_score(prev, n).item() == pytest.approx(0.0)
    assert interp.duplicate_token_score(duplicate, x).item() == pytest.approx(1.0)
    assert interp.duplicate_token_score(induction, x).item() == pytest.approx(0.0)
    uniform = torch.ones(T, T).tril()
    uniform = (uniform / uniform.sum(-1, keepdim=True))[None, None]
    # the second copy's query i spreads 1/(i+1) over i+1 keys
    expected = sum(1 / (i + 1) for i in range(n, 2 * n)) / n
    assert interp.induction_score(uniform, n).item() == pytest.approx(expected)
    with pytest.raises(ValueError, match="2 \\* length"):
        interp.induction_score(uniform, 7)
    with pytest.raises(ValueError, match="twice"):
        interp.duplicate_token_score(uniform, torch.arange(T)[None])


def test_attention_patterns_are_the_weights_and_leave_the_fused_flag():
    model = random_model()
    for layer in model.blocks.layers:
        layer.self_attn.fused = True
    x = ids()
    patterns = interp.attention_patterns(model, x)
    assert [p.shape for p in patterns] == [(3, 4, 22, 22)] * 2
    assert all(layer.self_attn.fused for layer in model.blocks.layers)
    torch.testing.assert_close(patterns[0].sum(-1), torch.ones(3, 4, 22))
    assert torch.all(patterns[1].triu(1) == 0)


# --- hooks ---


def test_zero_ablation_equals_removing_the_head_by_hand():
    model, x = random_model(), ids()
    z = interp.head_outputs(model, x)
    attn1 = model.blocks.layers[1].self_attn
    w_o = attn1.out_proj.weight.view(128, 4, 32)  # (d, h, hd)
    with torch.no_grad():
        expected_resid_change = z[1][:, :, 3] @ w_o[:, 3].T  # what head 1.3 adds (B, T, d)
        # layer 1 is the last: ablating it changes the final stream by exactly that
        norm = model.blocks.norm
        x0 = model.embed(x)
        x1 = x0 + torch.einsum("bthk,dhk->btd", z[0], model.blocks.layers[0].self_attn.out_proj.weight.view(128, 4, 32)) \
            + model.blocks.layers[0].self_attn.out_proj.bias
        x2 = x1 + torch.einsum("bthk,dhk->btd", z[1], w_o) + attn1.out_proj.bias
        expected = model.lm_head(norm(x2 - expected_resid_change))
        with interp.hooked(model, 1, interp.ablation_hook(3, 4)):
            got = model(x)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert not model.blocks.layers[1].self_attn.out_proj._forward_pre_hooks  # removed afterwards


def test_mean_ablation_with_a_constant_head_changes_nothing():
    model, x = random_model(), ids()
    z = interp.head_outputs(model, x)
    with torch.no_grad():
        plain = model(x)
        # replacing head 0.1's output by its own values at every position = no change
        with interp.hooked(model, 0, interp.patching_hook(1, 4, z[0])):
            same = model(x)
    torch.testing.assert_close(same, plain)
    n = x.size(1) // 2
    base = interp.loss_per_position(model, x)[n - 1 :].mean().item()
    assert interp.ablated_loss(model, x, 0, 1, "zero") != pytest.approx(base)
    assert interp.ablation_table(model, x, "mean").shape == (2, 4)
    with pytest.raises(ValueError, match="'zero' or 'mean'"):
        interp.ablated_loss(model, x, 0, 1, "none")


def test_patching_one_position_changes_only_that_position_onwards():
    model, x = random_model(), ids()
    other = ids(seed=7)
    clean_z = interp.head_outputs(model, x)
    with torch.no_grad():
        base = model(other)
        with interp.hooked(model, 1, interp.patching_hook(2, 4, clean_z[1], position=5)):
            patched = model(other)
    changed = (patched - base).abs().amax(dim=(0, 2))  # (T,)
    assert changed[5] > 1e-3 and changed[:5].max() == 0 and changed[6:].max() == 0


def test_patching_table_is_zero_for_identical_runs_shape():
    model, x = random_model(), ids(n=10)
    corrupted = x.clone()
    corrupted[:, :10] = ids(n=10, seed=9)[:, :10]
    table = interp.patching_table(model, x, corrupted)
    assert table.shape == (2, 4) and torch.isfinite(table).all()
    with pytest.raises(ValueError, match="same shape"):
        interp.patching_table(model, x, corrupted[:, :-1])


def test_direct_logit_attribution_sums_to_the_logits():
    model, x = random_model(dtype=torch.float64), ids()
    targets = torch.roll(x, -1, dims=1)
    parts = interp.direct_logit_attribution(model, x, targets)
    total = parts["embed"] + parts["heads"].sum(dim=(0, 1)) + parts["bias"]
    with torch.no_grad():
        logits = model(x).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(total, logits, atol=1e-9, rtol=1e-9)
    assert parts["heads"].shape == (2, 4, 3, 22)


def test_key_path_ablation_keeps_scores_when_the_head_writes_nothing():
    model, x = random_model(), ids()
    n = x.size(1) // 2
    full = interp.induction_score(interp.attention_patterns(model, x)[1], n)
    with torch.no_grad():
        model.blocks.layers[0].self_attn.out_proj.weight.view(128, 4, 32)[:, 2] = 0.0
    full = interp.induction_score(interp.attention_patterns(model, x)[1], n)
    torch.testing.assert_close(interp.key_path_ablation(model, x, 2), full)
    assert not torch.allclose(interp.key_path_ablation(model, x, 1), full)


def test_training_and_the_benchmark_line_run_on_a_tiny_budget():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "induction.py"
    spec = importlib.util.spec_from_file_location("induction_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    state = torch.get_num_threads()
    model, run = __import__("course_lib.induction", fromlist=["x"]).train_induction(
        steps=4, eval_every=2, threads=None)
    assert run.steps == [2, 4] and len(run.induction) == 2 and run.formed() is None
    line = bench.summary(model, run)
    assert line.startswith("induction: induction score ") and "(head 1." in line and "not formed" in line
    assert torch.get_num_threads() == state


# --- bad input (issue 39, section 4): a message that says what to fix, never a raw error or NaN ---


@pytest.mark.parametrize("call, words", [
    (lambda m, x: interp.ablated_loss(m, x, 2, 0), r"layer must be an int in 0 \.\. 1, got 2"),
    (lambda m, x: interp.ablated_loss(m, x, 0, 4), r"head must be an int in 0 \.\. 3, got 4"),
    (lambda m, x: interp.ablated_loss(m, x, -1, 0), r"layer must be an int in 0 \.\. 1, got -1"),
    (lambda m, x: interp.ablation_hook(4, 4), r"ablation_hook: head must be an int in 0 \.\. 3"),
    (lambda m, x: interp.ablation_hook(-1, 4), r"head must be an int in 0 \.\. 3, got -1"),
    (lambda m, x: interp.patching_hook(5, 4, interp.head_outputs(m, x)[0]), r"head must be .* 0 \.\. 3"),
    (lambda m, x: interp.patching_hook(1, 4, interp.head_outputs(m, x)[0], position=22),
     r"position must be an int in 0 \.\. 21"),
    (lambda m, x: interp.hooked(m, 2, interp.ablation_hook(0, 4)).__enter__(),
     r"hooked: layer must be an int in 0 \.\. 1, got 2"),
    (lambda m, x: interp.key_path_ablation(m, x, 4), r"head0 must be an int in 0 \.\. 3, got 4"),
])
def test_a_head_or_layer_out_of_range_is_named(call, words):
    model, x = random_model(), ids()
    with pytest.raises(ValueError, match=words):
        call(model, x)
    assert all(not a.self_attn.out_proj._forward_pre_hooks for a in model.blocks.layers)


@pytest.mark.parametrize("length", [0, -1, 2.5, True, "4"])
def test_induction_score_refuses_a_length_that_is_not_a_positive_int(length):
    with pytest.raises(ValueError, match="length must be an int >= 1"):
        interp.induction_score(torch.rand(1, 2, 8, 8).softmax(-1), length)


@pytest.mark.parametrize("call", [
    lambda m, x: interp.head_scores(m, x),
    lambda m, x: interp.ablated_loss(m, x, 0, 1),
    lambda m, x: interp.patching_table(m, x, torch.cat([ids(n=11, seed=5)[:, :11], x[:, 11:]], 1)),
    lambda m, x: interp.key_path_ablation(m, x, 1),
    lambda m, x: __import__("course_lib.induction", fromlist=["x"]).repeated_half_losses(m, x),
])
@pytest.mark.parametrize("bad", ["odd", "one token", "not repeated"])
def test_ids_that_are_not_two_copies_are_refused(call, bad):
    model = random_model()
    x = {"odd": ids()[:, :-1], "one token": ids(n=1), "not repeated": ids(n=22)[:, :22] * 0
         + torch.arange(22)}[bad]
    with pytest.raises(ValueError, match=r"not two copies \[r, r\]"):
        call(model, x)


def test_patching_table_with_nothing_to_patch_is_refused():
    model, x = random_model(), ids()
    with pytest.raises(ValueError, match="nothing to patch"):
        interp.patching_table(model, x, x.clone())
    with pytest.raises(ValueError, match=r"\[r', r\]"):
        interp.patching_table(model, x, ids(seed=4))  # its second half is not clean's


def test_duplicate_token_score_names_both_shapes():
    pattern = torch.rand(2, 3, 6, 6).softmax(-1)
    with pytest.raises(ValueError, match=r"ids \(1, 6\) do not fit the pattern \(2, 3, 6, 6\)"):
        interp.duplicate_token_score(pattern, torch.zeros(1, 6, dtype=torch.long))
    with pytest.raises(ValueError, match=r"ids \(2, 5\) do not fit the pattern \(2, 3, 6, 6\)"):
        interp.duplicate_token_score(pattern, torch.zeros(2, 5, dtype=torch.long))


def test_integer_patterns_are_accepted_by_every_score():
    T, n = 8, 4
    exact = one_hot_pattern(T, lambda i: i - n + 1)  # an exact induction head on [r, r]
    as_int = exact.long()
    assert interp.induction_score(as_int, n).tolist() == [1.0]
    assert interp.previous_token_score(one_hot_pattern(T, lambda i: i - 1).long()).tolist() == [1.0]
    x = torch.tensor([[3, 5, 7, 9, 3, 5, 7, 9]])
    assert interp.duplicate_token_score(one_hot_pattern(T, lambda i: i - n).long(), x).tolist() == [1.0]


def test_a_hook_for_the_wrong_number_of_heads_gets_a_message():
    model = random_model(num_heads=2)
    x = ids()
    with pytest.raises(ValueError, match="built for num_heads=3"):  # 128 does not split into 3
        with interp.hooked(model, 0, lambda m, a: interp.ablation_hook(0, 3)(m, a)):
            model(x)
    with pytest.raises(ValueError, match="built for num_heads=4, but layer 0 has 2 heads"):
        with interp.hooked(model, 0, interp.ablation_hook(0, 4)):
            model(x)
    with pytest.raises(ValueError, match=r"mean must be \(head_dim,\) = \(64,\)"):
        with interp.hooked(model, 0, interp.ablation_hook(0, 2, torch.zeros(32))):
            model(x)
    with pytest.raises(TypeError, match="hook must be a function"):
        with interp.hooked(model, 0, "zero"):
            pass


def test_loss_per_position_names_the_ids_given():
    model = random_model()
    with pytest.raises(ValueError, match=r"ids \(2, 1\) must hold"):
        interp.loss_per_position(model, torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="integer tensor"):
        interp.loss_per_position(model, torch.zeros(2, 5))


# --- the OV circuit ---


def test_full_ov_circuit_equals_the_head_run_on_one_token_by_hand():
    """Row a of the circuit = the head's direct effect on the logits when it attends only to a
    position holding token a, with LayerNorm's spread taken as 1 (and biases left out)."""
    model = random_model(num_heads=2, d_model=64, dtype=torch.float64)
    attn, norm1 = model.blocks.layers[1].self_attn, model.blocks.layers[1].norm1
    e = model.embed.token.embedding.weight[7]  # token 7
    x = (e - e.mean()) * norm1.weight  # LayerNorm with spread 1, no bias
    v = attn.v_proj.weight @ x  # (h * hd,)
    z = torch.zeros_like(v)
    z[32:] = v[32:]  # head 1 only
    out = attn.out_proj.weight @ z  # (d,)
    logits = model.lm_head.weight @ (out * model.blocks.norm.weight)  # (V,)
    circuit = interp.full_ov_circuit(model, 1, 1)
    assert circuit.shape == (64, 64)
    torch.testing.assert_close(circuit[7], logits.detach(), atol=1e-10, rtol=1e-10)


def test_copying_scores_of_known_maps():
    assert interp.copying_scores(torch.eye(5) * 3) == {"top1": 1.0, "eigen": 1.0}
    scores = interp.copying_scores(-torch.eye(5))
    assert scores["top1"] == 0.0 and scores["eigen"] == -1.0
    rotation = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])  # eigenvalues +-i: no copying
    assert abs(interp.copying_scores(rotation)["eigen"]) < 1e-12
    with pytest.raises(ValueError, match="square"):
        interp.copying_scores(torch.zeros(3, 4))


def test_the_trained_induction_heads_copy_and_layer_0_does_not():
    from course_lib.induction import load_checkpoint

    model, _ = load_checkpoint()
    for head in range(4):
        ind = interp.copying_scores(interp.full_ov_circuit(model, 1, head))
        assert ind["top1"] > 0.9 and ind["eigen"] > 0.9
        control = interp.copying_scores(interp.full_ov_circuit(model, 0, head))
        assert control["top1"] < 0.1 and control["eigen"] < 0
    with pytest.raises(ValueError, match=r"head must be an int in 0 \.\. 3, got 4"):
        interp.full_ov_circuit(model, 1, 4)
    gqa = random_model(num_kv_heads=2)
    assert interp.full_ov_circuit(gqa, 0, 3).shape == (64, 64)


# --- direct logit attribution's inputs (issue #48) ---


@pytest.mark.parametrize("change, error, words", [
    (dict(targets=lambda x: x[:, :-1]), ValueError,
     r"targets \(3, 21\) must have the shape of ids \(3, 22\), one target token per position; for "
     r"next-token targets pass ids\[:, :-1\] as ids and ids\[:, 1:\] as targets"),
    (dict(targets=lambda x: x.float()), ValueError, r"targets must be token ids \(B, T\), an integer tensor"),
    (dict(targets=lambda x: x + 64), ValueError, r"targets must be token ids in 0 \.\. 63 .* got values 64 \.\. "),
    (dict(ids=lambda x: x[0]), ValueError, r"ids must be token ids \(B, T\), an integer tensor, got \(22,\)"),
    (dict(model=lambda m: torch.nn.Linear(4, 4)), TypeError,
     r"direct_logit_attribution: expected a course_lib GPT \(the model itself.*got Linear"),
])
def test_direct_logit_attribution_names_bad_targets_ids_and_models(change, error, words):
    model, x = random_model(), ids()
    args = dict(model=model, ids=x, targets=torch.roll(x, -1, dims=1))
    for name, make in change.items():
        args[name] = make(model if name == "model" else x)
    with pytest.raises(error, match=words):
        interp.direct_logit_attribution(**args)
