#!/usr/bin/env bash
# stop 63 call 2: call 1's wheel (c030f4b's C++ with CUTLASS), this tree's Python; bench decode device against torch_graph.
export TE_ASYNC_COMMIT=${TE_ASYNC_COMMIT:-c030f4b}
export PREBUILT=$(ls .gpubuild/s63/wheel/*.whl)
export PYTEST_ARGS="tests/test_torch_decode_step.py tests/test_bench_decode.py"
export DECODE_ARGS="--modes device torch_graph --batches 1 8 64 --reps 10 --detail-batch 64 --no-plots"
bash tools/gpu_check.sh build test decode
