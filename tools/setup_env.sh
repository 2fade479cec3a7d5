#!/usr/bin/env bash
# Sourced by run_example.sh and run_tests.sh: makes ./.venv with everything from the package
# registry, then builds and installs te_async into it.
#
# Where `nvidia-smi -L` sees a GPU: jax[cuda13] and, with nvcc on the PATH, the CUDA handlers,
# compiled against the cuBLAS headers of the nvidia-cublas wheel (cuBLAS itself is loaded at run
# time) and the CUTLASS headers of nvidia-cutlass. Elsewhere: plain jax and the CPU handlers
# alone, all that a machine without a GPU can run. TE_ASYNC_BUILD_CUDA=1 compiles the CUDA
# handlers anyway (nvcc needed; CUTLASS still left out: its kernels take many minutes to
# compile), =0 never. JAX_SPEC overrides the jax requirement.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$SECONDS
step() { echo "te_async set-up [$1/4] $2 ($((SECONDS - t0)) s)"; }

gpu=0 build_cuda=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi
if [ "$gpu" = 1 ] && command -v nvcc >/dev/null; then build_cuda=1; fi
build_cuda=${TE_ASYNC_BUILD_CUDA:-$build_cuda}
JAX_SPEC=${JAX_SPEC:-$([ "$gpu" = 1 ] && echo "jax[cuda13]" || echo jax)}
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ -x .venv/bin/python ]; then step 1 "using .venv"; else step 1 "creating .venv"; "${PYTHON:-python3}" -m venv .venv; fi
. .venv/bin/activate

step 2 "installing $JAX_SPEC and the build tools from PyPI"
python -m pip install -q --upgrade pip
cublas=""
if [ "$build_cuda" = 1 ]; then cublas="nvidia-cublas==13.1.2.11"; fi
python -m pip install -q "$JAX_SPEC" "nanobind>=2.4" "scikit-build-core>=0.11" $cublas
if [ "$build_cuda" = 1 ] && [ "$gpu" = 1 ]; then python -m pip install -q --no-deps "nvidia-cutlass==4.2.0.0"; fi

if [ "$build_cuda" = 1 ]; then cuda=ON; step 3 "building te_async with its CUDA handlers (minutes) and installing its test and model extras"
else cuda=OFF; step 3 "building te_async (CPU handlers only) and installing its test and model extras"; fi
# The option is passed both ways: the build folder keeps its CMake cache between builds.
python -m pip install -q --no-build-isolation --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=$cuda ".[test,models]"

step 4 "checking the install"
# From outside the source tree, whose te_async/ has no compiled modules.
(cd / && python -c "import jax, te_async; print('te_async ready: jax', jax.__version__, jax.default_backend(), '| CUDA handlers built:', te_async.cuda_extension_built())")
echo "te_async set-up done in $((SECONDS - t0)) s"
