"""Checkers for lesson 15's other exercises: LoRA's count, wrapping a model, the merge Debug, adapters' bytes.

* ``check_lora_params(fn)`` (Predict): ``fn() -> int``, the trainable parameters of LoRA at r = 8 on the
  lesson's base (lesson 09's GPT with the course recipe: 1 block, d_model 128, d_ff 512) with the
  default targets q, k, v, out_proj, linear1, linear2. Each usual miscount is named.
* ``check_add_lora(fn)`` (Build): ``fn(model, r, alpha, lora_class) -> model``: every ``nn.Linear``
  named one of the targets replaced by ``lora_class(linear, r, alpha)``, everything else frozen, only
  the adapters' A and B trainable; tried on GPTs of 2 and 3 blocks (tied and untied head, with and
  without attention biases) and a Llama-style one (SwiGLU: ``gate`` and ``up`` are not targets).
* ``check_merge_fix(fn)`` (Debug): ``fn(W (d_out, d_in), A (r, d_in), B (d_out, r), scaling) -> the
  merged weight (d_out, d_in)``; its first message says what a layer merged with it computes, on
  which layers (square and not) it differs and what its merged weight is beside W and the update
  (unchanged, the update alone, k times it, its sign flipped, rows and columns swapped), never the fix;
  the W, A and B passed in must hold the same numbers after the call, and the result keep W's dtype.
* ``check_adapter_bytes(fn)`` (Predict): ``fn() -> (bytes of 10 fine-tuned copies, bytes of one base and
  10 adapters at r = 4)``, float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .common import CheckFailure, calls_to, checker, is_course_lib, plain, run_learner, time_limit
from .lesson11_modern import no_raw_errors
from .lesson15_lora import LIMIT_SECONDS, close_scaled, is_peft

__all__ = ["check_lora_params", "check_add_lora", "check_merge_fix", "check_adapter_bytes",
           "LESSON_BASE", "lora_params_answer", "adapter_bytes_answer"]

TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "linear1", "linear2")
# The lesson's base: lesson 09's GPT with the course recipe (COURSE: 1 block) on the plays' 83 characters
LESSON_BASE = dict(vocab_size=83, d_model=128, d_ff=512, num_layers=1, max_len=64)


def _base_count() -> int:
    from ..gpt import GPT, GPTConfig

    b = LESSON_BASE
    model = GPT(GPTConfig(vocab_size=b["vocab_size"], max_len=b["max_len"], d_model=b["d_model"],
                          num_heads=4, num_layers=b["num_layers"]))
    return sum(p.numel() for p in model.parameters())  # the tied head once


def _norm_count() -> int:
    """Parameters of the lesson's base's LayerNorms (two a block and the final one)."""
    from ..gpt import GPT, GPTConfig

    b = LESSON_BASE
    model = GPT(GPTConfig(vocab_size=b["vocab_size"], max_len=b["max_len"], d_model=b["d_model"],
                          num_heads=4, num_layers=b["num_layers"]))
    return sum(p.numel() for m in model.modules() if isinstance(m, nn.LayerNorm)
               for p in m.parameters())


def _target_shapes() -> list[tuple[str, int, int]]:
    """(name, d_in, d_out) of every target of one block."""
    d, f = LESSON_BASE["d_model"], LESSON_BASE["d_ff"]
    return [("q_proj", d, d), ("k_proj", d, d), ("v_proj", d, d), ("out_proj", d, d),
            ("linear1", d, f), ("linear2", f, d)]


def lora_params_answer(r: int = 8) -> int:
    """LoRA's trainable parameters on the lesson's base: r (d_in + d_out) per target."""
    return LESSON_BASE["num_layers"] * sum(r * (i + o) for _, i, o in _target_shapes())


def _as_int(raw: Any, what: str) -> int:
    value = plain(raw, what)
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CheckFailure(f"Return one number (an int), got {type(raw).__name__}: {raw!r}.")
    if value != int(value):
        raise CheckFailure(f"Return a whole number: {value!r} is not one; a count has no fraction.")
    return int(value)


def _predicted(fn: Callable[[], Any], refused: list[Callable[..., Any]]) -> Any:
    if is_course_lib(fn):
        raise CheckFailure("You handed in one of course_lib's own functions: return the number you "
                           "predict (you may write the product out).")
    with calls_to(refused) as seen, time_limit(LIMIT_SECONDS, "Your function ran for more than "
                                               f"{LIMIT_SECONDS} s: return a number."):
        raw = run_learner(fn, hint="Return your prediction.")
    if seen:
        raise CheckFailure("Your function measures the answer with course_lib "
                           f"({seen[0].__qualname__}); predict it: multiply the sizes yourself.")
    return raw


def _lora_refused() -> list[Callable[..., Any]]:
    from .. import lora

    return [lora.add_lora, lora.trainable_parameters, lora.lora_parameters, lora.LoRALinear.__init__]


@checker
def check_lora_params(fn: Callable[[], Any]) -> None:
    """Check ``fn() -> int``: LoRA's trainable parameters at r = 8 on the lesson's base."""
    got = _as_int(_predicted(fn, _lora_refused()), "your count")
    r, right = 8, lora_params_answer(8)
    shapes, norms = _target_shapes(), _norm_count()
    if got == right:
        print(f"check_lora_params: right, {right:,} = r · (d_in + d_out) summed over the six targets "
              f"of the one block (q, k, v, out_proj: 8 · 256 each; linear1, linear2: 8 · 640 each).")
        return
    mistakes = [
        (right - r * 256, "one of q_proj, k_proj, v_proj, out_proj is missing (each is 128 -> 128: "
         "r · 256 = 2,048), or q, k and v counted with ONE shared A as in GPT-2's fused c_attn; here "
         "each of the six targets is its own nn.Linear with its own A and B"),
        (right - r * 640, "linear1 or linear2 is missing: the feed-forward's two projections are "
         "targets too (128 -> 512 and 512 -> 128: r · 640 each)"),
        (right - 2 * r * 640, "linear1 and linear2 are both missing: the default targets include the "
         "feed-forward's projections"),
        (right - 4 * r * 256, "only the feed-forward is counted: q, k, v and out_proj are targets too"),
        (sum(r * i for _, i, _ in shapes), "only A (r · d_in) or only B (d_out · r) is counted per "
         "target; a LoRA layer trains both: r · (d_in + d_out)"),
        (sum(i * o for _, i, o in shapes), "that is the size of the frozen matrices W themselves "
         "(d_in · d_out each); LoRA trains A (r, d_in) and B (d_out, r) instead"),
        (right + sum(o for _, _, o in shapes), "the biases are counted: the base layer's weight and "
         "bias stay frozen; only A and B train"),
        (right + _base_count(), "the base's parameters are counted too: they are frozen; only the "
         "adapters' A and B train"),
        (_base_count(), "that is the whole base model: with LoRA its parameters are all frozen"),
        (len(shapes) * r * r, "r · r per target: A is (r, d_in) and B is (d_out, r)"),
        (len(shapes) * 2 * r * LESSON_BASE["d_model"], "every target counted as 128 -> 128: linear1 "
         "is 128 -> 512 and linear2 512 -> 128"),
        (right // r, "r is missing: each target trains r · (d_in + d_out) numbers, not d_in + d_out"),
        (right + norms, f"the norms are counted too (the 3 LayerNorms' weights and biases, "
         f"{norms:,} numbers): with LoRA they are frozen; only the adapters' A and B train"),
        (right + norms // 2, f"the norms' weights are counted too ({norms // 2:,} "
         "numbers): with LoRA the norms are frozen; only the adapters' A and B train"),
        (2 * right, "that is twice the count: 2 blocks (the lesson's base, the course recipe, has 1), or "
         "bytes at 2 a number (the question asks for parameters, not bytes), or r = 16, which is the "
         "lesson's alpha (the rank is r = 8; alpha only scales the update)"),
        (right + 2 * r * (LESSON_BASE["d_ff"] - LESSON_BASE["d_model"]), "linear1 and linear2 counted "
         "as d_ff -> d_ff (r · 1,024 each): linear1 is 128 -> 512 and linear2 512 -> 128 (r · 640 each)"),
        (right + len(shapes) * r + sum(o for _, _, o in shapes), "A and B are counted with biases "
         "(r for A, d_out for B, a target): a LoRA adapter's A and B are plain matrices, no bias"),
        (4 * right, "that is 4 times the count: 4 blocks (GPTConfig's default; the lesson's base, the "
         "course recipe, has 1), or float32 bytes at 4 a number (the question asks for parameters, not "
         "bytes)"),
        *[(k * right, f"that counts {k} blocks; the lesson's base, the course recipe, has 1")
          for k in (3, 6, 8, 12)],
        (lora_params_answer(4), "that is the count at r = 4 (the lesson's other runs); the question "
         "asks for r = 8"),
    ]
    for value, reason in mistakes:
        if got == value:
            raise CheckFailure(f"Not quite: {reason}.", mistake=reason.split(":")[0])
    if got < 0:
        raise CheckFailure("Not quite: a count of parameters is never negative.")
    direction = "too small: a target or a factor is missing" if got < right else (
        "too large: something frozen is counted, or a factor is too big")
    raise CheckFailure(f"Not quite: {direction}. LoRA trains, for each target nn.Linear (d_in -> "
                       "d_out), A (r, d_in) and B (d_out, r); list the six targets of the one block "
                       "with their d_in and d_out (d_model 128, d_ff 512).")


_UNITS = (("MiB (2^20 bytes)", 2 ** 20), ("MB (10^6 bytes)", 10 ** 6), ("KiB (1,024 bytes)", 1024),
          ("kB (1,000 bytes)", 1000), ("GiB (2^30 bytes)", 2 ** 30), ("GB (10^9 bytes)", 10 ** 9))


def _name_unit(raw: Any, right: tuple[int, int]) -> None:
    """CheckFailure naming the unit if either number is the right one in MiB, MB, KiB, kB, GiB or GB
    (within 3%, as a rounded answer is)."""
    for value, exact, what in zip(raw, right, ("the copies", "the base with adapters")):
        value = value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        error, unit = min((abs(value - exact / size) / (exact / size), unit) for unit, size in _UNITS)
        if value != exact and error <= 0.03:
            raise CheckFailure(f"Not quite: {what}: {value:g} is the size in {unit}; the question "
                               "asks for bytes, a whole number (float32: 4 bytes a number).",
                               mistake=f"answer in {unit.split()[0]}")


def adapter_bytes_answer() -> tuple[int, int]:
    """(10 full copies, one base + 10 adapters at r = 4), float32 bytes."""
    base, adapter, tasks = _base_count(), lora_params_answer(4), 10
    return tasks * base * 4, (base + tasks * adapter) * 4


@checker
def check_adapter_bytes(fn: Callable[[], Any]) -> None:
    """Check ``fn() -> (copies, adapters)``: float32 bytes of 10 fine-tuned copies of the base, and of
    one base with 10 LoRA adapters (r = 4, the six targets)."""
    raw = plain(_predicted(fn, _lora_refused()), "your answer")
    if not isinstance(raw, (tuple, list)) or len(raw) != 2:
        raise CheckFailure("Return two numbers, (bytes of the 10 copies, bytes of the base with 10 "
                           f"adapters), got {type(raw).__name__}: {raw!r}.")
    right = adapter_bytes_answer()
    _name_unit(raw, right)
    got = (_as_int(raw[0], "the copies' bytes"), _as_int(raw[1], "the adapters' bytes"))
    base, adapter, tasks = _base_count(), lora_params_answer(4), 10
    shapes, r4 = _target_shapes(), 4
    head = LESSON_BASE["vocab_size"] * LESSON_BASE["d_model"]  # a head apart from the (tied) token table
    if got == right:
        print(f"check_adapter_bytes: right, {right[0]:,} bytes for 10 copies against {right[1]:,} for "
              f"one base and 10 adapters ({right[0] / right[1]:.1f}x less).")
        return
    copies = {
        tasks * base: "the copies are counted in parameters, not bytes: float32 is 4 bytes a number",
        (tasks + 1) * base * 4: "the base is counted beside the 10 copies: each fine-tuned copy is a "
                                "whole model, and the 10 replace the base",
        base * 4: "that is one copy: 10 tasks need 10 fine-tuned copies",
        tasks * base * 2: "2 bytes a number is bfloat16; these weights are float32 (4 bytes)",
        tasks * base * 32: "that counts bits: float32 is 4 bytes a number",
        tasks * base * 4 * 3: "AdamW's two state tensors are counted too: the question asks for the "
                              "weights kept to serve the tasks",
        tasks * (base + head) * 4: f"the output head is counted apart from the token table ({head:,} "
                                   "numbers): the head is tied, it is the token table, stored once",
    }
    adapters = {
        (base + head + tasks * adapter) * 4: f"the output head is counted apart from the token table "
                                             f"({head:,} numbers): the head is tied, it is the token "
                                             "table, stored once",
        (base + tasks * adapter): "the base and adapters are counted in parameters, not bytes: float32 "
                                  "is 4 bytes a number",
        tasks * adapter * 4: "only the adapters: the base weights are needed too, once",
        tasks * (base + adapter) * 4: "the base is counted once per adapter: the 10 adapters share ONE "
                                      "copy of the base weights",
        (base + adapter) * 4: "that is one adapter: there are 10",
        (base + tasks * lora_params_answer(8)) * 4: "that is r = 8's adapter (the first exercise's); "
                                                    "here r = 4",
        (base + tasks * adapter) * 2: "2 bytes a number is bfloat16; these are float32 (4 bytes)",
        (base + tasks * r4 * sum(i for _, i, _ in shapes)) * 4:
            "each adapter is counted as A alone (r · d_in a target) or B alone (d_out · r): an adapter "
            "stores both, r · (d_in + d_out) a target",
        (base + tasks * sum(i * o for _, i, o in shapes)) * 4:
            "each adapter is counted as a full update ΔW (d_out · d_in a target): an adapter stores "
            "A (r, d_in) and B (d_out, r), r · (d_in + d_out) a target",
        (base + tasks * (adapter + sum(o for _, _, o in shapes))) * 4:
            "each adapter is counted with the targets' biases: the biases are the base's, frozen and "
            "stored once with it; an adapter is its A and B",
    }
    parts = []
    if got[0] != right[0]:
        parts.append(f"the copies: {copies.get(got[0], 'count the whole model once per task, in bytes')}")
    if got[1] != right[1]:
        parts.append(f"the base with adapters: "
                     f"{adapters.get(got[1], 'the base once, plus each adapter its A and B, in bytes')}")
    if got == right[::-1]:
        parts = ["the two numbers are in the other order: (copies, base with adapters)"]
    named = [p for p in parts if ("count the whole" not in p and "plus each adapter" not in p)]
    raise CheckFailure("Not quite: " + "; ".join(parts) + ".",
                       mistake=named[0] if named else None)


# ----------------------------------------------------------------------------------------------
# check_add_lora (build)
# ----------------------------------------------------------------------------------------------


def _configs() -> list[tuple[str, Any]]:
    from ..gpt import GPTConfig

    return [
        ("a GPT of 2 blocks, d_model 24, head tied to the token table",
         GPTConfig(vocab_size=29, max_len=16, d_model=24, num_heads=3, num_layers=2, d_ff=40)),
        ("a GPT of 3 blocks, d_model 16, no attention biases, head untied",
         GPTConfig(vocab_size=31, max_len=12, d_model=16, num_heads=2, num_layers=3, d_ff=48,
                   bias=False, tie_embeddings=False)),
        ("a Llama-style GPT of 2 blocks (SwiGLU: gate, up, linear2; RMSNorm; untied head)",
         GPTConfig.llama_style(vocab_size=37, max_len=16, d_model=32, num_heads=4, num_kv_heads=2,
                               num_layers=2)),
    ]


def _recording_class(wrapped: dict[int, str], names: dict[int, str], made: list[Any]) -> type:
    """A LoRA class the checker hands to the learner's function: it records what it wraps."""
    from ..lora import LoRALinear

    class CheckerLoRA(LoRALinear):
        def __init__(self, base: nn.Module, r: int, alpha: float) -> None:
            where = names.get(id(base), type(base).__name__)
            if id(base) in wrapped or isinstance(base, LoRALinear):
                raise CheckFailure(
                    f"Likely mistake: wrapping twice. {where} is wrapped a second time (a LoRA layer "
                    "around a LoRA layer, or around one's base_layer). Match the targets by the last "
                    "part of a module's name (or walk a list made before wrapping), and wrap each "
                    "nn.Linear once.", mistake="wrapping twice")
            if not isinstance(base, nn.Linear):
                raise CheckFailure(f"Your function wraps {where}, a {type(base).__name__}: only the "
                                   "nn.Linear projections named q_proj, k_proj, v_proj, out_proj, "
                                   "linear1, linear2 are targets.")
            super().__init__(base, r, alpha)
            wrapped[id(base)] = where
            made.append(self)

    CheckerLoRA.__name__ = CheckerLoRA.__qualname__ = "LoRALinear"
    return CheckerLoRA


def _frozen_name(name: str) -> str:
    if "embed" in name:
        return "the embeddings (the token table, which the head shares when tied, or the positions)"
    if name.startswith("lm_head"):
        return "the output head lm_head"
    if "norm" in name:
        return "the norms (LayerNorm or RMSNorm)"
    if ".base_layer." in name:
        return "the wrapped layers' own W or b"
    return "a projection that is not a target"


@checker
@no_raw_errors
def check_add_lora(fn: Callable[..., Any]) -> None:
    """Check ``fn(model, r, alpha, lora_class) -> model``: the targets wrapped, all else frozen."""
    from .. import lora
    from ..gpt import GPT

    if is_course_lib(fn) or is_peft(fn):
        raise CheckFailure("You handed in a library's function (course_lib's add_lora or PEFT's): "
                           "write the wrapping yourself; the lesson uses course_lib's afterwards.")
    refused = [lora.add_lora, lora.set_adapter, lora.merge_and_unload]
    for n, ((case, config), (r, alpha)) in enumerate(zip(_configs(), ((3, 7), (2, 5), (4, 4.5)))):
        torch.manual_seed(n)
        model = GPT(config).eval()
        names = {id(m): name for name, m in model.named_modules()}
        expected = {name for name, m in model.named_modules()
                    if name.rsplit(".", 1)[-1] in TARGETS and isinstance(m, nn.Linear)}
        linears = {name: m for name, m in model.named_modules() if name in expected}
        ids = torch.randint(0, config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            before = model(ids)
        wrapped: dict[int, str] = {}
        made: list[Any] = []
        LoRA = _recording_class(wrapped, names, made)
        with calls_to(refused) as seen, time_limit(LIMIT_SECONDS, f"Your function ran for more than "
                                                   f"{LIMIT_SECONDS} s ({case}): a loop that never ends?"):
            try:
                out = run_learner(fn, model, r, alpha, LoRA, case=case,
                                  hint="The function takes (model, r, alpha, lora_class) and calls "
                                       "lora_class(linear, r, alpha) for each target.")
            except CheckFailure as err:
                if isinstance(err.__cause__, AttributeError) and "Llama" in case and n > 0:
                    raise CheckFailure(
                        f"Your function ran on the GPTs but raised AttributeError on {case}: "
                        f"{err.__cause__}. That model's layers have other names and places (its "
                        "feed-forward is a SwiGLU with gate, up and linear2, no linear1), so a layer "
                        "reached by a fixed path is not there; the targets are the nn.Linear layers "
                        "named q_proj, k_proj, v_proj, out_proj, linear1, linear2, wherever they sit.",
                        mistake="fixed paths to the layers") from None
                raise
        if seen:
            raise CheckFailure(f"Your function calls course_lib's {seen[0].__name__}, the very thing "
                               "this exercise builds: write the wrapping yourself.")
        if out is None:
            raise CheckFailure("Your function returns None: return the model (wrapped in place).")
        if not isinstance(out, nn.Module):
            raise CheckFailure(f"Your function returns a {type(out).__name__}: return the model.")
        if out is not model:
            changed = sum(isinstance(m, LoRA) for m in model.modules())
            raise CheckFailure(
                f"The model your function returns is not the model passed in ({case}): the one passed "
                f"in has {changed} of its {len(expected)} targets wrapped, the one returned "
                f"{sum(isinstance(m, LoRA) for m in out.modules())}. The exercise changes the given "
                "model in place and returns it (a copy would keep a second set of base weights).",
                mistake="a copy of the model wrapped")
        if any(is_peft(m) for m in out.modules()):
            raise CheckFailure("Your model holds PEFT's LoRA layers: wrap the targets with the "
                               "lora_class you are given.")
        if any(isinstance(m, lora.LoRALinear) and not isinstance(m, LoRA) for m in out.modules()):
            raise CheckFailure(
                "Your function wraps the targets with course_lib's LoRALinear, not with the "
                "lora_class it is given: course_lib's is right, and the lesson uses it afterwards; "
                "here, call lora_class(linear, r, alpha), so that any LoRA class (yours, the "
                "checker's) can be used.", mistake="course_lib's LoRALinear used")
        found = {name: m for name, m in out.named_modules() if isinstance(m, LoRA)}
        missing = sorted(expected - set(found))
        extra = sorted(set(found) - expected)
        if missing:
            kinds = sorted({m.rsplit(".", 1)[-1] for m in missing})
            raise CheckFailure(
                f"Likely mistake ({case}): a target missed: {', '.join(kinds)} not wrapped "
                f"({len(missing)} layers, e.g. {missing[0]}). Every nn.Linear named one of q_proj, "
                "k_proj, v_proj, out_proj, linear1, linear2, in every block, is a target; find them "
                "by name, wherever they sit.", mistake="a target missed")
        if extra:
            raise CheckFailure(
                f"Your function also wraps {', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''} "
                f"({case}): only the six targets are wrapped (the head, SwiGLU's gate and up and "
                "every other layer stay as they are).", mistake="a layer that is not a target wrapped")
        for name, layer in found.items():
            if layer.base_layer is not linears[name]:
                raise CheckFailure(f"{name} wraps a copy of the model's nn.Linear ({case}): pass the "
                                   "layer itself to lora_class, so that the base weights exist once.")
            if (layer.r["default"], layer.lora_alpha["default"]) != (r, alpha):
                raise CheckFailure(
                    f"{name} was made with r={layer.r['default']}, alpha={layer.lora_alpha['default']}"
                    f"; the call asked for r={r}, alpha={alpha} ({case}): lora_class(linear, r, alpha).")
        adapters = {id(p) for layer in found.values() for p in (layer.A, layer.B)}
        frozen_adapters = [name for name, layer in found.items()
                           if not (layer.A.requires_grad and layer.B.requires_grad)]
        if frozen_adapters:
            raise CheckFailure(
                f"Likely mistake ({case}): the adapters' A and B are frozen (e.g. {frozen_adapters[0]}); "
                "freezing every parameter after wrapping freezes them too. Freeze first, then wrap "
                "(new A and B are trainable), or set requires_grad on A and B again.",
                mistake="A and B frozen")
        trainable = [name for name, p in out.named_parameters() if p.requires_grad
                     and id(p) not in adapters]
        if trainable and all(name.endswith("bias") for name in trainable):
            where = sorted({"the norms" if "norm" in name else "the wrapped layers (their base b)"
                            if ".base_layer." in name else "other layers" for name in trainable})
            raise CheckFailure(
                f"Likely mistake ({case}): the biases still train ({len(trainable)} tensors: those of "
                f"{' and '.join(where)}, e.g. {trainable[0]}): the weights "
                "are frozen, the biases not. With LoRA only the adapters' A and B train: set "
                "requires_grad_(False) on every other parameter, biases included.",
                mistake="biases trainable")
        if trainable:
            what = sorted({_frozen_name(name) for name in trainable})
            mistake = ("head or embeddings left trainable" if any("embed" in w or "head" in w for w in what)
                       else "LayerNorm trainable" if any("norms" in w for w in what)
                       else "base weights trainable")
            raise CheckFailure(
                f"Likely mistake ({case}): {', '.join(what)} still train(s) ({len(trainable)} tensors, "
                f"e.g. {trainable[0]}). With LoRA only the adapters' A and B train: set "
                "requires_grad_(False) on every other parameter.", mistake=mistake)
        with torch.no_grad():
            after = out(ids)
        if not close_scaled(after, before, 1e-5):
            raise CheckFailure(f"The wrapped model computes other logits than the model before "
                               f"wrapping ({case}), with every B still zero: keep the layers' weights "
                               "as they are.")
    print("check_add_lora: right on 3 models (2 and 3 blocks, tied and untied head, Llama-style): every "
          "target wrapped once, only A and B trainable, the logits unchanged. Well done!")


# ----------------------------------------------------------------------------------------------
# check_merge_fix (debug: what a merged layer computes; never the fix)
# ----------------------------------------------------------------------------------------------

# (case, d_out, d_in, r, scaling, dtype)
_MERGE_CASES = [
    ("a square layer, W (24, 24), r=4, scaling 2", 24, 24, 4, 2.0, torch.float32),
    ("W (48, 32): d_out 48, d_in 32, r=2, scaling 1.5", 48, 32, 2, 1.5, torch.float32),
    ("W (16, 40): d_out 16, d_in 40, r=8, scaling 0.5, float64", 16, 40, 8, 0.5, torch.float64),
]


def _observe_merge(got: torch.Tensor, W64: torch.Tensor, A64: torch.Tensor, B64: torch.Tensor,
                   s: float) -> tuple[str, str | None]:
    """What a merged weight ``got`` (d_out, d_in) is, in words that say what is seen, never the fix;
    and the mistake's name for the grader (None if nothing known is seen)."""
    g = got.double()
    update = B64 @ A64 * s  # (d_out, d_in): what the LoRA path adds, as a matrix
    change = g - W64
    square = W64.shape[0] == W64.shape[1]
    near = lambda a, b: close_scaled(a, b, 1e-5)  # noqa: E731

    def same_numbers(a: torch.Tensor, b: torch.Tensor) -> bool:
        return near(a.flatten().sort().values, b.flatten().sort().values)

    if square and near(g, W64 + update.T):
        return " It returns what merge_weight_ported returns.", "same as merge_weight_ported"
    if near(change, torch.zeros_like(change)):
        return (" Your merged weight equals W: the merge changes nothing, so what the LoRA path adds "
                "is lost.", "W returned unchanged")
    if near(g, update):
        return (" Your merged weight equals what the LoRA path adds, scaling · B A, alone: the layer's "
                "own W x is missing from the merged layer's output.", "only B A returned, without W")
    c = float((change * update).sum() / (update * update).sum())
    if near(change, c * update):
        if abs(c + 1) < 1e-3:
            return (" The change your merge makes to W is what the LoRA path adds with the opposite "
                    "sign.", "W - B A")
        name = ("the scaling not applied" if abs(c - 1 / s) < 1e-3 else "the scaling applied twice"
                if abs(c - s) < 1e-3 else f"the change scaled by {c:.3g}")
        return (f" The change your merge makes to W is {c:.3g}x what the LoRA path adds (scaling · B A, "
                f"with scaling = {s:g}).", name)
    if square and near(g - update, W64.T):
        return (" Your merged weight minus what the LoRA path adds is not W: it is W with its rows and "
                "columns swapped (W[i, j] sits at [j, i]).", "W transposed")
    if square and near(g, (W64 + update).T):
        return (" Your merged weight holds the numbers of W + scaling · B A with its rows and columns "
                "swapped ([i, j] holds [j, i]).", "the merged weight transposed")
    if same_numbers(change, update):
        return (" The change your merge makes to W holds the numbers the LoRA path adds, at other "
                "places in the matrix.", "the update's numbers moved")
    return "", None


def _short(case: str) -> str:
    """The layer of a merge case, e.g. 'W (48, 32)'."""
    return case[case.index("W ("):case.index(")") + 1]


@checker
@no_raw_errors
def check_merge_fix(fn: Callable[..., Any]) -> None:
    """Check ``fn(W, A, B, scaling) -> merged W``: a layer merged with it computes what the unmerged
    layer computes, on every layer. The first message says what is observed (on which layers, and what
    the merged weight is), never the fix."""
    if is_course_lib(fn) or is_peft(fn):
        raise CheckFailure("You handed in a library's function: fix the ported one.")
    # (layer, what is seen, the same in short for a later layer, mistake); "" when right
    outcomes: list[tuple[str, str, str, str | None]] = []
    for n, (case, d_out, d_in, r, s, dtype) in enumerate(_MERGE_CASES):
        gen = torch.Generator().manual_seed(300 + n)
        W = (torch.randn(d_out, d_in, generator=gen, dtype=torch.float64) * 0.3).to(dtype)
        A = (torch.randn(r, d_in, generator=gen, dtype=torch.float64) * 0.3).to(dtype)
        B = (torch.randn(d_out, r, generator=gen, dtype=torch.float64) * 0.3).to(dtype)
        x = torch.randn(5, d_in, generator=gen, dtype=torch.float64)
        W64, A64, B64 = W.double(), A.double(), B.double()
        unmerged = x @ W64.T + (x @ A64.T) @ B64.T * s  # (5, d_out): the layer before merging
        too_long = f"Your function ran for more than {LIMIT_SECONDS} s ({case})."
        given = (W.clone(), A.clone(), B.clone())
        try:
            with time_limit(LIMIT_SECONDS, too_long):
                got = run_learner(fn, *given, s, case=case,
                                  hint=f"It was given W {tuple(W.shape)}, A {tuple(A.shape)}, "
                                       f"B {tuple(B.shape)}, scaling {s}.")
        except CheckFailure as err:
            if str(err) == too_long:
                raise
            cause = err.__cause__
            short = (f"your function raised {type(cause).__name__}: {cause}" if cause is not None
                     else str(err))
            outcomes.append((case, str(err), short, err.mistake or "raised"))
            continue
        got = plain(got, "your merged weight")
        if not isinstance(got, torch.Tensor):
            raise CheckFailure(f"Your function returns a {type(got).__name__} ({case}), not a tensor.")
        changed = [name for name, t, t0 in zip("WAB", given, (W, A, B)) if not torch.equal(t, t0)]
        if changed:
            seen = (f"after the call, the {' and '.join(changed)} passed in "
                    f"hold{'s' if len(changed) == 1 else ''} other numbers than "
                    f"before: your function changes its input{'s' if len(changed) > 1 else ''} in place"
                    + (" (in the notebook's use the unmerged layer's W then already carries the update, "
                       "so merging adds it twice)" if changed == ["W"] else ""))
            outcomes.append((case, f"{seen[0].upper()}{seen[1:]} ({case}).", seen, "input changed in place"))
            continue
        if got.dtype != dtype:
            seen = f"your merged weight is {got.dtype} where W is {dtype}"
            outcomes.append((case, f"{seen[0].upper()}{seen[1:]} ({case}): a layer merged with it "
                                   "changes its dtype.", seen, "dtype changed"))
            continue
        if tuple(got.shape) != (d_out, d_in):
            outcomes.append((case, f"Your merged weight has shape {tuple(got.shape)} for W "
                                   f"{(d_out, d_in)} ({case}): a layer cannot use it in W's place.",
                             f"your merged weight has shape {tuple(got.shape)}", "wrong shape"))
            continue
        if not got.is_floating_point() or not torch.isfinite(got).all():
            seen = f"your merged weight holds {got.dtype} values, or NaN or inf"
            outcomes.append((case, f"{seen[0].upper()}{seen[1:]} ({case}).", seen, "not finite"))
            continue
        if close_scaled(got, W64 + B64 @ A64 * s, 1e-5 if dtype == torch.float32 else 1e-10):
            outcomes.append((case, "", "", None))
            continue
        merged = x @ got.double().T  # (5, d_out): the layer with your weight, no LoRA path
        difference = float((merged - unmerged).abs().max())
        scale = float(unmerged.abs().max())
        seen, name = _observe_merge(got, W64, A64, B64, s)
        outcomes.append((case, f"A layer merged with your function computes other outputs than the "
                               f"same layer unmerged ({case}): on 5 random inputs they differ by up to "
                               f"{difference:.3g}, with outputs of size up to {scale:.3g}.{seen}",
                         f"the outputs differ by up to {difference:.3g} (scaling {s:g}).{seen}",
                         name or "differs"))
    wrong = [(case, seen, short, name) for case, seen, short, name in outcomes if seen]
    if wrong:
        right = [_short(case) for case, seen, _, _ in outcomes if not seen]
        others = [f"on {_short(case)}, {short.rstrip('.')}." for case, _, short, _ in wrong[1:]]
        tail = (f" On {' and '.join(right)} a layer merged with it computes what the unmerged one "
                "computes." if right else "")
        more = (" And " + " And ".join(others) if others else "")
        raise CheckFailure(wrong[0][1] + tail + more, mistake=wrong[0][3])
    print(f"check_merge_fix: right on all {len(_MERGE_CASES)} layers (square and not, float32 and "
          "float64): a merged layer computes what the unmerged one computes. Well done!")
