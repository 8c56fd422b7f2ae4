# Two user-facing targets: `make demo` and `make test`. Everything else is their plumbing.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DATA ?= .uprof-data
# pytest-xdist worker processes for `make test` (decisions 0043 and 0046): on the 2-core
# reference machine 3 keep both cores busier than 2 now that tests wait on the database
# and on child processes more than they compute (277 s against 305 s; 4: 295 s).
# PYTEST_WORKERS=0 runs the suite in this one process.
PYTEST_WORKERS ?= 3

.PHONY: setup demo test bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch first: the pinned CPU build is on local disk; any later resolver then keeps it
# instead of pulling a multi-GB CUDA build.
#
# `--no-compile`, then one `compileall` on both cores (decision 0251's Left, item 4): pip
# compiles each package's bytecode on one core as it installs it (~60 s of the set-up);
# compiling them together afterwards with `-j 0` uses every core and leaves the same
# bytecode, so commands still start fast where PYTHONDONTWRITEBYTECODE is set. The one
# file excluded is a test helper of torch's written in Python 3.12 syntax, which pip's own
# compile skips too (compileall would exit 1 on it).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --no-compile torch==2.13.0
	$(BIN)/pip install --quiet --no-compile -e '.[dev]'
	$(BIN)/python -m compileall -q -j 0 -x 'py312_intrinsics\.py$$' $(VENV)/lib
	touch $@

# all-mpnet-base-v2 (UPROF_EMBEDDER=mpnet) is not a package: fetched once per machine into
# ~/.cache/uprof/models and verified file by file (decision 0049); a verified copy stays.
setup: $(VENV)/.installed
	$(BIN)/uprof models fetch mpnet

demo: setup
	HF_HUB_OFFLINE=1 $(BIN)/uprof demo --data-dir $(DATA)/demo --fresh

# The suite starts ~150 Python child processes (servers, workers, CLI runs) that import
# the project: with PYTHONDONTWRITEBYTECODE set in the environment (some machines set it)
# each would compile every module again, ~0.2 s of CPU per process. The run writes bytecode
# (__pycache__ is ignored by git).
#
# mypy runs beside pytest, not before it (decision 0056): from a clean clone it spends
# ~50 s of CPU on one core, while the test workers, waiting on the database and on child
# processes, leave part of the two cores idle. `nice` gives the tests first claim on the
# CPU, so the type check only takes what they leave. Its report follows the tests'; the
# target fails if either failed. `--durations=40` lists the slowest tests at the end of every
# run (CI's log included): the suite's time is bounded by CI's 30 minutes, and where it goes
# is read from there.
test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@log=$$(mktemp); \
	nice -n 10 $(BIN)/mypy > $$log 2>&1 & types=$$!; \
	PYTHONDONTWRITEBYTECODE= HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist load --durations=40; tests=$$?; \
	wait $$types; typed=$$?; \
	echo "mypy:"; cat $$log; rm -f $$log; \
	test $$tests -eq 0 && test $$typed -eq 0

clean:
	rm -rf $(VENV) $(DATA)
