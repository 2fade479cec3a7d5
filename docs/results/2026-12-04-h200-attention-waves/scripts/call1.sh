#!/bin/bash
# Call 1 (2026-12-04, session 41): build 7093db6 without CUTLASS, the attention GPU tests, bench
# attention (DeepSeek-V2-Lite MLA and Qwen3-30B-A3B GQA) for the new kernel and for the 7c91134
# wheel (the kernel before 7093db6; no CUTLASS either), one process each, same machine.
set -u
export TE_ASYNC_COMMIT=${COMMIT:-7093db6}
R=/tmp/runs; mkdir -p $R
OUT=$OUT WITH_CUTLASS=0 bash tools/gpu_check.sh build
PYTEST_ARGS="tests/test_decode_attention.py tests/test_mla_decode.py" OUT=$OUT bash tools/gpu_check.sh test
python3 -m pip install -q --no-deps --target /tmp/before .gpubuild/7c91134-nocutlass/*.whl
for tree in new before; do
  for preset in deepseek-v2-lite qwen3-30b-a3b; do
    d=$R/${tree}_$preset; mkdir -p $d
    pp=; [ $tree = before ] && pp=/tmp/before
    echo "=== $(date +%T) attention $tree $preset"
    PYTHONPATH=$pp timeout 150 python3 -P -m te_async.bench attention --preset $preset --out $d --batches 1 8 64 --reps 10 > $d/attention.log 2>&1
    tail -n 8 $d/attention.log
  done
done
tar czf $OUT/runs_call1.tgz -C $R .
