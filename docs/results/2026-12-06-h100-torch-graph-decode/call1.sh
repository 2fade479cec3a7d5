#!/usr/bin/env bash
# stop 63 call 1: main (c030f4b) with CUTLASS for sm_90a; ff4eda7's cluster-launch refactor and the torch decode step under test.
export TE_ASYNC_COMMIT=c030f4b
export PYTEST_ARGS="tests/test_token_moe.py tests/test_token_ffn.py tests/test_dense.py tests/test_gpu_device_mode.py tests/test_mla_decode.py tests/test_torch_decode_step.py tests/test_bench_decode.py"
bash tools/gpu_check.sh build test
