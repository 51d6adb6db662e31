"""Exercise checkers: ``check_xxx(your_function_or_class)``.

A checker runs your code and course_lib's reference on several seeded inputs. It prints one line
when everything matches; otherwise it raises ``AssertionError`` naming the likely mistake and how
to fix it. An exercise you have not started (it raises ``NotImplementedError``) just prints a reminder.

One module per lesson: prerequisites (00), attention (01), multi_head (02), embeddings (03),
encoder (04), decoder (05), training (06), inference (07), translation (08), gpt (09),
tokenization (10), modern (11), inside (12), scale (13), distributed (14).
``show_solution`` and ``predicted_answer`` (for the reveal cell after a "Predict, then run"
exercise) come from ``course_lib.solutions``.
"""

from ._common import CheckFailure, has_passed, yours_or_reference
from .attention import *  # noqa: F403
from .decoder import *  # noqa: F403
from .distributed import *  # noqa: F403
from .embeddings import *  # noqa: F403
from .encoder import *  # noqa: F403
from .gpt import *  # noqa: F403
from .inference import *  # noqa: F403
from .inside import *  # noqa: F403
from .modern import *  # noqa: F403
from .multi_head import *  # noqa: F403
from .prerequisites import *  # noqa: F403
from .scale import *  # noqa: F403
from .tokenization import *  # noqa: F403
from .training import *  # noqa: F403
from .translation import *  # noqa: F403
from ..solutions import predicted_answer, show_solution
