#!/bin/bash
# Call 5: the whole model at B=64 (DeepSeek-V2-Lite, device mode, c05bad7's wheel with CUTLASS,
# no profile), main's split count against one wave, alternating while time allows.
set -u
export TE_ASYNC_COMMIT=${COMMIT:-3d5aca0}
R=/tmp/runs5; mkdir -p $R; T0=$SECONDS
PREBUILT=$(ls .gpubuild/c05bad7/*.whl) OUT=$OUT bash tools/gpu_check.sh build > /dev/null 2>&1
site=$(cd / && python3 -c "import te_async, os; print(os.path.dirname(te_async.__file__))")
cp $site/decode_attention.py /tmp/ceil.py
for run in 1; do
  for v in ceil one_wave; do
    [ $((SECONDS - T0)) -gt 75 ] && [ $run = 2 ] && break 2
    if [ $v = ceil ]; then cp /tmp/ceil.py $site/decode_attention.py; else cp .gpubuild/scripts/decode_attention_one_wave.py $site/decode_attention.py; fi
    d=$R/${v}_$run; mkdir -p $d
    echo "=== $(date +%T) $v run $run"
    timeout 45 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 64 --modes device --steps 30 --no-profile --no-plots --out $d > $d/generate.log 2>&1
    grep -E "^\| [0-9]" $d/generate.md
  done
done
tar czf $OUT/runs_call5.tgz -C $R .
