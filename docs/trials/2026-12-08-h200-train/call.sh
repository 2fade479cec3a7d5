#!/bin/bash
# #19 on an H200 (README): the wgrad config sweep, bench train with torch, bench prefill with the stream, GPU tests.
# carry .gpubuild/prebuilt. $OUT/summary.txt, results.tgz.
set -u
S=$PWD; R=/tmp/h2t; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
mkdir -p .gpubuild/main && cp .gpubuild/prebuilt/te_async-*.whl .gpubuild/main/ && wheels main
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # torch runs in the same process
bench() {  # bench <name> <seconds> <args>...
  local name=$1 secs=$2
  shift 2
  PYTHONPATH=/tmp/w_main step $secs $R/$name.log python3 -P -m te_async.bench "$@" --out $R/$name
  echo "--- $name (at $((SECONDS - T0)) s)" >> $L; grep -E '^\| ' $R/$name/*.md >> $L 2>/dev/null
}
for p in deepseek-v2-lite qwen3-30b-a3b; do
  bench wgrad_$p 100 prefill --preset $p --gemms fc1_wgrad fc2_wgrad --cutlass-configs --contenders te_async_device \
    torch_grouped_mm --reps 10
done
bench train 120 train --contenders device te_async_ragged_dot torch_grouped_mm --reps 6
bench prefill_deepseek 110 prefill --contenders te_async_device torch_grouped_mm --reps 10
bench prefill_qwen3 130 prefill --preset qwen3-30b-a3b --contenders te_async_device torch_grouped_mm --reps 10
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
gpu_tests main $R/tests.log 120 $x $S/tests/test_gpu_device_mode.py $S/tests/test_grouped_mlp.py $S/tests/test_plan.py
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log; tar czf $OUT/results.tgz -C $R .
cat $L
