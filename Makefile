# speedtorch: the two commands of the README, and the pieces they are made of.
#   make demo   installs what is missing, builds, and runs the main job (python -m speedtorch demo)
#   make test   installs what is missing, builds, and runs every test (C++ with ctest, Python with pytest, and a
#               check that `pip install --no-build-isolation .` packages the library)
PYTHON ?= python3
BUILD ?= build
JOBS ?= $(shell nproc)
# Extra CMake options, e.g. CMAKE_ARGS=-DSPEEDTORCH_CUDA_ARCHS=9.0 for a Hopper-only build.
CMAKE_ARGS ?=
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
LIB := $(BUILD)/libspeedtorch_ops.so

.PHONY: demo test deps build test-cpp test-python test-package sanitize bench clean

demo: build
	SPEEDTORCH_LIBRARY=$(abspath $(LIB)) PYTHONPATH=$(abspath python) $(PYTHON) -m speedtorch demo

test: build test-cpp test-python test-package

# torch 2.11 from PyPI when no torch >= 2.4 is importable (an existing torch is reused: it must match the build);
# GoogleTest, cpp-httplib and nlohmann-json (the example server) from Debian when their headers are missing.
deps:
	@$(PYTHON) -c "import sys, torch; v = tuple(int(x) for x in torch.__version__.split(\"+\")[0].split(\".\")[:2]); sys.exit(v < (2, 4))" 2>/dev/null \
	  || $(PYTHON) -m pip install "torch==2.11.0"
	@$(PYTHON) -c "import numpy, pytest, hypothesis, tqdm, expecttest, scikit_build_core" 2>/dev/null \
	  || $(PYTHON) -m pip install -q numpy pytest hypothesis tqdm expecttest "scikit-build-core>=0.10" ninja
	@command -v cmake >/dev/null || $(PYTHON) -m pip install -q cmake
	@[ -f /usr/include/gtest/gtest.h ] && [ -f /usr/include/httplib.h ] && [ -d /usr/include/nlohmann ] \
	  || ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q libgtest-dev libcpp-httplib-dev nlohmann-json3-dev) \
	  || echo "GoogleTest / cpp-httplib / nlohmann-json not installed: the C++ tests and the example server are skipped"

build: deps
	cmake -S . -B $(BUILD) -G Ninja -DPython3_EXECUTABLE=$$(command -v $(PYTHON)) $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)

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
ASAN_BUILD ?= build-asan
sanitize: deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DPython3_EXECUTABLE=$$(command -v $(PYTHON)) -DSPEEDTORCH_CUDA=OFF \
	  -DSPEEDTORCH_SANITIZE=ON -DSPEEDTORCH_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  LD_PRELOAD="$$($(CXX_FOR_ASAN) -print-file-name=libasan.so) $$($(CXX_FOR_ASAN) -print-file-name=libubsan.so)" \
	  SPEEDTORCH_LIBRARY=$(abspath $(ASAN_BUILD))/libspeedtorch_ops.so \
	  $(PYTHON) -m pytest tests/python -q -m "not gpu" -p no:cacheprovider \
	  --ignore=tests/python/test_compile_export.py --ignore=tests/python/test_torchscript_examples.py

CXX_FOR_ASAN ?= c++

bench: build
	SPEEDTORCH_LIBRARY=$(abspath $(LIB)) $(PYTHON) bench/transfer.py

clean:
	rm -rf $(BUILD)
