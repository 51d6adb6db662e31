# Two commands do everything on a fresh machine with Python 3.11:
#   make lab    set up, then open the course in JupyterLab
#   make test   set up, then run every test: pytest for course_lib and strict nbval over every notebook
# `make setup` alone builds .venv: torch first (CPU build, pinned), then requirements.txt,
# course_lib in editable mode and a Jupyter kernel named "transformers-course".

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
KERNEL := transformers-course
STAMP  := $(VENV)/.stamp-setup
# The exact test command (README and .ci/run use `make test`).
PYTEST_ARGS := tests --nbval notebooks --nbval-current-env \
               --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=600 -p no:cacheprovider
SOLUTIONS_ARGS := tests/notebooks_with_solutions.py -p no:cacheprovider

.PHONY: setup lab test test-solutions test-lib test-notebooks benchmark images execute clean

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 needed, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -r requirements.txt
	$(PIP) install --quiet --no-deps -e .
	$(PY) -m ipykernel install --user --name $(KERNEL) --display-name "Python 3 (Transformers course)"
	@touch $(STAMP)

lab: setup
	$(VENV)/bin/jupyter lab notebooks/

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)
	$(PY) -m pytest $(SOLUTIONS_ARGS)

# The second run: every notebook with its exercise stubs replaced by the solutions; every checker passes.
test-solutions: setup
	$(PY) -m pytest $(SOLUTIONS_ARGS)

test-lib: setup
	$(PY) -m pytest tests

test-notebooks: setup
	$(PY) -m pytest --nbval notebooks --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider

# Re-execute every notebook in place (after editing one), storing fresh outputs.
execute: setup
	$(PY) scripts/execute_notebooks.py notebooks/*.ipynb

benchmark: setup
	$(PY) benchmarks/copy_task.py
	$(PY) benchmarks/attention.py

images: setup
	$(PY) images/make_images.py

clean:
	rm -rf $(VENV)
