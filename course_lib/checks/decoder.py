"""Checkers for the exercises of lesson (being written)."""

__all__: list[str] = []
