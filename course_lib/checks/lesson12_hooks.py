"""Checkers for lesson 12's hooks on ``out_proj``: ablating a head, patching one in.

* ``check_ablation_hook(fn)``: ``fn(head, num_heads, mean=None) -> hook``, a forward pre-hook for
  ``out_proj`` that zero- or mean-ablates one head. Reference: ``interp.ablation_hook``, compared
  through random attention-only GPTs' logits (4, 2 and 3 heads, batches of several shapes).
* ``check_patching_hook(fn)``: ``fn(head, num_heads, clean (B, T, h, hd), position=None) -> hook``,
  the fixed patching hook (the Debug exercise: the given hook tests ``if position:``, so position 0
  patches every position). Reference: ``interp.patching_hook``.

Every checker removes every hook it registers. ``random_model``, ``hooks_on`` and ``remove_hooks`` are
shared with ``lesson12_circuits``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import interp
from ..gpt import GPT
from ..induction import induction_config, repeated_tokens
from .common import CheckFailure, calls_to, checker
from .lesson12_inside import call_learner, close64, no_raw_errors, refuse_reference

__all__ = ["check_ablation_hook", "check_patching_hook"]


def _learner_hook_output(fn: Callable[..., Any], args: tuple, reference: Callable[..., Any], model: GPT,
                         ids: torch.Tensor, layer: int, case: str, refusal: str) -> tuple[Any, torch.Tensor]:
    """Build the learner's hook from ``args`` and run ``model(ids)`` with it on ``layer``'s out_proj:
    ``(hook, logits)``; refuse a hook factory that only calls course_lib's ``reference``."""
    with calls_to([reference]) as seen:
        hook = call_learner(fn, *args, case=case, hint="Build and return the inner hook function.")
        got = _run_with(model, ids, layer, hook, case,
                        "The hook receives (module, args); args[0] is out_proj's input "
                        "(B, T, num_heads * head_dim).")
    if seen:
        raise CheckFailure(refusal)
    return hook, got


# ----------------------------------------------------------------------------------------------
# check_ablation_hook (build, ★★) and check_patching_hook (debug)
# ----------------------------------------------------------------------------------------------


_HOOK_D_MODEL, _HOOK_HEADS, _HOOK_T = 48, 4, 10  # head_dim 12: != num_heads, views differ


def random_model(seed: int, num_layers: int = 2, num_heads: int = _HOOK_HEADS,
                 d_model: int = _HOOK_D_MODEL, scale: float = 3.0) -> GPT:
    """A random attention-only GPT (lesson 12's kind) with every weight moved by noise and the token
    table scaled by ``scale``, so that its heads are uneven and its predictions not uniform."""
    torch.manual_seed(seed)
    model = GPT(induction_config(num_layers=num_layers, num_heads=num_heads, d_model=d_model)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * scale * torch.randn_like(p))
        model.embed.token.weight.mul_(scale)
    return model


def hooks_on(model: GPT) -> int:
    """How many forward (pre-)hooks are registered anywhere in ``model``."""
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def remove_hooks(model: GPT) -> None:
    """Remove every forward (pre-)hook from ``model``'s modules."""
    for m in model.modules():
        m._forward_pre_hooks.clear()
        m._forward_hooks.clear()


def _run_with(model: GPT, ids: torch.Tensor, layer: int, hook: Any, case: str, hint: str) -> torch.Tensor:
    """The logits of ``model(ids)`` with ``hook`` on layer ``layer``'s out_proj (always removed)."""
    if not callable(hook):
        raise CheckFailure(f"Your function returned {type(hook).__name__}, not a hook ({case}): "
                           "return the inner function hook(module, args).")
    shapes: list[tuple[tuple[int, ...], Any]] = []  # (input shape, what the hook returned)

    def recorded(module: Any, args: tuple) -> Any:
        shapes.append((tuple(args[0].shape), None))
        result = hook(module, args)
        shapes[-1] = (shapes[-1][0], result)
        return result

    try:
        with interp.hooked(model, layer, recorded):
            out = model(ids)
    except (NotImplementedError, CheckFailure):
        raise
    except Exception as err:
        if shapes:
            wanted, result = shapes[-1]
            got = result[0] if isinstance(result, tuple) and result else result
            if isinstance(got, torch.Tensor) and tuple(got.shape) != wanted:
                raise CheckFailure(
                    f"Your hook returned a tensor of shape {tuple(got.shape)}, but out_proj's input "
                    f"has shape {wanted} ({case}): return it in the shape it came in, the heads side "
                    "by side (B, T, num_heads * head_dim), e.g. z.view(B, T, -1).") from err
        if "Boolean value of Tensor" in str(err):
            raise CheckFailure(
                f"Your hook asked for the truth of a tensor ({case}): `if mean:` (or `if not mean`, "
                "`mean or ...`) on a tensor of several numbers is refused by PyTorch. Whether an "
                "argument was given is `mean is None` / `mean is not None`.") from err
        raise CheckFailure(f"Your hook raised {type(err).__name__} inside out_proj's forward "
                           f"({case}): {err}. {hint}") from err
    return out


def _hook_verdict(got: torch.Tensor, expected: torch.Tensor, unhooked: torch.Tensor,
                  mistakes: list[tuple[str, torch.Tensor]], case: str, unchanged: str) -> None:
    if close64(got, expected, 1e-5):
        return
    if close64(got, unhooked, 1e-6):
        raise CheckFailure(unchanged.format(case=case))
    for message, wrong in mistakes:
        if close64(got, wrong, 1e-5):
            raise CheckFailure(f"Likely mistake ({case}): {message}.", mistake=message)
    raise CheckFailure(
        f"The model's output with your hook differs from its output with course_lib's ({case}): "
        f"largest difference {(got - expected).abs().max().item():.3g}. None of the usual mistakes "
        "explains it; print the input of out_proj before and after your hook for a small batch.")


def _replace_hook(change: Callable[[torch.Tensor], None]) -> Callable[..., Any]:
    """A pre-hook that clones out_proj's input, applies ``change`` to the clone, returns it."""

    def hook(module: Any, args: tuple) -> tuple:
        z = args[0].clone()
        change(z)
        return (z,)

    return hook


def _written_in_heads(h: int, hd: int, head: int, change: Callable[[torch.Tensor], None] | None = None
                      ) -> list[tuple[str, Callable[[torch.Tensor], None]]]:
    """The lesson's 4 heads written in where the model has ``h``: ``change(z4)`` on the (B, T, 4, -1)
    view (default: head ``head`` zeroed)."""
    d = h * hd
    if h == 4 or d % 4 or head >= 4:
        return []
    change = change or (lambda z4: z4[:, :, head].zero_())
    return [("the number of heads is written in as 4 (the lesson's model): this model has "
             f"{h} heads of {hd} numbers; use the argument num_heads, so the hook fits any layer",
             lambda z: change(z.view(*z.shape[:2], 4, -1)))]


def _only_four_heads(failure: CheckFailure, h: int, case: str) -> CheckFailure:
    """A failure in a case of ``h != 4`` heads after every 4-head case passed: say so."""
    message = str(failure)
    if "written in" in message:
        return failure
    return CheckFailure(
        f"Your hook is right for the lesson's 4 heads but not for {h} heads ({case}): is a number of "
        "heads or head_dim written in? Take num_heads from the argument and head_dim from the input, "
        f"args[0].size(-1) // num_heads. What the checker saw: {message}")


def _ablation_mistakes(model: GPT, ids: torch.Tensor, layer: int, head: int,
                       mean: torch.Tensor | None) -> list[tuple[str, torch.Tensor]]:
    h = model.config.num_heads
    hd = model.config.d_model // h
    fill = 0.0 if mean is None else mean
    variants: list[tuple[str, Callable[[torch.Tensor], None]]] = [
        ("interleaved slicing: z[..., head::num_heads] takes every num_heads-th number, but a head's "
         "output is a contiguous slice, numbers head * head_dim .. (head + 1) * head_dim - 1 "
         "(merge_heads puts the heads side by side)",
         lambda z: z[..., head::h].copy_(torch.zeros_like(z[..., head::h]) + fill)),
        ("the view has its axes the wrong way round: view(B, T, head_dim, num_heads) then [:, :, head] "
         "picks numbers across heads; view as (B, T, num_heads, head_dim)",
         lambda z: z.view(*z.shape[:2], hd, h)[:, :, head].copy_(
             torch.zeros_like(z.view(*z.shape[:2], hd, h)[:, :, head]) + fill)),
        ("every head is ablated, not only head `head`: change only its slice of the last axis",
         lambda z: z.view(*z.shape[:2], h, hd).copy_(torch.zeros_like(z.view(*z.shape[:2], h, hd))
                                                     + fill)),
    ]
    for other, word in ((head + 1, "the next"), (head - 1, "the previous")):
        if 0 <= other < h:
            variants.append((f"off by one head: you ablated {word} head ({other}, not {head}); head "
                             f"`head`'s slice starts at head * head_dim",
                             lambda z, o=other: z.view(*z.shape[:2], h, hd)[:, :, o].copy_(
                                 torch.zeros_like(z.view(*z.shape[:2], h, hd)[:, :, o]) + fill)))
    if mean is None:  # the lesson's head_dim, written in as a number (its slice reaches past head_dim)
        variants.append(("head_dim is written in as 32 (the lesson's model); compute it from the input, "
                         "head_dim = args[0].size(-1) // num_heads, so the hook fits any model",
                         lambda z: z[..., head * 32 : (head + 1) * 32].zero_()))
    if mean is None:
        variants += _written_in_heads(h, hd, head)
    if mean is not None:
        variants.append(("the mean is ignored: with `mean` given, the head's output becomes `mean` "
                         "(mean-ablation), not 0",
                         lambda z: z.view(*z.shape[:2], h, hd)[:, :, head].zero_()))
        variants.append(("the mean is subtracted from the head's output: mean-ablation REPLACES the "
                         "head's output by `mean`, so that nothing of this input's own output stays",
                         lambda z: z.view(*z.shape[:2], h, hd)[:, :, head].sub_(mean)))
    found = []
    for message, change in variants:
        try:
            found.append((message, _run_with(model, ids, layer, _replace_hook(change), "", "")))
        except CheckFailure:
            continue
    return found


def _changes_its_input(hook: Any, model: GPT, layer: int, shape: tuple[int, int]) -> bool:
    """Call ``hook`` on a tensor of out_proj's input shape ``(B, T, d_model)``: did it change that
    tensor in place?"""
    gen = torch.Generator().manual_seed(11)
    given = torch.randn(*shape, model.config.d_model, generator=gen)  # (B, T, h * head_dim)
    before = given.clone()
    try:
        hook(model.blocks.layers[layer].self_attn.out_proj, (given,))
    except Exception:  # noqa: BLE001 (the run through the model already passed)
        return False
    return not torch.equal(given, before)


# (num_heads, (B, T), layer, head, mean: None, "vector" (head_dim,) or "positions" (T, head_dim));
# d_model 48: heads of 12 (4 heads), 24 (2) and 16 (3) numbers, so a number written in shows
_ABLATION_CASES = [
    (4, (3, 10), 0, 1, None), (4, (3, 10), 1, 2, None), (4, (2, 7), 1, 0, "vector"),
    (4, (3, 10), 0, 3, None), (4, (1, 9), 0, 2, "positions"), (2, (4, 6), 1, 1, None),
    (2, (2, 5), 0, 0, "positions"), (3, (3, 8), 1, 2, "vector"), (3, (1, 4), 0, 1, None),
]


_UNCHANGED_ABLATION = (
    "Your hook changed nothing ({case}): the model's output equals the run without a hook. A forward "
    "pre-hook changes what out_proj receives only if it returns the new input (a tensor or a "
    "1-tuple), or changes args[0] in place; a changed copy that is not returned is thrown away.")


_IN_PLACE_NOTE = (
    "One note: your hook changes args[0], the tensor PyTorch passed in, in place. That works here, "
    "but other code may still hold that tensor (a hook that saved it, for one): change a clone, "
    "z = args[0].clone(), and return it.")


@checker
def check_ablation_hook(fn: Callable[..., Any]) -> None:
    """Check ``fn(head, num_heads, mean=None) -> pre-hook`` against ``interp.ablation_hook``,
    through random attention-only GPTs' logits: 4, 2 and 3 heads, batches of several shapes,
    zero- and mean-ablation, both layers."""
    no_raw_errors(_check_ablation_hook)(fn)


def _check_ablation_hook(fn: Callable[..., Any]) -> None:
    refuse_reference(fn, "the ablation hook")
    models = {h: random_model(seed=12 + h, num_heads=h) for h in (4, 2, 3)}
    gen = torch.Generator().manual_seed(7)
    in_place = False
    try:
        for h, (B, T), layer, head, kind in _ABLATION_CASES:
            model = models[h]
            hd = model.config.d_model // h
            ids = torch.randint(0, model.config.vocab_size, (B, T), generator=gen)  # (B, T)
            unhooked = model(ids)
            mean = None
            if kind == "vector":
                mean = torch.randn(hd, generator=gen)
            elif kind == "positions":
                mean = torch.randn(T, hd, generator=gen)
            what = ("zero-ablation" if mean is None else
                    f"mean-ablation with mean of shape {tuple(mean.shape)}")
            case = (f"layer {layer}, head {head} of {h}, head_dim {hd}, {what}, "
                    f"input ({B}, {T}, {model.config.d_model})")
            args = (head, h) if mean is None else (head, h, mean.clone())
            try:
                hook, got = _learner_hook_output(
                    fn, args, interp.ablation_hook, model, ids, layer, case, "Your function calls "
                    "course_lib's interp.ablation_hook, the hook this exercise asks you to write.")
                with interp.hooked(model, layer, interp.ablation_hook(head, h, mean)):
                    expected = model(ids)
                if not close64(got, expected, 1e-5):
                    _hook_verdict(got, expected, unhooked,
                                  _ablation_mistakes(model, ids, layer, head, mean), case,
                                  _UNCHANGED_ABLATION)
            except CheckFailure as failure:
                if h == 4 or "course_lib" in str(failure):
                    raise
                raise _only_four_heads(failure, h, case) from failure
            in_place = in_place or _changes_its_input(hook, model, layer, (B, T))
    finally:
        for model in models.values():
            remove_hooks(model)
    print(f"check_ablation_hook: all {len(_ABLATION_CASES)} cases (4, 2 and 3 heads, several batch "
          "shapes) match course_lib's reference (the model's logits with your hook). Well done!")
    if in_place:
        print(_IN_PLACE_NOTE)


# --- the patching hook (debug) ---------------------------------------------------------------

# (num_heads, layer, head, position): d_model 48, heads of 12, 24 and 16 numbers
_PATCH_CASES = [(4, 0, 1, None), (4, 1, 2, None), (4, 1, 0, 4), (4, 0, 3, 7), (4, 1, 3, 0),
                (2, 1, 1, None), (2, 0, 0, 3), (3, 1, 2, None), (3, 0, 1, 0)]


_POSITION_ZERO = (
    "With position=0 your hook changed the corrupted run as if no position were given: head {head}'s "
    "output was patched at every position ({case}). With position=4 and position=7 it patched only "
    "that position. What does your hook do differently when position is 0?")


_UNCHANGED_PATCH = (
    "The patched run's output equals the unpatched run's ({case}): the patch never reached "
    "out_proj. Hint: your hook writes the clean values somewhere; ask what out_proj then receives. "
    "The documentation of nn.Module.register_forward_pre_hook says which of the hook's doings "
    "PyTorch uses.")


def _patch_mistakes(model: GPT, ids: torch.Tensor, layer: int, head: int, clean: torch.Tensor,
                    position: int | None) -> list[tuple[str, torch.Tensor]]:
    h = model.config.num_heads
    T = ids.size(1)

    def heads(z: torch.Tensor) -> torch.Tensor:
        return z.view(*z.shape[:2], h, -1)  # (B, T, h, hd)

    def put(z: torch.Tensor, where: Any, which: Any, source: torch.Tensor) -> None:
        heads(z)[:, where, which] = source

    where = slice(None) if position is None else position
    variants: list[tuple[str, Callable[[torch.Tensor], None]]] = [
        ("every head is patched, not only head `head`: write clean[:, ..., head] into head `head`'s "
         "slice only", lambda z: put(z, where, slice(None), clean[:, where])),
        ("patched from the wrong tensor: you wrote zeros (an ablation), not the clean run's output",
         lambda z: put(z, where, head, 0.0)),
        ("interleaved slicing: a head's output is a contiguous slice of out_proj's input, numbers "
         "head * head_dim .. (head + 1) * head_dim - 1",
         lambda z: z.view(*z.shape[:2], -1, h)[:, where, :, head].copy_(clean[:, where, head])),
    ]
    for other in (head - 1, head + 1):
        if 0 <= other < h:
            variants.append((f"patched from the wrong tensor: you wrote head {other}'s clean output "
                             f"into head {head}; take clean[:, ..., head]",
                             lambda z, o=other: put(z, where, head, clean[:, where, o])))
            variants.append((f"off by one head: you patched head {other}, not head {head}",
                             lambda z, o=other: put(z, where, o, clean[:, where, o])))
            variants.append((f"off by one head: you wrote head {head}'s clean output into head "
                             f"{other}'s slice; head `head`'s slice starts at head * head_dim",
                             lambda z, o=other: put(z, where, o, clean[:, where, head])))
    if position is not None:
        variants.append((f"patched every position, though position={position} was given: with a "
                         "position, only that position changes",
                         lambda z: put(z, slice(None), head, clean[:, :, head])))
        for other in (position + 1, position - 1):
            if 0 <= other < T:
                variants.append((f"wrong position: you patched position {other}, not {position}",
                                 lambda z, o=other: put(z, o, head, clean[:, o, head])))
    found = []
    for message, change in variants:
        try:
            found.append((message, _run_with(model, ids, layer, _replace_hook(change), "", "")))
        except CheckFailure:
            continue
    return found


@checker
def check_patching_hook(fn: Callable[..., Any]) -> None:
    """Check ``fn(head, num_heads, clean (B, T, h, hd), position=None) -> pre-hook`` against
    ``interp.patching_hook``, through a random attention-only GPT's logits on a corrupted run."""
    no_raw_errors(_check_patching_hook)(fn)


def _check_patching_hook(fn: Callable[..., Any]) -> None:
    refuse_reference(fn, "the patching hook")
    gen = torch.Generator().manual_seed(8)
    n = _HOOK_T // 2
    runs = {}  # num_heads -> (model, corrupted ids, clean head outputs, unpatched logits)
    for h in (4, 2, 3):
        model = random_model(seed=21 + h, num_heads=h)
        clean_ids = repeated_tokens(3, n, model.config.vocab_size, gen)  # (3, 2n): [r, r]
        other = torch.randint(0, model.config.vocab_size, (3, n), generator=gen)
        corrupted = torch.cat([other, clean_ids[:, n:]], dim=1)  # [r', r]
        runs[h] = (model, corrupted, interp.head_outputs(model, clean_ids), model(corrupted))
    in_place = False
    try:
        for h, layer, head, position in _PATCH_CASES:
            model, corrupted, clean_z, unpatched = runs[h]
            where = "every position" if position is None else f"position={position}"
            case = f"layer {layer}, head {head} of {h}, {where}, clean {tuple(clean_z[layer].shape)}"
            args = (head, h, clean_z[layer].clone())
            if position is not None:
                args += (position,)
            try:
                hook, got = _learner_hook_output(
                    fn, args, interp.patching_hook, model, corrupted, layer, case, "Your function "
                    "calls course_lib's interp.patching_hook: fix the given hook instead.")
                with interp.hooked(model, layer, interp.patching_hook(head, h, clean_z[layer],
                                                                      position)):
                    expected = model(corrupted)
                if not close64(got, expected, 1e-5) and position == 0:
                    with interp.hooked(model, layer, interp.patching_hook(head, h, clean_z[layer])):
                        everywhere = model(corrupted)
                    if close64(got, everywhere, 1e-5):
                        raise CheckFailure(_POSITION_ZERO.format(head=head, case=case))
                if not close64(got, expected, 1e-5):
                    _hook_verdict(got, expected, unpatched,
                                  _patch_mistakes(model, corrupted, layer, head, clean_z[layer],
                                                  position), case, _UNCHANGED_PATCH)
            except CheckFailure as failure:
                if h == 4 or "course_lib" in str(failure):
                    raise
                raise _only_four_heads(failure, h, case) from failure
            in_place = in_place or _changes_its_input(hook, model, layer, tuple(corrupted.shape))
    finally:
        for model, *_ in runs.values():
            remove_hooks(model)
    print(f"check_patching_hook: all {len(_PATCH_CASES)} cases (4, 2 and 3 heads) match course_lib's "
          "reference (the corrupted run's logits with your patch). Well done!")
    if in_place:
        print(_IN_PLACE_NOTE)
