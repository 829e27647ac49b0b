# CUDA Memory Lab. Two commands on a fresh machine (Python 3.10+):
#   make book   create .venv, install the pinned requirements, execute the notebooks,
#               build the HTML book into _build/html (warnings are errors)
#   make test   the same environment; unit tests, notebook execution, book build
PYTHON ?= python3
VENV ?= .venv
BIN := $(CURDIR)/$(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
export PATH := $(BIN):$(PATH)

.PHONY: book book-student test test-gpu install notebooks record clean

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10 or newer is needed; found " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)

# constraints.txt pins every package (torch 2.13.0 is a CPU build on the lab's build machines).
$(STAMP): $(PY) requirements.txt constraints.txt pyproject.toml
	$(PY) -m pip install --quiet -c constraints.txt -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $@

install: $(STAMP)

notebooks: install
	$(PY) scripts/sync_notebooks.py

book: notebooks
	$(BIN)/jupyter-book build . --warningiserror --keep-going
	@echo "The book is at file://$(CURDIR)/_build/html/index.html"

# A build for students: exercise solutions left out.
book-student: notebooks
	$(PY) scripts/student_config.py > $(VENV)/student_config.yml
	$(BIN)/jupyter-book build . --config $(VENV)/student_config.yml --path-output _build/student --warningiserror --keep-going
	@echo "The student book is at file://$(CURDIR)/_build/student/_build/html/index.html"

test: install
	$(PY) -m pytest

# On a GPU: the GPU-marked tests only.
test-gpu: install
	$(PY) -m pytest -m gpu

# On a GPU: measure every experiment and rewrite experiments/recorded/.
record: install
	$(PY) -m experiments record

clean:
	rm -rf _build .pytest_cache
