#!/usr/bin/env bash
# The main job: greedy generation with a tiny MoE checkpoint (tests/fixtures/hf/deepseek_v2) in every
# group-sizes mode and with jax.lax.ragged_dot experts, checked to give the same tokens, on whatever
# backend JAX finds; on a GPU also per-token latency of a DeepSeek-V2-Lite-shaped model (4 layers).
# Arguments go to examples/generate.py (--help lists them).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
python examples/generate.py "$@"
