#!/bin/bash
# Session 59 call 8 (last seconds of device time): RouteKernel's time inside the profiled T=64 step,
# new2 (call 7's wheel, no CUTLASS: small_groups GEMMs) and main (5180726's CUTLASS wheel).
set -u
R=$OUT; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
for v in new2 old; do
  d=/tmp/w_$v; whl=.gpubuild/s58/te_async-*.whl; [ $v = new2 ] && whl=.gpubuild/s59b/te_async-*.whl
  mkdir -p $d && python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" $whl $d
  (cd / && PYTHONPATH=$d XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true timeout 50 python3 -P -m te_async.bench decode \
    --modes device --batches 64 --reps 3 --no-plots --profile --detail-batch 64 --out /tmp/p_$v) > $R/prof_${v}_T64.log 2>&1
  cp /tmp/p_$v/decode_timeline_T64_kernels.md $R/prof_${v}_T64_kernels.md 2>/dev/null
  cp /tmp/p_$v/decode.md $R/prof_${v}_T64_decode.md 2>/dev/null
  grep RouteKernel $R/prof_${v}_T64_kernels.md; echo "$v done at $((SECONDS - T0)) s"
done
