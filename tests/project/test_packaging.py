"""What ``pip install .`` ships (Colab, a wheel, the Gradescope image): every package of course_lib."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_course_lib_package_is_installed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "course_lib").rglob("__init__.py")}
    assert listed == on_disk
