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
test: build
	@cd $(BUILD) && OMP_WAIT_POLICY=PASSIVE ctest --output-on-failure -j$(JOBS)

test-cpu: build
	@cd $(BUILD) && OMP_WAIT_POLICY=PASSIVE ctest --output-on-failure -j$(JOBS) -LE gpu

format:
	@clang-format -i $$(git ls-files '*.h' '*.cpp' '*.cu')

clean:
	@rm -rf $(BUILD)
