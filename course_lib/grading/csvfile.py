"""Every CSV file the grader writes (grades.csv, grades_NN.csv, grades_canvas_NN.csv,
grades_moodle_NN.csv) goes through ``write_csv``, so that no cell opens as a formula.

A learner names their own file, and the file's stem is their id: ``=2+5.ipynb`` would put ``=2+5``
in grades.csv, which Excel, LibreOffice Calc and Google Sheets evaluate as a formula when the file
is opened or imported (CSV injection; a formula can fetch a URL or, in older Excel, run a command).
Following OWASP's advice ("CSV Injection"), a text cell that begins with ``=``, ``+``, ``-``, ``@``,
a tab or a carriage return is written with a single quote in front (``'=2+5``): spreadsheets show
such a cell as the text after the quote. Numbers are not text cells: they are passed as numbers and
written as ``points.number`` writes them (``3``, ``2.5``, ``-1``), without a quote. Names and ids from
a roster are text cells too (an identity beginning with one of those characters keeps its quote in a
platform file; the import then shows that learner as unmatched, to be matched by hand).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path

from .points import number

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def cell(value: object) -> str:
    """One cell as written: a number as ``number`` writes it; text, with a quote in front if it
    begins like a formula."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return number(value)
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def write_csv(path: Path, rows: Iterable[Sequence[object]]) -> None:
    """Write ``rows`` (the header first) to ``path``, each cell through ``cell``."""
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        for row in rows:
            out.writerow([cell(value) for value in row])
