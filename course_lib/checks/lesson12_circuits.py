"""Checkers for lesson 12's ★★★ exercises on circuits: activation patching and the OV circuit.

* ``check_patching_table(fn)``: ``fn(model, clean, corrupted) -> (num_layers, h)``, activation
  patching. Reference: ``interp.patching_table`` on the trained checkpoint and a random model; a
  crash from runs of 2n and 2n - 1 positions is named.
* ``check_ov_circuit(fn)``: ``fn(model, layer, head) -> (V, V)``, the full OV circuit with
  LayerNorm's centring and gains folded in. Reference: ``interp.full_ov_circuit`` on random models
  of 4, 2 and 8 heads (one with grouped-query attention) and on the trained checkpoint.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .. import interp
from ..gpt import GPT
from ..induction import induction_config, load_checkpoint, repeated_tokens
from .common import CheckFailure, calls_to, checker
from .lesson12_hooks import hooks_on, random_model, remove_hooks
from .lesson12_inside import as_float_tensor, call_learner, close64, no_raw_errors, refuse_reference

__all__ = ["check_patching_table", "check_ov_circuit"]


# ----------------------------------------------------------------------------------------------
# check_patching_table (build, ★★★)
# ----------------------------------------------------------------------------------------------


def _patching_inputs(vocab_size: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``clean = [r, r]`` and ``corrupted = [r', r]``, each ``(8, 2n)``."""
    gen = torch.Generator().manual_seed(seed)
    clean = repeated_tokens(8, n, vocab_size, gen)
    other = torch.randint(0, vocab_size, (8, n), generator=gen)
    return clean, torch.cat([other, clean[:, n:]], dim=1)


def _patching_models() -> list[tuple[str, GPT, int]]:
    """``(description, model, n)``: the lesson's trained model and a random 3-layer, 2-head one."""
    try:
        trained, _ = load_checkpoint()
    except FileNotFoundError as err:
        raise CheckFailure(f"The trained model is missing: {err}.") from err
    random = random_model(seed=5, num_layers=3, num_heads=2, d_model=64)
    return [("the lesson's trained model", trained, 12),
            ("a random attention-only model with 3 layers of 2 heads", random, 10)]


def _table_mistakes(model: GPT, clean: torch.Tensor, corrupted: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """``(message, (num_layers, h) table)`` of the usual mistakes, in float64."""
    c = model.config
    L, h, n = c.num_layers, c.num_heads, clean.size(1) // 2

    def logits(ids: torch.Tensor, layer: int | None = None, hook: Any = None) -> torch.Tensor:
        if layer is None:
            return model(ids[:, :-1]).double()
        with interp.hooked(model, layer, hook):
            return model(ids[:, :-1]).double()  # (B, 2n-1, V)

    def second(lg: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(lg[:, n - 1:].transpose(1, 2), targets[:, n:])

    def whole(lg: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(lg.transpose(1, 2), targets[:, 1:])

    def rows(lg: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # (B,) per-row second half
        return F.cross_entropy(lg[:, n - 1:].transpose(1, 2), targets[:, n:], reduction="none").mean(1)

    z_clean = interp.head_outputs(model, clean[:, :-1])
    z_corr = interp.head_outputs(model, corrupted[:, :-1])
    lg_clean, lg_corr = logits(clean), logits(corrupted)
    patched = [[logits(corrupted, l, interp.patching_hook(k, h, z_clean[l])) for k in range(h)]
               for l in range(L)]
    swapped = [[logits(clean, l, interp.patching_hook(k, h, z_corr[l])) for k in range(h)]
               for l in range(L)]

    def all_heads(z: torch.Tensor) -> Callable[..., Any]:
        return lambda module, args: (z.reshape(args[0].shape),)

    layers = [logits(corrupted, l, all_heads(z_clean[l])) for l in range(L)]

    def table(loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], runs: list, formula,
              clean_targets_for_corrupted: bool = True) -> torch.Tensor:
        low_t = clean if clean_targets_for_corrupted else corrupted
        low, high = loss(lg_corr, low_t), loss(lg_clean, clean)
        return torch.stack([torch.stack([formula(low, high, loss(runs[l][k], low_t))
                                         for k in range(h)]) for l in range(L)])

    fraction = lambda low, high, x: (low - x) / (low - high)  # noqa: E731
    ref = table(second, patched, fraction)

    def late_positions(l: int, k: int) -> Callable[..., Any]:  # only positions n-1 .. 2n-2 patched
        def hook(module: Any, args: tuple) -> tuple:
            z = args[0].clone().view(*args[0].shape[:2], h, -1)
            z[:, n - 1:, k] = z_clean[l][:, n - 1:, k]
            return (z.view(args[0].shape),)
        return hook

    late = [[logits(corrupted, l, late_positions(l, k)) for k in range(h)] for l in range(L)]
    return [
        ("only positions n-1 .. 2n-2 are patched (the ones whose predictions are scored): patch the "
         "head's output at every position; a later layer reads the earlier positions too",
         table(second, late, fraction)),
        ("the table holds 1 - patched / corrupted (the share of the corrupted loss removed); the share "
         "of the GAP closed is (corrupted loss - patched loss) / (corrupted loss - clean loss)",
         table(second, patched, lambda low, high, x: 1 - x / low)),
        ("not normalised: that is the raw drop in loss (nats); divide it by the whole gap, "
         "corrupted loss - clean loss, so that 1 means the head recovers all of it",
         table(second, patched, lambda low, high, x: low - x)),
        ("the sign is reversed (you computed 1 - fraction: the part of the gap that stays); the "
         "fraction closed is (corrupted loss - patched loss) / (corrupted loss - clean loss)", 1 - ref),
        ("the sign is reversed: the fraction closed is (corrupted loss - patched loss) / (corrupted "
         "loss - clean loss), positive when the patch helps", -ref),
        ("the direction is swapped: you patched the corrupted run's head output into the clean run; "
         "patch the clean run's output into the corrupted run",
         table(second, swapped, lambda low, high, x: (low - x) / (low - high))),
        ("the direction is swapped: you patched the corrupted run's head output into the clean run; "
         "patch the clean run's output into the corrupted run",
         table(second, swapped, lambda low, high, x: (x - high) / (low - high))),
        ("scored over the whole sequence: only the second half's tokens can be predicted (by "
         "copying); score the predictions of tokens n .. 2n-1, logits[:, n-1:] against clean[:, n:]",
         table(whole, patched, fraction)),
        ("scored over the whole sequence against the corrupted run's own tokens: score only the "
         "second half, against the clean run's next tokens, logits[:, n-1:] against clean[:, n:]",
         table(whole, patched, fraction, clean_targets_for_corrupted=False)),
        ("scored one position late: logits[:, n:] predict tokens n+1 .. 2n-1; the second half's "
         "first token is predicted at position n-1, so take logits[:, n-1:] against clean[:, n:]",
         table(lambda lg, t: F.cross_entropy(lg[:, n:].transpose(1, 2), t[:, n + 1:]), patched,
               fraction)),
        ("each position scored against its own token, not the next: position t predicts token t+1",
         table(lambda lg, t: F.cross_entropy(lg[:, n:].transpose(1, 2), t[:, n:-1]), patched,
               fraction)),
        ("patched the whole layer: every head of the layer gets the same number; patch one head's "
         "slice of out_proj's input at a time",
         torch.stack([fraction(second(lg_corr, clean), second(lg_clean, clean),
                               second(layers[l], clean)).repeat(h) for l in range(L)])),
        ("the fraction is averaged over rows: compute the mean losses over the whole batch first, "
         "then one fraction from them",
         torch.stack([torch.stack([fraction(rows(lg_corr, clean), rows(lg_clean, clean),
                                            rows(patched[l][k], clean)).mean()
                                   for k in range(h)]) for l in range(L)])),
    ]


def _cropping(failure: CheckFailure, n: int, case: str) -> CheckFailure:
    """A crash whose message names both 2n and 2n - 1 positions (or n + 1 and n predictions): the
    runs were not all cropped to ``inputs[:, :-1]``; anything else stays as it was."""
    numbers = set(re.findall(r"\d+", str(failure).split("):", 1)[-1]))
    if {str(2 * n), str(2 * n - 1)} <= numbers:
        what = ("two lengths meet: 2n = {a} positions (a run on the whole input) and 2n-1 = {b} "
                "(a run on inputs[:, :-1])").format(a=2 * n, b=2 * n - 1)
    elif {str(n + 1), str(n)} <= numbers:
        what = (f"n + 1 = {n + 1} predictions met n = {n} targets: logits[:, n-1:] of a run on the "
                "whole input (2n positions) reach one past the last target")
    else:
        return failure
    return CheckFailure(f"Your code raised an error where {what} ({case}). Run the model on "
                        "inputs[:, :-1] every time (the clean run that keeps the head outputs, the "
                        "corrupted and the patched runs): position t predicts token t + 1, so the "
                        "last token is never an input. What PyTorch said: "
                        f"{str(failure).split(': ', 1)[-1]}")


@checker
def check_patching_table(fn: Callable[..., Any]) -> None:
    """Check ``fn(model, clean, corrupted) -> (num_layers, h)`` against ``interp.patching_table`` on
    the trained checkpoint and on a random model; no hook may stay on the model afterwards."""
    no_raw_errors(_check_patching_table)(fn)


def _check_patching_table(fn: Callable[..., Any]) -> None:
    refuse_reference(fn, "the patching table")
    models = _patching_models()
    for k, (description, model, n) in enumerate(models):
        clean, corrupted = _patching_inputs(model.config.vocab_size, n, seed=30 + k)
        L, h = model.config.num_layers, model.config.num_heads
        case = f"{description}, clean = [r, r] and corrupted = [r', r] of shape {tuple(clean.shape)}"
        try:
            # interp.patching_table is wrapped by torch.no_grad, whose code every such wrapper
            # shares: watch the function inside
            with calls_to([inspect.unwrap(interp.patching_table)]) as seen, torch.enable_grad():
                try:
                    raw = call_learner(fn, model, clean.clone(), corrupted.clone(), case=case,
                                hint="Run the clean model once to keep each layer's head outputs, "
                                "then one corrupted run per head with a patching hook.")
                except CheckFailure as failure:
                    raise _cropping(failure, n, case) from failure
            if seen:
                raise CheckFailure("Your function calls course_lib's interp.patching_table, the "
                                   "table this exercise asks you to build.")
            left = hooks_on(model)
            if left:
                raise CheckFailure(
                    f"Your function left {left} hook(s) registered on the model ({case}): every later "
                    "run of the model would still be patched. Remove each hook when its run is done "
                    "(handle.remove() in a finally:, or interp.hooked(...) as a with block).")
        finally:
            remove_hooks(model)
        if isinstance(raw, torch.Tensor) and raw.dim() == 2 and tuple(raw.shape) != (L, h):
            raise CheckFailure(f"Wrong output shape ({case}): {tuple(raw.shape)}, expected (num_layers, "
                               f"num_heads) = {(L, h)}: read both from model.config.")
        got = as_float_tensor(raw, (L, h), f"the table ({case})", "One number per head: (num_layers, h).")
        expected = interp.patching_table(model, clean, corrupted)
        if close64(got, expected, 1e-4):
            continue
        for message, wrong in _table_mistakes(model, clean, corrupted):
            if close64(got, wrong, 1e-4):
                raise CheckFailure(f"Likely mistake ({case}): {message}.", mistake=message)
        raise CheckFailure(
            f"Your table differs from course_lib's reference ({case}): largest difference "
            f"{(got.double() - expected.double()).abs().max().item():.3g}. None of the usual mistakes "
            "explains it; print the clean, corrupted and one patched loss, and compare with "
            "interp.loss_per_position.")
    print(f"check_patching_table: both models ({len(models)} cases) match course_lib's reference. "
          "Well done!")


# ----------------------------------------------------------------------------------------------
# check_ov_circuit (build, ★★★)
# ----------------------------------------------------------------------------------------------


def _ov_models() -> list[tuple[str, GPT, list[tuple[int, int]]]]:
    """``(description, model, [(layer, head), ...])``: random models of other sizes, then the
    lesson's trained one."""
    four = random_model(seed=41, num_heads=4, d_model=48)
    two = random_model(seed=42, num_heads=2, d_model=48)
    torch.manual_seed(43)
    eight = GPT(induction_config(num_layers=2, num_heads=8, d_model=64, num_kv_heads=4,
                                 vocab_size=40)).eval()
    with torch.no_grad():
        for p in eight.parameters():
            p.add_(0.05 * torch.randn_like(p))
    try:
        trained, _ = load_checkpoint()
    except FileNotFoundError as err:
        raise CheckFailure(f"The trained model is missing: {err}.") from err
    return [("a random model with 4 heads of 12", four, [(0, 1), (1, 3)]),
            ("a random model with 2 heads of 24", two, [(1, 0), (0, 1)]),
            ("a random model with 8 query heads sharing 4 key/value heads (GQA), vocabulary 40",
             eight, [(1, 5), (0, 2)]),
            ("the lesson's trained model", trained, [(1, 2)])]


def _ov_mistakes(model: GPT, layer: int, head: int) -> list[tuple[str, torch.Tensor]]:
    """``(message, (V, V))`` of the usual mistakes, in float64."""
    block = model.blocks.layers[layer]
    attn = block.self_attn
    hd, group = attn.head_dim, attn.num_heads // attn.num_kv_heads
    kv = head // group
    w_e = model.embed.token.embedding.weight.double()  # (V, d)
    centred = w_e - w_e.mean(dim=-1, keepdim=True)
    g, g_f = block.norm1.weight.double(), model.blocks.norm.weight.double()
    v_w = attn.v_proj.weight.double()
    o_w = attn.out_proj.weight.double()
    w_v = v_w[kv * hd:(kv + 1) * hd].T  # (d, hd)
    w_v_query_index = v_w[head * hd:(head + 1) * hd].T if (head + 1) * hd <= v_w.size(0) else None
    w_o = o_w[:, head * hd:(head + 1) * hd].T  # (hd, d)
    w_u = model.lm_head.weight.double().T  # (d, V)
    circuit = (centred * g) @ w_v @ w_o @ (w_u * g_f[:, None])
    found = [
        ("the embeddings are not centred: LayerNorm subtracts each vector's mean before anything "
         "reads it", (w_e * g) @ w_v @ w_o @ (w_u * g_f[:, None])),
        ("the layer's LayerNorm gain (norm1.weight) is missing: it scales what W_V reads",
         centred @ w_v @ w_o @ (w_u * g_f[:, None])),
        ("the final LayerNorm's gain (model.blocks.norm.weight) is missing: it scales what W_U reads",
         (centred * g) @ w_v @ w_o @ w_u),
        ("both LayerNorm gains are missing", centred @ w_v @ w_o @ w_u),
        ("rows and columns are swapped: row a must be what the head adds to every logit when it "
         "attends to token a (the source token indexes the rows)", circuit.T),
        ("interleaved slicing: a head's numbers are a contiguous block, head * head_dim .. "
         "(head + 1) * head_dim - 1, of v_proj's rows and of out_proj's columns",
         (centred * g) @ v_w[kv::attn.num_kv_heads].T @ o_w[:, head::attn.num_heads].T
         @ (w_u * g_f[:, None])),
    ]
    if group > 1 and w_v_query_index is not None:
        found.append(("with grouped-query attention, query head `head` reads key/value head "
                      "head // (num_heads // num_kv_heads): v_proj has only num_kv_heads heads",
                      (centred * g) @ w_v_query_index @ w_o @ (w_u * g_f[:, None])))
    return found


@checker
def check_ov_circuit(fn: Callable[..., Any]) -> None:
    """Check ``fn(model, layer, head) -> (V, V)`` against ``interp.full_ov_circuit`` on random models
    of 4, 2 and 8 heads (GQA) and on the trained checkpoint."""
    no_raw_errors(_check_ov_circuit)(fn)


def _check_ov_circuit(fn: Callable[..., Any]) -> None:
    refuse_reference(fn, "the full OV circuit")
    count = 0
    for description, model, heads in _ov_models():
        V = model.config.vocab_size
        for layer, head in heads:
            case = f"{description}, head {layer}.{head}"
            attn = model.blocks.layers[layer].self_attn
            with calls_to([inspect.unwrap(interp.full_ov_circuit)]) as seen, torch.enable_grad():
                try:
                    raw = call_learner(fn, model, layer, head, case=case,
                                hint="Return the (V, V) product for head `head` of layer `layer`.")
                except CheckFailure as failure:
                    if attn.num_kv_heads == attn.num_heads or "ran for more than" in str(failure):
                        raise
                    raise CheckFailure(
                        f"Your code stopped on grouped-query attention ({case}): v_proj has only "
                        f"num_kv_heads * head_dim = {attn.num_kv_heads * attn.head_dim} rows here, and "
                        "query head h reads key/value head h // (num_heads // num_kv_heads). What the "
                        f"checker saw: {failure}") from failure
            if seen:
                raise CheckFailure("Your function calls course_lib's interp.full_ov_circuit, the "
                                   "circuit this exercise asks you to build.")
            got = as_float_tensor(raw, (V, V), f"the circuit ({case})",
                             "One row and one column per token: (vocab_size, vocab_size).")
            expected = interp.full_ov_circuit(model, layer, head).double()
            scale = expected.abs().max().item()
            if close64(got / scale, expected / scale, 1e-5):
                count += 1
                continue
            for message, wrong in _ov_mistakes(model, layer, head):
                if close64(got / scale, wrong.detach() / scale, 1e-5):
                    raise CheckFailure(f"Likely mistake ({case}): {message}.", mistake=message)
            if close64(got / scale, -expected / scale, 1e-5):
                raise CheckFailure(f"The sign is reversed ({case}): row a must be what the head ADDS.")
            raise CheckFailure(
                f"Your circuit differs from course_lib's reference ({case}): largest difference "
                f"{(got.double() - expected).abs().max().item():.3g} (the entries reach {scale:.3g}). "
                "None of the usual mistakes explains it; compare the shapes of each factor with the "
                "definition, one step at a time.")
    print(f"check_ov_circuit: all {count} heads (4, 2 and 8 heads, GQA, the trained model) match "
          "course_lib's reference. Well done!")
