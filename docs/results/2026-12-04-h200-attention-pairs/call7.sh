#!/bin/bash
# Session 43 call 7: GPU tests of the final tree's Python on 19e4a1a's wheel (main's kernels).
set -u
export TE_ASYNC_COMMIT=${COMMIT}
R=/tmp/runs7; mkdir -p $R
PREBUILT=$(ls .gpubuild/19e4a1a/*.whl) OUT=$R bash tools/gpu_check.sh build | tail -1
PYTEST_ARGS="tests/test_decode_attention.py tests/test_mla_decode.py tests/test_models_gpu.py tests/test_models_hf_parity.py tests/test_token_ffn.py tests/test_token_moe.py" OUT=$R timeout 300 bash tools/gpu_check.sh test | tail -3
tar czf $OUT/runs_call7.tgz -C $R .
