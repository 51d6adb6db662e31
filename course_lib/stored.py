"""Deprecated name (kept until Part IV is complete): now ``course_lib.studies.stored`` (docs/developers.md)."""

from .studies.stored import *  # noqa: F401,F403
