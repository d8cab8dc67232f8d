# Quick start: `make run` and `make test`. Both install missing Debian packages first.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: setup configure build run test test-cpu clean format

setup:
	@bash scripts/setup.sh

configure: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

run: build
	@$(BUILD)/trainer_bin sft

# Tests run in parallel: OpenMP threads sleep instead of spinning while they wait.
# The multi-rank tests then run again on another BLAS kernel family (AVX2 "Haswell" kernels,
# which trainer_bin never picks on an AVX-512 machine): a verdict that depends on the CPU's
# kernels (a rounding difference deciding a discrete outcome) fails here, not on a user's machine.
PORTABILITY_CORETYPE ?= Haswell
test: build
	@cd $(BUILD) && OMP_WAIT_POLICY=PASSIVE ctest --output-on-failure -j$(JOBS)
	@echo "== the mpi label again with OPENBLAS_CORETYPE=$(PORTABILITY_CORETYPE)"
	@cd $(BUILD) && OMP_WAIT_POLICY=PASSIVE OPENBLAS_CORETYPE=$(PORTABILITY_CORETYPE) \
	  ctest --output-on-failure -j$(JOBS) -L mpi

test-cpu: build
	@cd $(BUILD) && OMP_WAIT_POLICY=PASSIVE ctest --output-on-failure -j$(JOBS) -LE gpu

format:
	@clang-format -i $$(git ls-files '*.h' '*.cpp' '*.cu')

clean:
	@rm -rf $(BUILD)
