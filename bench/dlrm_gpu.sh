#!/usr/bin/env bash
# The GPU calls of issue 24 (many tables, the pipeline, DLRM, scale), one figure group per call, each under 5 minutes
# after the build (device tool, carry: ["build-deps"]; results and logs under $OUT):
#   RUN=tests     bash bench/dlrm_gpu.sh   gpu tests of the collection, the pipeline and DLRM (bit-identical
#                                          pipelined vs not on the GPU, placements alike)                    ~1 min
#   RUN=dlrm      bash bench/dlrm_gpu.sh   report.py dlrm: 26 tables one collection vs 26 HostEmbeddings, and
#                                          DLRM with tables in host RAM / hybrid / GPU / torch, 5M-row cap    ~4 min
#   RUN=criteo1tb bash bench/dlrm_gpu.sh   report.py criteo1tb: the 40M-capped Criteo 1TB tables (108 GB of
#                                          host RAM), samples/s pipelined and not, init time, profile         ~4 min
#   RUN=billion   bash bench/dlrm_gpu.sh   report.py billion: 1e9 x 32 bf16 rows, row-wise Adagrad (80 GB),
#                                          300 steps, host RSS against the raw bytes                           ~4 min
# Each report writes $OUT/report.json and $OUT/report.md; merge several calls' reports here with
#   python bench/report.py --merge <files_at>/report.json ... --out bench/report
set -u
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
echo "=== build ($(date +%T))"
# The library alone (the shared build folder's options are left as the other scripts set them).
cmake -S . -B build -G Ninja -DSPEEDTORCH_CUDA_ARCHS=9.0 -DPython3_EXECUTABLE="$(command -v $PY)" \
  -DCMAKE_PREFIX_PATH="$PWD/build-deps" >"$OUT/build.log" 2>&1 \
  && timeout ${BUILD_SECONDS:-420} ninja -C build speedtorch_ops >>"$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
export SPEEDTORCH_LIBRARY=$PWD/build/libspeedtorch_ops.so
nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader
free -g | head -2
echo "=== ${RUN:-?} ($(date +%T))"
case "${RUN:-}" in
  tests)
    timeout ${PYTEST_SECONDS:-280} $PY -m pytest -m gpu -q -p no:cacheprovider -rf \
      tests/python/test_embedding_collection.py tests/python/test_train_pipeline.py tests/python/test_dlrm.py ;;
  dlrm|criteo1tb|billion)
    $PY bench/report.py --sections "$RUN" --out "$OUT" --section-timeout ${SECTION_SECONDS:-290} ${REPORT_ARGS:-} ;;
  *) echo "RUN=${RUN:-}: expected tests, dlrm, criteo1tb or billion"; exit 2 ;;
esac
