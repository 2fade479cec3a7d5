#!/bin/bash
# Session 59 call 3 (same warm machine as call 2; /tmp/w = main's wheel 5180726, /tmp/wn = this
# tree's, both with CUTLASS for sm_90a): bench decode T=8 and 64, device mode, old and new alternating.
set -u
R=/tmp/s59r3; rm -rf $R; mkdir -p $R; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
for run in 1 2; do
  for v in old new; do
    p=/tmp/w; [ $v = new ] && p=/tmp/wn
    (cd / && PYTHONPATH=$p timeout 110 python3 -P -m te_async.bench decode --modes device --batches 8 64 --reps 10 --no-plots \
      --out $R/decode_${v}_$run) > $R/decode_${v}_$run.log 2>&1
    echo "$v $run: $(grep -E '^\| device' $R/decode_${v}_$run/decode.md | tr '\n' ' ')"
  done
done
echo "=== $(date +%T) done at $((SECONDS - T0)) s"
tar czf $OUT/s59_call3.tgz -C $R .
