#!/bin/bash
# Session 45 call 2: build the tree (sm_90a, no CUTLASS), GPU tests of the touched kernels and the
# models, then bench generate at B=1 and 2 (DeepSeek-V2-Lite, device mode), alternating: 2ce7354's
# wheel (stop 44's four-kernel call), 4e8ab59's (the whole attention half, weights before the
# wait), this tree's (8-warp split kernel, parallel column sums, two sequences a product block);
# TE_ASYNC_MLA_DECODE=unfused on this tree once; one profiled B=1 run of this tree.
set -u
export TE_ASYNC_COMMIT=${COMMIT}
R=/tmp/r2; mkdir -p $R $OUT/gpubuild; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
true
python3 -m pip install -q --no-deps --force-reinstall .gpubuild/e1d1f8a/te_async-*.whl >> $R/build.log 2>&1
python3 -m pip install -q --no-deps --target /tmp/old .gpubuild/2ce7354/te_async-*.whl >> $R/build.log 2>&1
python3 -m pip install -q --no-deps --target /tmp/mid .gpubuild/4e8ab59/te_async-*.whl >> $R/build.log 2>&1
echo "=== $(date +%T) built in $((SECONDS - T0)) s"
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
true
grep -E "passed|failed|FAILED|Error" $R/tests.log | tail -15
echo "=== $(date +%T) tests done at $((SECONDS - T0)) s"
gen() {  # name, PYTHONPATH, extra env
  d=$R/generate_$1; mkdir -p $d
  echo "=== $(date +%T) generate $1"
  env PYTHONPATH=$2 ${3:-} timeout 70 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 2 --modes device --steps 60 --no-profile --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md || tail -5 $d/generate.log
}
for run in 1 2; do
  [ $((SECONDS - T0)) -gt 380 ] && break
  gen old_$run /tmp/old; gen mid_$run /tmp/mid; gen new_$run ""
done
[ $((SECONDS - T0)) -lt 420 ] && gen unfused "" TE_ASYNC_MLA_DECODE=unfused
if [ $((SECONDS - T0)) -lt 450 ]; then
  d=$R/generate_new_profiled; mkdir -p $d
  echo "=== $(date +%T) generate new profiled"
  timeout 80 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --detail-batch 1 --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md; head -1 $d/*kernels.md
fi
tar czf $OUT/runs_call2.tgz -C $R .
