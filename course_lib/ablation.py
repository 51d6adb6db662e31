"""Deprecated name (kept until Part IV is complete): now ``course_lib.studies.ablation`` (docs/developers.md)."""

from .studies.ablation import *  # noqa: F401,F403
