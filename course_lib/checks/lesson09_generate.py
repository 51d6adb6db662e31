"""Checker for lesson 09's sampling loop (★★).

* ``check_generate(fn)``: the sampling loop; the same tokens as ``GPT.generate`` for the same seed,
  or, for another way of sampling, draws that follow the right distribution (``_distribution_check``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..gpt import GPT, GPTConfig
from .common import CheckFailure, calls_to, checker, expect_shape, is_course_lib, one_thread, passed
from .lesson09_gpt import learner_time_limit, random_gpt

__all__ = ["check_generate"]


# ----------------------------------------------------------------------------------------------
# check_generate (build, ★★): the sampling loop, checked against GPT.generate
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def _generate_variant(model: GPT, ids: torch.Tensor, n: int, temperature: float, top_k: int | None,
                      generator: torch.Generator, crop: str = "last", temp: str = "divide",
                      topk: str = "keep_k", where: int | str = -1,
                      sample: str = "multinomial") -> torch.Tensor:
    """The sampling loop, with one knob per plausible mistake; the defaults give
    ``model.generate(ids, n, temperature, top_k, generator=generator, use_cache=False)``."""
    out = ids
    L = model.config.max_len
    for _ in range(n):
        context = {"last": out[:, -L:], "first": out[:, :L], "minus_one": out[:, -(L - 1):],
                   "prompt": ids[:, -L:]}[crop]
        scores = model(context)  # (B, <= L, V)
        logits = scores.mean(1) if where == "mean" else scores[:, where]  # (B, V)
        if temp in ("divide", "twice"):
            logits = logits / temperature
        elif temp == "multiply":
            logits = logits * temperature
        if top_k is not None and topk != "ignored":
            k = {"keep_k": top_k, "k_plus_1": top_k + 1, "k_minus_1": max(top_k - 1, 1)}.get(topk, top_k)
            k = min(k, logits.size(-1))
            kth = logits.sort(dim=-1, descending=True, stable=True).values[:, k - 1 : k]  # (B, 1)
            fill = 0.0 if topk == "zero" else float("-inf")
            logits = logits.masked_fill(logits < kth, fill)
            if temp == "twice":  # divided once more after the filter
                logits = logits / temperature
        if sample == "greedy":
            next_id = logits.argmax(-1, keepdim=True)
        else:
            probs = logits.softmax(0) if sample == "batch_axis" else logits.softmax(-1)
            next_id = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
        out = torch.cat([out, next_id], dim=1)
    return out


_GENERATE_MISTAKES: list[tuple[dict[str, Any], str]] = [
    ({"crop": "first"}, "the context is cropped to the FIRST max_len tokens (out[:, :max_len]); "
     "the model must read the LAST max_len tokens, the ones just before the next token"),
    ({"crop": "minus_one"}, "the context is cropped to the last max_len - 1 tokens: the model has "
     "max_len positions (0..max_len-1), so it can read the last max_len tokens"),
    ({"crop": "prompt"}, "the model reads the prompt at every step, never the tokens drawn since: "
     "each step's logits must come from the text so far, prompt and new tokens"),
    ({"where": 0}, "the next token is drawn from the logits of the first position ([:, 0]); the "
     "prediction for the next token is at the LAST position, [:, -1]"),
    ({"where": "mean"}, "the next token's logits are averaged over all positions; the prediction "
     "for the next token is the LAST position's, [:, -1]"),
    ({"temp": "multiply"}, "the logits are multiplied by the temperature; divide them: T < 1 "
     "sharpens, T > 1 flattens"),
    ({"temp": "ignored"}, "the temperature changes nothing in your draws: divide the LOGITS by it "
     "before softmax (dividing the probabilities does nothing, multinomial renormalises them)"),
    ({"topk": "ignored"}, "top_k changes nothing in your draws: only the top_k LARGEST logits may "
     "be drawn (the others set to -inf before softmax); a filter that keeps more, say everything "
     "above the k-th smallest, keeps almost every token"),
    ({"topk": "k_plus_1"}, "top-k keeps top_k + 1 tokens (an off-by-one at the k-th value)"),
    ({"topk": "k_minus_1"}, "top-k keeps top_k - 1 tokens: keep every logit >= the k-th largest "
     "(torch.topk(logits, k).values[:, -1:]); '>' drops the k-th itself"),
    ({"topk": "zero"}, "the logits outside the top k are set to 0, not -inf: softmax still gives "
     "them probability. Fill them with float('-inf')"),
    ({"temp": "twice"}, "the logits are divided by the temperature twice "
     "(before and after the top-k filter): a temperature T acts as T squared"),
    ({"sample": "batch_axis"}, "softmax runs over the batch axis (dim 0): the probabilities of each "
     "row must sum to 1 over the vocabulary, softmax(dim=-1)"),
    ({"sample": "greedy"}, "you take the argmax: this exercise samples, torch.multinomial(probs, 1, "
     "generator=generator)"),
]


@checker
def check_generate(fn: Callable[..., Any]) -> None:
    """Check ``fn(model, ids (B, T), max_new_tokens, temperature=1.0, top_k=None, generator=None)
    -> (B, T + max_new_tokens)``: the same tokens as ``GPT.generate`` with the same seed. The global
    random state is left as it was."""
    with torch.random.fork_rng(devices=[]), one_thread():
        _check_generate(fn)


def _check_generate(fn: Callable[..., Any]) -> None:
    if is_course_lib(fn):
        raise CheckFailure("You handed in one of course_lib's own functions: write the loop yourself.")
    config = GPTConfig(vocab_size=37, max_len=12, d_model=16, num_heads=2, num_layers=1, d_ff=24)
    # (case, B, prompt length, new tokens, temperature, top_k, seed): past max_len in every case
    cases = [
        ("B=1, prompt of 5, 20 new, temperature 1.0", 1, 5, 20, 1.0, None, 0),
        ("B=2, prompt of 3, 16 new, temperature 0.6, top_k=5", 2, 3, 16, 0.6, 5, 1),
        ("B=1, prompt of 12 (= max_len), 8 new, temperature 1.7, top_k=3", 1, 12, 8, 1.7, 3, 2),
        ("B=2, prompt of 4, 0 new", 2, 4, 0, 1.0, None, 3),
    ]
    sampled_otherwise = []
    for case, B, T, n, temperature, top_k, seed in cases:
        model = random_gpt(config, seed, std=0.5)
        ids = torch.randint(0, config.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))
        got = _run_generate(fn, model, ids, n, temperature, top_k, 100 + seed, case)
        expected = model.generate(ids, n, temperature, top_k,
                                  generator=torch.Generator().manual_seed(100 + seed), use_cache=False)
        _expect_tokens(got, ids, n, case)
        if torch.equal(got, expected):
            continue
        shared = torch.Generator().manual_seed(100 + seed)  # one sequence at a time, one generator
        rows = [model.generate(ids[b : b + 1], n, temperature, top_k, generator=shared, use_cache=False)
                for b in range(B)]
        if torch.equal(got, torch.cat(rows)):
            continue
        if not torch.equal(got[:, :T], ids):
            raise CheckFailure(f"The first {T} tokens of your output are not the prompt ({case}): "
                               "return the prompt followed by the new tokens, torch.cat along dim 1.")
        for knobs, message in _GENERATE_MISTAKES:
            if knobs.get("topk") and top_k is None:
                continue
            try:
                wrong = _generate_variant(model, ids, n, temperature, top_k,
                                          torch.Generator().manual_seed(100 + seed), **knobs)
            except RuntimeError:  # a variant that cannot run here (no distribution) does not match
                continue
            if torch.equal(got, wrong):
                raise CheckFailure(f"Likely mistake ({case}): {message}.", mistake=message)
        again = _run_generate(fn, model, ids, n, temperature, top_k, 100 + seed, case, global_seed=7)
        if not torch.equal(again, got):
            raise CheckFailure(
                f"Your draws do not come from `generator` ({case}): the same generator seed gave "
                "other tokens after a different torch.manual_seed. Pass it on: "
                "torch.multinomial(probs, 1, generator=generator)."
            )
        # Other draws than GPT.generate's for the same seed: another way of sampling (top-k by
        # gather, Gumbel-max, ...) is right if the draws follow the right distribution.
        _distribution_check(fn, model, temperature, top_k, case, seed)
        sampled_otherwise.append(case)
    if not sampled_otherwise:
        passed("check_generate", len(cases))
        return
    print(f"check_generate: all {len(cases)} cases right. Your tokens differ from GPT.generate's for "
          f"the same seed in {len(sampled_otherwise)} of them (you sample another way, which is "
          f"fine), so the checker drew {_DRAW_ROWS * _DRAW_STEPS:,} tokens with your loop in each: "
          "they follow the model's distribution (temperature, top-k, the last max_len tokens). "
          "Well done!")


_DRAW_ROWS, _DRAW_STEPS = 250, 8  # the distribution test: 2,000 draws, past max_len
_FALSE_ALARM = 1e-9  # the chance that the test refuses a right sampler, at most


@torch.no_grad()
def _step_probs(model: GPT, out: torch.Tensor, prompt_len: int, temperature: float,
                top_k: int | None, crop: str = "last", temp: str = "divide", topk: str = "keep_k",
                where: int | str = -1, sample: str = "multinomial") -> torch.Tensor:
    """The probabilities (N, V), float64, from which the next token after ``out (N, t)`` (its
    first ``prompt_len`` tokens the prompt) is drawn: right (the defaults, as ``GPT.generate``) or
    with the named mistake of ``_generate_variant``."""
    L = model.config.max_len
    context = {"last": out[:, -L:], "first": out[:, :L], "minus_one": out[:, -(L - 1):],
               "prompt": out[:, :prompt_len][:, -L:]}[crop]
    scores = model(context).double()  # (N, <= L, V)
    logits = scores.mean(1) if where == "mean" else scores[:, where]  # (N, V)
    if temp in ("divide", "twice"):
        logits = logits / temperature
    elif temp == "multiply":
        logits = logits * temperature
    if top_k is not None and topk != "ignored":
        k = {"keep_k": top_k, "k_plus_1": top_k + 1, "k_minus_1": max(top_k - 1, 1)}.get(topk, top_k)
        kth = logits.sort(dim=-1, descending=True).values[:, min(k, logits.size(-1)) - 1:][:, :1]
        logits = logits.masked_fill(logits < kth, 0.0 if topk == "zero" else float("-inf"))
        if temp == "twice":
            logits = logits / temperature
    if sample == "greedy":
        return F.one_hot(logits.argmax(-1), logits.size(-1)).double()
    return logits.softmax(-1)


def _distribution_check(fn: Callable[..., Any], model: GPT, temperature: float, top_k: int | None,
                        case: str, seed: int) -> None:
    """Pass if the learner's loop draws from the right distribution, else fail naming the mistake.

    The loop continues 250 random prompts of max_len - 2 tokens by 8 tokens each (past max_len).
    For each draw, the right probabilities given the learner's own text so far are computed. Three
    tests, each refusing a right sampler with probability <= 1e-9 whatever the seed:
    * a drawn token of probability 0 (outside the top k) is impossible;
    * likelihood ratios: a named mistake is chosen when its probabilities make the draws more
      than 1e9 times likelier than the right ones (times the number of mistakes tried; Ville's
      inequality bounds the chance of that under the right distribution);
    * the probability integral transform: under the right distribution, F(x-) + U p(x) is
      uniform, and the DKW inequality bounds the Kolmogorov-Smirnov distance of 2,000 of them.
    """
    L, V = model.config.max_len, model.config.vocab_size
    T, n = L - 2, _DRAW_STEPS
    ids = torch.randint(0, V, (_DRAW_ROWS, T), generator=torch.Generator().manual_seed(500 + seed))
    got = _run_generate(fn, model, ids, n, temperature, top_k, 600 + seed, case, seconds=300.0)
    _expect_tokens(got, ids, n, case)
    options = [({}, "")] + [(knobs, message) for knobs, message in _GENERATE_MISTAKES
                            if (top_k is not None or not knobs.get("topk"))
                            and knobs.get("sample") != "batch_axis"]  # that one depends on the batch
    log_lik = torch.zeros(len(options), dtype=torch.float64)
    p_drawn, p_before, p_tied = ([[] for _ in options] for _ in range(3))
    for j in range(n):
        prefix, drawn = got[:, : T + j], got[:, T + j : T + j + 1]  # (N, T + j), (N, 1)
        for i, (knobs, _) in enumerate(options):
            q = _step_probs(model, prefix, T, temperature, top_k, **knobs)  # (N, V)
            px = q.gather(1, drawn)  # (N, 1)
            log_lik[i] += px.log().sum()
            p_drawn[i].append(px[:, 0])
            p_before[i].append((q * (q > px)).sum(-1))  # tokens likelier than the drawn one
            p_tied[i].append((q * (q == px)).sum(-1))
    M = _DRAW_ROWS * n
    jitter = torch.rand(M, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    bound = math.sqrt(math.log(2 / _FALSE_ALARM) / (2 * M))

    def ks_distance(i: int) -> float:  # how far the draws are from option i's distribution
        u = (torch.cat(p_before[i]) + jitter * torch.cat(p_tied[i])).sort().values  # (M,)
        grid = torch.arange(1, M + 1, dtype=torch.float64) / M
        return torch.maximum(grid - u, u - (grid - 1 / M)).max().item()

    margin = math.log(len(options) / _FALSE_ALARM)
    ratios = log_lik - log_lik[0]
    best = int(ratios[1:].argmax()) + 1
    if ratios[best] > margin and ks_distance(best) <= bound:
        raise CheckFailure(f"Likely mistake ({case}; your draws, {M:,} of them, follow this "
                           f"mistake's probabilities): {options[best][1]}.")
    p_drawn = torch.cat(p_drawn[0])
    outside = int((p_drawn == 0).sum())
    if outside:
        raise CheckFailure(
            f"Your loop drew {outside} tokens of probability 0 ({case}, {_DRAW_ROWS * n:,} draws): "
            f"tokens outside the top {top_k}, which may never be drawn. Only the top_k "
            "highest-scoring tokens of each step may be drawn.")
    distance = ks_distance(0)  # F(x-) + U p(x) is uniform on [0, 1] if the draws are right
    if distance > bound:
        u_mean = (torch.cat(p_before[0]) + jitter * torch.cat(p_tied[0])).mean().item()
        likely = "likelier" if u_mean < 0.5 else "less likely"
        raise CheckFailure(
            f"Your draws do not follow the model's distribution ({case}): over {M:,} draws, your "
            f"loop picks {likely} tokens than the model's distribution gives (Kolmogorov-Smirnov "
            f"distance {distance:.3f}; right samplers stay below {bound:.3f}). None of the usual "
            "mistakes explains "
            "it. Each step: the logits of the last position of the last max_len tokens, divided "
            "by the temperature, only the top_k highest may be drawn, one draw per row."
        )


def _run_generate(fn: Callable[..., Any], model: GPT, ids: torch.Tensor, n: int, temperature: float,
                  top_k: int | None, seed: int, case: str, global_seed: int = 0,
                  seconds: float = 60.0) -> Any:
    """The learner's loop, with a step limit (forward passes), a time limit, and named errors."""
    calls = {"n": 0}
    limit = ids.size(0) * 3 * (n + ids.size(1)) + 10  # one sequence at a time is welcome

    def count(module: Any, inputs: Any) -> None:  # noqa: ARG001
        calls["n"] += 1
        if calls["n"] > limit:
            raise CheckFailure(
                f"Your loop ran more than {limit} forward passes for {n} new tokens ({case}) and "
                "was stopped: it should run exactly max_new_tokens steps."
            )

    handle = model.register_forward_pre_hook(count)
    torch.manual_seed(global_seed)
    try:
        with calls_to([GPT.generate]) as seen, learner_time_limit(seconds, case):
            got = fn(model, ids.clone(), n, temperature=temperature, top_k=top_k,
                     generator=torch.Generator().manual_seed(seed))
    except (NotImplementedError, CheckFailure):
        raise
    except Exception as err:
        raise CheckFailure(_generate_error(err, case, model.config.max_len, ids.size(0))) from err
    finally:
        handle.remove()
    if seen:
        raise CheckFailure("Your function calls model.generate, the reference it is checked "
                           "against: write the loop yourself (model(...) gives the logits).")
    return got


def _generate_error(err: Exception, case: str, max_len: int, B: int) -> str:
    text = str(err)
    where = f"({case}; {type(err).__name__}: {err})"
    if "must have same number of dimensions" in text:
        return (f"The new tokens and the text have different numbers of axes {where}: the text is "
                f"(B, T) and torch.cat along dim 1 needs the new tokens as (B, 1); yours lost that "
                "axis (an argmax, max or squeeze without keepdim).")
    if B > 1 and "must match the size" in text and (f"size of tensor b ({B})" in text
                                                    or f"size of tensor a ({B})" in text):
        return (f"A value per row has shape (B,) = ({B},) and met the logits (B, V) {where}: "
                "broadcasting lines up the LAST axes, so (B,) is read as one value per vocabulary "
                "entry. A per-row threshold (the k-th largest logit) must keep its axis: (B, 1).")
    if "positions but the model has" in text:
        return (f"The text grew past max_len = {max_len} and went to the model whole {where}: "
                f"learned positions stop at max_len, so feed only the last max_len tokens, "
                f"out[:, -max_len:], at every step.")
    if "probability tensor" in text or "invalid multinomial distribution" in text:
        return (f"torch.multinomial was given something that is not a probability distribution "
                f"{where}: apply softmax to the (divided, filtered) logits first.")
    if "unexpected keyword" in text or "positional argument" in text:
        return (f"Your function's arguments differ from the exercise's {where}: "
                "my_generate(model, ids, max_new_tokens, temperature=1.0, top_k=None, generator=None).")
    return f"Your code raised {type(err).__name__} ({case}): {err}."


def _expect_tokens(got: Any, ids: torch.Tensor, n: int, case: str) -> None:
    B, T = ids.shape
    if not isinstance(got, torch.Tensor):
        raise CheckFailure(f"Return a tensor of token ids (B, T + max_new_tokens), got "
                           f"{type(got).__name__} ({case}).")
    if (got.dim() == 2 and got.size(0) == B and got.size(1) == n and n > T
            and torch.equal(got[:, :T], ids)):
        raise CheckFailure(f"Your output has max_new_tokens = {n} tokens in all, the prompt "
                           f"included ({case}): max_new_tokens counts the NEW tokens, so return "
                           f"(B, T + max_new_tokens) = {(B, T + n)}.")
    if got.dim() == 2 and got.size(0) == B and got.size(1) == n and n != T + n:
        raise CheckFailure(f"You return only the {n} new tokens ({case}): return the prompt "
                           f"followed by them, (B, T + max_new_tokens) = {(B, T + n)}.")
    if got.dim() == 2 and got.size(0) == B and got.size(1) != T + n:
        extra = got.size(1) - (T + n)
        raise CheckFailure(
            f"Your output has {got.size(1)} tokens, expected T + max_new_tokens = {T + n} ({case}): "
            f"{abs(extra)} too {'many' if extra > 0 else 'few'}; the loop runs max_new_tokens times."
        )
    expect_shape(got, (B, T + n), f"the generated ids ({case})", "(B, T + max_new_tokens).")
    if got.dtype != torch.long:
        raise CheckFailure(f"The ids have dtype {got.dtype}, expected torch.long ({case}).")
