#!/bin/bash
# Call 4: main's kernel (c05bad7's wheel), bench attention for MLA at B=16 and 64 with main's split
# count (ceil(2 SMs / blocks): 17 and 5 splits, 1.03 and 1.21 waves of 2 blocks per SM) and with
# one wave (floor: 16 and 4), alternating, two processes each.
set -u
export TE_ASYNC_COMMIT=${COMMIT:-3d5aca0}
R=/tmp/runs4; mkdir -p $R
PREBUILT=$(ls .gpubuild/c05bad7/*.whl) OUT=$OUT bash tools/gpu_check.sh build > /dev/null 2>&1
site=$(cd / && python3 -c "import te_async, os; print(os.path.dirname(te_async.__file__))")
cp $site/decode_attention.py /tmp/ceil.py
for run in 1 2; do
  for v in ceil one_wave; do
    if [ $v = ceil ]; then cp /tmp/ceil.py $site/decode_attention.py; else cp .gpubuild/scripts/decode_attention_one_wave.py $site/decode_attention.py; fi
    d=$R/${v}_$run; mkdir -p $d
    echo "=== $(date +%T) $v run $run"
    timeout 70 python3 -P -m te_async.bench attention --out $d --batches 16 64 --reps 10 > $d/attention.log 2>&1
    grep -E "^\| [0-9]" $d/attention.md
  done
done
tar czf $OUT/runs_call4.tgz -C $R .
