#!/usr/bin/env bash
# The test suite on whatever backend JAX finds; GPU-only tests skip without a GPU. Tests run in
# parallel processes (pytest-xdist), one per core up to 8; arguments go to pytest (-n 0: serial).
# On the GPU machine use tools/gpu_check.sh instead: it needs no registry and turns on the debug checks.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
workers=$(nproc)
[ "$workers" -le 8 ] || workers=8
# Several processes share a GPU: none may take most of its memory up front, as JAX does by default.
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}
pytest -q -rs -n "$workers" "$@"
