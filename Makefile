# The two commands of the README: `make demo` and `make test`. Everything else is CMake.
BUILD      ?= build
BUILD_TYPE ?= Release
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all setup configure build test demo bench clean

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

# The main job: zero-train on 4 in-process ranks at stage 2; the loss falls.
demo: build
	@$(BUILD)/bin/zero-train --steps 300

bench: build
	@$(BUILD)/bin/zero_bench_kernels --benchmark_counters_tabular=true

clean:
	@rm -rf $(BUILD)
