"""Draw every diagram of the course: runs `draw(outdir)` of each images/diagrams_*.py.

    python images/make_images.py        (or: make images)

The diagrams are original matplotlib drawings; their PNGs are committed so that the notebooks show
them on GitHub and offline. Re-run after editing a diagrams_*.py file.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

HERE = Path(__file__).resolve().parent


def main() -> None:
    for script in sorted(HERE.glob("diagrams_*.py")):
        spec = importlib.util.spec_from_file_location(script.stem, script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for path in module.draw(HERE):
            print(f"{script.name}: wrote {path.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
