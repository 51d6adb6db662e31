"""Checkers for the exercises of lesson 03 (embeddings and positions).

- ``check_positional_encoding(fn)``: ``fn(max_len, d_model) -> (max_len, d_model)``, the paper's
  sinusoids.
- ``check_token_embedding(cls)``: ``cls(vocab_size, d_model)`` with an ``nn.Embedding`` named
  ``embedding``; ``forward(ids (B, L)) -> (B, L, d_model)`` scaled by ``sqrt(d_model)``.
- ``check_pe_dot_prediction(fn)``, ``check_token_norm_prediction(fn)``: "predict, then
  run" questions; ``fn()`` returns a number, the checker computes the truth itself and explains it.
- ``check_fixed_positional_encoding(fn)``: the debug exercise, a blog post's loop with the `2*i` and
  `i+1` bugs fixed; ``fn(max_len, d_model)`` for even ``d_model`` must equal the paper's sinusoids.
- ``check_embedding_layer(cls)``: a BERT-style layer ``cls(vocab_size, d_model, max_len, dropout)``
  with ``token``, ``position`` (both ``nn.Embedding``), ``norm`` (``nn.LayerNorm``) and ``dropout``;
  ``forward(ids) = dropout(norm(token(ids) + position(0..L-1)))``, no ``sqrt(d_model)`` scaling.
"""

from __future__ import annotations

import contextlib
import math
import numbers

import torch
import torch.nn.functional as F
from torch import nn

from ..embeddings import TokenEmbedding, TransformerEmbedding, sinusoidal_positional_encoding
from .common import (
    CheckFailure,
    is_course_lib,
    Mistake,
    checker,
    compare,
    expect_finite,
    expect_shape,
    load_reference_weights,
    passed,
    run_learner,
)

def _refuse_course_lib(candidate, what: str) -> None:
    """Fail if the learner handed in course_lib's own object instead of writing one."""
    if candidate is sinusoidal_positional_encoding or is_course_lib(candidate):
        raise CheckFailure(
            f"This is course_lib's own `{getattr(candidate, '__name__', candidate)}`, the reference "
            f"the checker compares with, not code of yours: it passes trivially and teaches "
            f"nothing. Write {what} yourself."
        )


__all__ = [
    "check_positional_encoding",
    "check_token_embedding",
    "check_embedding_layer",
    "check_token_norm_prediction",
    "check_pe_dot_prediction",
    "check_fixed_positional_encoding",
]


# --------------------------------------------------------------------------- positional encoding
def _pe_from(
    max_len: int,
    d_model: int,
    sin_exp,
    cos_exp,
    base: float = 10000.0,
    start: int = 0,
    swap: bool = False,
    divide: bool = True,
) -> torch.Tensor:
    """A sinusoid table where column ``j`` uses ``pos / base**exp(j)``; ``sin_exp``/``cos_exp`` map
    the column index to the exponent for sine (even) and cosine (odd) columns."""
    pos = torch.arange(start, start + max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    for j in range(d_model):
        even = j % 2 == 0
        exp = sin_exp(j) if even else cos_exp(j)
        angle = pos[:, 0] / base ** exp if divide else pos[:, 0] * base**exp
        use_sin = even != swap
        pe[:, j] = torch.sin(angle) if use_sin else torch.cos(angle)
    return pe.float()


def _pe_angles(max_len: int, d_model: int) -> torch.Tensor:
    """(max_len, ceil(d_model / 2)) angles pos * 10000**(-2i/d_model), float64."""
    pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    return pos / 10000.0 ** (two_i / d_model)


def _pe_floor_angle(max_len: int, d_model: int) -> torch.Tensor:
    angles = torch.floor(_pe_angles(max_len, d_model))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe.float()


def _pe_halves(max_len: int, d_model: int) -> torch.Tensor:
    angles = _pe_angles(max_len, d_model)
    return torch.cat([torch.sin(angles), torch.cos(angles[:, : d_model // 2])], dim=-1).float()


def _pair(j: int) -> int:
    """Column j belongs to the pair whose sine sits in column 2i = j - j % 2."""
    return j - j % 2


def _pe_mistakes() -> list[Mistake]:
    right = lambda d: (lambda j: _pair(j) / d)  # noqa: E731  exponent 2i / d_model
    mistakes = [
        Mistake(
            "frequencies off by a factor of 2 (the `2*i` bug: the exponent is doubled)",
            "Your loop index already steps by 2 (0, 2, 4, ...), so it IS the paper's 2i: use "
            "`10000 ** (i / d_model)`, not `10000 ** (2 * i / d_model)`. With the doubled "
            "exponent the "
            "wavelengths grow twice as fast and half the columns are almost constant.",
            lambda n, d: _pe_from(n, d, lambda j: 2 * _pair(j) / d, lambda j: 2 * _pair(j) / d),
        ),
        Mistake(
            "the cosine uses the next pair's frequency (the `i+1` bug)",
            "Column 2i+1 must use the SAME frequency as its sine partner in column 2i: "
            "`cos(pos / 10000 ** (2i / d_model))`, not `10000 ** ((2i + 2) / d_model)`. With the "
            "next frequency every cosine sits one column before its sine, column 0's sine has no "
            "cosine at all, and the table is not the paper's.",
            lambda n, d: _pe_from(n, d, lambda j: _pair(j) / d, lambda j: (_pair(j) + 2) / d),
        ),
        Mistake(
            "both bugs of a popular blog post's loop at once: exponent doubled (`2*i`) and the "
            "cosine "
            "on the next frequency (`2*(i+1)`)",
            "With `for i in range(0, d_model, 2)` the exponent is `i / d_model` for BOTH "
            "`pe[pos, i] = sin(...)` and `pe[pos, i + 1] = cos(...)`; do not write 2*i, and do "
            "not use i+1 "
            "inside the cosine.",
            lambda n, d: _pe_from(
                n, d, lambda j: 2 * _pair(j) / d, lambda j: 2 * (_pair(j) + 1) / d
            ),
        ),
        Mistake(
            "each column uses its own index j in the exponent (cosine columns are half a step off)",
            "The exponent belongs to the PAIR: columns 2i and 2i+1 both use 2i / d_model. For an "
            "odd "
            "column j use j - 1, e.g. `two_i = j - j % 2`.",
            lambda n, d: _pe_from(n, d, lambda j: j / d, lambda j: j / d),
        ),
        Mistake(
            "exponent halved (i / d_model with i the pair number)",
            "If i counts pairs (0, 1, 2, ...), the exponent is 2 * i / d_model, not i / d_model.",
            lambda n, d: _pe_from(n, d, lambda j: _pair(j) / (2 * d), lambda j: _pair(j) / (2 * d)),
        ),
        Mistake(
            "sin and cos swapped (cosine on the even columns)",
            "Even columns 0, 2, 4, ... hold the sine, odd columns the cosine: `pe[:, 0::2] = sin`, "
            "`pe[:, 1::2] = cos`.",
            lambda n, d: _pe_from(n, d, right(d), right(d), swap=True),
        ),
        Mistake(
            "positions start at 1 instead of 0",
            "The first token has position 0: `torch.arange(max_len)`, so row 0 is [0, 1, 0, 1, "
            "...].",
            lambda n, d: _pe_from(n, d, right(d), right(d), start=1),
        ),
        Mistake(
            "multiplied by 10000^(2i/d_model) instead of dividing",
            "The angle is pos / 10000^(2i/d_model) (slower and slower waves), i.e. pos * "
            "10000^(-2i/d_model).",
            lambda n, d: _pe_from(n, d, right(d), right(d), divide=False),
        ),
    ]
    mistakes += [
        Mistake(
            "integer division `//` in the exponent (every column gets the same frequency)",
            "`two_i // d_model` is 0 for every column (two_i < d_model), so every pair becomes "
            "sin(pos), cos(pos). Use true division: `10000 ** (two_i / d_model)`.",
            lambda n, d: _pe_from(n, d, lambda j: 0.0, lambda j: 0.0),
        ),
        Mistake(
            "integer division `//` in the angle (pos // 10000**(2i/d_model) rounds it down)",
            "The angle is a real number: `pos / 10000 ** (two_i / d_model)`, not `//`.",
            lambda n, d: _pe_floor_angle(n, d),
        ),
        Mistake(
            "sine in every column (the odd columns must hold the cosine)",
            "Column 2i holds sin(pos * w_i) and column 2i+1 holds cos(pos * w_i), of the same angle.",
            lambda n, d: torch.sin(_pe_angles(n, d).repeat_interleave(2, dim=1)[:, :d]).float(),
        ),
        Mistake(
            "sin and cos concatenated in halves (all sines, then all cosines) instead of "
            "interleaved",
            "The paper interleaves them: column 2i holds the sine and column 2i+1 the cosine of "
            "the same frequency: `pe[:, 0::2] = torch.sin(angles)`, `pe[:, 1::2] = "
            "torch.cos(angles)`, not `torch.cat([sin, cos], dim=-1)`.",
            lambda n, d: _pe_halves(n, d),
        ),
    ]
    for base in (1000.0, 100000.0, math.e):
        label = "e" if base == math.e else f"{base:g}"
        mistakes.append(
            Mistake(
                f"wrong base ({label} instead of 10000)",
                "The paper's constant is 10000 (= 1e4), giving wavelengths from 2*pi up to 10000 "
                "* 2*pi. "
                "If you use the log form, it is `torch.exp(-two_i * math.log(10000.0) / d_model)`.",
                lambda n, d, b=base: _pe_from(n, d, right(d), right(d), base=b),
            )
        )
    return mistakes


_PE_CASES = [(16, 8), (50, 64), (30, 16), (10, 128), (9, 7), (1, 5), (20, 33)]


_ODD_HINT = (
    "It crashes for an odd d_model, where there is one sine column more than cosine columns (the "
    "last pair has no cosine): fill `pe[:, 0::2] = torch.sin(angles)` and "
    "`pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])`."
)


@checker
def check_positional_encoding(fn) -> None:
    """``fn(max_len, d_model) -> (max_len, d_model)``: the paper's sinusoids, even or odd width."""
    _refuse_course_lib(fn, "the sinusoidal encoding")
    mistakes = _pe_mistakes()
    for max_len, d_model in _PE_CASES:
        case = f"max_len={max_len}, d_model={d_model}"
        got = run_learner(fn, max_len, d_model, case=case, hint=_ODD_HINT if d_model % 2 else "")
        expected = sinusoidal_positional_encoding(max_len, d_model)
        if (
            isinstance(got, torch.Tensor)
            and tuple(got.shape) == (d_model, max_len)
            and max_len != d_model
        ):
            if torch.allclose(got.T.float(), expected, atol=1e-4):
                raise CheckFailure(
                    f"Likely mistake ({case}): positions and dimensions transposed: your output "
                    "has shape "
                    f"{tuple(got.shape)} = (d_model, max_len). Rows must be positions: shape "
                    "(max_len, d_model); "
                    "build `position` as a column (max_len, 1) and the frequencies as a row."
                )
        expect_shape(
            got,
            (max_len, d_model),
            f"fn({max_len}, {d_model})",
            "Expected one row per position and one column per dimension: (max_len, d_model).",
        )
        expect_finite(
            got, f"fn({max_len}, {d_model})", "Check for a division by zero or a huge power."
        )
        transposed = Mistake(
            "positions and dimensions transposed",
            "Rows are positions, columns are dimensions.",
            lambda n, d: sinusoidal_positional_encoding(n, d).T,
        )
        compare(got.float(), expected, (max_len, d_model), [*mistakes, transposed], case, atol=1e-4)
    passed("check_positional_encoding", len(_PE_CASES))


# ------------------------------------------------------------------- debug: the blog post's loop
_DEBUG_CASES = [(16, 8), (50, 64), (30, 16), (10, 128), (1, 4)]


@checker
def check_fixed_positional_encoding(fn) -> None:
    """Debug exercise: ``fn(max_len, d_model)`` (even ``d_model``) must equal the paper's sinusoids.

    Only even widths are tested: the loop of the exercise writes column ``i + 1`` and was never
    asked to handle an odd ``d_model``.
    """
    _refuse_course_lib(fn, "the fixed loop (repair the copy of `loop_a`)")
    mistakes = _pe_mistakes()
    for max_len, d_model in _DEBUG_CASES:
        case = f"max_len={max_len}, d_model={d_model}"
        got = run_learner(fn, max_len, d_model, case=case)
        expect_shape(
            got,
            (max_len, d_model),
            f"fn({max_len}, {d_model})",
            "The loop should fill a (max_len, d_model) table: keep `torch.zeros(max_len, "
            "d_model)`.",
        )
        expect_finite(
            got, f"fn({max_len}, {d_model})", "Check for a division by zero or a huge power."
        )
        compare(
            got.float(),
            sinusoidal_positional_encoding(max_len, d_model),
            (max_len, d_model),
            mistakes,
            case,
            atol=1e-4,
        )
    print(
        f"check_fixed_positional_encoding: all {len(_DEBUG_CASES)} cases match the paper's "
        "formula. "
        "Both bugs fixed: `i` already steps by 2 (it IS the paper's 2i), so the exponent is "
        "`i / d_model`, and the cosine in column i + 1 uses the same frequency as the sine in "
        "column i."
    )


# --------------------------------------------------------------------------- predict, then run
def _prediction(fn, example: str) -> float:
    """Return the learner's prediction ``fn()`` as a float, or fail saying what to return."""
    got = run_learner(fn, case="your prediction")
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        raise CheckFailure(
            f"Your prediction should be one number, e.g. `return {example}`, "
            f"got {type(got).__name__}: {got!r}."
        )
    if not math.isfinite(float(got)):
        raise CheckFailure(
            f"Your prediction is {got}; return a finite number, e.g. `return {example}`."
        )
    return float(got)


def _near(value: float, target: float, rel: float = 0.1) -> bool:
    return abs(value - target) <= rel * abs(target)


@checker
def check_token_norm_prediction(fn) -> None:
    """Predict: the typical norm of an ``nn.Embedding(10_000, 512)`` row (default init) x sqrt(512).

    Accepted within 10% of the measured mean norm (about 512).
    """
    d_model = 512
    gen = torch.Generator().manual_seed(3)
    table = torch.randn(10_000, d_model, generator=gen)  # nn.Embedding's default init: N(0, 1)
    truth = (table.norm(dim=-1) * math.sqrt(d_model)).mean().item()
    pe_norm = math.sqrt(d_model / 2)
    guess = _prediction(fn, "100.0")
    why = (
        f"Each of the {d_model} entries is N(0, 1), so |row|^2 is about {d_model} and |row| about "
        f"sqrt({d_model}) = {math.sqrt(d_model):.1f}; times sqrt({d_model}) that is about "
        f"{d_model} "
        f"(measured: {truth:.1f})."
    )
    if _near(guess, truth):
        print(
            f"check_token_norm_prediction: right, about {truth:.0f}. {why} That is "
            f"{truth / pe_norm:.0f} times the norm {pe_norm:.0f} of a PE vector: the word drowns "
            "the position."
        )
        return
    confusions = [
        (math.sqrt(d_model), "that is the norm BEFORE the sqrt(d_model) factor"),
        (
            1.0,
            "that is the norm with the paper's small initialisation N(0, 1/d_model), not "
            "nn.Embedding's "
            "default N(0, 1)",
        ),
        (pe_norm, "that is the norm of a positional-encoding vector, sqrt(d_model / 2)"),
        (float(d_model) ** 1.5, "that is |row| times d_model; the factor is sqrt(d_model)"),
        (float(d_model) ** 2, "the SQUARED norm of the scaled vector; the norm is its square root"),
    ]
    for value, what in confusions:
        if _near(guess, value):
            raise CheckFailure(f"Your prediction {guess:g} is off: {what}. {why}", mistake=what)
    raise CheckFailure(f"Your prediction {guess:g} is off. {why}")


@checker
def check_pe_dot_prediction(fn) -> None:
    """Predict: ``PE[40] . PE[47] - PE[5] . PE[12]`` for ``d_model = 64`` (the answer is 0)."""
    pe = sinusoidal_positional_encoding(100, 64).double()
    truth = (pe[40] @ pe[47] - pe[5] @ pe[12]).item()  # 0 up to float32 rounding of the table
    near = (pe[5] @ pe[12]).item()
    guess = _prediction(fn, "1.5")
    why = (
        "Per pair, sin(wp) sin(wq) + cos(wp) cos(wq) = cos(w (p - q)), so PE[p] . PE[q] = "
        "sum_i cos(w_i (p - q)) depends only on the distance p - q. Both dot products have "
        "distance 7 "
        f"(each is {near:.2f}), so the difference is 0 (measured: {truth:.1e}, float32 rounding)."
    )
    if abs(guess - truth) <= 1e-3:
        print(f"check_pe_dot_prediction: right, 0. {why}")
        return
    if abs(guess - near) <= 0.05 * abs(near) or abs(guess + near) <= 0.05 * abs(near):
        raise CheckFailure(
            f"Your prediction {guess:g} is the size of ONE of the two dot products, not their "
            f"difference. {why}"
        )
    raise CheckFailure(f"Your prediction {guess:g} is off. {why}")


# --------------------------------------------------------------------------- token embedding
def _load(learner: nn.Module, state: dict[str, torch.Tensor], what: str, ids: torch.Tensor) -> None:
    """``load_reference_weights``, but a forward that is still a stub says "not implemented yet"."""
    try:
        load_reference_weights(learner, state, what)
    except CheckFailure:
        with contextlib.suppress(CheckFailure):  # run_learner lets only NotImplementedError escape
            run_learner(learner, ids)
        raise


_TOKEN_CASES = [(11, 16, (2, 5)), (50, 64, (3, 7)), (7, 9, (1, 1)), (30, 4, (4, 3))]


@checker
def check_token_embedding(cls) -> None:
    """``cls(vocab_size, d_model)`` with ``self.embedding = nn.Embedding(...)``;
    ``forward(ids (B, L)) -> (B, L, d_model)`` = lookup x sqrt(d_model)."""
    if is_course_lib(cls):
        raise CheckFailure(f"This is course_lib's own `{getattr(cls, '__name__', cls)}`, not a "
                           "class of yours: write the token embedding yourself.")
    for n, (vocab_size, d_model, shape) in enumerate(_TOKEN_CASES):
        case = f"vocab_size={vocab_size}, d_model={d_model}, ids {shape}"
        gen = torch.Generator().manual_seed(300 + n)
        ref = TokenEmbedding(vocab_size, d_model)
        with torch.no_grad():
            ref.embedding.weight.copy_(
                torch.randn(vocab_size, d_model, generator=gen) * d_model**-0.5
            )
        ids = torch.randint(0, vocab_size, shape, generator=gen)
        learner = cls(vocab_size, d_model)
        _load(
            learner,
            {"embedding.weight": ref.embedding.weight.detach().clone()},
            f"{type(learner).__name__}({vocab_size}, {d_model})",
            ids,
        )
        learner.eval()
        with torch.no_grad():
            got = run_learner(learner, ids, case=case)
            expected = ref(ids)
        expect_shape(
            got,
            (*shape, d_model),
            f"forward(ids of shape {shape})",
            "One d_model vector per token: (B, L, d_model). Did you sum or average over a "
            "dimension?",
        )
        table = ref.embedding.weight.detach()
        mistakes = [
            Mistake(
                "missing the sqrt(d_model) scale",
                "The paper multiplies the looked-up vectors by sqrt(d_model): "
                "`self.embedding(ids) * math.sqrt(self.d_model)`.",
                lambda i: table[i],
            ),
            Mistake(
                "scaled by d_model instead of sqrt(d_model)",
                "Multiply by math.sqrt(d_model), not by d_model.",
                lambda i: table[i] * d_model,
            ),
            Mistake(
                "divided by sqrt(d_model) instead of multiplied",
                "Attention divides scores by sqrt(d_k); the embedding MULTIPLIES by sqrt(d_model).",
                lambda i: table[i] / math.sqrt(d_model),
            ),
            Mistake(
                "scaled by sqrt(vocab_size) instead of sqrt(d_model)",
                "The factor is the width of the vectors, sqrt(d_model), not the vocabulary size.",
                lambda i: table[i] * math.sqrt(vocab_size),
            ),
        ]
        compare(got, expected, (ids,), mistakes, case)
    passed("check_token_embedding", len(_TOKEN_CASES))


# ---------------------------------------------------------------------- BERT-style embedding layer
_NAME_MAP = {  # learner's name -> course_lib TransformerEmbedding's name
    "token.weight": "token.embedding.weight",
    "position.weight": "position.embedding.weight",
    "norm.weight": "norm.weight",
    "norm.bias": "norm.bias",
}
# the first case has vocab_size < max_len, so positions looked up from the ids run and are named
_LAYER_CASES = [(10, 16, 12, (2, 5)), (50, 32, 40, (3, 9)), (7, 8, 6, (1, 6))]


def _run_embedding(learner: nn.Module, ids: torch.Tensor, case: str, max_len: int) -> torch.Tensor:
    """``learner(ids)``; an IndexError (an index past the position table) is named."""
    try:
        return learner(ids)
    except IndexError as err:
        raise CheckFailure(
            f"Likely mistake ({case}): an index past the end of a table (IndexError: {err}). The "
            f"position table has max_len={max_len} rows, but the token ids go up to "
            f"{int(ids.max())}: did you look up the positions with the token ids "
            "(`self.position(ids)`)? Positions are 0, 1, ..., L-1 whatever the tokens are: "
            "`self.position(torch.arange(ids.size(1), device=ids.device))`."
        ) from err
    except (NotImplementedError, CheckFailure):
        raise
    except Exception:  # any other crash: run_learner names it
        return run_learner(learner, ids, case=case)


def _reference_layer(
    vocab_size: int, d_model: int, max_len: int, dropout: float, seed: int
) -> TransformerEmbedding:
    gen = torch.Generator().manual_seed(seed)
    ref = TransformerEmbedding(
        vocab_size,
        d_model,
        max_len,
        positional="learned",
        scale_embedding=False,
        layer_norm=True,
        dropout=dropout,
    )
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        ref.norm.weight.add_(1.0)  # LayerNorm gain around 1, bias around 0
    return ref


def _dropped_twice(x: torch.Tensor, norm, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return F.dropout(norm(F.dropout(x, 0.1, training=True)), 0.1, training=True)


@checker
def check_embedding_layer(cls) -> None:
    """BERT-style ``cls(vocab_size, d_model, max_len, dropout)``.

    ``forward(ids) = dropout(norm(token(ids) + position(0..L-1)))``.
    """
    if is_course_lib(cls):
        raise CheckFailure(
            f"This is course_lib's own `{getattr(cls, '__name__', cls)}`, not a class of yours. "
            "Write `BertStyleEmbedding` with the submodules the exercise lists."
        )
    n_cases = 0
    for n, (vocab_size, d_model, max_len, shape) in enumerate(_LAYER_CASES):
        case = f"vocab_size={vocab_size}, d_model={d_model}, max_len={max_len}, ids {shape}"
        ref = _reference_layer(vocab_size, d_model, max_len, 0.1, seed=400 + n)
        ref_state = ref.state_dict()
        learner = cls(vocab_size, d_model, max_len, 0.1)
        ids = torch.randint(0, vocab_size, shape, generator=torch.Generator().manual_seed(500 + n))
        _load(
            learner,
            {ours: ref_state[theirs].clone() for ours, theirs in _NAME_MAP.items()},
            f"{type(learner).__name__}({vocab_size}, {d_model}, {max_len}, 0.1)",
            ids,
        )
        L = shape[1]
        tok = ref.token.embedding.weight.detach()
        pos = ref.position.embedding.weight.detach()
        norm = ref.norm

        def ln(x: torch.Tensor) -> torch.Tensor:
            return F.layer_norm(x, (d_model,), norm.weight.detach(), norm.bias.detach(), norm.eps)

        # 1) eval mode: dropout off, the arithmetic must match
        learner.eval()
        ref.eval()
        with torch.no_grad():
            got = _run_embedding(learner, ids, case + ", eval mode", max_len)
            expected = ref(ids)
        expect_shape(
            got,
            (*shape, d_model),
            f"forward(ids of shape {shape})",
            "One d_model vector per token: (B, L, d_model). Add the (L, d_model) positions to the "
            "(B, L, d_model) token vectors (broadcasting over B).",
        )
        expect_finite(got, "the output", "Check the LayerNorm.")
        mistakes = [
            Mistake(
                "scaled by sqrt(d_model) (BERT does not scale)",
                "BERT adds raw token vectors to learned positions and relies on LayerNorm; drop "
                "the "
                "`* math.sqrt(d_model)` here.",
                lambda i: ln(tok[i] * math.sqrt(d_model) + pos[:L]),
            ),
            Mistake(
                "no LayerNorm after the sum",
                "Apply `self.norm` to token + position before the dropout.",
                lambda i: tok[i] + pos[:L],
            ),
            Mistake(
                "LayerNorm applied to the tokens before adding the positions",
                "Normalize the SUM: `self.norm(self.token(ids) + self.position(positions))`.",
                lambda i: ln(tok[i]) + pos[:L],
            ),
            Mistake(
                "positions not added",
                "Look up `self.position(torch.arange(L, device=ids.device))` and add it.",
                lambda i: ln(tok[i]),
            ),
            Mistake(
                "positions start at 1 instead of 0",
                "The first token has position 0: `torch.arange(L, device=ids.device)`.",
                lambda i: ln(tok[i] + pos[1 : L + 1]),
            ),
            Mistake(
                "positions looked up with the token ids (`self.position(ids)`)",
                "The position table is indexed by the place of the token, 0, 1, ..., L-1, not by "
                "its id: `self.position(torch.arange(ids.size(1), device=ids.device))`. (With a "
                "vocabulary larger than max_len, `self.position(ids)` even crashes.)",
                lambda i: ln(tok[i] + pos[i]),
            ),
        ]
        compare(got, expected, (ids,), mistakes, case + ", eval mode")
        n_cases += 1

        # 2) train mode with the same random seed: the dropout must be the reference's
        learner.train()
        ref.train()
        torch.manual_seed(600 + n)
        got = _run_embedding(learner, ids, case + ", train mode", max_len).detach()
        torch.manual_seed(600 + n)
        expected = ref(ids).detach()

        def dropped(x: torch.Tensor, p: float) -> torch.Tensor:
            torch.manual_seed(600 + n)
            return F.dropout(x, p, training=True)

        train_mistakes = [
            Mistake(
                "dropout with p=0.5 (`nn.Dropout()` without an argument)",
                "`nn.Dropout()` defaults to p=0.5; pass the rate: `nn.Dropout(dropout)`.",
                lambda i: dropped(ln(tok[i] + pos[:L]), 0.5),
            ),
            Mistake(
                "dropout applied before the LayerNorm",
                "The order is sum -> LayerNorm -> dropout: `self.dropout(self.norm(x))`.",
                lambda i: ln(dropped(tok[i] + pos[:L], 0.1)),
            ),
            Mistake(
                "dropout applied twice (before and after the LayerNorm)",
                "Apply `self.dropout` once, to the normalized sum: `self.dropout(self.norm(x))`.",
                lambda i: _dropped_twice(tok[i] + pos[:L], ln, 600 + n),
            ),
            Mistake(
                "no dropout in training mode",
                "Apply `self.dropout` (nn.Dropout(dropout)) to the normalized sum.",
                lambda i: ln(tok[i] + pos[:L]),
            ),
        ]
        compare(got, expected, (ids,), train_mistakes, case + ", train mode (dropout on)")
        n_cases += 1
    passed("check_embedding_layer", n_cases)
