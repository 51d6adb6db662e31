"""Shape tracing with loguru: watch tensors change shape as they flow through the model.

Off by default. One call turns it on::

    from course_lib.tracing import enable_shape_tracing, disable_shape_tracing
    enable_shape_tracing()        # every course_lib module now logs the shapes it produces
    model(src, tgt)
    disable_shape_tracing()

or, for one block of code, ``with shape_tracing(): model(src, tgt)``.

The format is deterministic (no timestamps, no colours, no line numbers) so that a notebook that
shows a trace still compares equal under nbval::

    MultiHeadAttention | q after split_heads: (2, 4, 7, 8)

Turning tracing on replaces loguru's handlers (the default one prints timestamps to stderr).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

import torch
from loguru import logger

__all__ = ["enable_shape_tracing", "disable_shape_tracing", "shape_tracing", "trace", "is_tracing"]

_FORMAT = "{extra[component]} | {message}"
_state = {"handler": None}

logger.disable("course_lib")


def is_tracing() -> bool:
    """True while shape tracing is on."""
    return _state["handler"] is not None


def trace(component: str, label: str, tensor: torch.Tensor) -> None:
    """Log ``label: shape`` for ``tensor`` under ``component`` (no-op unless tracing is on)."""
    if _state["handler"] is not None:
        logger.bind(component=component).debug("{}: {}", label, tuple(tensor.shape))


def enable_shape_tracing(sink: TextIO | None = None) -> None:
    """Turn shape tracing on; messages go to ``sink`` (default: ``sys.stdout``)."""
    disable_shape_tracing()
    logger.remove()  # drop loguru's default stderr handler (it prints timestamps)
    _state["handler"] = logger.add(
        sink if sink is not None else sys.stdout,
        format=_FORMAT,
        level="DEBUG",
        colorize=False,
        filter="course_lib",
    )
    logger.enable("course_lib")


def disable_shape_tracing() -> None:
    """Turn shape tracing off (a no-op when it is already off)."""
    if _state["handler"] is not None:
        logger.remove(_state["handler"])
        _state["handler"] = None
    logger.disable("course_lib")


@contextmanager
def shape_tracing(sink: TextIO | None = None) -> Iterator[None]:
    """Context manager: trace shapes inside the ``with`` block only."""
    enable_shape_tracing(sink)
    try:
        yield
    finally:
        disable_shape_tracing()
