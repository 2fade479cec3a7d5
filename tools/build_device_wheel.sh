#!/usr/bin/env bash
# Builds, on this CPU machine, the te_async wheel the GPU machine installs (tools/gpu_check.sh's
# PREBUILT=<wheel>, or pip install --no-deps), so that a device call spends none of its time
# compiling CUTLASS (about 250 s of device time there; about 12 min here on 2 cores). Stop 64 ran its
# only call on such a wheel: it loaded on the H100 machine and passed 177 GPU tests.
#
# The GPU machine runs python 3.12 and jax 0.11.2 (PY=, JAX_VERSION= for others). The wheel links
# the CUDA runtime of this machine's nvcc statically (13.0 here: the GPU's driver must take it; 580
# does) and loads cuBLAS at run time, so only cuBLAS's headers are fetched (from the nvidia-cublas
# wheel). CUTLASS's headers come from the nvidia-cutlass wheel in .whl/, as on the GPU machine.
# Needs nvcc and the package registry. Usage: [CLEAN=1] tools/build_device_wheel.sh; the wheel lands in
# .gpubuild/<commit>/ (git-ignored; carry that folder).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$(ls /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -n 1 || true)}
JAX_VERSION=${JAX_VERSION:-0.11.2}
[ -x "$PY" ] || { echo "no python 3.12: set PY=<interpreter>" >&2; exit 1; }
cutlass_wheel=$(ls .whl/nvidia_cutlass-*.whl 2>/dev/null | head -n 1)
[ -n "$cutlass_wheel" ] || { echo "no .whl/nvidia_cutlass-*.whl: pip download --no-deps nvidia-cutlass==4.2.0.0 -d .whl" >&2; exit 1; }
command -v nvcc >/dev/null || { echo "no nvcc on PATH" >&2; exit 1; }

work=${WORK:-/tmp/te_async_device_wheel}
mkdir -p "$work"
if [ ! -x "$work/venv/bin/python" ]; then
  "$PY" -m venv "$work/venv"
  "$work/venv/bin/pip" install -q "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION" nanobind scikit-build-core cmake ninja
fi
if [ ! -f "$work/cublas/nvidia/cu13/include/cublas_v2.h" ]; then
  "$work/venv/bin/pip" download -q --no-deps "nvidia-cublas>=13,<14" -d "$work/dl"
  "$work/venv/bin/python" - "$work" <<'EOF'
import glob, sys, zipfile
work = sys.argv[1]
wheel = zipfile.ZipFile(glob.glob(f"{work}/dl/nvidia_cublas-*.whl")[0])
for name in wheel.namelist():
    if "/include/" in name:
        wheel.extract(name, f"{work}/cublas")
EOF
fi
# The build folder is kept, so a change to a few files recompiles those (stop 66: route_rows.cu alone, about
# 1.5 min, where a fresh build takes about 12), and CUTLASS is extracted once (extracting again renews the
# headers' times, and the build then recompiles every CUTLASS file). CLEAN=1 starts afresh with both.
[ "${CLEAN:-0}" = 1 ] && rm -rf "$work/build" "$work/cutlass"
if [ ! -d "$work/cutlass/cutlass_library/source/include" ]; then
  "$work/venv/bin/python" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$cutlass_wheel" "$work/cutlass"
fi

out=.gpubuild/$(git rev-parse --short HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || out=$out-dirty
mkdir -p "$out"
PATH="$work/venv/bin:$PATH" CUTLASS_INCLUDE_DIR="$work/cutlass/cutlass_library/source/include" \
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$work/venv/bin/python" -m pip wheel --no-build-isolation --no-deps -w "$out" \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=ON \
  --config-settings=cmake.define.CUBLAS_INCLUDE_DIR="$work/cublas/nvidia/cu13/include" \
  --config-settings=build-dir="$work/build" .
wheel=$(ls "$PWD/$out"/te_async-*.whl)
rm -rf "$work/check"
"$work/venv/bin/pip" install -q --no-deps --target "$work/check" "$wheel"
(cd / && PYTHONPATH="$work/check" "$work/venv/bin/python" -c "
from te_async import _ffi
m = _ffi.cuda_module()
assert m is not None and m.CUTLASS_BUILT, 'the wheel has no CUDA extension with CUTLASS'")
echo "built with CUDA and CUTLASS: $wheel"
