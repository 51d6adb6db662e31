"""Deprecated name (kept until Part IV is complete): now ``course_lib.studies.dates_remedy`` (docs/developers.md)."""

from .studies.dates_remedy import *  # noqa: F401,F403
