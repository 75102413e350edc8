# Two entry points for a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-stamp
DEMO_OUT ?= demo_out

.PHONY: venv demo test lint docs clean

$(STAMP): pyproject.toml constraints.txt setup.py csrc/jpegwindow.c
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first, alone: pip then takes the local CPU build instead of a multi-GB CUDA one.
	$(PIP) install -q -c constraints.txt torch
	$(PIP) install -q -c constraints.txt -e ".[all]"
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(PY) scripts/demo.py --out $(DEMO_OUT)

test: venv
	# One test process per core (at most 4); the Ray tests share one (conftest.py).
	$(PY) -m pytest -q -p no:cacheprovider -n auto --maxprocesses 4 --dist loadgroup

docs: venv
	# The documentation site (mkdocs.yml) into site/; --strict: a broken link or page fails
	$(VENV)/bin/mkdocs build --strict --quiet

lint: venv
	$(VENV)/bin/ruff check packer readers scripts tests
	$(VENV)/bin/mypy

clean:
	rm -rf $(DEMO_OUT) .pytest_cache site
