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

# The main job. Until zero-train exists this is the CPU kernel benchmark against the triad.
demo: build
	@$(BUILD)/bin/zero_bench_kernels --benchmark_filter='BM_(Triad|AdamW)_CPU/(16777216|67108864)/' \
	  --benchmark_counters_tabular=true

bench: build
	@$(BUILD)/bin/zero_bench_kernels --benchmark_counters_tabular=true

clean:
	@rm -rf $(BUILD)
