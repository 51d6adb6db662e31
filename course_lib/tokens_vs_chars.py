"""Deprecated name (kept until Part IV is complete): now ``course_lib.studies.tokens_vs_chars`` (docs/developers.md)."""

from .studies.tokens_vs_chars import *  # noqa: F401,F403
