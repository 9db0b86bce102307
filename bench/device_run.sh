#!/usr/bin/env bash
# One call on the GPU machine: build (sm_90 only, for speed), C++ and Python tests with CUDA, the transfer
# benchmark, the CPU-path benchmark, and (SANITIZE=1) compute-sanitizer over the GPU tests. TRAIN=1 adds
# bench/train.py (TRAIN_ARGS passes options; SCALE_ROWS=N adds its scale run), RACECHECK=1 compute-sanitizer
# racecheck, LOADTEST=1 the server's load test on CPU and GPU, FUSED=1 the fused-step kernel variants, CONTIG=1
# bench/contiguous.py, DIST=1 the distributed table (bench/distributed.py at world sizes 1 and 2, and with 2+ GPUs
# tests/python/test_distributed.py again with NCCL), TESTS=0 / DEMO=0 skip the tests / info+demo, TRANSFER=0 stops
# before the transfer benchmarks; PYTEST_ARGS passes options to each pytest (e.g. "-m gpu": the GPU tests only).
# Logs and JSON go to $OUT (or bench/out). Usage: bash bench/device_run.sh [transfer bench args...]
set -u
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
step() { echo; echo "=== $* ($(date +%T))"; }

step build
[ -d build-deps ] && DEPS=1
# build-deps/ (carried, not in git): header-only cpp-httplib and nlohmann-json for the example server, which the GPU
# machine lacks.
cmake -S . -B build -G Ninja -DSPEEDTORCH_CUDA_ARCHS=9.0 -DPython3_EXECUTABLE="$(command -v $PY)" \
  ${DEPS:+-DCMAKE_PREFIX_PATH=$PWD/build-deps} >"$OUT/build.log" 2>&1 && ninja -C build >>"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
export SPEEDTORCH_LIBRARY=$PWD/build/libspeedtorch_ops.so
nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.max,pcie.link.width.max,driver_version --format=csv

if [ "${TESTS:-1}" = 1 ]; then
step ctest
(cd build && ctest --output-on-failure >"$OUT/ctest.log" 2>&1); tail -3 "$OUT/ctest.log"

step pytest
# One process per file: a crash in one file does not hide the results of the others.
: >"$OUT/pytest.log"
for f in tests/python/test_*.py; do
  $PY -m pytest "$f" -q -p no:cacheprovider -rf ${PYTEST_ARGS:-} >/tmp/pytest_one.log 2>&1
  echo "$f rc=$? $(tail -1 /tmp/pytest_one.log)"
  { echo "##### $f"; cat /tmp/pytest_one.log; } >>"$OUT/pytest.log"
done
grep -E "^FAILED" "$OUT/pytest.log"
fi

if [ "${DEMO:-1}" = 1 ]; then

step info
PYTHONPATH=python $PY -m speedtorch info

step demo
PYTHONPATH=python $PY -m speedtorch demo --no-progress
fi

if [ "${FUSED:-0}" = 1 ]; then
  step fused step variants
  $PY bench/experiments/fused_step_variants.py 2>&1 | tail -22
fi

if [ "${TRAIN:-0}" = 1 ]; then
  step train
  $PY bench/train.py --json "$OUT/train.json" ${SCALE_ROWS:+--scale-rows $SCALE_ROWS} ${TRAIN_ARGS:-} 2>&1 | tee "$OUT/train.log" | tail -20
fi

if [ "${SANITIZE:-0}" = 1 ]; then
  step compute-sanitizer
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/cpp/speedtorch_cpp_tests \
    --gtest_filter='RowOpsCuda.*' >"$OUT/memcheck_cpp.log" 2>&1; echo "memcheck C++ rc=$?"; tail -3 "$OUT/memcheck_cpp.log"
  timeout ${SANITIZE_PY_SECONDS:-200} compute-sanitizer --tool memcheck --error-exitcode 9 \
    $PY -m pytest tests/python/test_row_ops_gpu.py tests/python/test_row_optimizer.py tests/python/test_host_embedding.py tests/python/test_persistence.py -m gpu -q -x -p no:cacheprovider ${SANITIZE_PY_ARGS:-} \
    >"$OUT/memcheck_py.log" 2>&1
  echo "memcheck pytest rc=$?"; tail -4 "$OUT/memcheck_py.log"
fi

if [ "${RACECHECK:-0}" = 1 ]; then
  step compute-sanitizer racecheck
  timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 build/tests/cpp/speedtorch_cpp_tests \
    --gtest_filter='RowOpsCuda.*' >"$OUT/racecheck_cpp.log" 2>&1; echo "racecheck C++ rc=$?"; tail -2 "$OUT/racecheck_cpp.log"
  timeout ${RACECHECK_PY_SECONDS:-150} compute-sanitizer --tool racecheck --error-exitcode 9 \
    $PY -m pytest tests/python/test_row_ops_gpu.py tests/python/test_row_optimizer.py -m gpu -q -x -p no:cacheprovider \
    >"$OUT/racecheck_py.log" 2>&1
  echo "racecheck pytest rc=$?"; tail -3 "$OUT/racecheck_py.log"
fi

if [ "${LOADTEST:-0}" = 1 ]; then
  step load test
  $PY torchscript_examples/recommender_model.py --out /tmp/lt_model.pt --users 1000000 --items 10000 --dim 64 \
    --sidecar /tmp/lt_users.npy >/dev/null 2>&1 || echo "model writer failed"
  for dev in cpu cuda; do
    # The same model as an AOTInductor package for $dev (docs/torchscript.md), served side by side with it.
    $PY torchscript_examples/recommender_aoti.py --model /tmp/lt_model.pt --table /tmp/lt_users_aoti.npy \
      --out /tmp/lt_model_$dev.pt2 --device $dev >/dev/null 2>&1 || echo "package compile for $dev failed"
    $PY torchscript_examples/load_test.py --server build/torchscript_examples/speedtorch_server \
      --model /tmp/lt_model.pt --package /tmp/lt_model_$dev.pt2 --table /tmp/lt_users_aoti.npy \
      --clients 16 --requests 400 --threads 16 --device $dev 2>&1 | grep -v Warn | tail -12
  done
fi

if [ "${DIST:-0}" = 1 ]; then
  step distributed
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    SPEEDTORCH_TEST_DIST_BACKEND=nccl $PY -m pytest tests/python/test_distributed.py -q -p no:cacheprovider -rf       >"$OUT/distributed_nccl.log" 2>&1; echo "distributed tests (NCCL) rc=$?"; tail -3 "$OUT/distributed_nccl.log"
  fi
  $PY bench/distributed.py ${DIST_ARGS:-} 2>&1 | grep -v Warning | tee "$OUT/distributed.log" | tail -6
fi

if [ "${CONTIG:-0}" = 1 ]; then
  step contiguous
  $PY bench/contiguous.py 2>&1 | tee "$OUT/contiguous.log" | tail -25
fi

[ "${TRANSFER:-1}" = 1 ] || exit 0
step bench
$PY bench/transfer.py --torch-pinned-rss --json "$OUT/transfer.json" "$@" 2>&1 | tee "$OUT/transfer.log" | tail -80

step cpu-bench
CUDA_VISIBLE_DEVICES= $PY bench/transfer.py --rows 2000000 --threads 16,2 2>&1 | tail -12

