# The two commands of the README: `make demo` and `make test`. Everything else is CMake.
BUILD      ?= build
BUILD_TYPE ?= Release
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all setup configure build test demo bench clean sanitize sanitize-address sanitize-thread fuzz

all: build

setup:
	@bash scripts/setup.sh

configure: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The whole CTest suite: unit, mpi and gpu labels (gpu tests skip without a device).
test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

# The main job: zero-train on 4 in-process ranks at stage 2; the loss falls. The build's own
# lines go to $(BUILD)/build.log (shown only if it fails), so the screen holds the program's.
demo: configure
	@echo "building (log: $(BUILD)/build.log) ..."
	@cmake --build $(BUILD) -j $(JOBS) > $(BUILD)/build.log 2>&1 || { cat $(BUILD)/build.log; exit 1; }
	@$(BUILD)/bin/zero-train --steps 300

bench: build
	@$(BUILD)/bin/zero_bench_kernels --benchmark_counters_tabular=true

# --- Sanitizers (cmake/ZeroSanitize.cmake) -------------------------------------------------
# `make sanitize`: two build directories of their own, each configure + build + ctest.
#   build-asan  ZERO_SANITIZE=address (ASan + UBSan, any UB report fails): the unit and mpi
#               labels. LeakSanitizer is on except in the ranks mpirun starts (OpenMPI's own
#               leaks cannot be suppressed by library name; cmake/ZeroSanitizeDefaults.cc, which
#               holds the run-time options compiled into the test programs). The two tests whose host
#               program is not built here (python3 via ctypes, the example built against the
#               installed package) run in a second ctest call with the ASan runtime preloaded and
#               leak checking off (python3's and cmake's own allocations are not ours). The
#               python label (PyTorch in the process) is left out.
#   build-tsan  ZERO_SANITIZE=thread: only the in-process communicator and engine tests
#               (SANITIZE_TSAN_TESTS, CTest label tsan), with ZERO_CPU_THREADS=1 so that no
#               OpenMP parallel region runs (libgomp is not TSan-instrumented).
# Both are CPU-only (ZERO_CUDA=OFF), RelWithDebInfo (line numbers in the reports).
SANITIZE_TSAN_TESTS ?= zero_local_comm_test zero_external_comm_test zero_engine_test zero_engine_failures_test zero_guard_test \
                       zero_checkpoint_test zero_components_test
SANITIZE_CMAKE_ARGS  = -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZERO_CUDA=OFF -DZERO_BUILD_BENCH=OFF $(CMAKE_ARGS)
SANITIZE_HOSTED      = ^example\.(python_ctypes|cpp_installed)$$
empty :=
space := $(empty) $(empty)

sanitize: sanitize-address sanitize-thread

sanitize-address: setup
	@cmake -S . -B build-asan -DZERO_SANITIZE=address $(SANITIZE_CMAKE_ARGS) >/dev/null
	@cmake --build build-asan -j $(JOBS)
	@cd build-asan && ctest -L 'unit|mpi' -LE python -E '$(SANITIZE_HOSTED)' --output-on-failure -j $(JOBS) --timeout 1800
	@cd build-asan && LD_PRELOAD="$$(cat zero_asan_runtime.txt)" ASAN_OPTIONS=detect_leaks=0 \
	  ctest -L 'unit|mpi' -LE python -R '$(SANITIZE_HOSTED)' --output-on-failure -j $(JOBS) --timeout 1800

sanitize-thread: setup
	@cmake -S . -B build-tsan -DZERO_SANITIZE=thread \
	  "-DZERO_SANITIZE_TSAN_TESTS=$(subst $(space),;,$(strip $(SANITIZE_TSAN_TESTS)))" \
	  $(SANITIZE_CMAKE_ARGS) >/dev/null
	@cmake --build build-tsan -j $(JOBS) --target $(SANITIZE_TSAN_TESTS)
	@cd build-tsan && ctest -L tsan --output-on-failure -j $(JOBS) --timeout 1800

# --- Fuzzing (cmake/ZeroFuzz.cmake, tests/fuzz/) ---------------------------------------------
# `make fuzz`: clang + libFuzzer + ASan/UBSan in build-fuzz; replays the saved reproducers
# (tests/fuzz/regressions/) and fuzzes each target for FUZZ_SECONDS (CTest label fuzz).
# A longer run of one target (two processes, corpus kept in the build directory):
#   build-fuzz/bin/zero_fuzz_config -max_total_time=3600 -jobs=2 -workers=2 \
#     -dict=tests/fuzz/config.dict -artifact_prefix=build-fuzz/ \
#     build-fuzz/tests/fuzz/work/config tests/fuzz/corpus/config
# (zero_fuzz_checkpoint likewise, with -dict=tests/fuzz/checkpoint.dict and .../checkpoint).
FUZZ_SECONDS ?= 20
FUZZ_TARGETS  = zero_fuzz_config zero_fuzz_checkpoint

fuzz: setup
	@CC=clang CXX=clang++ cmake -S . -B build-fuzz -DZERO_BUILD_FUZZ=ON -DZERO_SANITIZE=address \
	  -DZERO_FUZZ_SECONDS=$(FUZZ_SECONDS) $(SANITIZE_CMAKE_ARGS) >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target $(FUZZ_TARGETS)
	@cd build-fuzz && ctest -L fuzz --output-on-failure --timeout 900

clean:
	@rm -rf $(BUILD) build-asan build-tsan build-fuzz
