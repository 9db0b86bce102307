#!/usr/bin/env bash
# Builds speedtorch against another PyTorch release and runs its C++ and Python tests there, to check the versions
# the README says it supports: bash tests/compat/run_with_torch.sh 2.4.1 [pytest options]
# Everything goes into build-compat/torch-VERSION/ (git-ignored): a virtual environment with that torch from PyPI
# (several GB with its CUDA libraries), the build, and the logs. The library is built without CUDA: this checks the
# API it compiles against and what runs on the CPU; the GPU run (bench/device_run.sh) uses the reference torch.
set -euo pipefail
VERSION=${1:?usage: run_with_torch.sh TORCH_VERSION [pytest options]}
shift
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$ROOT/build-compat/torch-$VERSION
VENV=$WORK/venv
mkdir -p "$WORK"

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$VERSION')" 2>/dev/null || {
  echo "installing torch==$VERSION into $VENV"
  "$VENV/bin/pip" install -q "torch==$VERSION" "numpy<2" pytest hypothesis tqdm expecttest cmake ninja
}

# torch < 2.5 built for CUDA looks for the CUDA toolkit's nvToolsExt, which CUDA 13 no longer ships: only the
# CMake target is needed to configure a build without CUDA kernels, so an empty one stands in when it is missing.
SHIM=$WORK/nvtx_shim.cmake
cat >"$SHIM" <<'CMAKE'
if(NOT TARGET CUDA::nvToolsExt)
  add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
endif()
CMAKE
NVTX_LIB=$(find -L "$VENV" -name 'libnvToolsExt.so*' 2>/dev/null | head -1 || true)

PATH=$VENV/bin:$PATH cmake -S "$ROOT" -B "$WORK/build" -G Ninja -DPython3_EXECUTABLE="$VENV/bin/python" \
  -DSPEEDTORCH_CUDA=OFF -DCMAKE_PROJECT_INCLUDE="$SHIM" ${NVTX_LIB:+-DLIBNVTOOLSEXT=$NVTX_LIB} \
  $(command -v ccache >/dev/null && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache) \
  >"$WORK/configure.log" 2>&1 || { tail -30 "$WORK/configure.log"; exit 1; }
grep -E "^-- speedtorch|WARNING" -A2 "$WORK/configure.log" || true
PATH=$VENV/bin:$PATH cmake --build "$WORK/build" -j "$(nproc)" >"$WORK/build.log" 2>&1 \
  || { grep -E "error|FAILED" "$WORK/build.log" | head -30; exit 1; }

PATH=$VENV/bin:$PATH ctest --test-dir "$WORK/build" -j "$(nproc)" --output-on-failure | tail -12
SPEEDTORCH_LIBRARY=$WORK/build/libspeedtorch_ops.so SPEEDTORCH_BUILD_DIR=$WORK/build \
  "$VENV/bin/python" -m pytest "$ROOT/tests/python" -q -p no:cacheprovider -rs "$@"
