#!/usr/bin/env bash
# Sourced by run_example.sh and run_tests.sh: makes ./.venv with everything from the package
# registry, then builds and installs te_async into it. With nvcc on the PATH the CUDA handlers
# are compiled too; their cuBLAS headers come from the nvidia-cublas wheel (cuBLAS itself is
# loaded at run time, so nothing here needs a GPU); with a GPU, the CUTLASS headers come from
# nvidia-cutlass.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
if [ -z "${JAX_SPEC:-}" ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then JAX_SPEC="jax[cuda13]"; else JAX_SPEC=jax; fi
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "$JAX_SPEC" "nanobind>=2.4" "scikit-build-core>=0.10" numpy pytest flax matplotlib tqdm
if command -v nvcc >/dev/null; then python -m pip install -q "nvidia-cublas==13.1.2.11"; fi
# The CUTLASS headers for device mode's Hopper grouped GEMM, only where a GPU can run it: its
# kernel instantiations take many minutes to compile (CMake skips them without the headers).
if command -v nvcc >/dev/null && [ "$JAX_SPEC" != jax ]; then python -m pip install -q --no-deps "nvidia-cutlass==4.2.0.0"; fi
python -m pip install -q --no-build-isolation --no-deps .
# Checked from outside the source tree, whose te_async/ has no compiled modules.
(cd / && python -c "import jax, te_async; print('te_async ready: jax', jax.__version__, jax.default_backend(), '| CUDA handlers built:', te_async.cuda_extension_built())")
