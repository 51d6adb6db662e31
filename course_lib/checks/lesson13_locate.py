"""What ``check_locate`` (in ``lesson13_scale``) says when no whole mistake of ``LOCATE_MISTAKES``
matches: the learner's pairs ``(physical block, slot)`` over all the cases are read one number at a
time, and each number is matched against the rules that produce it (which entry of the table, which
slot formula), so that a block rule and a slot rule combine freely.

* ``locate_rules(outcomes, cases) -> str | None``: the observed rules, or None when a number of the
  pairs fits none of them.
* ``locate_failure(outcomes, cases) -> CheckFailure``: the message for the first wrong case.
* ``locate_observed(got, table, position, size, asked) -> str``: one case as it is observed.

A case is ``(block_table, position, block_size)``; an outcome is what the learner's function returned
(a pair of ints), or ``("raised", error name, text)``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import torch

from .common import CheckFailure

__all__ = ["locate_rules", "locate_failure", "locate_observed"]

Rule = Callable[[list[int], int, int], Any]

# (what the index into the table is, fn(table, position, block_size) -> index); None: no table entry
_INDEX_RULES: list[tuple[str, Rule]] = [
    ("block_table[position // block_size]", lambda t, p, s: p // s),
    ("block_table[ceil(position / block_size)], the index rounded up: every position but a block's "
     "first goes to the next block", lambda t, p, s: math.ceil(p / s)),
    ("block_table[round(position / block_size)], the index rounded to the nearest integer: positions "
     "in the second half of a block go to the next block", lambda t, p, s: round(p / s)),
    ("block_table[position // block_size + 1]: blocks count from 0", lambda t, p, s: p // s + 1),
    ("block_table[position // block_size - 1]: blocks count from 0", lambda t, p, s: p // s - 1),
    ("block_table[-1 - position // block_size], the table read from its end",
     lambda t, p, s: len(t) - 1 - p // s),
    ("block_table[position // len(block_table)], divided by the table's length, not by block_size",
     lambda t, p, s: p // len(t)),
    ("block_table[position % block_size], the remainder used as the index",
     lambda t, p, s: p % s),
    ("block_table[(position - 1) // block_size], the block of position - 1",
     lambda t, p, s: (p - 1) // s),
]
# (what the block number is, fn) for blocks that are not an entry of the table
_BLOCK_RULES: list[tuple[str, Rule]] = [
    ("position // block_size, the logical block itself: the table is not read",
     lambda t, p, s: p // s),
    ("block_table[position // block_size] * block_size + slot, an address in the pool's flat array "
     "of slots", lambda t, p, s: t[p // s] * s + p % s),
    ("the position itself", lambda t, p, s: p),
]
_SLOT_RULES: list[tuple[str, Rule]] = [
    ("position % block_size", lambda t, p, s: p % s),
    ("the position itself, not its offset inside the block", lambda t, p, s: p),
    ("position % block_size + 1, counted from 1", lambda t, p, s: p % s + 1),
    ("block_size - 1 - position % block_size, counted from the block's end",
     lambda t, p, s: s - 1 - p % s),
    ("(position // block_size) * block_size, the block's first position",
     lambda t, p, s: p // s * s),
    ("physical block * block_size + offset, an address in the pool's flat array",
     lambda t, p, s: t[p // s] * s + p % s),
    ("position // block_size, the logical block", lambda t, p, s: p // s),
    ("position % len(block_table), the table's length used as block_size",
     lambda t, p, s: p % len(t)),
    ("(position - 1) % block_size, the slot of position - 1", lambda t, p, s: (p - 1) % s),
]


def _pairs(outcomes: list[Any]) -> list[tuple[int, int]] | None:
    pairs = []
    for got in outcomes:
        if not (isinstance(got, tuple) and len(got) == 2 and all(
                isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in got)):
            return None
        pairs.append((int(got[0]), int(got[1])))
    return pairs


def _block_fits(rule: Rule, table: list[int], position: int, size: int, block: int,
                index_rule: bool) -> tuple[bool, bool]:
    """Whether ``block`` is what ``rule`` gives (as a table index: the entry, or the end entry the
    index was clipped to when it runs past the table); and whether clipping was needed."""
    value = rule(table, position, size)
    if not index_rule:
        return value == block, False
    if 0 <= value < len(table):
        return table[value] == block, False
    if value >= len(table):
        return block == table[-1], True
    return -len(table) <= value and table[value] == block, False


def locate_rules(outcomes: list[Any], cases: list[tuple[list[int], int, int]]) -> str | None:
    """The rules that give the learner's blocks and slots in every case (at most three each), as a
    sentence, or None when the outcomes are not pairs of ints or a number fits no known rule."""
    pairs = _pairs(outcomes)
    if pairs is None:
        return None
    blocks, clipped = [], False
    for rules, is_index in ((_INDEX_RULES, True), (_BLOCK_RULES, False)):
        for what, rule in rules:
            fits = [_block_fits(rule, t, p, s, b, is_index) for (t, p, s), (b, _) in zip(cases, pairs)]
            if all(f for f, _ in fits):
                blocks.append(what)
                clipped = clipped or (is_index and len(blocks) == 1 and any(c for _, c in fits))
    slots = [what for what, rule in _SLOT_RULES
             if all(rule(t, p, s) == slot for (t, p, s), (_, slot) in zip(cases, pairs))]
    if not blocks or not slots:
        return None
    block_ok, slot_ok = blocks[0] == _INDEX_RULES[0][0], slots[0] == _SLOT_RULES[0][0]
    if block_ok and slot_ok:
        return None
    said, why = [], []
    if block_ok:
        said.append("your physical block is right in every case")
    else:
        clip = " (where that index runs past the table, its last entry)" if clipped else ""
        said.append("your physical block is " + " or ".join(blocks[:3]) + clip)
        why.append("the block of position p is block_table[p // block_size]: logical block n holds "
                   "positions n * block_size .. (n + 1) * block_size - 1")
    if slot_ok:
        said.append("your slot is right in every case")
    else:
        said.append("your slot is " + " or ".join(slots[:3]))
        why.append("the slot is the offset inside the block, 0..block_size - 1")
    return f"over all {len(cases)} cases, " + ", and ".join(said) + "".join(
        f". {w[0].upper()}{w[1:]}" for w in why)


def locate_observed(got: Any, table: list[int], position: int, size: int, asked: str = "") -> str:
    """One case as observed: what the learner returned (or raised) and the right pair."""
    logical, slot = divmod(position, size)
    where = (f"position {position} of a sequence with block_size {size} and block_table {table} "
             f"({len(table)} blocks)")
    if isinstance(got, tuple) and got and got[0] == "raised":
        return (f"{where}: your code raised {got[1]} ({got[2]}){asked}; that position is in logical "
                f"block {position} // {size} = {logical}, slot {slot}")
    return f"{where}: you return {got!r}, expected ({table[logical]}, {slot})"


def locate_failure(outcomes: list[Any], cases: list[tuple[list[int], int, int]]) -> CheckFailure:
    """What ``check_locate`` says when no whole mistake matched: the rules observed, else the first
    wrong case with what it looks like."""
    rules = locate_rules(outcomes, cases)
    if rules is not None:
        first = next(n for n, ((t, p, s), o) in enumerate(zip(cases, outcomes))
                     if o != (t[p // s], p % s))
        said = locate_observed(outcomes[first], *cases[first])
        return CheckFailure(f"Observed {rules}. For example, {said}.", mistake=rules)
    for (table, position, size), got in zip(cases, outcomes):
        case = f"block_table {table}, position {position}, block_size {size}"
        if isinstance(got, tuple) and got and got[0] == "raised":
            return CheckFailure(f"Observed: {locate_observed(got, table, position, size)}. Logical "
                                "block n holds positions n * block_size .. (n + 1) * block_size - 1, "
                                "and the table has one entry per logical block.")
        if isinstance(got, (tuple, list)) and len(got) == 2:
            got = tuple(int(x.item()) if isinstance(x, torch.Tensor) else x for x in got)
        logical, slot = divmod(position, size)
        right = (table[logical], slot)
        if got == right:
            continue
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = int(got.item())
        if isinstance(got, numbers.Integral) and got == table[logical] * size + slot:
            return CheckFailure(f"({case}) observed {got}: an index into the pool's flat array of "
                                f"slots (block * block_size + slot); return the pair (physical block "
                                f"table[{logical}] = {table[logical]}, slot {slot}).",
                                mistake="the pool's flat index")
        if not (isinstance(got, tuple) and len(got) == 2):
            return CheckFailure(f"Return a pair (physical block, slot), got {got!r} ({case}).")
        if got == (slot, table[logical]):
            return CheckFailure(f"({case}) the two numbers are swapped: return (physical block, slot).")
        if got == (slot, logical):
            return CheckFailure(f"({case}) observed {got}: the slot first, then the logical block "
                                f"{logical}, not the physical one, table[{logical}] = {table[logical]}: "
                                "return (physical block, slot).")
        if got == (logical, slot):
            return CheckFailure(f"({case}) you return the logical block {logical}: the block table maps "
                                f"it to the physical block table[{logical}] = {table[logical]}.")
        if got[1] == slot and 0 <= logical - 1 < len(table) and got[0] == table[logical - 1]:
            return CheckFailure(f"({case}) one block too early: position {position} is in logical "
                                f"block {position} // {size} = {logical} (blocks count from 0).")
        earlier = divmod(position - 1, size)
        if got == (table[earlier[0]], earlier[1]):
            return CheckFailure(f"({case}) observed {got}: that is where position {position - 1} is "
                                f"stored, not {position}. Positions count from 0; use the position "
                                "as it is, not position - 1.", mistake="position - 1")
        flat = table[logical] * size + slot
        if got[0] == flat or got == (flat, slot) or got == (logical * size + slot, slot):
            return CheckFailure(f"({case}) observed {got}: {got[0]} is an index into the pool's flat "
                                f"array of slots (block * block_size + slot); return the physical "
                                f"block table[{logical}] = {table[logical]} and the slot {slot} apart.",
                                mistake="the pool's flat index")
        n = len(table)
        by_len = (table[position // n] if position // n < n else None, position % n)
        if got == by_len or (got[0] == table[logical] and got[1] == position % n != slot) or (
                got[1] == slot and position // n < n and got[0] == table[position // n] != right[0]):
            also = " (here also block_size - 1)" if n == size - 1 else ""
            return CheckFailure(f"({case}) observed {got}: that divides by {n}, the table's length{also}, "
                                f"not by block_size = {size}. Each block holds block_size positions; "
                                "the table only says where each block is.",
                                mistake="division by the table's length")
        return CheckFailure(f"Not yet ({case}): you return {got}, expected {right}. Logical block n "
                            "holds positions n * block_size .. (n + 1) * block_size - 1.")
    return CheckFailure("Not yet: a case differs from (block_table[position // block_size], "
                        "position % block_size).")
