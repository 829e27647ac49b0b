# CUDA Memory Lab. Two commands on a fresh machine (Python 3.11+, which the pins need):
#   make book   create .venv, install the pinned requirements, execute the notebooks,
#               build the HTML book into _build/html (warnings are errors)
#   make test   the same environment; unit tests, notebook execution, book build
PYTHON ?= python3
VENV ?= .venv
BIN := $(CURDIR)/$(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
export PATH := $(BIN):$(PATH)
# The book shows the lab GPU's recorded results unless asked otherwise, so a build on a
# GPU machine gives the same pages as the online book: `make book BOOK_MODE=auto`
# measures live on this machine's GPU instead.
BOOK_MODE ?= recorded

.PHONY: book book-student test test-gpu install notebooks record clean browser sandbox pyodide system-packages test-executed

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "make needs Python 3.11 or newer (the pinned packages do); found " + sys.version.split()[0] + ". Try: make book PYTHON=python3.11")'
	$(PYTHON) -m venv $(VENV)

# constraints.txt pins every package (torch 2.13.0 is a CPU build on the lab's build machines).
# pip installs one package after another on one core (about 70 s for these 117): the pinned set is
# installed as two halves at once (torch and a third of the rest, then the others; the
# sphinxcontrib-* packages, which share a folder, together), each with --no-deps, which takes
# about 40 s on two cores. The plain install after them is what decides: it finds every
# requirement met (or installs what a stale pin left out) and fails on a conflict.
PIN_HALVES := $(VENV)/.pins
$(STAMP): $(PY) requirements.txt constraints.txt pyproject.toml
	@mkdir -p $(PIN_HALVES)
	@awk '/^[[:space:]]*(#|$$)/ {next} /^torch==/ {print > "$(PIN_HALVES)/a.txt"; next} \
	     tolower($$0) ~ /^sphinxcontrib/ {print > "$(PIN_HALVES)/b.txt"; next} \
	     {n++; print > ("$(PIN_HALVES)/" (n % 3 == 1 ? "a" : "b") ".txt")}' constraints.txt
	$(PY) -m pip install --quiet --no-deps -r $(PIN_HALVES)/a.txt & a=$$!; \
	$(PY) -m pip install --quiet --no-deps -r $(PIN_HALVES)/b.txt; b=$$?; wait $$a && [ $$b = 0 ]
	$(PY) -m pip install --quiet -c constraints.txt -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $@

install: $(STAMP)

# The page "Check your own snapshot" runs the doctor in the reader's browser on Pyodide, which the
# book ships from the npm registry's `pyodide` package, at the version package-lock.json pins
# (book/_ext/doctor_page.py copies it into the site). node_modules/ is not committed.
NPM ?= npm
PYODIDE := node_modules/pyodide/package.json
$(PYODIDE): package.json package-lock.json
	@command -v $(NPM) >/dev/null || { echo "the book ships Pyodide from the npm registry: install Node.js and npm (Debian: apt-get install npm)"; exit 2; }
	$(NPM) ci --ignore-scripts --no-audit --no-fund
	@touch $@

pyodide: $(PYODIDE)

# The package's own bytecode, written once (pip compiles the installed packages, not an editable
# one): where PYTHONDONTWRITEBYTECODE is set, as on the lab's machines, every notebook kernel, grader
# sandbox and subprocess would otherwise compile the modules it imports again (about 0.7 s of CPU
# for a chapter's imports). Python checks each file's time stamp, so a stale file is never used.
notebooks: install
	$(PY) -m compileall -q -j 0 experiments tests scripts book/_ext >/dev/null
	$(PY) scripts/sync_notebooks.py

# CUDA_MEMLAB_STATIC=1: every ex.panel becomes a recorded-grid explorer that needs no kernel
# and no widget JavaScript (experiments/explorer.py).
book: notebooks pyodide
	CUDA_MEMLAB_STATIC=1 CUDA_MEMLAB_MODE=$(BOOK_MODE) $(BIN)/jupyter-book build . --warningiserror --keep-going
	@echo "The book is at file://$(CURDIR)/_build/html/index.html"

# A build for students: exercise solutions and the instructors' page left out; only the pages,
# the notebooks to hand out and the package's wheel land in _build/student (the build itself runs
# in a private folder beside it). A course that hosts the wheel: make book-student PACKAGE_URL=https://...
book-student: notebooks pyodide
	CUDA_MEMLAB_MODE=$(BOOK_MODE) $(PY) scripts/student_edition.py build _build/student $(if $(PACKAGE_URL),--package-url $(PACKAGE_URL))

# The browser tests drive Debian's chromium (no browser download); CI runs as root, elsewhere
# sudo is used if there is one. Another Chromium-based browser: make test CHROMIUM=/path/to/it
CHROMIUM ?= /usr/bin/chromium
export CUDA_MEMLAB_CHROMIUM := $(CHROMIUM)
SUDO := $(shell [ "$$(id -u)" = 0 ] || command -v sudo)

$(CHROMIUM):
	@command -v apt-get >/dev/null || { echo "the browser tests need chromium at $(CHROMIUM) (Debian: apt-get install chromium)"; exit 2; }
	$(SUDO) apt-get install -y chromium || { $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium; }

browser: $(CHROMIUM)

# The grader runs every submission in a bubblewrap sandbox (experiments/grading/sandbox.py);
# its tests need Debian's bubblewrap, installed the same way. Another bwrap: make test BWRAP=/path/to/bwrap
BWRAP ?= /usr/bin/bwrap
export CUDA_MEMLAB_BWRAP := $(BWRAP)

$(BWRAP):
	@command -v apt-get >/dev/null || { echo "the grader's tests need bubblewrap at $(BWRAP) (Debian: apt-get install bubblewrap)"; exit 2; }
	$(SUDO) apt-get install -y bubblewrap || { $(SUDO) apt-get update && $(SUDO) apt-get install -y bubblewrap; }

sandbox: $(BWRAP)

# Both system packages `make test` needs, from ONE apt-get: `make test` installs them while pip
# and the notebooks run, and two apt-gets at once would fight over dpkg's lock.
SYSTEM_PACKAGES = $(if $(wildcard $(CHROMIUM)),,chromium) $(if $(wildcard $(BWRAP)),,bubblewrap)
system-packages:
	@pkgs="$(strip $(SYSTEM_PACKAGES))"; [ -z "$$pkgs" ] && exit 0; \
	command -v apt-get >/dev/null || { echo "the browser tests need chromium at $(CHROMIUM) and the grader's tests bubblewrap at $(BWRAP) (Debian: apt-get install chromium bubblewrap)"; exit 2; }; \
	echo "apt-get install -y $$pkgs"; \
	$(SUDO) apt-get install -y $$pkgs || { $(SUDO) apt-get update && $(SUDO) apt-get install -y $$pkgs; }

# The book build is the one execution of the notebooks (a cell error fails it); the tests then
# read its pages and executed notebooks (tests/conftest.py: built_book), so nothing runs twice.
# It is built as `make book` builds it (static explorers), and the browser tests serve it.
# Both steps use every core, up to TEST_JOBS (default: the cores, at most 4): the notebooks are
# executed TEST_JOBS at a time into the build's execution cache first (tests/bookbuild.py; the
# build then only reads it; `finish` fails if it executed one again), and pytest runs in
# TEST_JOBS processes (pytest-xdist; tests/scheduling.py keeps a module's costly set-up in one).
# TEST_JOBS=1 executes the notebooks one at a time and runs the tests in one worker.
# On a fresh machine the set-up waits on different things (pip on the disk, apt-get and npm on
# the network) while executing the notebooks needs only the venv: apt-get and npm run beside
# pip and the notebooks' execution (a make of its own with -j3), the build waits for all three.
# The fast loop while developing skips the build and the slow tests:
#   .venv/bin/python -m pytest -m "not slow" -n 2
TEST_BOOK := _build/test
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
BOOK_ENV := CUDA_MEMLAB_STATIC=1 CUDA_MEMLAB_MODE=recorded
test:
	rm -rf $(TEST_BOOK)
	$(MAKE) --no-print-directory -j3 test-executed system-packages pyodide
	$(BOOK_ENV) $(BIN)/jupyter-book build . --path-output $(TEST_BOOK) --warningiserror --keep-going
	$(PY) -m tests.bookbuild finish $(TEST_BOOK)
	CUDA_MEMLAB_BOOK_BUILD=$(CURDIR)/$(TEST_BOOK) $(PY) -m pytest -n $(TEST_JOBS) --dist loadgroup

test-executed: notebooks
	$(BOOK_ENV) $(PY) -m tests.bookbuild execute $(TEST_BOOK) --jobs $(TEST_JOBS)

# On a GPU: the GPU-marked tests only.
test-gpu: install
	$(PY) -m pytest -m gpu

# On a GPU: measure every experiment and rewrite experiments/recorded/.
record: install
	$(PY) -m experiments record

clean:
	rm -rf _build .pytest_cache
