"""Grading a class on several machines: ``--shard K/N``, and the rows file every run writes.

The split is decided by the learner ids alone: the class's stems are ordered by the SHA-256 of
the stem (then the stem), and shard K takes every N-th of them starting with the K-th. So the N
shares differ by at most one submission, a learner's shard does not depend on the order of the
files or on the machine, and the N shards together grade everyone exactly once, as long as every
shard is given the same class.

Every run (sharded or not) writes ``rows.json`` beside grades.csv: each row with everything the
report and the feedback pages show, the class's stems, the shard, the sandbox line and the platform
options. ``python -m course_lib.grading.merge`` reads it back (``read_rows``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from .runner import Graded

ROWS_FILE = "rows.json"
FORMAT = 1


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/3"`` -> (2, 3); ValueError saying what to fix for anything but 1 <= K <= N."""
    k, sep, n = text.partition("/")
    if not sep or not k.strip().isdigit() or not n.strip().isdigit():
        raise ValueError(f"--shard {text!r}: expected K/N with whole numbers, e.g. --shard 2/3 (the second of three)")
    k_, n_ = int(k), int(n)
    if n_ < 1 or not 1 <= k_ <= n_:
        raise ValueError(f"--shard {text}: K must be between 1 and N (N >= 1), e.g. --shard 1/{max(n_, 1)} "
                         f"... --shard {max(n_, 1)}/{max(n_, 1)}")
    return k_, n_


def shard_order(stems: list[str]) -> list[str]:
    """The class's learner ids in the order the shards deal them out."""
    return sorted(set(stems), key=lambda s: (hashlib.sha256(s.encode("utf-8")).hexdigest(), s))


def shard_of(stems: list[str], k: int, n: int) -> set[str]:
    """The learner ids of shard ``k`` (1-based) of ``n``."""
    return set(shard_order(stems)[k - 1::n])


def write_rows(out: Path, rows: list[Graded], class_stems: list[str], shard: tuple[int, int] | None,
               sandbox: str, platform: dict[str, Any]) -> None:
    """``out/rows.json``: what ``merge`` needs to write every file as one run would have."""
    data = {"format": FORMAT, "shard": list(shard) if shard else None, "class": sorted(class_stems),
            "sandbox": sandbox, "platform": platform,
            "rows": [dataclasses.asdict(r) for r in sorted(rows, key=lambda r: r.student)]}
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (ROWS_FILE + ".part")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
    tmp.replace(out / ROWS_FILE)  # whole or not at all: a merge never reads half a file


def read_rows(folder: Path) -> dict[str, Any]:
    """A run's rows.json, its rows as ``Graded``; ValueError saying what is wrong with it."""
    path = Path(folder) / ROWS_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{folder}: no {ROWS_FILE}; is it the --out folder of a `python -m course_lib.grading` "
                         "run (one that finished)?") from None
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: unreadable ({err}); run that shard again") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a rows file of this grader (format {FORMAT}); run that shard again")
    fields = {f.name for f in dataclasses.fields(Graded)}
    try:
        data["rows"] = [Graded(**{k: v for k, v in row.items() if k in fields}) for row in data["rows"]]
    except (TypeError, KeyError, AttributeError) as err:
        raise ValueError(f"{path}: a row is damaged ({err}); run that shard again") from None
    return data
