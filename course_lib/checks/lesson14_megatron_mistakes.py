"""Differential diagnosis for two lesson-14 checkers: ZeRO-1's bytes (the Predict) and Megatron's MLP.
Each computes what every likely mistake gives on the same inputs and names the one the learner's
numbers match (several, as alternatives, when they give the same number).

* ``name_zero1_bytes(got, parameters, world_size)``: the message for a wrong prediction of AdamW's
  bytes per rank under ZeRO-1, or None when no mistake explains it.
* ``watch_mlp_calls(cls, counts, phase)``: a context manager that counts the collectives and the
  dropout calls of a learner's module (``counts["forward:all_gather"]``, ...), also when the learner
  imported them by name.
* ``mlp_layout(params, dense, rank, world_size)``: what each parameter of a rank holds of the dense
  layer (``dense = {"w1": (d_ff, d), "b1": (d_ff,), "w2": (d, d_ff), "b2": (d,)}``).
* ``name_mlp_layout(layouts, dense, world_size, counts)``: the message for shards that are not chunk
  r of each matrix on rank r (another split, another chunk, whole, scaled), or None.
* ``name_scale(got, expected, world_size)``: ``got = c * expected`` gives c, else None.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["name_zero1_bytes", "watch_mlp_calls", "mlp_layout", "name_mlp_layout", "name_scale",
           "COLLECTIVES"]

# --- ZeRO-1's bytes per rank ---------------------------------------------------------------------

# each dimension: {value: (short name, what it means) when it is not the right one, None when right}
_NUMBERS = {2: None,
            1: ("one number per weight", "AdamW keeps TWO numbers per weight (exp_avg and exp_avg_sq)"),
            3: ("three numbers per weight", "AdamW's state is two moments per weight (exp_avg, "
                "exp_avg_sq); a third number (the weights, a master copy, the gradient) is not part "
                "of it"),
            4: ("four numbers per weight", "weights, gradients and both moments counted: the question "
                "asks for AdamW's two moments only")}
_WHOLE = {0: None,
          1: ("the weights (or the gradients) added, whole on every rank", "ZeRO-1 shards only the "
              "optimizer's state, and the question asks for that state alone"),
          2: ("the weights and the gradients added, whole on every rank", "the question asks for "
              "AdamW's state alone")}
_BYTES = {4: None,
          1: ("numbers counted, not bytes", "a float32 takes 4 bytes"),
          2: ("2 bytes a number (fp16/bf16)", "the model and AdamW's state are float32, 4 bytes each"),
          8: ("8 bytes a number (float64)", "the model trains in float32, 4 bytes a number")}
_RANKS = {2: None,
          1: ("not divided among the 2 ranks", "that is the whole state, on one process; with ZeRO-1 "
              "each rank keeps the moments of its half of the weights only")}
_UNITS = {1: None, 1 / 8: "bits", 1000: "kB", 1024: "KiB", 1e6: "MB", 2**20: "MiB", 1e9: "GB",
          2**30: "GiB"}
# mistakes less often made, listed last when several give the same number
_RARE = {"2 bytes a number (fp16/bf16)": 3, "the answer in bits": 3,
         "the weights and the gradients added, whole on every rank": 2,
         "the weights (or the gradients) added, whole on every rank": 2}
# parameters a learner may count differently from the question's (lesson 09's GPT, d_model 128)
_COUNT_SLIPS = {10_624: "the token embedding counted twice (the output layer shares its weights with "
                        "it: 83 x 128 = 10,624 weights, counted once)",
                -1_536: "the biases left out (LayerNorm's and the Linear layers', 1,536)",
                -1_152: "the Linear layers' biases left out (1,152)",
                -8_192: "the position embedding left out (64 x 128 = 8,192)",
                -10_624: "the token embedding left out (83 x 128 = 10,624)"}


def _fmt(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.6g}"


def _hypotheses(n: int) -> Iterator[tuple[int, float, list[tuple[str, str]], str]]:
    """(cost, value, reasons, formula) for every mix of at most two mistakes."""
    for numbers, whole, nbytes, ranks, unit in itertools.product(_NUMBERS, _WHOLE, _BYTES, _RANKS,
                                                                  _UNITS):
        reasons = [d[k] for d, k in ((_NUMBERS, numbers), (_WHOLE, whole), (_BYTES, nbytes),
                                     (_RANKS, ranks)) if d[k] is not None]
        if unit != 1:
            reasons.append((f"the answer in {_UNITS[unit]}", "the question asks for plain bytes"))
        if len(reasons) > 2:
            continue
        formula = f"{numbers} x {n:,}" + (f" / {ranks}" if ranks != 1 else "")
        size = f"{nbytes} byte{'s' if nbytes > 1 else ''}"
        formula = f"{size} x ({formula} + {whole} x {n:,})" if whole else f"{size} x {formula}"
        formula = f"8 x {formula} (bits)" if unit == 1 / 8 else formula
        formula = f"{formula} / {int(unit):,} ({_UNITS[unit]})" if unit > 1 else formula
        yield len(reasons), nbytes * (numbers * n / ranks + whole * n) / unit, reasons, formula


def _matches(got: float, value: float) -> bool:
    if value >= 100:  # a number of bytes or bits: whole, up to rounding an odd half
        return abs(got - value) <= 0.5
    return abs(got - value) <= 0.01 * value  # kB, MB, ...: rounded to a few digits


def name_zero1_bytes(got: float, parameters: int, world_size: int = 2) -> str | None:
    """The message for ``got``, a wrong prediction of AdamW's bytes per rank under ZeRO-1 (float32,
    ``world_size`` 2), naming the mistakes that give exactly that number; None if none does."""
    n, right = parameters, 2 * 4 * parameters / world_size
    found: dict[int, list[tuple[list[tuple[str, str]], str]]] = {}
    for cost, value, reasons, formula in _hypotheses(n):
        if cost and _matches(got, value):
            found.setdefault(cost, []).append((reasons, formula))
    if found:
        options = found[min(found)]
        if len(options) == 1:
            reasons, formula = options[0]
            told = "; and ".join(f"{short}: {why}" for short, why in reasons)
            return f"Observed: {_fmt(got)} = {formula}. Likely mistake: {told}."
        options.sort(key=lambda o: sum(_RARE.get(short, 1) for short, _ in o[0]))
        listed = "; or ".join(f"({i + 1}) {' and '.join(short for short, _ in r)}: {f}"
                              for i, (r, f) in enumerate(options[:4]))
        many = (f"{len(options)} different mistakes give exactly this number; yours is likely one of "
                "them" if len(options) <= 4 else f"{len(options)} mixes of mistakes give exactly this "
                "number; the likeliest")
        return (f"Observed: {_fmt(got)}. {many}: {listed}. AdamW's state is two float32 moments per "
                "weight, and ZeRO-1 gives each of the 2 ranks those of half the weights.")
    counts = []  # (weights counted, reasons, formula) for the hypotheses that fit another count
    for cost, value, reasons, formula in _hypotheses(n):
        counted = got / (value / n)
        if cost <= 1 and 0.9 * n <= counted <= 1.1 * n and counted != n and float(counted).is_integer():
            counts.append((int(counted), reasons, formula.replace(f"{n:,}", f"{int(counted):,}")))
    if len({c for c, _, _ in counts}) == 1:
        counted, reasons, formula = counts[0]
        slip = _COUNT_SLIPS.get(counted - n)
        also = "".join(f"; and {short}: {why}" for short, why in reasons)
        if len(counts) > 1:
            also = "; and, besides, one of: " + "; or ".join(
                " and ".join(short for short, _ in r) or "nothing else" for _, r, _ in counts)
        why = (f"Likely mistake: {slip}{also}" if slip else "The weights are counted differently from "
               f"the question, or there is a slip in the arithmetic{also}")
        return (f"Observed: {_fmt(got)} = {formula}: {counted:,} weights, not the question's "
                f"{n:,}. {why}.")
    return None


# --- Megatron's MLP: what the learner's module calls ---------------------------------------------

COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all", "reduce",
               "all_gather_into_tensor", "reduce_scatter_tensor", "scatter", "gather")


@contextlib.contextmanager
def watch_mlp_calls(cls: Any, counts: dict[str, int], phase: list[str]) -> Iterator[None]:
    """Count ``torch.distributed``'s collectives and dropout with p > 0 (in training mode) while the
    block runs, as ``counts[f"{phase[0]}:{name}"]``: through ``dist``, ``distributed_c10d`` and the
    names the learner's module imported itself (``from torch.distributed import all_reduce``)."""
    import torch.distributed.distributed_c10d as c10d
    import torch.nn.functional as F

    originals: dict[str, Callable[..., Any]] = {n: getattr(dist, n) for n in COLLECTIVES
                                                 if hasattr(dist, n)}

    def counted(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            key = f"{phase[0]}:{name}"
            counts[key] = counts.get(key, 0) + 1
            return original(*args, **kwargs)
        return wrapper

    def dropout_counted(original: Callable[..., Any]) -> Callable[..., Any]:
        # F.dropout(x, p, training) and torch.dropout(x, p, train)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
            training = args[2] if len(args) > 2 else kwargs.get("training", kwargs.get("train", True))
            if p and training:
                key = f"{phase[0]}:dropout p={p:g}"
                counts[key] = counts.get(key, 0) + 1
            return original(*args, **kwargs)
        return wrapper

    patches = [(dist, n, f, counted(n, f)) for n, f in originals.items()]
    patches += [(c10d, n, f, w) for _, n, f, w in list(patches) if hasattr(c10d, n)]
    patches += [(F, "dropout", F.dropout, dropout_counted(F.dropout)),
                (torch, "dropout", torch.dropout, dropout_counted(torch.dropout))]
    wrappers = {id(f): w for _, _, f, w in patches}
    module = sys.modules.get(getattr(cls, "__module__", ""), None)
    names = vars(module) if module is not None else {}
    patches += [(module, k, v, wrappers[id(v)]) for k, v in list(names.items())
                if id(v) in wrappers and module not in (dist, c10d, F, torch)]
    try:
        for owner, name, _, wrapper in patches:
            setattr(owner, name, wrapper)
        yield
    finally:
        for owner, name, original, _ in reversed(patches):
            setattr(owner, name, original)


# --- Megatron's MLP: which part of the dense layer each parameter holds --------------------------

def _find(rows: torch.Tensor, full: torch.Tensor, scale: float = 1.0) -> list[int] | None:
    """Indices i with rows[j] == scale * full[i] for every j (rows (k, m), full (M, m)), else None."""
    if rows.dim() != 2 or rows.size(1) != full.size(1) or rows.size(0) == 0:
        return None
    diff = (rows.double()[:, None, :] - scale * full.double()[None]).abs().amax(-1)  # (k, M)
    best = diff.min(1)
    if (best.values > 1e-12 * (1 + full.abs().max().item())).any():
        return None
    return best.indices.tolist()


def mlp_layout(params: list[tuple[str, torch.Tensor]], dense: dict[str, torch.Tensor],
               world_size: int) -> list[dict[str, Any]]:
    """For each (name, value): {"name", "what" ("w1", "b1", "w2" or "b2"), "axis" (the dense
    matrix's "rows" or "columns", "entries" for a bias), "index" (which of them, in order),
    "scale"}; "what" is None when the value is none of these."""
    out = []
    w1, w2 = dense["w1"], dense["w2"]  # (d_ff, d), (d, d_ff)
    for name, value in params:
        found: dict[str, Any] = {"name": name, "what": None, "shape": tuple(value.shape)}
        if value.dim() == 2:
            for (what, axis, full), t in itertools.product(
                    (("w1", "rows", w1), ("w2", "columns", w2.T), ("w1", "columns", w1.T),
                     ("w2", "rows", w2)), (value, value.T)):
                index = _find(t, full)
                if index is not None:
                    found.update(what=what, axis=axis, index=index, scale=1.0)
                    break
        elif value.dim() == 1:
            for what, scale in itertools.product(("b1", "b2"), (1.0, 1 / world_size, world_size)):
                index = _find(value[:, None], dense[what][:, None], scale)
                if index is not None:
                    found.update(what=what, axis="entries", index=index, scale=scale)
                    break
        out.append(found)
    return out


def _span(index: list[int]) -> str:
    if len(index) > 1 and index == list(range(index[0], index[-1] + 1)):
        return f"{index[0]}..{index[-1]}"
    if len(index) > 2 and len({b - a for a, b in zip(index, index[1:])}) == 1:
        return f"{index[0]}, {index[1]}, {index[2]}, ... (a step of {index[1] - index[0]})"
    return ", ".join(map(str, index))


_LABEL = {("w1", "rows"): "linear1's weight rows (its output features)",
          ("w1", "columns"): "linear1's weight columns (its input features)",
          ("w2", "columns"): "linear2's weight columns (its input features)",
          ("w2", "rows"): "linear2's weight rows (its output features)",
          ("b1", "entries"): "linear1's bias entries", ("b2", "entries"): "linear2's bias entries"}


def name_mlp_layout(layouts: list[list[dict[str, Any]]], dense: dict[str, torch.Tensor],
                    world_size: int, counts: list[dict[str, int]], case: str) -> str | None:
    """The message for the first rank whose shards are not its chunk of each matrix, or None."""
    d_ff, d_model = dense["w1"].shape
    c = d_ff // world_size
    split_in = [(r, p) for r, lay in enumerate(layouts) for p in lay
                if p["what"] == "w1" and p["axis"] == "columns" and len(p["index"]) < d_model]
    split_out = [(r, p) for r, lay in enumerate(layouts) for p in lay
                 if p["what"] == "w2" and p["axis"] == "rows" and len(p["index"]) < d_model]
    if split_in or split_out:
        r, p = (split_in or split_out)[0]
        seen = (f"Observed ({case}, rank {r}): your {p['name']} {tuple(p['shape'])} holds "
                f"{_LABEL[p['what'], p['axis']]} {_span(p['index'])} of the dense layer's.")
        if split_in and split_out:
            why = ("rows and columns are swapped: linear1 is split by its input features (columns of "
                   "its (d_ff, d_model) weight) and linear2 by its output features (rows of its "
                   "(d_model, d_ff) weight). Megatron's 'column-parallel' linear1 means the columns of "
                   "A in Y = XA, which are the ROWS of nn.Linear's (out, in) weight: rank r keeps rows "
                   "r*c..(r+1)*c-1 of linear1's weight and the same COLUMNS of linear2's")
        elif split_in:
            why = ("linear1 is split by its input features, so each rank works on a slice of x and "
                   "gets a partial sum of every hidden feature; the activation of a partial sum is "
                   "not a part of the activation (GELU(a) + GELU(b) != GELU(a + b)). Split linear1 by "
                   "its output features instead: rank r keeps rows r*c..(r+1)*c-1 of its weight, "
                   "whole hidden features from the whole x")
        else:
            why = ("linear2 is split by its output features, so no rank has the whole output; "
                   "split it by its input features (rank r keeps columns r*c..(r+1)*c-1 of its "
                   "(d_model, d_ff) weight, matching its hidden features) and sum the partial "
                   "outputs with one all-reduce")
        return f"{seen} Likely mistake: {why}."
    for r, lay in enumerate(layouts):
        where = f"({case}, rank {r})"
        right = list(range(r * c, (r + 1) * c))
        gathered = sorted(k for k in counts[r] if k.split(":")[1].startswith("all_gather")
                          and not k.startswith("build"))
        for p in lay:
            if p["what"] is None:
                continue
            label = _LABEL[p["what"], p["axis"]]
            whole = p["index"] == list(range(d_model if p["what"] == "b2" else d_ff))
            seen = (f"Observed {where}: your {p['name']} {tuple(p['shape'])} holds {label} "
                    f"{_span(p['index'])} of the dense layer's")
            if p["what"] == "b2":
                if not whole:
                    return (f"{seen}. Likely mistake: linear2's bias is split; every rank keeps it "
                            "whole, and it is added once, after the all-reduce.")
                if p["scale"] != 1:
                    return (f"{seen}, times {p['scale']:g}. Likely mistake: linear2's bias is scaled "
                            "by the number of ranks; keep it as it is and add it once, after the "
                            "all-reduce (it then counts once, and its gradient is the dense one).")
                continue
            if p["scale"] != 1:
                return (f"{seen}, times {p['scale']:g}. Likely mistake: linear1's bias is scaled; each "
                        "rank computes whole hidden features, so it keeps its entries of the bias "
                        "as they are.")
            if whole and p["what"] == "w2" and gathered:
                return (f"Observed {where}: your module calls {', '.join(gathered)} and your "
                        f"{p['name']} holds the whole of linear2's weight. all_gather is not one of "
                        "the allowed collectives (one all-reduce in forward, one in backward): "
                        "Megatron's layout never gathers the hidden activations; each rank "
                        "multiplies its own hidden features by its columns of linear2, and g sums "
                        "the partial outputs.")
            if whole:
                return (f"{seen} (all of them). Likely mistake: this rank keeps the whole "
                        f"{'bias' if p['what'] == 'b1' else 'matrix'}; rank r keeps only its chunk r "
                        f"of {c} hidden features ({r * c}..{(r + 1) * c - 1}), as its own parameters.")
            if p["index"] == right:
                continue
            chunks = [list(range(k * c, (k + 1) * c)) for k in range(world_size)]
            if p["index"] in chunks:
                why = (f"that is chunk {chunks.index(p['index'])}, another rank's. The checker expects "
                       f"chunk r on rank r, in order (as the exercise says): {label} {r * c}.."
                       f"{(r + 1) * c - 1} on rank {r}")
            elif p["index"] == list(range(r, d_ff, world_size)):
                why = (f"that is one hidden feature in {world_size} (a strided split); the checker "
                       f"expects the contiguous chunk r on rank r: {label} {r * c}..{(r + 1) * c - 1}")
            else:
                why = (f"rank {r}'s own chunk is {r * c}..{(r + 1) * c - 1}: the ranks' shards "
                       "overlap, repeat or miss features, so some hidden features are counted twice "
                       f"and others never. Rank r keeps chunk r: {label} r*{c} .. (r+1)*{c} - 1")
            return f"{seen}. Likely mistake: {why}."
    return None


def name_scale(got: torch.Tensor, expected: torch.Tensor, tol: float = 1e-10) -> float | None:
    """c when ``got == c * expected`` (to ``tol``), else None."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return None
    e, g = expected.double(), got.double()
    norm = (e * e).sum().item()
    if norm == 0:
        return None
    c = (g * e).sum().item() / norm
    return c if (g - c * e).abs().max().item() <= tol * max(1.0, abs(c)) else None
