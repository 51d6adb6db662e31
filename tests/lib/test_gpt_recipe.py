"""The GPT benchmark's claim, on every float path (scripts/float_paths.py runs this file on each):
the course's recipe ends below the final loss of nanoGPT's CPU recipe (the anchor) on the held-out
plays, and passes it before its own last evaluation. Times are `make benchmark`'s business, not a
test's; the step at which the course's recipe passes the anchor is what makes it about 3x faster
(its steps cost about half of the anchor's on two cores, see benchmarks/gpt.py).

The course's run is trained once per module (AVX2, 1 thread: its 700 steps about 70 s) and
evaluated only where an assertion reads it, at 0.9 x its steps and at its end (each evaluation of
1,024 windows costs about 12 training steps; the curve every 70 steps is benchmarks/gpt.py's).

Its target is the anchor's final loss as recorded (``ANCHOR_FINAL``, the lowest of every path
measured), not the anchor run itself: those 2,000 steps (about 370 s of CPU on AVX2, 1 thread) are
the same fixed baseline every time, and they were CI's costliest test. The anchor still runs, and
its test checks that it ends at or above the recorded loss on the path at hand (so that beating
``ANCHOR_FINAL`` is beating the anchor there), in the full float-path plan (`make
test-portability`), which runs every test; `make benchmark` runs it too. The paired plan (CI)
deselects it with ``-m "not anchor"``."""

from __future__ import annotations

import pytest

from course_lib.lm_training import COURSE, NANOGPT_CPU, train_lm
from course_lib.data.shakespeare import ShakespeareCorpus

PASS_BY = COURSE.num_steps * 9 // 10  # 630 of 700
# The anchor's final validation loss (1,024 windows, seed 0) rounded down to two decimals: 1.9180
# on AVX2 and 1.9180 on the portable kernels (1 thread), 1.918 on AVX-512 (2 threads, docs/developers.md).
ANCHOR_FINAL = 1.91


@pytest.fixture(scope="module")
def course():
    # evaluated at step 0, at PASS_BY (the step by which it must pass the anchor) and at the end
    run = train_lm(ShakespeareCorpus(), COURSE, seed=0, eval_every=PASS_BY, val_windows=1024,
                   progress=False)
    assert [step for step, _, _ in run.curve] == [0, PASS_BY, COURSE.num_steps]
    return run


def test_course_recipe_ends_below_the_anchor(course):
    final = course.curve[-1][2]
    assert final < ANCHOR_FINAL - 0.01, (final, ANCHOR_FINAL)  # 1.85 measured


def test_course_recipe_passes_the_anchor_before_its_end(course):
    reached = course.first_reaching(ANCHOR_FINAL)
    assert reached is not None, (course.curve, ANCHOR_FINAL)
    assert reached[0] <= PASS_BY, (course.curve, ANCHOR_FINAL)  # 1.860 at 630 (AVX2, default)


@pytest.mark.anchor
def test_the_anchor_ends_at_or_above_its_recorded_loss():
    anchor = train_lm(ShakespeareCorpus(), NANOGPT_CPU, seed=0, val_windows=1024, progress=False)
    final = anchor.curve[-1][2]
    assert ANCHOR_FINAL <= final < 1.95, final  # it learned, and beating ANCHOR_FINAL beats it
