#!/usr/bin/env bash
# The Engram GPU call (issue 26): build, the Engram tests marked gpu (ngram_hash, gather_dequant,
# NgramHashEmbedding, row-wise Adam), then bench/engram.py, which prints every GPU figure beside its baseline:
# gather of bf16 / int8 / fp8 rows vs pinned memcpy, the 1,024-row lookup in a CUDA graph, the GPT's step with its
# tables in host RAM vs GPU memory, a 300M-row table's step and RSS. Logs and the JSON under $OUT.
# Usage (device tool, carry: ["build-deps"]): bash bench/engram_gpu.sh
set -u
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
step() { echo "=== $* ($(date +%T))"; }
step build
cmake -S . -B build -G Ninja -DSPEEDTORCH_CUDA_ARCHS=9.0 \
  -DPython3_EXECUTABLE="$(command -v $PY)" -DCMAKE_PREFIX_PATH="$PWD/build-deps" >"$OUT/build.log" 2>&1 \
  && timeout ${BUILD_SECONDS:-400} ninja -C build speedtorch_ops >>"$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
export SPEEDTORCH_LIBRARY=$PWD/build/libspeedtorch_ops.so
nvidia-smi --query-gpu=name,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader
step "pytest -m gpu (Engram)"
timeout ${PYTEST_SECONDS:-120} $PY -m pytest -q -p no:cacheprovider -rf -m gpu tests/python/test_ngram_hash.py \
  tests/python/test_gather_dequant.py tests/python/test_ngram_embedding.py tests/python/test_row_optimizer.py \
  -k "not test_gpu_pinned_table_matches_torch_optim or rowwise" >"$OUT/engram_pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$OUT/engram_pytest.log" | tail -15
step bench/engram.py
PYTHONPATH=python timeout ${BENCH_SECONDS:-240} $PY bench/engram.py --json "$OUT/engram.json" ${BENCH_ARGS:-} 2>&1
echo "bench rc=$?"
