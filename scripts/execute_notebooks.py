"""Execute notebooks top to bottom on a fresh kernel and store their outputs in place.

    python scripts/execute_notebooks.py notebooks/01_attention.ipynb [more.ipynb ...]

Runs from the notebook's own folder (as JupyterLab does), records no timing metadata, and sets the
generic "python3" kernel so the stored notebooks open anywhere (JupyterLab, Colab).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def execute(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=900, kernel_name="python3", record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    nb.metadata["kernelspec"] = KERNELSPEC
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    print(f"executed {path}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for arg in sys.argv[1:]:
        execute(Path(arg))
