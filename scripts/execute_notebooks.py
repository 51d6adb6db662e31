"""Execute notebooks top to bottom on a fresh kernel and store their outputs in place.

    python scripts/execute_notebooks.py notebooks/01_attention.ipynb [more.ipynb ...]

Runs from the notebook's own folder (as JupyterLab does), records no timing metadata, stores each
text stream as a terminal would show it (a progress bar's carriage-return updates collapse to its
final state, as nbval also compares them), and sets the generic "python3" kernel so the stored
notebooks open anywhere (JupyterLab, Colab). A reveal cell (metadata ``"reveals"``: it runs the
experiment after a "Predict, then run" exercise) keeps no output: the learner sees the result only by
running it, after answering.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def collapse_carriage_returns(text: str) -> str:
    """Keep what a terminal shows: on each line, only the text after the last carriage return."""
    return "\n".join(re.sub(r"^.*\r(?=[^\r]*$)", "", line) for line in text.split("\n"))


def merge_streams(outputs: list) -> list:
    """Join consecutive outputs of the same stream (one per message) and collapse carriage returns."""
    merged: list = []
    for output in outputs:
        if output.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream" \
                and merged[-1]["name"] == output["name"]:
            merged[-1]["text"] += output["text"]
        else:
            merged.append(output)
    for output in merged:
        if output.get("output_type") == "stream":
            output["text"] = collapse_carriage_returns(output["text"])
    return merged


def execute(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=900, kernel_name="python3", record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = merge_streams(cell.outputs)
            if cell.metadata.get("reveals"):
                cell.outputs, cell.execution_count = [], None
    nb.metadata["kernelspec"] = KERNELSPEC
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    print(f"executed {path}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for arg in sys.argv[1:]:
        execute(Path(arg))
