# loadfuzz: set-up, build, test, demo, bench.
# Every target is idempotent: a second `make` does nothing that is already done.

PYTHON      ?= python3.11
VENV        := .venv
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip --disable-pip-version-check -q
SITE        = $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ET          = $(SITE)/executorch
BUILD       := build
CC          ?= gcc

.PHONY: all setup harness fixtures bytecode test demo bench lint clean chromium
all: setup harness fixtures bytecode

# --- the environment ---------------------------------------------------------
$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first and pinned, so that nothing can make pip resolve another (CUDA) torch;
# executorch without its Python dependencies: only its shared libraries matter here.
$(VENV)/.deps: pyproject.toml | $(PY)
	$(PIP) install torch==2.13.0
	$(PIP) install --no-deps executorch==1.5.1
	$(PIP) install -e '.[dev]'
	touch $@

setup: $(VENV)/.deps

# Byte-compile loadfuzz (only what changed): with PYTHONDONTWRITEBYTECODE set, as here, every
# command would otherwise compile the package from source again (60-90 ms of each start-up).
bytecode: setup
	$(PY) -m compileall -q loadfuzz tools

# --- the C harness -------------------------------------------------------------
# One recipe (loadfuzz/run/build.py), the one an installed loadfuzz uses on first run;
# --strict makes warnings errors. The binary lands in ~/.cache/loadfuzz/harness-<hash>.
harness: setup
	$(PY) -m loadfuzz.run.build --strict

# --- fixture libraries for the tests ------------------------------------------
include tests/fixtures/fixtures.mk

# --- headless Chromium, for looking at the HTML report -------------------------
chromium: /usr/bin/chromium
/usr/bin/chromium:
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

# --- what users run -----------------------------------------------------------
test: all chromium
	$(VENV)/bin/pytest -q

lint: setup
	$(VENV)/bin/ruff check loadfuzz tests tools

demo: all $(LEGACY_PLUGIN)
	$(VENV)/bin/loadfuzz matrix executorch --add $(LEGACY_PLUGIN) --expect results/expectations/executorch.toml

# The whole commands as users run them against the plain way (tools/plain.c, built with $(CC))
# on every core; about 5 minutes on 2 cores. Prints times, never asserts one.
bench: all
	CC="$(CC)" $(PY) tools/bench.py

clean:
	rm -rf $(BUILD)
