# Every target bootstraps its own virtualenv in .venv, so a fresh clone needs only Python 3.11+.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test demo venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

## test: the whole test suite (PostgreSQL from AGENTRUN_TEST_DATABASE_URL, Docker, or embedded)
test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## demo: the crash-and-resume demo
demo: $(STAMP)
	$(BIN)/agentrun demo

clean:
	rm -rf $(VENV) build *.egg-info
