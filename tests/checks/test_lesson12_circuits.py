"""Lesson-12 ★★★ checkers (course_lib/checks/lesson12_circuits.py: the patching table, the OV circuit):
right answers pass, each named mistake is caught."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _helpers import passes

from course_lib import interp
from course_lib.checks import CheckFailure, check_ov_circuit, check_patching_table
from course_lib.solutions import solution_source


def _solution(key: str) -> dict:
    """The names a solution block defines, run with nothing but ``torch`` imported: the notebook
    imports little, and a block is pasted into it as it stands."""
    namespace: dict = {"torch": torch}
    exec(solution_source(key), namespace)  # noqa: S102  (our own solution file)
    return namespace


# ----------------------------------------------------------------------------------------------
# 12.patching_table (★★★)
# ----------------------------------------------------------------------------------------------


def table_variant(normalise=True, reverse=False, negate=False, swap=False, whole=False,
                  own_targets=False, whole_layer=False, leave_hooks=False, per_row=False,
                  late=False, no_grad=True, float64=False):
    """A learner's patching table written with interp's tools; right by default, each option one
    way to get it wrong (or, for no_grad and float64, another right way)."""

    def loss_rows(model, ids, targets, n):
        logits = model(ids[:, :-1])
        if float64:
            logits = logits.double()
        if whole:
            return F.cross_entropy(logits.transpose(1, 2), targets[:, 1:], reduction="none")
        if late:
            return F.cross_entropy(logits[:, n:].transpose(1, 2), targets[:, n + 1:], reduction="none")
        return F.cross_entropy(logits[:, n - 1:].transpose(1, 2), targets[:, n:], reduction="none")

    def table(model, clean, corrupted):
        c = model.config
        n = clean.size(1) // 2
        base, source = (clean, corrupted) if swap else (corrupted, clean)
        src_z = interp.head_outputs(model, source[:, :-1])
        base_targets = corrupted if own_targets else clean

        def loss(ids, targets):
            rows = loss_rows(model, ids, targets, n).mean(dim=1)  # (B,)
            return rows if per_row else rows.mean()

        low, high = loss(corrupted, base_targets), loss(clean, clean)
        out = torch.zeros(c.num_layers, c.num_heads, dtype=torch.float64 if float64 else torch.float32)
        for layer in range(c.num_layers):
            for head in range(c.num_heads):
                if whole_layer:
                    def hook(m, a, z=src_z[layer]):
                        return z.reshape(a[0].shape)
                else:
                    hook = interp.patching_hook(head, c.num_heads, src_z[layer])
                if leave_hooks:
                    model.blocks.layers[layer].self_attn.out_proj.register_forward_pre_hook(hook)
                    patched = loss(base, base_targets if not swap else clean)
                else:
                    with interp.hooked(model, layer, hook):
                        patched = loss(base, base_targets if not swap else clean)
                value = (low - patched) if not normalise else (low - patched) / (low - high)
                if swap:
                    value = (low - patched) / (low - high)
                if reverse:
                    value = 1 - value
                if negate:
                    value = -value
                out[layer, head] = value.mean().detach()
        return out

    if no_grad:
        return torch.no_grad()(table)
    return table


def test_patching_table_solution_passes(capsys):
    assert passes(check_patching_table, _solution("12.patching_table")["my_patching_table"])
    assert "check_patching_table: both models" in capsys.readouterr().out


@torch.no_grad()
def table_full_runs(model, clean, corrupted):
    """Whole sequences through the model (the last position's logits dropped), the learner's own
    hooks, one row at a time for the losses, summed: also right."""
    L, h = model.config.num_layers, model.config.num_heads
    n = clean.size(1) // 2
    projections = [block.self_attn.out_proj for block in model.blocks.layers]
    kept = [None] * L

    def second_half_sum(ids):
        logits = model(ids)[:, n - 1:-1]  # (B, n, V): the predictions of tokens n .. 2n-1
        return sum(F.cross_entropy(logits[b], clean[b, n:], reduction="sum") for b in range(len(ids)))

    handles = [p.register_forward_pre_hook(lambda m, a, i=i: kept.__setitem__(i, a[0].clone()))
               for i, p in enumerate(projections)]
    high = second_half_sum(clean)
    for handle in handles:
        handle.remove()
    low = second_half_sum(corrupted)
    table = torch.empty(L, h)
    for layer in range(L):
        hd = kept[layer].size(-1) // h
        for head in range(h):
            def patch(m, a, layer=layer, head=head):
                a[0][..., head * hd:(head + 1) * hd] = kept[layer][..., head * hd:(head + 1) * hd]

            handle = projections[layer].register_forward_pre_hook(patch)
            table[layer, head] = (low - second_half_sum(corrupted)) / (low - high)
            handle.remove()
    return table


@pytest.mark.parametrize("fn", [table_variant(), table_variant(no_grad=False, float64=True),
                                table_full_runs],
                         ids=["interp's tools", "float64, no no_grad", "whole runs, own hooks"])
def test_patching_table_styles_pass(fn):
    assert passes(check_patching_table, fn)


@pytest.mark.parametrize("fn, words", [
    (table_variant(normalise=False), "not normalised"),
    (table_variant(reverse=True), r"sign is reversed \(you computed 1 - fraction"),
    (table_variant(negate=True), "sign is reversed"),
    (table_variant(swap=True), "direction is swapped"),
    (table_variant(whole=True), "scored over the whole sequence"),
    (table_variant(whole=True, own_targets=True), "against the corrupted run's own tokens"),
    (table_variant(late=True), "scored one position late"),
    (table_variant(whole_layer=True), "patched the whole layer"),
    (table_variant(per_row=True), "averaged over rows"),
    (table_variant(leave_hooks=True), r"left \d+ hook\(s\) registered"),
], ids=["raw drop", "1 - x", "-x", "clean<->corrupted", "whole sequence", "corrupted tokens",
        "one late", "whole layer", "per row", "hooks left"])
def test_patching_table_mistakes_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_patching_table(fn)


@pytest.mark.parametrize("fn, words", [
    (lambda model, clean, corrupted: torch.zeros(3, 2), r"Wrong output shape.*\(3, 2\), expected "
                                                        r"\(num_layers, num_heads\) = \(2, 4\)"),
    (lambda model, clean, corrupted: (table_variant()(model, clean, corrupted)
                                      if model.config.num_heads == 4 else torch.zeros(2, 4)),
     r"Wrong output shape \(a random attention-only model with 3 layers of 2 heads.*\(2, 4\), "
     r"expected \(num_layers, num_heads\) = \(3, 2\): read both from model.config"),
    (lambda model, clean, corrupted: [[0.0] * 4] * 2, "should be a torch.Tensor"),
    (lambda model, clean, corrupted: model(clean), "Wrong output shape"),
    (lambda model, clean, corrupted: 1 / 0, "raised ZeroDivisionError"),
    (lambda model, clean, corrupted: interp.patching_table(model, clean, corrupted),
     "calls course_lib's interp.patching_table"),
    (interp.patching_table, "course_lib's own functions"),
])
def test_patching_table_bad_answers_get_a_check_failure(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_patching_table(fn)


def test_patching_table_stub(capsys):
    def my_patching_table(model, clean, corrupted):
        raise NotImplementedError

    check_patching_table(my_patching_table)
    assert "not implemented yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# Issue 39's learner tryout: each finding, fixed
# ----------------------------------------------------------------------------------------------


def _table_with(patch_from=None, crop_clean=True, formula=None):
    """The solution's table, with one tryout mistake: patch only from position ``patch_from`` on,
    read the clean run on the uncropped input, or another ``formula(low, high, patched)``."""

    def table(model, clean, corrupted):
        num_layers, h = model.config.num_layers, model.config.num_heads
        n = clean.size(1) // 2

        def loss(ids, layer=None, hook=None):
            if hook is None:
                logits = model(ids[:, :-1])
            else:
                with interp.hooked(model, layer, hook):
                    logits = model(ids[:, :-1])
            return F.cross_entropy(logits[:, n - 1:].transpose(1, 2), clean[:, n:]).item()

        zs = interp.head_outputs(model, clean[:, :-1] if crop_clean else clean)
        low, high = loss(corrupted), loss(clean)
        out = torch.zeros(num_layers, h)
        for layer in range(num_layers):
            for head in range(h):
                def hook(module, args, layer=layer, head=head):
                    z = args[0].clone().view(*args[0].shape[:2], h, -1)
                    where = slice(None) if patch_from is None else slice(patch_from(n), None)
                    z[:, where, head] = zs[layer][:, where, head]
                    return z.view(args[0].shape)
                x = loss(corrupted, layer, hook)
                out[layer, head] = (formula or (lambda lo, hi, p: (lo - p) / (lo - hi)))(low, high, x)
        return out

    return table


@pytest.mark.parametrize("fn, words", [
    (_table_with(), None),
    (_table_with(patch_from=lambda n: n - 1), r"only positions n-1 \.\. 2n-2 are patched"),
    (_table_with(formula=lambda lo, hi, p: 1 - p / lo), r"1 - patched / corrupted"),
    (_table_with(crop_clean=False), r"two lengths meet: 2n = 24 positions .* and 2n-1 = 23"),
])
def test_patching_table_tryout_mistakes_are_named(fn, words):
    if words is None:
        assert passes(check_patching_table, fn)
        return
    with pytest.raises(CheckFailure, match=words):
        check_patching_table(fn)


def test_patching_table_uncropped_logits_are_named():
    def uncropped(model, clean, corrupted):
        n = clean.size(1) // 2
        logits = model(corrupted)  # (B, 2n, V): one too many
        return F.cross_entropy(logits[:, n - 1:].transpose(1, 2), clean[:, n:])

    with pytest.raises(CheckFailure, match=r"n \+ 1 = 13 predictions met n = 12 targets"):
        check_patching_table(uncropped)


# ----------------------------------------------------------------------------------------------
# 12.ov_circuit (★★★)
# ----------------------------------------------------------------------------------------------


def ov_variant(center=True, gain=True, final_gain=True, transpose=False, kv_rule=True, einsum=False):
    """A learner's full OV circuit, right by default; each option is one way to get it wrong."""

    def make(model, layer, head):
        block = model.blocks.layers[layer]
        attn = block.self_attn
        hd = attn.head_dim
        kv = head // (attn.num_heads // attn.num_kv_heads) if kv_rule else head
        w_e = model.embed.token.embedding.weight.detach().double()
        x = w_e - w_e.mean(-1, keepdim=True) if center else w_e
        if gain:
            x = x * block.norm1.weight.detach().double()
        w_v = attn.v_proj.weight.detach().double()[kv * hd:(kv + 1) * hd]  # (hd, d)
        w_o = attn.out_proj.weight.detach().double()[:, head * hd:(head + 1) * hd]  # (d, hd)
        w_u = model.lm_head.weight.detach().double()
        if final_gain:
            w_u = w_u * model.blocks.norm.weight.detach().double()
        if einsum:
            out = torch.einsum("ad,kd,ek,ve->av", x, w_v, w_o, w_u)
        else:
            out = x @ w_v.T @ w_o.T @ w_u.T
        return out.T if transpose else out

    return make


def ov_loops(model, layer, head):
    """One token at a time, float32."""
    rows = [ov_variant()(model, layer, head)[a] for a in range(model.config.vocab_size)]
    return torch.stack(rows).float()


@pytest.mark.parametrize("fn", [ov_variant(), ov_variant(einsum=True), ov_loops,
                                lambda m, l, h: ov_variant()(m, l, h).float()])
def test_ov_circuit_styles_pass(fn):
    assert passes(check_ov_circuit, fn)


def test_ov_circuit_solution_passes(capsys):
    assert passes(check_ov_circuit, _solution("12.ov_circuit")["my_full_ov_circuit"])
    assert "check_ov_circuit: all 7 heads" in capsys.readouterr().out


@pytest.mark.parametrize("fn, words", [
    (ov_variant(center=False), "not centred"),
    (ov_variant(gain=False), "layer's LayerNorm gain"),
    (ov_variant(final_gain=False), "final LayerNorm's gain"),
    (ov_variant(gain=False, final_gain=False), "both LayerNorm gains are missing"),
    (ov_variant(transpose=True), "rows and columns are swapped"),
    (ov_variant(kv_rule=False), "grouped-query attention"),
    (lambda m, l, h: -ov_variant()(m, l, h), "sign is reversed"),
    (lambda m, l, h: ov_variant()(m, l, h) * 1.01, "differs from course_lib's reference"),
])
def test_ov_circuit_mistakes_are_named(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_ov_circuit(fn)


@pytest.mark.parametrize("fn, words", [
    (lambda m, l, h: torch.zeros(3, 3), "Wrong output shape"),
    (lambda m, l, h: 1 / 0, "raised ZeroDivisionError"),
    (lambda m, l, h: interp.full_ov_circuit(m, l, h), "calls course_lib's interp.full_ov_circuit"),
    (interp.full_ov_circuit, "course_lib's own functions"),
])
def test_ov_circuit_bad_answers_get_a_check_failure(fn, words):
    with pytest.raises(CheckFailure, match=words):
        check_ov_circuit(fn)


def test_ov_circuit_stub(capsys):
    def my_full_ov_circuit(model, layer, head):
        raise NotImplementedError

    check_ov_circuit(my_full_ov_circuit)
    assert "not implemented yet" in capsys.readouterr().out
