#!/bin/bash
# Call 1: build this tree with CUTLASS (the wheel comes back in $OUT/gpubuild), then the GPU tests of
# the decode attention, the fused MLA kernel and the models.
set -u
export TE_ASYNC_COMMIT=${COMMIT:?}
OUT=$OUT bash tools/gpu_check.sh build
PYTEST_ARGS="tests/test_decode_attention.py tests/test_mla_decode.py tests/test_models_gpu.py" OUT=$OUT bash tools/gpu_check.sh test
gzip -k $OUT/test.log
