"""Deprecated name (kept until Part IV is complete): now ``course_lib.studies.adam_betas`` (docs/developers.md)."""

from .studies.adam_betas import *  # noqa: F401,F403
