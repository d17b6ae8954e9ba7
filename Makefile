# Two entry points for a fresh machine:
#   make demo   - venv, install, 2-rank data-parallel training example
#   make test   - venv, install with test extras, the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
NP ?= 2
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: venv install install-test demo test test-multihost test-mpi4jax test-horovod test-jax-latest test-gpu gpu-wheels bench clean

venv:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)

install: venv
	$(PIP) ".[mpich,examples]"

install-test: venv
	$(PIP) ".[mpich,test,examples,torch,tensorflow]"
	$(PIP) --no-deps "tf-keras==2.21.0"

demo: install
	$(PY) -m jaxcache.run -np $(NP) examples/train_digits.py

test: install-test
	$(VENV)/bin/pytest -v -rs tests --ignore=tests/multihost

test-multihost: install-test
	$(VENV)/bin/pytest -v -rs tests/multihost

# mpi4jax's own test suite (from its PyPI sdist) against jaxcache.mpi4jax, one mpirun per
# test at 2 and 3 ranks (docs/mpi4jax.md); not part of make test (about half an hour).
test-mpi4jax: install-test
	$(PY) tests/mpi4jax_suite.py --np 2 --np 3

# Horovod's own test suites (torch, TensorFlow, Keras) against jaxcache's bridges, one mpirun
# per test at 2 ranks (docs/horovod.md); needs a Horovod source checkout: HOROVOD_SRC=DIR
# (e.g. git clone -b v0.28.1 https://github.com/horovod/horovod). Not part of make test.
HOROVOD_SUITES ?= --suite torch
test-horovod: install-test
	@test -n "$(HOROVOD_SRC)" || { echo "test-horovod: set HOROVOD_SRC to a Horovod source checkout"; exit 2; }
	$(VENV)/bin/pip install --quiet --disable-pip-version-check mock cloudpickle parameterized
	$(PY) tests/horovod_suite.py --horovod $(HOROVOD_SRC) $(HOROVOD_SUITES)

# The newest jax (0.12, which needs Python >= 3.12) in a venv of its own: jaxcache built
# against its FFI headers, then the core multi-rank tests, the exactly-once tests of
# transformations, async use and resizing, point-to-point (its ordered effect), the CUDA
# lowering tests, and several devices per process (shard_map, sharded arrays, axis_name).
JAX_LATEST ?= 0.12.0.1
VENV_LATEST ?= .venv-jax012
PYTHON312 ?= $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12; do \
	$$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { echo $$p; break; }; done)
test-jax-latest:
	@test -n "$(PYTHON312)" || { echo "test-jax-latest: SKIPPED, no Python 3.12 found"; exit 0; }; \
	set -e; test -x $(VENV_LATEST)/bin/python || $(PYTHON312) -m venv $(VENV_LATEST); \
	$(VENV_LATEST)/bin/python -m pip install --quiet --disable-pip-version-check "jax==$(JAX_LATEST)" \
		"jaxlib==$(JAX_LATEST)" mpich "mpi4py>=4.0" pytest pytest-timeout nanobind scikit-build-core cmake ninja; \
	PATH=$(abspath $(VENV_LATEST))/bin:$$PATH $(VENV_LATEST)/bin/python -m pip install --quiet \
		--disable-pip-version-check --no-build-isolation --no-deps --force-reinstall .; \
	$(VENV_LATEST)/bin/pytest -v -rs tests/test_core.py tests/test_exactly_once.py tests/test_cuda.py \
		tests/test_jax_versions.py tests/test_point_to_point.py tests/test_devices.py \
		-k "not repeated and (test_core or transforms or async or resize or cuda or versions or point_to_point or devices)"

# The GPU check (docs/gpu.md). On the GPU machine: make test-gpu (needs .whl/ from gpu-wheels).
test-gpu:
	bash tests/gpu/device_check.sh

# The wheels the GPU check machine lacks (no MPI library, no network there), into .whl/.
gpu-wheels:
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl mpich==5.0.2 mpi4py==4.1.2

bench: install
	$(PY) -m jaxcache.run -np $(NP) -m jaxcache.bench

clean:
	rm -rf build dist *.egg-info
