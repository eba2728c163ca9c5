# The two set-up commands in README.md: `make demo` and `make test`.
# Each creates or updates .venv on first use (and again when pyproject.toml changes).
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test clean

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	# torch first and pinned: an unpinned torch pulls gigabytes of CUDA packages.
	$(VENV)/bin/python -m pip install -q "torch==2.13.0"
	$(VENV)/bin/python -m pip install -q -e ".[torch,plot,test,apps]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/actorpy demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
