#!/usr/bin/env bash
# The main job: an MoE decode loop through grouped_mlp on whatever backend JAX finds.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
python examples/moe_decode.py "$@"
