#!/usr/bin/env bash
# Issue 32 on nvidia-h200-x4 (device tool, kind "nvidia-h200-x4", carry: ["build-deps"]): the NCCL tests of
# speedtorch.distributed and the DLRM benchmark over 1, 2, 4 GPUs and 2 simulated hosts x 2. Three calls, in this
# order, each step under its own time limit so that every call stays under 9 minutes (the build is a no-op on a
# machine still warm from the previous call):
#   RUN=tests1 bash bench/dlrm_distributed_gpu.sh   build; test_distributed.py with NCCL, 4 GPUs           ~6-8 min
#   RUN=tests2 bash bench/dlrm_distributed_gpu.sh   the collection's and the pipeline's tests with NCCL, and
#                                                   the distributed GPU test with Gloo (pytest -m gpu)      ~4-6 min
#   RUN=bench  bash bench/dlrm_distributed_gpu.sh   bench/dlrm_distributed.py at 1, 2, 4 GPUs and 2 hosts x 2,
#                                                   then its table and the 8 x 8 model                     ~5-7 min
# Logs and $OUT/dlrm_distributed.jsonl (the records; `python bench/dlrm_distributed.py --report <file>` prints
# them) come back under $OUT. BENCH_ARGS passes options to the benchmark (e.g. "--cap 2000000" if /dev/shm is small:
# the default 5M cap needs 15 GB of shared memory per host, `df -h /dev/shm` is printed first).
set -u
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
echo "=== build ($(date +%T))"
cmake -S . -B build -G Ninja -DSPEEDTORCH_CUDA_ARCHS=9.0 -DPython3_EXECUTABLE="$(command -v $PY)" \
  -DCMAKE_PREFIX_PATH="$PWD/build-deps" >"$OUT/build.log" 2>&1 \
  && timeout ${BUILD_SECONDS:-300} ninja -C build speedtorch_ops >>"$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
export SPEEDTORCH_LIBRARY=$PWD/build/libspeedtorch_ops.so
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
free -g | head -2
df -h /dev/shm | tail -1
# pytest-xdist runs test files' tests side by side where it is installed (each test has its own port and folder)
PAR=$($PY -c "import xdist" 2>/dev/null && echo "-n 4" || echo "")
PYTEST="$PY -m pytest -q -p no:cacheprovider -rf $PAR"
echo "=== ${RUN:-?} ($(date +%T))"
case "${RUN:-}" in
  tests1)
    SPEEDTORCH_TEST_DIST_BACKEND=nccl timeout ${PYTEST_SECONDS:-420} $PYTEST tests/python/test_distributed.py \
      2>&1 | tee "$OUT/tests1.log" | tail -40 ;;
  tests2)
    SPEEDTORCH_TEST_DIST_BACKEND=nccl timeout ${PYTEST_SECONDS:-300} $PYTEST \
      tests/python/test_distributed_collection.py tests/python/test_train_pipeline_distributed.py \
      2>&1 | tee "$OUT/tests2.log" | tail -40
    timeout 120 $PY -m pytest -q -p no:cacheprovider -rf -m gpu tests/python/test_distributed.py \
      2>&1 | tee -a "$OUT/tests2.log" | tail -10 ;;
  bench)
    RECORDS=$OUT/dlrm_distributed.jsonl
    for run in "1 1" "2 1" "4 1" "4 2"; do
      set -- $run
      echo "--- $1 GPU(s), $2 host(s) ($(date +%T))"
      timeout ${RUN_SECONDS:-110} $PY -m torch.distributed.run --nproc-per-node "$1" --master-port $((29500 + $1 + 10 * $2)) \
        bench/dlrm_distributed.py --hosts "$2" --results "$RECORDS" ${BENCH_ARGS:-} 2>&1 \
        | grep -v '^{' | tee -a "$OUT/bench.log" | tail -4
    done
    $PY bench/dlrm_distributed.py --report "$RECORDS" | tee -a "$OUT/bench.log" ;;
  *) echo "RUN=${RUN:-}: expected tests1, tests2 or bench"; exit 2 ;;
esac
