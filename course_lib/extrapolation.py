"""Deprecated name (kept until Part IV is complete): now ``course_lib.studies.extrapolation`` (docs/developers.md)."""

from .studies.extrapolation import *  # noqa: F401,F403
