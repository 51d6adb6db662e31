"""Deprecated: lesson 09's references live in course_lib.lm_training and course_lib.gpt; re-exported here for older notebooks."""

from ..gpt import port_attention_reference
from ..lm_training import lm_train_reference

__all__ = ["lm_train_reference", "port_attention_reference"]
