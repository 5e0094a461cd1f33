# make demo / make test: create .venv, install the package, run. make install and make demo build the
# CUDA extension _C only where a GPU driver is found (setup.py; JETSPEC_BUILD_CUDA=1 asks for it
# anyway); make test also builds it wherever nvcc is found, for the tests of the build itself.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU machines install torch from a local wheel; set TORCH_SPEC= (empty) to keep an existing torch.
TORCH_SPEC ?= torch==2.13.0
VENV_FLAGS ?=
PYTEST_ARGS ?=
# A test running past this many seconds fails (pytest-timeout) instead of hanging the suite: a
# planted bug in the Triton topn bisection once looped forever (mutation campaign 3).
PYTEST_TIMEOUT ?= 900
# make test runs the suite in this many pytest-xdist processes (0: one process, no xdist).
PYTEST_WORKERS ?= 2
# make fuzz (600 s unless FUZZ_ARGS says --seconds): e.g. FUZZ_ARGS="--seconds 3600 --seed 42 --ops verify_tree,tree_attention"
FUZZ_ARGS ?=
STAMP := $(VENV)/.jetspec-installed
# make test's second stamp: the install rebuilt with _C where nvcc is found (driver or not).
TEST_STAMP := $(VENV)/.jetspec-installed-for-tests
TEST_BUILD_CUDA ?= $(if $(wildcard $(NVCC)),1,auto)
# make demo DEMO_ARGS=--full: the whole acceptance table (about 7 minutes on 2 CPU cores).
DEMO_ARGS ?=
BUILD_INPUTS := pyproject.toml setup.py CMakeLists.txt $(shell find csrc -type f 2>/dev/null)

.PHONY: install test test-slow fuzz demo bench-quick ext device-bundle clean

$(STAMP): $(BUILD_INPUTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(if $(TORCH_SPEC),$(PY) -m pip install -q "$(TORCH_SPEC)")
	$(PY) -m pip install -q "setuptools>=64" wheel "pybind11>=2.12" "cmake>=3.26" ninja
	@$(PY) setup.py --cuda-plan
	@start=$$(date +%s); $(PY) -m pip install -q --no-build-isolation -e '.[test,hf]' && \
	  echo "installed jetspec_kernels in $$(( $$(date +%s) - start )) s"
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	@JETSPEC_BUILD_CUDA=$(TEST_BUILD_CUDA) $(PY) setup.py --cuda-plan
	@start=$$(date +%s); JETSPEC_BUILD_CUDA=$(TEST_BUILD_CUDA) \
	  $(PY) -m pip install -q --no-build-isolation --no-deps -e . && \
	  echo "reinstalled jetspec_kernels for the tests in $$(( $$(date +%s) - start )) s"
	touch $(TEST_STAMP)

install: $(STAMP)

test: $(TEST_STAMP)
	$(PY) -m pytest -q --benchmark-disable -m "not slow" -n $(PYTEST_WORKERS) --dist worksteal \
	  --timeout $(PYTEST_TIMEOUT) $(PYTEST_ARGS) tests

# The tests marked slow (minutes on 2 cores): the Hopper attention gates, which build the sweep
# harness (bench/attn_sweep) for sm_90a and read its ptxas reports and SASS; the exact mode's
# largest end-to-end cases on the triton interpreter (B 16 / budget 64, B 1 / budget 256).
test-slow: $(TEST_STAMP)
	$(PY) -m pytest -q --benchmark-disable -m slow --timeout $(PYTEST_TIMEOUT) $(PYTEST_ARGS) tests

fuzz: $(STAMP)
	$(PY) tests/fuzz/run.py $(FUZZ_ARGS)

demo: $(STAMP)
	$(PY) -m jetspec_kernels demo $(DEMO_ARGS)

bench-quick: $(STAMP)
	$(PY) -m pytest -q tests/test_bench_quick.py

# _C for the GPU machines (sm_90a, their Python 3.12) and the attention sweep binary, built here
# and carried by the device tool
# (git-ignored; bench/device_check.sh loads it and rebuilds only if it does not load or its sources
# changed since). On the GPU machine: make device-bundle DEVICE_PYTHON=python3 PYBIND11_PY=python3.
DEVICE_BUNDLE ?= .device-bundle
DEVICE_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) $(shell command -v python3.12 2>/dev/null))
PYBIND11_PY ?= $(PY)
CMAKE ?= $(firstword $(abspath $(wildcard $(VENV)/bin/cmake)) cmake)
NINJA ?= $(firstword $(abspath $(wildcard $(VENV)/bin/ninja)) $(shell command -v ninja 2>/dev/null) ninja)
NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) /usr/local/cuda/bin/nvcc)

# _C alone, for EXT_ARCHS only, with CMake and ninja straight into EXT_OUT (no pip, no
# attention sweep): device_check.sh's build fallback on the GPU machine (make ext EXT_PYTHON=python3).
EXT_PYTHON ?= $(PY)
EXT_ARCHS ?= 90a
EXT_OUT ?= jetspec_kernels
ext:
	$(CMAKE) -S . -B build/ext-$(EXT_ARCHS) -GNinja -DCMAKE_MAKE_PROGRAM=$(NINJA) \
	  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER=$(NVCC) -DPython_EXECUTABLE=$(EXT_PYTHON) \
	  -Dpybind11_DIR=$$($(EXT_PYTHON) -m pybind11 --cmakedir) -DJETSPEC_CUDA_ARCHS=$(EXT_ARCHS) \
	  -DJETSPEC_OUTPUT_DIR=$(abspath $(EXT_OUT))
	$(CMAKE) --build build/ext-$(EXT_ARCHS) --target _C --parallel

device-bundle:
	@test -n "$(DEVICE_PYTHON)" || { echo "device-bundle: no python3.12 found (set DEVICE_PYTHON)"; exit 1; }
	$(CMAKE) -S . -B build/device-bundle -GNinja -DCMAKE_MAKE_PROGRAM=$(NINJA) \
	  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER=$(NVCC) -DPython_EXECUTABLE=$(DEVICE_PYTHON) \
	  -Dpybind11_DIR=$$($(PYBIND11_PY) -m pybind11 --cmakedir) -DJETSPEC_CUDA_ARCHS=90a \
	  -DJETSPEC_OUTPUT_DIR=$(abspath $(DEVICE_BUNDLE))
	$(CMAKE) --build build/device-bundle --parallel
	bash bench/device_check.sh --source-hash > $(DEVICE_BUNDLE)/SOURCES.sha256
	$(MAKE) -C bench/attn_sweep -j2 NVCC=$(NVCC)
	cp build/attn_sweep/attn_sweep $(DEVICE_BUNDLE)/attn_sweep
	ls -l $(DEVICE_BUNDLE)

clean:
	rm -rf build *.egg-info jetspec_kernels/_C*.so
