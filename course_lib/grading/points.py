"""Points per exercise: ``--points 09.lm_train=3,09.generate=2`` or ``--points FILE``.

By default every checked exercise is worth 1 point. An instructor may weight some of them; the
others stay at 1. The weights come inline (``KEY=POINTS`` pairs separated by commas) or from a file:

- ``.json``: ``{"09.lm_train": 3, "09.generate": 2}``
- ``.toml``: ``"09.lm_train" = 3`` lines (keys quoted: they hold a dot), or the same under ``[points]``
- ``.csv``:  a header ``exercise,points`` and one row per weighted exercise

Points are numbers >= 0 (0 leaves an exercise in the files but worth nothing). A passed exercise
earns its points, any other outcome 0; ``total`` is the sum of the points earned. An unknown key is
an error that names the lesson's valid keys.
"""

from __future__ import annotations

import csv
import json
import math
import tomllib
from pathlib import Path

from .lessons import Lesson


def parse_points(spec: str | None, lessons: dict[str, Lesson]) -> dict[str, float]:
    """The weights that ``spec`` sets, by exercise key ({} for None: every exercise worth 1).

    Raises ValueError with a message that says what to fix (unknown key, a value that is not a
    number >= 0, an unreadable file)."""
    if spec is None or not spec.strip():
        return {}
    path = Path(spec)
    if path.is_file():
        raw = _read_file(path)
        where = str(path)
    elif "=" in spec:
        raw = {}
        for pair in spec.split(","):
            if not pair.strip():
                continue
            key, sep, value = pair.partition("=")
            if not sep:
                raise ValueError(f"--points: {pair.strip()!r} is not KEY=POINTS (e.g. 09.lm_train=3)")
            raw[key.strip()] = value.strip()
        where = "--points"
    else:
        raise ValueError(f"--points: {spec!r} is neither a file nor KEY=POINTS pairs "
                         "(e.g. --points 09.lm_train=3,09.generate=2, or --points points.toml)")
    return _validated(raw, lessons, where)


def _read_file(path: Path) -> dict[str, object]:
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
        elif suffix == ".toml":
            data = tomllib.loads(path.read_text(encoding="utf-8"))
            data = data.get("points", data)
        elif suffix == ".csv":
            with path.open(newline="", encoding="utf-8-sig") as f:
                reader = csv.DictReader(f)
                if reader.fieldnames is None or not {"exercise", "points"} <= set(reader.fieldnames):
                    raise ValueError(f"{path}: the header must be 'exercise,points' (found {reader.fieldnames})")
                data = {row["exercise"].strip(): row["points"] for row in reader if row.get("exercise")}
        else:
            raise ValueError(f"{path}: a points file is .json, .toml or .csv (see --help)")
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError, csv.Error) as err:
        raise ValueError(f"{path}: cannot read it as {suffix[1:]}: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a table of exercise -> points, found {type(data).__name__}")
    return data


def _validated(raw: dict[str, object], lessons: dict[str, Lesson], where: str) -> dict[str, float]:
    valid = {k for lesson in lessons.values() for k in lesson.keys}
    points: dict[str, float] = {}
    for key, value in raw.items():
        if key not in valid:
            lesson = lessons.get(str(key)[:2])
            hint = (f"lesson {lesson.lesson_id}'s exercises are {', '.join(lesson.keys)}" if lesson else
                    f"keys look like 09.lm_train; the lessons with exercises are {', '.join(sorted(lessons))}")
            raise ValueError(f"{where}: unknown exercise {key!r}; {hint}")
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"{where}: the points of {key} must be a number, found {value!r}") from None
        if not math.isfinite(number) or number < 0:
            raise ValueError(f"{where}: the points of {key} must be a number >= 0, found {value!r}")
        points[key] = number
    return points


def worth(key: str, points: dict[str, float]) -> float:
    """What exercise ``key`` is worth: its weight, else 1."""
    return points.get(key, 1.0)


def earned(results: dict[str, dict[str, str]], points: dict[str, float]) -> dict[str, float]:
    """Points earned per exercise of one row: its weight if passed, else 0."""
    return {k: worth(k, points) if r["outcome"] == "passed" else 0.0 for k, r in results.items()}


def possible(lesson: Lesson, points: dict[str, float]) -> float:
    """The most a submission of ``lesson`` can earn."""
    return sum(worth(k, points) for k in lesson.keys)


def number(value: float) -> str:
    """A number as the CSV files write it: ``3``, not ``3.0``; ``2.5`` stays."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
