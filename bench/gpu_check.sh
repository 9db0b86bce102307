#!/usr/bin/env bash
# A short GPU call for a session with little device time left: build, ctest, every `gpu` test in one pytest process
# (faster than device_run.sh's one process per file, at the risk of one crash hiding the rest), and the demo.
# Logs under $OUT. Usage (device tool, carry: ["build-deps"]): bash bench/gpu_check.sh
set -u
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
step() { echo "=== $* ($(date +%T))"; }
step build
cmake -S . -B build -G Ninja -DSPEEDTORCH_CUDA_ARCHS=9.0 -DPython3_EXECUTABLE="$(command -v $PY)" \
  -DCMAKE_PREFIX_PATH="$PWD/build-deps" >"$OUT/build.log" 2>&1 \
  && timeout ${BUILD_SECONDS:-300} ninja -C build >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export SPEEDTORCH_LIBRARY=$PWD/build/libspeedtorch_ops.so
nvidia-smi --query-gpu=name,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader
step ctest
(cd build && timeout ${CTEST_SECONDS:-150} ctest -j 8 --output-on-failure >"$OUT/ctest.log" 2>&1); tail -2 "$OUT/ctest.log"
grep -E "\(Failed\)|\(Timeout\)" "$OUT/ctest.log"
step pytest -m gpu
timeout ${PYTEST_SECONDS:-330} $PY -m pytest tests/python -m gpu -q -p no:cacheprovider -rf ${PYTEST_ARGS:-} \
  >"$OUT/pytest.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR|passed|failed" "$OUT/pytest.log" | tail -25
if [ "${DEMO:-1}" = 1 ]; then
  step demo
  PYTHONPATH=python timeout ${DEMO_SECONDS:-90} $PY -m speedtorch demo --no-progress 2>&1 | tail -8
fi
