#!/usr/bin/env bash
# The test suite on whatever backend JAX finds; GPU-only tests skip without a GPU. On the GPU
# machine use tools/gpu_check.sh instead: it needs no registry and turns on the debug checks.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
pytest -q -rs "$@"
