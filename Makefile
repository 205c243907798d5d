# lowbit entry points. `make run` and `make test` install missing packages, configure and build
# first. Variables: BUILD_DIR (default build), CUDA_ARCHS (CMake syntax, e.g.
# CUDA_ARCHS="90a-real;100a-real"; unset keeps the configured value, 90a-real at first),
# BUILD_TYPE (default Release), JOBS (default: all cores).
BUILD_DIR ?= build
CUDA_ARCHS ?=
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
MAKEFLAGS += --no-print-directory

CMAKE_FLAGS := -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)
ifneq ($(strip $(CUDA_ARCHS)),)
CMAKE_FLAGS += "-DLOWBIT_CUDA_ARCHS=$(CUDA_ARCHS)"
endif

FORMAT_FILES = $(or $(shell git ls-files --cached --others --exclude-standard \
	'*.h' '*.cpp' '*.cu' '*.cuh' 2>/dev/null), \
	$(shell find include src tests bench tools \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' \
	-o -name '*.cuh' \) 2>/dev/null))

.PHONY: all deps build run test test-gpu format clean

all: build

deps:
	@scripts/install_deps.sh

build: deps
	cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS)
	cmake --build $(BUILD_DIR) -j$(JOBS)

# The main job: train on the bundled corpus (the tiny preset on the CPU, 124m on a GPU), the
# loss falling, then print a sample. ARGS adds flags, e.g. make run ARGS="--precision nvfp4".
# Each make run starts over in RUN_OUT (--overwrite_output_dir).
RUN_OUT ?= runs/make-run
run: build
	$(BUILD_DIR)/lowbit info
	$(BUILD_DIR)/lowbit train --out $(RUN_OUT) --overwrite_output_dir --time_limit_minutes 5 $(ARGS)

# Everything that needs no GPU (what CI runs).
test: build
	ctest --test-dir $(BUILD_DIR) -LE gpu --output-on-failure -j2

# CUDA kernels against their CPU twins; needs a GPU host.
test-gpu: build
	ctest --test-dir $(BUILD_DIR) -L gpu --output-on-failure

format:
	clang-format -i $(FORMAT_FILES)

clean:
	rm -rf $(BUILD_DIR)
