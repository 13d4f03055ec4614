# Two commands: `make setup` (a .venv with torch, the XLA CPU plugin and the
# built extension) and `make test` (C tests under ASan+UBSan, then pytest).
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
CC      ?= gcc
CFLAGS  := -std=c11 -Wall -Wextra -Werror -g -Icsrc
SAN     := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
BUILD   := build/ctest
CORE    := csrc/core.c
RT      := csrc/runtime/runtime.c
HLO     := csrc/hlo/hlo.c

.PHONY: setup build test check pytest clean

setup:
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet "torch==2.13.0" numpy pytest expecttest xla-cpu-pjrt
	$(MAKE) build

build:
	$(VPY) -m pip install --quiet --no-build-isolation --no-deps -e .

plugin = $(shell $(VPY) -c "import torchtpu._plugin as p; print(p.find()[0])" 2>/dev/null)
plugin_include = $(shell $(VPY) -c "import os, torchtpu._plugin as p; print(os.path.join(os.path.dirname(p.find()[0]), 'include'))" 2>/dev/null)

$(BUILD):
	mkdir -p $(BUILD)

# C unit tests, under AddressSanitizer and UndefinedBehaviorSanitizer.
check: | $(BUILD)
	$(CC) $(CFLAGS) $(SAN) $(CORE) $(HLO) tests/c/test_hlo.c -lm -o $(BUILD)/test_hlo
	$(BUILD)/test_hlo
	$(CC) $(CFLAGS) $(SAN) $(CORE) $(RT) tests/c/test_runtime.c -ldl -lpthread -o $(BUILD)/test_runtime
	LSAN_OPTIONS=suppressions=tests/c/lsan.supp ASAN_OPTIONS=detect_leaks=1 $(BUILD)/test_runtime $(plugin)
	@if [ -f tests/c/test_hlo_run.c ]; then \
	  $(CC) $(CFLAGS) $(SAN) $(CORE) $(RT) $(HLO) tests/c/test_hlo_run.c -ldl -lpthread -lm -o $(BUILD)/test_hlo_run && \
	  LSAN_OPTIONS=suppressions=tests/c/lsan.supp $(BUILD)/test_hlo_run $(plugin); fi
	@if [ -f $(plugin_include)/pjrt_c_api.h ]; then \
	  $(CC) $(CFLAGS) -I$(plugin_include) tests/c/test_pjrt_abi.c -ldl -o $(BUILD)/test_pjrt_abi && \
	  $(BUILD)/test_pjrt_abi $(plugin); \
	else echo "test_pjrt_abi: the plugin ships no pjrt_c_api.h; skipped"; fi

pytest:
	$(VPY) -m pytest -q tests

test: build check pytest

clean:
	rm -rf build *.egg-info torchtpu/_C*.so
