# The two commands (see README.md):
#   make run   install missing dependencies, build Release, start ckptd on 127.0.0.1:8420 (./data)
#   make test  install missing dependencies, build with -Werror, run every test through ctest
# and for a quick start:
#   make install         ckpt and ckptd into $(PREFIX)/bin (default ~/.local/bin)
#   make python-client   the Python client in $(VENV) (default build/venv)
BUILD_DIR    ?= build
RELEASE_DIR  ?= build-release
CONFIG       ?= config/ckptd.toml
JOBS         ?= $(shell nproc)
PREFIX       ?= $(HOME)/.local
VENV         ?= $(BUILD_DIR)/venv

.PHONY: deps run test test-asan test-tsan build release install python-client bench clean format \
	recovery-walkthrough fuzz fuzz-seeds

deps:
	@./scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_WERROR=ON
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The status page's test drives headless Chromium (Debian's chromium package).
test: build
	@./scripts/install-deps.sh --browser
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600

# The whole suite under AddressSanitizer + UndefinedBehaviorSanitizer (integration tests run
# the sanitized ckptd too).
test-asan: deps
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCKPT_WERROR=ON \
	  -DCKPT_SANITIZE=address,undefined -DCKPT_BUILD_BENCH=OFF
	cmake --build build-asan -j $(JOBS)
	cd build-asan && UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) --timeout 600

# The whole suite under ThreadSanitizer. Races inside Debian's uninstrumented librocksdb are
# suppressed (tests/sanitizers/tsan.supp); the largest history keeps the stacks of its writes
# (into memtables that ckptd's threads then read through iterators) so that the rule matches.
# Left out (they run in the other builds): the fork-based crash test, as TSan cannot follow a
# fork of a multi-threaded process, and the tests that fill a volume or cut a push off after
# 128 MiB, which move hundreds of MiB through the sanitized build and outrun their deadlines.
test-tsan: deps
	cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCKPT_WERROR=ON \
	  -DCKPT_SANITIZE=thread -DCKPT_BUILD_BENCH=OFF
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS="halt_on_error=1 history_size=7 suppressions=$(CURDIR)/tests/sanitizers/tsan.supp" \
	  ctest --output-on-failure -j $(JOBS) --timeout 900 \
	  -E 'RecoveryRemovesChunksOfInterruptedPush|CrashSpaceTest|DiskFullTest'

# libFuzzer harnesses (tests/fuzz) built with clang, ASan and UBSan, each run FUZZ_SECONDS
# (default 60) from the seed corpus. Crashing inputs land in build-fuzz/fuzz-artifacts/.
FUZZ_SECONDS ?= 60
fuzz:
	@./scripts/install-deps.sh --fuzz
	cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCKPT_BUILD_FUZZ=ON -DCKPT_BUILD_TESTS=OFF -DCKPT_BUILD_BENCH=OFF -DCKPT_SANITIZE=address,undefined
	cmake --build build-fuzz -j $(JOBS)
	./scripts/run-fuzzers.sh build-fuzz $(FUZZ_SECONDS)

# Rewrites the seed corpora in tests/fuzz/corpus from the current codecs and formats.
fuzz-seeds: build
	./$(BUILD_DIR)/tests/fuzz/fuzz_make_seeds tests/fuzz/corpus

release: deps
	cmake -S . -B $(RELEASE_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release -DCKPT_BUILD_TESTS=OFF
	cmake --build $(RELEASE_DIR) -j $(JOBS)

run: release
	./$(RELEASE_DIR)/daemon/ckptd --config $(CONFIG)

# The Release binaries ckpt and ckptd into $(PREFIX)/bin.
install: release
	cmake --install $(RELEASE_DIR) --prefix $(PREFIX)
	@echo "ckpt and ckptd are in $(PREFIX)/bin (add it to PATH if it is not there)"

# The Python client in a virtual environment that also sees Debian's PyTorch and numpy, with
# its native codec module from the Release build.
python-client: release
	./scripts/install-python-client.sh $(VENV) $(wildcard $(RELEASE_DIR)/python/ckptd/_native*.so)

# docs/failure-recovery.md: a PyTorch trainer and ckptd killed and restarted; the final model
# must equal an uninterrupted run's.
recovery-walkthrough: build
	/usr/bin/python3 scripts/failure_recovery.py --ckptd $(BUILD_DIR)/daemon/ckptd

bench: release
	@./scripts/install-deps.sh --bench
	@echo "benchmark programs are in $(RELEASE_DIR)/bench; see docs/benchmarks.md"

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD_DIR) $(RELEASE_DIR) build-asan build-tsan build-fuzz
