# make demo / make test: create .venv, install the package (building _C when nvcc is found), run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU machines install torch from a local wheel; set TORCH_SPEC= (empty) to keep an existing torch.
TORCH_SPEC ?= torch==2.13.0
VENV_FLAGS ?=
PYTEST_ARGS ?=
STAMP := $(VENV)/.jetspec-installed
BUILD_INPUTS := pyproject.toml setup.py CMakeLists.txt $(shell find csrc -type f 2>/dev/null)

.PHONY: install test test-slow demo bench-quick clean

$(STAMP): $(BUILD_INPUTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(if $(TORCH_SPEC),$(PY) -m pip install -q "$(TORCH_SPEC)")
	$(PY) -m pip install -q "setuptools>=64" wheel "pybind11>=2.12" "cmake>=3.26" ninja
	$(PY) -m pip install -q --no-build-isolation -e '.[test,hf]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q --benchmark-disable -m "not slow" $(PYTEST_ARGS) tests

# The tests marked slow (minutes on 2 cores): the Hopper attention gates, which build the sweep
# harness (bench/attn_sweep) for sm_90a and read its ptxas reports and SASS.
test-slow: $(STAMP)
	$(PY) -m pytest -q --benchmark-disable -m slow $(PYTEST_ARGS) tests

demo: $(STAMP)
	$(PY) -m jetspec_kernels demo

bench-quick: $(STAMP)
	$(PY) -m pytest -q tests/test_bench_quick.py

clean:
	rm -rf build *.egg-info jetspec_kernels/_C*.so
