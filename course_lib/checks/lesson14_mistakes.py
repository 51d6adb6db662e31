"""Differential diagnosis for lesson 14's checkers: what each likely mistake would give on the same
inputs, and which one the learner's numbers match.

* ``describe_rows(shapes, batch, block, k)``: the micro-batches the model ran on, when they are not
  k pieces of B/k rows (shapes of the inputs the model saw).
* ``fit_micro_weights(grads, micro, stale)``: the weights w_i, c with ``grads = sum_i w_i g_i + c S``
  (g_i: micro-batch i's gradient, S: the stale ``.grad``), or None when no such mix explains them.
* ``name_accumulation(weights, stale, batch, k)``: (what is observed, the likely mistake) from those
  weights.
* ``label_rank_gradients(grads, locals_, rank)``: per parameter, what a rank's gradient equals (the
  mean, the sum times a factor, its own share's, another rank's, the elementwise max/min/product).
* ``name_averaging(labels, world, n_params, numels)``: (what is observed, the likely mistake) from
  every rank's labels.
* ``replica_runs(batches, ...)``: two replicas trained by hand in one process, for the Debug exercise's
  wrong fixes (seeds, shares, averaging, zeroing).
"""

from __future__ import annotations

from fractions import Fraction

import torch

from ..gpt import GPT, GPTConfig, lm_loss

__all__ = ["describe_rows", "fit_micro_weights", "name_accumulation", "label_rank_gradients",
           "name_averaging", "replica_runs", "fraction"]

TOL = 1e-6


def fraction(value: float) -> str:
    """``0.3333 -> "1/3"``, ``2.0 -> "2"``: a factor as a learner would write it."""
    f = Fraction(value).limit_denominator(10_000)
    if abs(float(f) - value) > 1e-6 * max(1.0, abs(value)):
        return f"{value:.4g}"
    return str(f)


def _near(a: float, b: float) -> bool:
    return abs(a - b) <= TOL * max(1.0, abs(b))


# --- gradient accumulation ----------------------------------------------------------------------

def describe_rows(shapes: list[tuple[int, ...]], batch: int, block: int, k: int) -> str | None:
    """What the model ran on, in words, when it is not k micro-batches of B/k rows; None if it is."""
    rows = [s[0] for s in shapes]
    size = batch // k
    if rows == [size] * k and all(s[1:] == (block,) for s in shapes):
        return None
    where = f"the model ran on {len(shapes)} batch{'es' if len(shapes) != 1 else ''} of shapes " \
            f"{[tuple(s) for s in shapes]}"
    if shapes and all(s == (batch, block) for s in shapes):
        return (f"{where}: the whole batch of B = {batch} rows at once, not k = {k} micro-batches of "
                f"B/k = {size} rows, so all of its activations are in memory together")
    if len(shapes) == size and all(s == (k, block) for s in shapes) and k != size:
        return (f"{where}: B/k = {size} pieces of k = {k} rows, not k = {k} micro-batches of B/k = "
                f"{size} rows (x.split(k) cuts pieces OF k rows; x.chunk(k) cuts k pieces)")
    if shapes and all(s == (k, block) for s in shapes) and k != size:
        return (f"{where}: pieces of k = {k} rows, not micro-batches of B/k = {size} rows, so rows "
                f"are missing: x holds B = {batch}")
    if len(shapes) == k and all(s[0] == batch and s[1] * k == block for s in shapes):
        return (f"{where}: every piece holds all {batch} rows and 1/k of the time steps: the batch is "
                f"cut along time (dim 1), not along the rows (dim 0)")
    if shapes and all(s == (size, block) for s in shapes):
        return (f"{where}: only {len(shapes)} of the k = {k} micro-batches of B/k = {size} rows ran"
                if len(shapes) < k else
                f"{where}: {len(shapes)} micro-batches of B/k = {size} rows, not k = {k} of them")
    return (f"{where}; accumulation runs it k = {k} times on micro-batches of B/k = {size} rows "
            "(x.chunk(k))")


def fit_micro_weights(grads: dict[str, torch.Tensor], micro: list[dict[str, torch.Tensor]],
                      stale: dict[str, torch.Tensor]) -> tuple[list[float], float] | None:
    """Least squares: ``grads = sum_i w_i micro[i] + c stale`` over every parameter; ``([w_i], c)``,
    or None when the residual is not at round-off level (no such mix explains the gradients)."""
    names = list(stale)
    target = torch.cat([grads[n].double().reshape(-1) for n in names])  # (P,)
    columns = [torch.cat([g[n].double().reshape(-1) for n in names]) for g in micro]
    columns.append(torch.cat([stale[n].double().reshape(-1) for n in names]))
    a = torch.stack(columns, dim=1)  # (P, k + 1)
    solution = torch.linalg.lstsq(a, target.unsqueeze(1)).solution.squeeze(1)  # (k + 1,)
    residual = (a @ solution - target).norm().item()
    if residual > 1e-8 * max(target.norm().item(), 1e-30) + 1e-12:
        return None
    values = solution.tolist()
    return values[:-1], values[-1]


def name_accumulation(weights: list[float], stale: float, batch: int, k: int) -> tuple[str, str]:
    """(what is observed, the likely mistake) for ``.grad = sum_i w_i g_i + c S``; the right answer
    is w_i = 1/k, c = 0."""
    mix = " + ".join(f"{fraction(w)} x g{i + 1}" for i, w in enumerate(weights))
    if abs(stale) > TOL:
        mix += f" + {fraction(stale)} x (the stale .grad)"
    right = " + ".join(f"1/{k} x g{i + 1}" for i in range(k))
    observed = (f"your .grad = {mix}, where g_i is the gradient of lm_loss on micro-batch i alone; the "
                f"whole batch's is {right}")
    mistakes = []
    if _near(stale, 1.0):
        mistakes.append("the previous step's gradients are still in .grad: backward adds to them; "
                        "zero them (model.zero_grad() or p.grad = None) once, before the first "
                        "micro-batch")
    elif abs(stale) > TOL:
        mistakes.append(f"the previous step's gradients are still in .grad, scaled by "
                        f"{fraction(stale)}: zero them once, before the first micro-batch")
    if all(_near(w, weights[0]) for w in weights):
        factor = weights[0] * k  # times the whole batch's gradient
        if _near(factor, 1.0):
            observed = (f"your .grad = the whole batch's gradient + {fraction(stale)} x the stale "
                        ".grad (the previous step's, which the checker left in .grad)")
        else:
            observed = f"your gradients are {fraction(factor)} times the whole batch's ({observed})"
        named = [
            (k, f"the gradients are k = {k} times too large: each micro-batch's mean loss counts "
                "fully, but backward adds the k gradients; divide each micro-batch's loss by k"),
            (k * k, f"each micro-batch's loss is multiplied by k = {k} instead of divided by it"),
            (1 / k, f"the gradients are divided by k = {k} twice (the loss by k, and .grad by k "
                    "again): divide once"),
            (k * k / batch, f"each micro-batch's loss is divided by B/k = {batch // k} (its number "
                            f"of rows) instead of by k = {k}: lm_loss is already a mean over the rows"),
            (k / batch, f"each micro-batch's loss is divided by B = {batch} (all the rows) instead "
                        f"of by k = {k}: lm_loss is already a mean over the rows"),
            (0.0, "no micro-batch's gradient is left in .grad: the gradients are zeroed (or "
                  "replaced) after the last backward"),
        ]
        if not _near(factor, 1.0):
            for value, message in named:
                if _near(factor, value):
                    mistakes.append(message)
                    break
            else:
                mistakes.append(f"every micro-batch's gradient counts {fraction(weights[0])} times, "
                                f"not 1/k = 1/{k} times")
    elif all(abs(w) <= TOL for w in weights[:-1]):
        times = "" if _near(weights[-1], 1.0) else f" (times {fraction(weights[-1])})"
        mistakes.append(f"only the last micro-batch's gradient is left{times}: the gradients are "
                        "zeroed inside the loop; zero them once, before it")
    elif all(abs(w) > TOL for w in weights) and all(
            _near(weights[i + 1] / weights[i], k) for i in range(k - 1)):
        mistakes.append(f".grad is divided by k = {k} after every backward, which shrinks the "
                        "earlier micro-batches' gradients again and again: divide each loss by k "
                        "once (or .grad once, after the loop)")
    else:
        mistakes.append(f"the micro-batches do not count equally; each must count 1/k = 1/{k}")
    if not mistakes:  # only the stale part was wrong, handled above; never reached for a right fit
        mistakes.append("the gradients are not the whole batch's")
    if len(mistakes) == 2:
        return observed, f"two of them: {mistakes[0]}; and {mistakes[1]}"
    return observed, mistakes[0]


# --- averaging the gradients --------------------------------------------------------------------

def label_rank_gradients(grads: dict[str, torch.Tensor], locals_: list[dict[str, torch.Tensor]],
                         rank: int, tol: float = 1e-12) -> dict[str, set]:
    """Per parameter, every description that fits this rank's gradient: ``("mean",)``,
    ``("sum", factor)`` (the sum over the ranks times a factor), ``("own",)``, ``("rank", s)``,
    ``("max",)``, ``("min",)``, ``("product",)``. locals_[r]: rank r's own share's gradients."""
    labels: dict[str, set] = {}
    for n, g in grads.items():
        stack = torch.stack([loc[n] for loc in locals_])  # (N, *shape)
        total = stack.sum(0)
        fits: set = set()
        if not stack.any() and not g.any():  # no rank has a gradient here (k_proj's bias): no clue
            continue

        def close(t: torch.Tensor) -> bool:
            return g.shape == t.shape and bool(torch.allclose(g, t, rtol=0, atol=tol))

        if close(total / len(locals_)):
            fits.add(("mean",))
        if close(locals_[rank][n]):
            fits.add(("own",))
        for s in range(len(locals_)):
            if s != rank and close(locals_[s][n]):
                fits.add(("rank", s))
        for op, value in (("max", stack.amax(0)), ("min", stack.amin(0)), ("product", stack.prod(0))):
            if close(value):
                fits.add((op,))
        norm = total.double().pow(2).sum().item()
        if g.shape == total.shape and norm > 0:
            factor = (g.double() * total.double()).sum().item() / norm
            if close(total * factor):
                fits.add(("sum", float(f"{factor:.10g}")))
        labels[n] = fits
    return labels


def _describe(label: tuple, world: int, rank: int) -> str:
    kind = label[0]
    if kind == "mean":
        return "the whole batch's (right)"
    if kind == "own":
        return f"still rank {rank}'s own share's"
    if kind == "rank":
        return f"rank {label[1]}'s own share's"
    if kind in ("max", "min", "product"):
        word = {"max": "maximum", "min": "minimum", "product": "product"}[kind]
        return f"the elementwise {word} of the {world} ranks' share gradients"
    factor = label[1]
    if _near(factor, 1.0):
        return f"the SUM over the {world} ranks ({world} times the whole batch's)"
    if factor > 0 and _near(1 / factor, round(1 / factor)):
        return f"the sum over the ranks divided by {round(1 / factor)}"
    return f"the sum over the ranks times {fraction(factor)}"


def name_averaging(labels: list[dict[str, set]], world: int, n_params: int,
                   numels: dict[str, int]) -> tuple[str, str] | None:
    """(what is observed, the likely mistake) from every rank's per-parameter labels, or None when
    no description fits."""
    per_rank: list[tuple | None] = []
    if not any(labels):
        return None
    for rank_labels in labels:
        common = None
        for fits in rank_labels.values():
            common = set(fits) if common is None else common & fits
        sums = [next((f for f in fits if f[0] == "sum"), None) for fits in rank_labels.values()]
        if common and ("mean",) in common:
            per_rank.append(("mean",))
        elif common:
            order = ["own", "rank", "max", "min", "product", "sum"]
            per_rank.append(sorted(common, key=lambda f: order.index(f[0]))[0])
        elif all(s is not None for s in sums) and all(
                _near(s[1] * numels[n], 1.0) for s, n in zip(sums, rank_labels)):
            per_rank.append(("per_numel",))
        else:
            per_rank.append(None)
    if all(lab is not None and lab == per_rank[0] for lab in per_rank):
        label = per_rank[0]
        kind = label[0]
        if kind == "per_numel":
            return ("every parameter's gradient is the sum over the ranks divided by that parameter's "
                    "number of elements (p.numel())",
                    "the sum is divided by p.numel(), not by the number of ranks: divide by "
                    "dist.get_world_size()")
        observed = f"every rank's gradients are {_describe(label, world, 0).replace(' of rank 0', '')}"
        if kind in ("max", "min", "product"):
            op = {"max": "MAX", "min": "MIN", "product": "PRODUCT"}[kind]
            return (observed, f"the all-reduce combines the ranks with ReduceOp.{op}; an average is the "
                              "SUM (all_reduce's default op) divided by the world size")
        if kind == "sum":
            factor = label[1]
            if _near(factor, 1.0):
                return (observed, "each rank's loss is already a mean over its share, so the ranks' "
                                  "gradients must be averaged: divide the sum by the world size")
            if _near(factor * n_params, 1.0):
                return (observed + f", and {n_params} is the number of parameters",
                        f"the sum is divided by the number of parameters ({n_params}), not by the "
                        f"number of ranks ({world}): divide by dist.get_world_size()")
            return (observed + f", on {world} ranks",
                    f"the sum is divided by {fraction(1 / factor)} on {world} ranks: divide by "
                    "dist.get_world_size()")
        return None  # own / rank: the checker's own messages name these
    parts = []
    for rank, label in enumerate(per_rank):
        parts.append(f"rank {rank}'s are " + (_describe(label, world, rank) if label else "none of "
                                               "the mean, the sum or a share's"))
    observed = "the ranks' gradients differ: " + "; ".join(parts)
    factors = [lab[1] if lab and lab[0] == "sum" else (1 / world if lab == ("mean",) else None)
               for lab in per_rank]
    if all(f is not None for f in factors):
        divisors = [1 / f for f in factors]
        if all(_near(d, r + 1) for r, d in enumerate(divisors)):
            return (observed, "rank r divides the sum by r + 1 (dist.get_rank() + 1): divide by the "
                              "world size, the same number on every rank")
        return (observed, "the ranks divide the sum by different numbers: every rank must divide by "
                          "the world size")
    if all(lab is not None for lab in per_rank):
        return (observed, "the ranks do different things to their gradients: every rank must end "
                          "with the same average")
    # within a rank, the parameters differ: some averaged, some not
    rank = next(r for r, lab in enumerate(per_rank) if lab is None)
    left = {n: fits for n, fits in labels[rank].items() if ("mean",) not in fits}
    own = [n for n, fits in left.items() if ("own",) in fits]
    shown = ", ".join(list(left)[:3]) + (" ..." if len(left) > 3 else "")
    what = ("still rank's own share's gradients" if len(own) == len(left)
            else "not the average")
    return (f"on rank {rank}, {n_params - len(left)} of {n_params} gradients are the whole batch's, "
            f"but {len(left)} ({shown}) are {what.replace('rank', f'rank {rank}')}",
            "only some of the parameters' gradients are averaged: average every parameter's "
            "gradient (model.parameters())")


# --- the Debug exercise: two replicas by hand ---------------------------------------------------

def _model(seed: int) -> GPT:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(GPTConfig(vocab_size=67, max_len=16, d_model=32, num_heads=4, num_layers=2)).double()


def replica_runs(batches: list, seeds: tuple[int, int] = (1337, 1338), combine: str = "mean",
                 shares: str = "rows", zero: bool = True, average_weights: bool = False,
                 copy_after_step: int | None = None) -> list[dict[str, torch.Tensor]]:
    """Two replicas trained by hand in one process, with AdamW (lr 1e-2), each on its share of every
    batch; returns both replicas' weights.

    combine: "mean" (average the gradients), "sum" (sum them), "none" (keep each rank's own).
    shares: "rows" (x.chunk(2)[rank]), "first" (every rank the first half), "time" (x.chunk(2, dim=1)).
    average_weights: average the weights after every step as well.
    copy_after_step: copy that replica's weights to both after every step."""
    models = [_model(seed) for seed in seeds]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in models]
    for x, y in batches:
        for rank, (model, optimizer) in enumerate(zip(models, optimizers)):
            if shares == "rows":
                xs, ys = x.chunk(2)[rank], y.chunk(2)[rank]
            elif shares == "first":
                xs, ys = x.chunk(2)[0], y.chunk(2)[0]
            else:
                xs, ys = x.chunk(2, dim=1)[rank], y.chunk(2, dim=1)[rank]
            if zero:
                optimizer.zero_grad()
            lm_loss(model(xs), ys).backward()
        if combine != "none":
            for p0, p1 in zip(models[0].parameters(), models[1].parameters()):
                total = p0.grad + p1.grad
                p0.grad, p1.grad = (total / 2, total / 2) if combine == "mean" else (total, total.clone())
        for optimizer in optimizers:
            optimizer.step()
        if average_weights:
            with torch.no_grad():
                for p0, p1 in zip(models[0].parameters(), models[1].parameters()):
                    mean = (p0 + p1) / 2
                    p0.copy_(mean)
                    p1.copy_(mean)
        if copy_after_step is not None:
            with torch.no_grad():
                for pair in zip(models[0].parameters(), models[1].parameters()):
                    pair[1 - copy_after_step].copy_(pair[copy_after_step])
    return [{n: p.detach().clone() for n, p in m.named_parameters()} for m in models]
