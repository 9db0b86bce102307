# speedtorch: the two commands of the README, and the pieces they are made of.
#   make demo   installs what the library needs, builds the library alone (for the GPUs present), makes `import
#               speedtorch` work in this Python (make develop), and runs the main job (python -m speedtorch demo)
#   make test   installs what is missing, builds everything (tests, example server, benchmarks), and runs every test
#               (C++ with ctest, Python with pytest, and a check that `pip install --no-build-isolation .` packages
#               the library)
#   make sanitize / tsan / fuzz   the CPU path under ASan + UBSan / ThreadSanitizer, and the libFuzzer targets
PYTHON ?= python3
BUILD ?= build
JOBS ?= $(shell nproc)
# Extra CMake options, e.g. CMAKE_ARGS=-DSPEEDTORCH_CUDA_ARCHS=9.0 for a Hopper-only build, or =all for the five
# architectures a wheel ships (the default is the GPUs of this machine: CMakeLists.txt).
CMAKE_ARGS ?=
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
LIB := $(BUILD)/libspeedtorch_ops.so

.PHONY: demo test deps test-deps build-library build develop undevelop test-cpp test-python test-package sanitize tsan fuzz fuzz-deps bench seed-speedtorch device-deps clean

demo: build-library develop
	SPEEDTORCH_LIBRARY=$(abspath $(LIB)) PYTHONPATH=$(abspath python) $(PYTHON) -m speedtorch demo

test: build develop test-cpp test-python test-package

# What the library and the demo need. torch 2.11 from PyPI when no torch >= 2.4 is importable (an existing torch is
# reused: it must match the build); numpy and tqdm (the package's own dependencies); CMake and Ninja; from Debian when
# their headers are missing, nlohmann-json and xxHash (the library's meta files and content hashes) and robin-map
# (the id index of growing tables; header-only).
deps:
	@$(PYTHON) -c "import sys, torch; v = tuple(int(x) for x in torch.__version__.split(\"+\")[0].split(\".\")[:2]); sys.exit(v < (2, 4))" 2>/dev/null \
	  || $(PYTHON) -m pip install "torch==2.11.0"
	@$(PYTHON) -c "import numpy, tqdm" 2>/dev/null || $(PYTHON) -m pip install -q numpy tqdm
	@command -v cmake >/dev/null || $(PYTHON) -m pip install -q cmake
	@command -v ninja >/dev/null || $(PYTHON) -m pip install -q ninja
	@[ -d /usr/include/nlohmann ] && [ -f /usr/include/xxhash.h ] && [ -f /usr/include/tsl/robin_map.h ] \
	  || ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q nlohmann-json3-dev libxxhash-dev robin-map-dev)

# What the tests need besides: the test tools, scikit-build-core (test-package), and matplotlib
# (bench/plot_sweeps.py, which tests/python/test_bench_sweeps.py runs); GoogleTest from Debian (the C++ tests:
# optional); tritonclient (PyPI: the example server's protocol tests) and prometheus_client (PyPI: its parser reads
# the server's /metrics in tests/python/test_server_metrics.py).
test-deps: deps
	@$(PYTHON) -c "import pytest, hypothesis, expecttest, scikit_build_core, matplotlib" 2>/dev/null \
	  || $(PYTHON) -m pip install -q pytest hypothesis expecttest "scikit-build-core>=0.10" matplotlib
	@[ -f /usr/include/gtest/gtest.h ] \
	  || ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q libgtest-dev) \
	  || echo "GoogleTest not installed: the C++ tests are skipped"
	@$(PYTHON) -c "import tritonclient.http" 2>/dev/null || $(PYTHON) -m pip install -q "tritonclient[http]" \
	  || echo "tritonclient not installed: the server's Open Inference Protocol tests with it are skipped"
	@$(PYTHON) -c "import prometheus_client.parser" 2>/dev/null || $(PYTHON) -m pip install -q prometheus_client \
	  || echo "prometheus_client not installed: the server's /metrics test with its parser is skipped"

CONFIGURE = cmake -S . -B $(BUILD) -G Ninja -DPython3_EXECUTABLE=$$(command -v $(PYTHON)) $(CMAKE_ARGS)

# The library alone (libspeedtorch_ops.so): what the demo and the Python package load.
build-library: deps
	$(CONFIGURE)
	cmake --build $(BUILD) -j $(JOBS) --target speedtorch_ops

# Every target: the library, the C++ tests, the example server and trainer, the benchmarks' C++ side.
build: test-deps
	$(CONFIGURE)
	cmake --build $(BUILD) -j $(JOBS)

# `import speedtorch` from anywhere in this Python, as `pip install -e .` would, without a second build: a
# speedtorch-source.pth in its site-packages (the user's when that is not writable) puts python/ on sys.path, and the
# package finds build/libspeedtorch_ops.so beside it (python/speedtorch/_library.py; with another BUILD folder, set
# SPEEDTORCH_LIBRARY). `make undevelop` removes it.
DEVELOP_PTH = $(PYTHON) -c "import os, site, sysconfig; d = sysconfig.get_paths()['purelib']; \
  d = d if os.access(d, os.W_OK) else site.getusersitepackages(); print(os.path.join(d, 'speedtorch-source.pth'))"
develop:
	@pth=$$($(DEVELOP_PTH)) && mkdir -p "$$(dirname "$$pth")" && echo "$(abspath python)" > "$$pth" \
	  && echo "import speedtorch: $(abspath python) (written to $$pth)"

undevelop:
	rm -f "$$($(DEVELOP_PTH))"

test-cpp:
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-python:
	SPEEDTORCH_LIBRARY=$(abspath $(LIB)) $(PYTHON) -m pytest tests/python -q

# The wheel build path: install into a scratch folder and import from there.
test-package:
	rm -rf $(BUILD)/package-check
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps --target $(BUILD)/package-check .
	cd /tmp && PYTHONPATH=$(abspath $(BUILD)/package-check) $(PYTHON) -c "import speedtorch; print(speedtorch.library_path(), speedtorch.build_info())"

# The CPU path built with AddressSanitizer and UBSan; the C++ tests and the CPU Python tests run under it (the
# sanitizer runtime is preloaded into Python; leak checks are off because Python and torch keep memory at exit).
# test_distributed.py (and test_train_pipeline_distributed.py and test_distributed_collection.py, which spawn ranks the
# same way; under ASan a torchrun rank of the latter once aborted at exit, "terminate called without an active
# exception", in its teardown) is left to make
# test: it starts dozens of Python processes whose own work (Gloo, pickling) is not ours; the library calls it makes
# (PinnedEmbedding.create / open, the fused step) have tests of their own that run here. So are the example server's
# process tests (test_server_robustness.py, test_server_protocol.py, test_quantized_serving.py, which also compiles
# a package): the server is not built here; its request reading has GoogleTest tests and a fuzz target, and the
# operators the quantized copies use are tested here (test_gather_dequant.py, test_persistence.py).
ASAN_BUILD ?= build-asan
sanitize: test-deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DPython3_EXECUTABLE=$$(command -v $(PYTHON)) -DSPEEDTORCH_CUDA=OFF \
	  -DSPEEDTORCH_SANITIZE=ON -DSPEEDTORCH_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  LD_PRELOAD="$$($(CXX_FOR_ASAN) -print-file-name=libasan.so) $$($(CXX_FOR_ASAN) -print-file-name=libubsan.so)" \
	  SPEEDTORCH_LIBRARY=$(abspath $(ASAN_BUILD))/libspeedtorch_ops.so \
	  $(PYTHON) -m pytest tests/python -q -m "not gpu" -p no:cacheprovider \
	  --ignore=tests/python/test_compile_export.py --ignore=tests/python/test_torchscript_examples.py \
	  --ignore=tests/python/test_distributed.py --ignore=tests/python/test_train_pipeline_distributed.py \
	  --ignore=tests/python/test_distributed_collection.py \
	  --ignore=tests/python/test_server_robustness.py --ignore=tests/python/test_server_protocol.py \
	  --ignore=tests/python/test_quantized_serving.py

CXX_FOR_ASAN ?= c++

# The CPU path built with ThreadSanitizer; the C++ tests run under it, tests/cpp/test_concurrency.cpp (threads
# gathering while others scatter, step and save one PinnedEmbedding) first among them. OMP_NUM_THREADS=1 keeps
# at::parallel_for on the calling thread: libgomp is not instrumented, so TSan cannot see its barriers and would
# report every parallel loop as a race. For the same reason the tests that force OpenMP threads themselves
# (ScatterThreads with 2 and 3 threads, RowCopyLarge, a parallel region around helped_parallel_for) are left out
# here; they run in make test and make sanitize. helped_parallel_for's own helper threads are std::threads, which
# TSan sees: its tests run here with several threads. tests/tsan_suppressions.txt names the one report that comes
# from libc10 not being instrumented, and why.
TSAN_BUILD ?= build-tsan
TSAN_SKIP := ^(Threads/ScatterThreads\.DuplicatesLastOccurrenceWins/[23]|RowCopyLarge\..*|HelpedParallelForAlone\.RunsOnTheCallingThreadInsideAParallelRegion)$$
tsan: test-deps
	cmake -S . -B $(TSAN_BUILD) -G Ninja -DPython3_EXECUTABLE=$$(command -v $(PYTHON)) -DSPEEDTORCH_CUDA=OFF \
	  -DSPEEDTORCH_SANITIZE=ON -DSPEEDTORCH_SANITIZE_KIND=thread -DSPEEDTORCH_BUILD_EXAMPLES=OFF \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(abspath tests/tsan_suppressions.txt) \
	  OMP_NUM_THREADS=1 \
	  ctest --test-dir $(TSAN_BUILD) --output-on-failure -j $(JOBS) -E '$(TSAN_SKIP)'

# libFuzzer targets over the .npy header parser, the loading of saved tables and the example server's reading of
# request bodies (tests/fuzz/), built with clang and ASan + UBSan. Each runs FUZZ_SECONDS over its checked-in corpus; new inputs go to a scratch folder in the
# build, never into the repository. A crash, a sanitizer report or an exception other than c10::Error fails the
# target, and the input that did it is left as $(FUZZ_BUILD)/crash-<target>-*. (allocator_may_return_null: an
# allocation too large for the host fails as it does without ASan, with torch's error, not an ASan abort; leak
# checks are off because torch keeps memory at exit.)
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := npy_header embedding_files request_body
FUZZ_SUMMARY := ^(\#[0-9]+[[:space:]]+(INITED|DONE)|stat::number_of_executed_units|stat::new_units_added)
fuzz: test-deps fuzz-deps
	cmake -S tests/fuzz -B $(FUZZ_BUILD) -G Ninja -DPython3_EXECUTABLE=$$(command -v $(PYTHON)) \
	  -DCMAKE_CXX_COMPILER=clang++
	cmake --build $(FUZZ_BUILD) -j $(JOBS)
	@for target in $(FUZZ_TARGETS); do \
	  rm -rf $(FUZZ_BUILD)/new-inputs-$$target && mkdir -p $(FUZZ_BUILD)/new-inputs-$$target && \
	  echo "fuzz_$$target: $(FUZZ_SECONDS) s" && \
	  ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  $(FUZZ_BUILD)/fuzz_$$target -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    -dict=tests/fuzz/$$target.dict -artifact_prefix=$(FUZZ_BUILD)/crash-$$target- \
	    $(FUZZ_BUILD)/new-inputs-$$target tests/fuzz/corpus/$$target > $(FUZZ_BUILD)/fuzz_$$target.log 2>&1; \
	  rc=$$?; \
	  grep -E '$(FUZZ_SUMMARY)' $(FUZZ_BUILD)/fuzz_$$target.log; \
	  [ $$rc -eq 0 ] || { tail -n 60 $(FUZZ_BUILD)/fuzz_$$target.log; \
	                      echo "fuzz_$$target failed (log: $(FUZZ_BUILD)/fuzz_$$target.log)"; exit 1; }; \
	done

# clang's libFuzzer runtime (Debian: libclang-rt-dev, with clang).
fuzz-deps:
	@echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
	  | clang++ -x c++ -fsanitize=fuzzer - -o /tmp/speedtorch-libfuzzer-probe 2>/dev/null \
	  || ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q clang libclang-rt-dev)
	@rm -f /tmp/speedtorch-libfuzzer-probe

bench: build-library
	SPEEDTORCH_LIBRARY=$(abspath $(LIB)) $(PYTHON) bench/transfer.py

# SpeedTorch 0.1.6 (the 2019 library; import name SpeedTorch, built on CuPy), which bench/transfer.py, train.py and
# sweep.py run beside speedtorch when CuPy and a GPU are there. Its distribution name is ours too, so it goes into a
# folder of its own (bench/seed_speedtorch.py imports it from there), from the hash-pinned wheel. build-deps/ is
# git-ignored and carried to the GPU machine, which has no network. The last line imports it (needs CuPy).
# What the GPU machine (the device tool; no network there) lacks, gathered into build-deps/ for `carry: ["build-deps"]`:
# xxHash's and robin-map's headers (the library needs them) and SpeedTorch 0.1.6 for the benchmarks. (The example
# server needs nothing more: its HTTP layer is its own.)
device-deps: test-deps seed-speedtorch
	mkdir -p build-deps/include
	cp /usr/include/xxhash.h build-deps/include/
	cp -r /usr/include/tsl build-deps/include/
	du -sh build-deps

SEED_DIR := build-deps/seed-speedtorch
SEED_WHEELS := build-deps/wheels
seed-speedtorch:
	$(PYTHON) -m pip download -q --no-deps --only-binary :all: --require-hashes -r bench/seed-speedtorch.txt \
	  -d $(SEED_WHEELS)
	rm -rf $(SEED_DIR)
	$(PYTHON) -m pip install -q --no-deps --no-compile --target $(SEED_DIR) \
	  $(SEED_WHEELS)/SpeedTorch-0.1.6-py3-none-any.whl
	$(PYTHON) bench/seed_speedtorch.py || echo "(it imports where CuPy is installed: the GPU machine)"

clean:
	rm -rf $(BUILD)
