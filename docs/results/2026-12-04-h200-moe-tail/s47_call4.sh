#!/bin/bash
# Session 47 call 4 (no build): 167b083's wheel; generate B=1,2 with the layers scanned (main's choice at B<4) against written out (UNROLL_BATCHES widened), alternating; one profiled unrolled B=1 run.
set -u
R=/tmp/s47r4; rm -rf $R; mkdir -p $R; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
python3 -m pip install -q --no-deps --force-reinstall .gpubuild/167b083/te_async-*.whl > $R/build.log 2>&1
export TE_ASYNC_COMMIT=167b083
gen() {  # name, runner
  d=$R/generate_$1; mkdir -p $d
  echo "=== $(date +%T) generate $1"
  timeout 100 python3 -P $2 generate --preset deepseek-v2-lite --batches 1 2 --modes device --steps 60 --no-profile --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md || tail -5 $d/generate.log
}
for run in 1 2; do
  [ $((SECONDS - T0)) -gt 360 ] && break
  gen scan_$run "-m te_async.bench"; gen unrolled_$run .gpubuild/probe/generate_unrolled.py
done
if [ $((SECONDS - T0)) -lt 460 ]; then
  d=$R/generate_unrolled_profiled; mkdir -p $d
  echo "=== $(date +%T) generate unrolled profiled"
  timeout 110 python3 -P .gpubuild/probe/generate_unrolled.py generate --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --detail-batch 1 --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md; head -1 $d/*kernels.md
fi
tar czf $OUT/runs_call4.tgz -C $R .
