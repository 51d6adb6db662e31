"""Exercise checkers: ``check_xxx(your_function_or_class)``.

A checker runs your code and course_lib's reference on several seeded inputs. It prints one line
when everything matches; otherwise it raises ``AssertionError`` naming the likely mistake and how
to fix it. An exercise you have not started (it raises ``NotImplementedError``) just prints a reminder.

One module per lesson and concept, ``lessonNN_<concept>.py`` (its docstring lists its exercises):

* 00 ``lesson00_prerequisites``
* 01 ``lesson01_attention``
* 02 ``lesson02_heads`` (split, merge, views), ``lesson02_multi_head`` (parameters, the layer)
* 03 ``lesson03_embeddings``
* 04 ``lesson04_encoder``
* 05 ``lesson05_decoder``
* 06 ``lesson06_training``
* 07 ``lesson07_inference``
* 08 ``lesson08_translation``
* 09 ``lesson09_gpt`` (initial loss, the loss, the forward pass), ``lesson09_recipe`` (the training
  loop), ``lesson09_generate`` (sampling), ``lesson09_port`` (the attention port)
* 10 ``lesson10_tokenization`` (token counts; what the others share), ``lesson10_merge``,
  ``lesson10_train_bpe``, ``lesson10_bpe_encode``, ``lesson10_wordpiece``
* 11 ``lesson11_modern`` (RMSNorm, SwiGLU; what the others share), ``lesson11_rope`` (RoPE, its
  layout), ``lesson11_gqa`` (grouped-query attention, the KV cache's bytes), ``lesson11_rope_decode``
* 12 ``lesson12_inside`` (the induction score, the ablation prediction; what the others share),
  ``lesson12_hooks`` (ablation and patching hooks), ``lesson12_circuits`` (the patching table, the OV
  circuit)
* 13 ``lesson13_scale`` (its usual mistakes as code in ``lesson13_scale_mistakes``), ``lesson13_flash_backward``
  (the backward tile, the IO bytes), ``lesson13_paged`` (the paged cache read page by page),
  ``lesson13_locate`` (check_locate's reading of each number), ``lesson13_named`` (the mistakes of tryout
  13e as code, and how each is told apart), ``lesson13_named_f`` and ``lesson13_named_g`` (those of
  tryouts 13f and 13g)
* 14 ``lesson14_distributed`` (accumulation, averaging, the seeds Debug, Megatron's MLP; what their likely
  mistakes give in ``lesson14_mistakes``; ZeRO-1's bytes and Megatron's MLP in
  ``lesson14_megatron_mistakes``), ``lesson14_ddp``
  (the DDP container), ``lesson14_zero`` (the sharded optimizer, ZeRO's bytes), ``lesson14_autograd``
  (Megatron's f and g)
* 15 ``lesson15_lora`` (the LoRA layer, ★★★; what the others share), ``lesson15_adapters`` (LoRA's
  count, wrapping a model's targets, the merge Debug, the bytes of adapters against copies)
* 16 ``lesson16_sft`` (the positions that carry loss, the labels, the sequence log-probability; what the
  others share), ``lesson16_dpo`` (DPO's loss at step 0, the loss ★★★, the reference that trained, Debug)

``common`` is what they share: the ``checker`` decorator, ``compare`` and its named mistakes, and the
one guard against handing in course_lib's own code (``is_course_lib``, ``course_lib_used``).
``show_solution`` and ``predicted_answer`` (for the reveal cell after a "Predict, then run"
exercise) come from ``course_lib.solutions``. ``gpt`` and ``distributed`` only re-export lesson 09's
and 14's references for older notebooks (deprecated); the library holds them now.
"""

from ..attention import merge_heads as reference_merge_heads  # deprecated: course_lib.attention.merge_heads
from ..attention import split_heads as reference_split_heads  # deprecated: course_lib.attention.split_heads
from ..solutions import predicted_answer, show_solution
from .common import CheckFailure, has_passed, yours_or_reference
from .lesson00_prerequisites import *  # noqa: F403
from .lesson01_attention import *  # noqa: F403
from .lesson02_heads import *  # noqa: F403
from .lesson02_multi_head import *  # noqa: F403
from .lesson03_embeddings import *  # noqa: F403
from .lesson04_encoder import *  # noqa: F403
from .lesson05_decoder import *  # noqa: F403
from .lesson06_training import *  # noqa: F403
from .lesson07_inference import *  # noqa: F403
from .lesson08_translation import *  # noqa: F403
from .lesson09_gpt import *  # noqa: F403
from .lesson09_recipe import *  # noqa: F403
from .lesson09_generate import *  # noqa: F403
from .lesson09_port import *  # noqa: F403
from .lesson10_tokenization import *  # noqa: F403
from .lesson10_merge import *  # noqa: F403
from .lesson10_train_bpe import *  # noqa: F403
from .lesson10_bpe_encode import *  # noqa: F403
from .lesson10_wordpiece import *  # noqa: F403
from .lesson11_modern import *  # noqa: F403
from .lesson11_rope import *  # noqa: F403
from .lesson11_gqa import *  # noqa: F403
from .lesson11_rope_decode import *  # noqa: F403
from .lesson12_inside import *  # noqa: F403
from .lesson12_hooks import *  # noqa: F403
from .lesson12_circuits import *  # noqa: F403
from .lesson13_scale import *  # noqa: F403
from .lesson13_flash_backward import *  # noqa: F403
from .lesson13_paged import *  # noqa: F403
from .lesson14_distributed import *  # noqa: F403
from .lesson14_zero import *  # noqa: F403
from .lesson14_ddp import *  # noqa: F403
from .lesson14_autograd import *  # noqa: F403
from .lesson15_lora import *  # noqa: F403
from .lesson15_adapters import *  # noqa: F403
from .lesson16_sft import *  # noqa: F403
from .lesson16_dpo import *  # noqa: F403
