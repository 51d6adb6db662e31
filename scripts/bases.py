"""The trained bases of lessons 15 and 16, which the lessons load instead of training them live.

    python scripts/bases.py        (or: make bases; about 2 min on 1 thread)

Trains ``train_base(seed=0)`` (lesson 15: lesson 09's GPT, ``COURSE``, 700 steps on the training
plays) and ``train_chat_base(seed=0)`` (lesson 16: the same at 128 positions, grown by the chat
template's 3 ids) with one thread, and writes them to ``course_lib/results/finetuning_base.pt`` and
``instruct_base.pt``. On the float path the files were made on (``BASE_FLOAT_PATH``, avx512) it writes
them again bit for bit; on another path it writes that path's weights, and says that the loaders,
which check each file's sha256, refuse them until ``BASE_SHA256`` / ``CHAT_BASE_SHA256`` are set to
the printed values.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch starts its thread pool

import torch  # noqa: E402

from course_lib.studies.finetuning import BASE_SHA256, save_base  # noqa: E402
from course_lib.studies.instruct import CHAT_BASE_SHA256, save_chat_base  # noqa: E402
from course_lib.studies.stored import float_path  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)  # the stored files' setting
    print(f"float path {float_path()}, torch {torch.__version__}, {torch.get_num_threads()} thread")
    for name, save, expected in (("BASE_SHA256", save_base, BASE_SHA256),
                                 ("CHAT_BASE_SHA256", save_chat_base, CHAT_BASE_SHA256)):
        path, sha = save()
        same = "the stored file, bit for bit" if sha == expected else (
            f"differs from {name} = {expected[:12]}...: set it to this sha256 for the loaders to accept it")
        print(f"wrote {path} ({path.stat().st_size:,} bytes), sha256 {sha}: {same}", flush=True)


if __name__ == "__main__":
    main()
