#!/usr/bin/env bash
# The GPU machine's script: build (sm_90 only, for speed), tests, compute-sanitizer, benchmarks and sweeps, with
# every log and JSON written under $OUT (or bench/out). The machine has no network: build-deps/ (git-ignored) must be
# carried with the working tree, `carry: ["build-deps"]`, made here by `make device-deps`: build-deps/include/xxhash.h
# (the library's hash header, which that machine lacks) and build-deps/seed-speedtorch (SpeedTorch 0.1.6 for the
# side-by-side benchmarks). Each step has a time limit, so that each call below stays under the device
# tool's 10 minutes a command; on a machine still warm from the previous call the build is a no-op.
#
# The session's calls, in this order (about 25 minutes of device time in all):
#   RUN=tests    bash bench/device_run.sh   build, ctest, pytest -m gpu (one process per file)         ~6-8 min
#   RUN=sanitize bash bench/device_run.sh   compute-sanitizer memcheck and racecheck over the C++ CUDA
#                                           tests and the GPU tests of row ops, optimizers, HostEmbedding ~6-8 min
#   RUN=bench    bash bench/device_run.sh   transfer.py and train.py, SpeedTorch 0.1.6 timed in turns
#                                           with ours (ratios printed), the CPU-path transfer benchmark   ~6-8 min
#   RUN=sweep    bash bench/device_run.sh   sweep.py: 16k..512k ids and 32..512 wide against the link's
#                                           bound -> $OUT/sweep.json (plots: bench/plot_sweeps.py here)  ~4-6 min
# Then, on this machine: python bench/plot_sweeps.py <files_at>/sweep.json --out bench/plots --prefix h100_
#
# RUN sets defaults for the switches below; each can also be set alone (TESTS=1 SANITIZE=1 ... bash
# bench/device_run.sh). TESTS=1 ctest + pytest (PYTEST_ARGS passes options to each pytest, e.g. "-m gpu"); DEMO=1
# `speedtorch info` + demo; SANITIZE=1 memcheck, RACECHECK=1 racecheck; TRANSFER=1 bench/transfer.py
# (TRANSFER_ARGS, and the script's own arguments, go to it) and its CPU path; TRAIN=1 bench/train.py (TRAIN_ARGS;
# SCALE_ROWS=N adds its scale run); SWEEP=1 bench/sweep.py (SWEEP_ARGS); FUSED=1 the fused-step kernel variants;
# LOADTEST=1 the server's load test; CONTIG=1 bench/contiguous.py; DIST=1 the distributed table (bench/distributed.py
# at world sizes 1 and 2, and with 2+ GPUs tests/python/test_distributed.py with NCCL).
set -u
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
step() { echo; echo "=== $* ($(date +%T))"; }

case "${RUN:-}" in
  tests) : "${TESTS:=1}" "${PYTEST_ARGS:=-m gpu}" "${DEMO:=0}" "${TRANSFER:=0}" ;;
  sanitize) : "${TESTS:=0}" "${DEMO:=0}" "${SANITIZE:=1}" "${RACECHECK:=1}" "${TRANSFER:=0}" ;;
  bench) : "${TESTS:=0}" "${DEMO:=0}" "${TRAIN:=1}" "${TRANSFER:=1}" "${TRANSFER_ARGS:=--fractions=-1,0,1,0.5}" ;;
  sweep) : "${TESTS:=0}" "${DEMO:=0}" "${SWEEP:=1}" "${TRANSFER:=0}" ;;
  "") ;;
  *) echo "RUN=$RUN: expected tests, sanitize, bench or sweep"; exit 2 ;;
esac

step build
# build-deps/ (carried, not in git; make device-deps): xxhash.h.
[ -f build-deps/include/xxhash.h ] || [ -f /usr/include/xxhash.h ] \
  || echo "no xxhash.h: carry build-deps/ (carry: [\"build-deps\"]); CMake will stop"
cmake -S . -B build -G Ninja -DSPEEDTORCH_CUDA_ARCHS=9.0 -DPython3_EXECUTABLE="$(command -v $PY)" \
  -DCMAKE_PREFIX_PATH="$PWD/build-deps" >"$OUT/build.log" 2>&1 \
  && timeout ${BUILD_SECONDS:-420} ninja -C build >>"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
export SPEEDTORCH_LIBRARY=$PWD/build/libspeedtorch_ops.so
nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.max,pcie.link.width.max,driver_version --format=csv

# SpeedTorch 0.1.6 for the benchmarks: say at once whether it was carried and imports (CuPy is on that machine).
if [ "${TRAIN:-0}" = 1 ] || [ "${TRANSFER:-1}" = 1 ] || [ "${SWEEP:-0}" = 1 ]; then
  step SpeedTorch 0.1.6
  $PY bench/seed_speedtorch.py || echo "SpeedTorch 0.1.6 will be left out of the benchmarks: run" \
    "\`make device-deps\` on the CPU machine and carry build-deps/"
fi

if [ "${TESTS:-1}" = 1 ]; then
step ctest
(cd build && timeout ${CTEST_SECONDS:-200} ctest --output-on-failure >"$OUT/ctest.log" 2>&1); tail -3 "$OUT/ctest.log"

step pytest
# One process per file: a crash in one file does not hide the results of the others.
: >"$OUT/pytest.log"
for f in tests/python/test_*.py; do
  timeout ${PYTEST_FILE_SECONDS:-240} $PY -m pytest "$f" -q -p no:cacheprovider -rf ${PYTEST_ARGS:-} \
    >"$OUT/pytest_one.log" 2>&1
  echo "$f rc=$? $(tail -1 "$OUT/pytest_one.log")"
  { echo "##### $f"; cat "$OUT/pytest_one.log"; } >>"$OUT/pytest.log"
done
rm -f "$OUT/pytest_one.log"
grep -E "^FAILED" "$OUT/pytest.log"
fi

if [ "${DEMO:-1}" = 1 ]; then
step info
PYTHONPATH=python $PY -m speedtorch info

step demo
PYTHONPATH=python timeout 120 $PY -m speedtorch demo --no-progress
fi

if [ "${FUSED:-0}" = 1 ]; then
  step fused step variants
  $PY bench/experiments/fused_step_variants.py 2>&1 | tail -22
fi

if [ "${SANITIZE:-0}" = 1 ]; then
  step compute-sanitizer memcheck
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

if [ "${TRANSFER:-1}" = 1 ]; then
  step bench
  timeout ${TRANSFER_SECONDS:-200} $PY bench/transfer.py --torch-pinned-rss --json "$OUT/transfer.json" \
    ${TRANSFER_ARGS:-} "$@" 2>&1 | tee "$OUT/transfer.log" | tail -80

  step cpu-bench
  CUDA_VISIBLE_DEVICES= timeout 60 $PY bench/transfer.py --rows 2000000 --threads 16,2 2>&1 | tail -12
fi

if [ "${TRAIN:-0}" = 1 ]; then
  step train
  timeout ${TRAIN_SECONDS:-240} $PY bench/train.py --json "$OUT/train.json" ${SCALE_ROWS:+--scale-rows $SCALE_ROWS} \
    ${TRAIN_ARGS:-} 2>&1 | tee "$OUT/train.log" | tail -24
fi

if [ "${SWEEP:-0}" = 1 ]; then
  step sweep
  timeout ${SWEEP_SECONDS:-420} $PY bench/sweep.py --json "$OUT/sweep.json" ${SWEEP_ARGS:-} 2>&1 \
    | tee "$OUT/sweep.log" | tail -16
  # The plots are drawn where the JSON is brought back; here too when this machine has matplotlib.
  if [ -f "$OUT/sweep.json" ] && $PY -c "import matplotlib" 2>/dev/null; then
    $PY bench/plot_sweeps.py "$OUT/sweep.json" --out "$OUT/plots" --prefix gpu_
  fi
fi
