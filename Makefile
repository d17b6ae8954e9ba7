# Two entry points for a fresh machine:
#   make demo   - venv, install, 2-rank data-parallel training example
#   make test   - venv, install with test extras, the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
NP ?= 2
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: venv install install-test demo test test-multihost bench clean

venv:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)

install: venv
	$(PIP) ".[mpich,examples]"

install-test: venv
	$(PIP) ".[mpich,test,examples,torch,tensorflow]"

demo: install
	$(VENV)/bin/mpirun -np $(NP) $(PY) examples/train_digits.py

test: install-test
	$(VENV)/bin/pytest -v -rs tests --ignore=tests/multihost

test-multihost: install-test
	$(VENV)/bin/pytest -v -rs tests/multihost

bench: install
	$(VENV)/bin/mpirun -np $(NP) $(PY) -m jaxcache.bench

clean:
	rm -rf build dist *.egg-info
