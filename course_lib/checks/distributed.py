"""Deprecated: lesson 14's measure_zero1_bytes lives in course_lib.parallel; re-exported here for older notebooks."""

from ..parallel import measure_zero1_bytes

__all__ = ["measure_zero1_bytes"]
