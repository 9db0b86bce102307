#!/usr/bin/env bash
# The example server on the GPU machine, in one call (device tool, carry: ["build-deps"]; about 3.5 minutes after the
# build): builds the server and its load client, writes a 1,000,000 x 64 recommender, its row-wise int8 serving copy
# (quantized_recommender.py) and the AOTInductor packages of both for cuda (compiled at once), then serves each of
# the four with --device cuda to 64 keep-alive clients of the C++ load generator (lookups of 16 ids in the Open
# Inference Protocol with binary tensors, an /update every 100 requests to the float32 forms (the int8 copy is
# read-only), every answer checked: the copy's rows against the library's dequantized rows) and prints req/s, p50,
# p99 and wrong answers side by side, with the client's own ceiling against a trivial endpoint first.
# Target (issue 27): >= 15,000 req/s at p99 <= 10 ms for both forms. QUANTIZED=0 leaves the int8 copy out.
#   bash bench/serve_gpu.sh            (SECONDS_PER_FORM=10 CLIENTS=64 THREADS=16 SERVER_ARGS="..." to change)
set -u
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
step() { echo "=== $* ($(date +%T))"; }
step build
cmake -S . -B build -G Ninja -DSPEEDTORCH_CUDA_ARCHS=9.0 -DSPEEDTORCH_BUILD_EXAMPLES=ON -DPython3_EXECUTABLE="$(command -v $PY)" \
  -DCMAKE_PREFIX_PATH="$PWD/build-deps" >"$OUT/build.log" 2>&1 \
  && timeout ${BUILD_SECONDS:-420} ninja -C build speedtorch_server speedtorch_load_client >>"$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
export SPEEDTORCH_LIBRARY=$PWD/build/libspeedtorch_ops.so
nvidia-smi --query-gpu=name,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader
step models and packages
$PY torchscript_examples/recommender_model.py --out /tmp/serve_model.pt --users 1000000 --items 10000 --dim 64 \
  --sidecar /tmp/serve_users.npy 2>&1 | grep -v Warn
QUANTIZED_ARGS=""
INT8_PID=""
if [ "${QUANTIZED:-1}" = 1 ]; then
  # Converted and compiled beside the float32 package (a compilation keeps about one core busy): little time added.
  ( $PY torchscript_examples/quantized_recommender.py --model /tmp/serve_model.pt --format int8_rowwise \
      --table /tmp/serve_users_int8.npy --out /tmp/serve_model_int8.pt \
    && $PY torchscript_examples/recommender_aoti.py --model /tmp/serve_model_int8.pt \
      --out /tmp/serve_model_int8_cuda.pt2 --device cuda ) >"$OUT/serve_aoti_int8.log" 2>&1 &
  INT8_PID=$!
  QUANTIZED_ARGS="--quantized /tmp/serve_model_int8.pt --quantized-package /tmp/serve_model_int8_cuda.pt2"
fi
$PY torchscript_examples/recommender_aoti.py --model /tmp/serve_model.pt --table /tmp/serve_users_aoti.npy \
  --out /tmp/serve_model_cuda.pt2 --device cuda >"$OUT/serve_aoti.log" 2>&1 || { tail -20 "$OUT/serve_aoti.log"; exit 1; }
if [ -n "$INT8_PID" ]; then
  wait "$INT8_PID" || { tail -20 "$OUT/serve_aoti_int8.log"; exit 1; }
  grep "int8_rowwise table" "$OUT/serve_aoti_int8.log"
fi
step load test
$PY torchscript_examples/load_test.py --server build/torchscript_examples/speedtorch_server \
  --load-client build/torchscript_examples/speedtorch_load_client --model /tmp/serve_model.pt \
  --package /tmp/serve_model_cuda.pt2 --table /tmp/serve_users_aoti.npy $QUANTIZED_ARGS --device cuda \
  --clients ${CLIENTS:-64} --seconds ${SECONDS_PER_FORM:-10} --warmup 50 --update-every 100 --protocol binary \
  --threads ${THREADS:-16} --ceiling --server-args "${SERVER_ARGS:-}" 2>&1 | grep -v Warn | tee "$OUT/serve_gpu.log"
