"""Checks of the arguments every layer takes (used from lesson 01 on).

A size field (``d_model``, ``num_heads``, ...), a tensor of token ids and ids against a vocabulary,
each refused with a message that says what was expected, what came and how to fix it: never a
cryptic failure from deep inside, never NaN. The modules of every lesson import these three.
"""

from __future__ import annotations

import math
import numbers

import torch

__all__ = ["check_size", "check_tensor", "check_ids"]


def check_size(value, name: str, where: str, minimum: int = 1) -> int:
    """A size field (``d_model``, ``num_heads``, ``d_ff``, ...) as a Python int.

    An int (or a NumPy integer) is kept; a float that equals an int (``4 * 48 / 3`` is ``64.0``:
    sizes computed with ``/``) becomes that int; anything else (``42.5``, ``True``, ``"64"``) is
    refused with a message that names the field. Sizes below ``minimum`` are refused too.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where}: {name} must be a whole number, got {value!r} ({type(value).__name__})")
    if not isinstance(value, numbers.Integral):
        if not (math.isfinite(value) and float(value).is_integer()):
            raise ValueError(
                f"{where}: {name} must be a whole number, got {value!r}; a size computed with '/' "
                "is a float: use '//' or round() and check that the result is what you meant"
            )
    size = int(value)
    if size < minimum:
        raise ValueError(f"{where}: {name} must be >= {minimum}, got {size}")
    return size


def check_tensor(ids, where: str, name: str = "token ids") -> None:
    """Token ids must be a torch tensor: a list or a NumPy array is refused with the fix."""
    if not isinstance(ids, torch.Tensor):
        fix = "torch.from_numpy(ids)" if type(ids).__module__ == "numpy" else "torch.tensor(ids)"
        raise TypeError(
            f"{where}: {name} must be a torch tensor (B, L) of integers, got {type(ids).__name__}; "
            f"convert them with {fix}"
        )


def check_ids(ids: torch.Tensor, vocab_size: int, where: str) -> torch.Tensor:
    """Check ``ids (B, L)`` against the vocabulary and return them as int64 (``nn.Embedding`` takes
    only int64 and int32; every integer dtype is accepted: int8, uint8, int16 ... become int64)."""
    check_tensor(ids, where)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(
            f"{where}: token ids must be an integer tensor, got dtype {ids.dtype}; token ids are "
            "whole numbers (ids.long() if the values are right)"
        )
    if ids.dim() != 2 or ids.numel() == 0:
        raise ValueError(f"{where}: token ids must be a non-empty (B, L) tensor, got shape {tuple(ids.shape)}")
    ids = ids.long()  # int8, uint8, int16, int32, uint16 ... -> int64; the values are checked next
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(
            f"{where}: token ids must lie in [0, {vocab_size - 1}] (vocab_size={vocab_size}), "
            f"got values from {lo} to {hi}; check the tokenizer against the model's vocab_size"
        )
    return ids
