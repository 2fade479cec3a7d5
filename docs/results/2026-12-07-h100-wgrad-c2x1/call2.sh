#!/bin/bash
# Call 2: the heuristic with the 2x1 cooperative tile (2a1561f's wheel, .gpubuild/heur) against main's before it
# (9bcff4a's, .gpubuild/prebuilt): GPU tests, bench train device mode alternated (old, new, old, new), bench
# prefill's weight gradients with the new heuristic beside torch.
set -u
S=$PWD; R=/tmp/c2x1b; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
mkdir -p .gpubuild/old && cp .gpubuild/prebuilt/te_async-*.whl .gpubuild/old/ && wheels old heur
x=; python3 -c "import xdist" 2>/dev/null && x="-n 4"
gpu_tests heur $R/tests.log 90 $x $S/tests/test_gpu_device_mode.py $S/tests/test_plan.py $S/tests/test_grouped_mlp.py
for w in old heur old heur; do
  PYTHONPATH=/tmp/w_$w XLA_PYTHON_CLIENT_PREALLOCATE=false step 60 $R/train_$w.log python3 -P -m te_async.bench train \
    --contenders device --reps 6 --out $R/train_${w}_$SECONDS
  echo "train $w (at $((SECONDS - T0)) s): $(grep -E '^\| device' $R/train_$w.log | tail -1)" >> $L
done
for p in deepseek-v2-lite qwen3-30b-a3b; do
  PYTHONPATH=/tmp/w_heur XLA_PYTHON_CLIENT_PREALLOCATE=false step 60 $R/prefill_$p.log python3 -P -m te_async.bench prefill \
    --preset $p --gemms fc1_wgrad fc2_wgrad --contenders te_async_device torch_grouped_mm --reps 10 --out $R/prefill_$p
  echo "--- prefill $p (at $((SECONDS - T0)) s)" >> $L; grep -E '^\| (te_async|torch)' $R/prefill_$p/prefill.md >> $L
done
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log; tar czf $OUT/results.tgz -C $R .
cat $L
