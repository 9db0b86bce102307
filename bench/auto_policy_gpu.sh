#!/usr/bin/env bash
# Issue 30 item 4 in one GPU call: `auto` must never be slower than UVA alone. Every step has its own time limit
# (30 + 150 + 40 + 120 + 120 s = 7.7 minutes at most; about 4 when the build takes its usual 90 s). Builds, runs the
# transfer engine's GPU tests (the split's guard among them), then
#   1. bench/transfer.py --quick --threads 16,2: `auto`, UVA alone and the splits 0.9 / 0.8 on the spread rows, `auto`
#      and UVA alone in turns for float32 / float16 / bfloat16 with a `check ... ok|FAIL` line each, what the CPU
#      threads of the staged share move, the measured splits and the guard's state, then the stand-alone reference
#      (bench/uva_reference.py: a UVA kernel + CPU threads staging a share) in the same process;
#   2. the sequence in which `auto` once collapsed to 24 ms a call (bench/report.py's transfer section: shares
#      -1,0,1, CuPy and SpeedTorch 0.1.6 in turns, then fp16 / bf16) at 16 threads, with the same checks: whether
#      the collapse comes back, and if it does, whether the guard ends it and whether the CPU gather itself slowed
#      (one 8 MiB staging chunk gathered on the CPU through the helper threads and through torch's OpenMP, before
#      and after SpeedTorch's turns).
# Logs (each run's whole table) and JSON under $OUT; the lines that matter are echoed at the end of each step.
# Usage (device tool, carry: ["build-deps"] for SpeedTorch 0.1.6 in step 2): bash bench/auto_policy_gpu.sh
set -u
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
step() { echo "=== $* ($(date +%T))"; }
key_lines() { grep -E "^check |^split of |^CPU gather|^torch.index_select|^busiest threads|^contiguous pinned|^reference|^--- reference|^  (gather|scatter|split)|^memcpy limits|Traceback|Error" "$1" | tail -${2:-80}; }

step build
timeout ${CMAKE_SECONDS:-30} cmake -S . -B build -G Ninja -DSPEEDTORCH_CUDA_ARCHS=9.0 -DSPEEDTORCH_BUILD_EXAMPLES=OFF \
  -DPython3_EXECUTABLE="$(command -v $PY)" -DCMAKE_PREFIX_PATH="$PWD/build-deps" >"$OUT/build.log" 2>&1 \
  && timeout ${BUILD_SECONDS:-150} ninja -C build speedtorch_ops >>"$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
export SPEEDTORCH_LIBRARY=$PWD/build/libspeedtorch_ops.so
nvidia-smi --query-gpu=name,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader
nproc; uptime

step "pytest -m gpu: the transfer engine (launch shapes, the measured split and its guard)"
timeout ${PYTEST_SECONDS:-40} $PY -m pytest -q -p no:cacheprovider -rf -m gpu tests/python/test_transfer_engine_gpu.py \
  >"$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$OUT/pytest.log" | tail -10

step "bench/transfer.py --quick --threads 16,2 (+ the reference)"
PYTHONPATH=python timeout ${QUICK_SECONDS:-120} $PY bench/transfer.py --quick --threads 16,2 \
  --json "$OUT/transfer_quick.json" >"$OUT/transfer_quick.log" 2>&1
echo "quick rc=$?"; key_lines "$OUT/transfer_quick.log" 90

step "bench/transfer.py as bench/report.py's transfer section, 16 threads (the collapse's sequence)"
PYTHONPATH=python timeout ${FULL_SECONDS:-120} $PY bench/transfer.py --threads 16 --fractions=-1,0,1 \
  --torch-pinned-rss --no-step --json "$OUT/transfer_full.json" >"$OUT/transfer_full.log" 2>&1
echo "full rc=$?"; key_lines "$OUT/transfer_full.log" 60
step done
