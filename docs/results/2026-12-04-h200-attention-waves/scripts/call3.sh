#!/bin/bash
# Call 3: build 340f8a5 without CUTLASS, the attention GPU tests, bench attention for it and the
# 7c91134 wheel (one process each), then bench generate (DeepSeek-V2-Lite, device mode, no
# profile) for both trees at the batches time allows.
set -u
export TE_ASYNC_COMMIT=${COMMIT:-340f8a5}
R=/tmp/runs3; mkdir -p $R
T0=$SECONDS
OUT=$OUT WITH_CUTLASS=0 bash tools/gpu_check.sh build | tail -3
PYTEST_ARGS="tests/test_decode_attention.py tests/test_mla_decode.py" OUT=$OUT bash tools/gpu_check.sh test | tail -3
python3 -m pip install -q --no-deps --target /tmp/before .gpubuild/7c91134-nocutlass/*.whl
for preset in deepseek-v2-lite qwen3-30b-a3b; do
  for tree in new before; do
    d=$R/${tree}_$preset; mkdir -p $d
    pp=; [ $tree = before ] && pp=/tmp/before
    echo "=== $(date +%T) attention $tree $preset"
    PYTHONPATH=$pp timeout 100 python3 -P -m te_async.bench attention --preset $preset --out $d --batches 1 8 64 --reps 10 > $d/attention.log 2>&1
    grep -E "^\| [0-9]" $d/attention.md
  done
done
for b in 64 8 1; do
  for tree in new before; do
    [ $((SECONDS - T0)) -gt 500 ] && break 2
    d=$R/gen_${tree}_B$b; mkdir -p $d
    pp=; [ $tree = before ] && pp=/tmp/before
    echo "=== $(date +%T) generate $tree B=$b"
    PYTHONPATH=$pp timeout 80 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches $b --modes device --steps 30 --no-profile --no-plots --out $d > $d/generate.log 2>&1
    grep -E "^\| [0-9]" $d/generate.md
  done
done
tar czf $OUT/runs_call3.tgz -C $R .
