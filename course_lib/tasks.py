"""Deprecated name (kept until Part IV is complete): the tasks now live in ``course_lib.data.variable_length`` and
``course_lib.data.shakespeare``; ``python -m course_lib.tasks fetch`` still fetches (docs/developers.md)."""

from .data.files import checked_file, data_dir  # noqa: F401
from .data.shakespeare import *  # noqa: F401,F403
from .data.variable_length import VariableLengthTask  # noqa: F401

if __name__ == "__main__":  # python -m course_lib.tasks fetch, as older setup cells run it
    from .data.__main__ import main

    raise SystemExit(main())
