# The two commands of a fresh Debian 12 machine:
#   make run    install what is missing, build, and generate text on the embedded default model
#   make test   install what is missing, build, and pass the CPU tests
BUILD_DIR ?= build
JOBS ?= $(shell nproc)

.PHONY: all setup run test test-asan fuzz clean

all: setup

setup:
	scripts/setup.sh

run: setup
	$(BUILD_DIR)/bin/kimirt run

test: setup
	ctest --test-dir $(BUILD_DIR) -L cpu --output-on-failure -j$(JOBS)

test-asan:
	PRESET=asan BUILD_DIR=build-asan scripts/setup.sh
	ctest --test-dir build-asan -L cpu --output-on-failure -j$(JOBS)

fuzz:
	scripts/fuzz.sh $(or $(MINUTES),1)

clean:
	rm -rf $(BUILD_DIR)
