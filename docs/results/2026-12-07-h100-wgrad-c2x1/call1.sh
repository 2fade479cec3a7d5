#!/bin/bash
# The 2x1 cooperative tile for ragged k (README): its GPU tests, then bench prefill's weight gradients with every
# CUTLASS config beside torch, DeepSeek-V2-Lite and Qwen3-30B-A3B. carry .gpubuild/c2x1.
set -u
S=$PWD; R=/tmp/c2x1; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
wheels c2x1
x=; python3 -c "import xdist" 2>/dev/null && x="-n 4"
gpu_tests c2x1 $R/tests.log 100 $x $S/tests/test_gpu_device_mode.py $S/tests/test_plan.py -k "cutlass or plan"
for p in deepseek-v2-lite qwen3-30b-a3b; do
  PYTHONPATH=/tmp/w_c2x1 XLA_PYTHON_CLIENT_PREALLOCATE=false step 100 $R/prefill_$p.log python3 -P -m te_async.bench prefill \
    --preset $p --gemms fc1_wgrad fc2_wgrad --cutlass-configs --contenders te_async_device torch_grouped_mm --reps 10 \
    --out $R/prefill_$p
  echo "--- prefill $p (at $((SECONDS - T0)) s)" >> $L; grep -E '^\| (te_async|torch)' $R/prefill_$p/prefill.md >> $L
done
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log; tar czf $OUT/results.tgz -C $R .
cat $L
