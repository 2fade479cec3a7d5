#!/bin/bash
# Call 5: bench prefill (table PT's command) with the stream as the slope between 20 and 40 back-to-back calls
# (call 2's stream of 30 calls still carried the batch's fixed latency: about 17 us a call above the GPU
# timeline, by tools/stream_gap_probe.py in call 3). carry .gpubuild/prebuilt.
set -u
S=$PWD; R=/tmp/pstream5; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
mkdir -p .gpubuild/main && cp .gpubuild/prebuilt/te_async-*.whl .gpubuild/main/ && wheels main
for p in deepseek-v2-lite qwen3-30b-a3b; do
  PYTHONPATH=/tmp/w_main XLA_PYTHON_CLIENT_PREALLOCATE=false step 150 $R/prefill_$p.log python3 -P -m te_async.bench prefill \
    --preset $p --contenders te_async_device torch_grouped_mm --reps 10 --out $R/prefill_$p
  echo "--- prefill $p (at $((SECONDS - T0)) s)" >> $L; grep -E '^\| (te_async|torch)' $R/prefill_$p/prefill.md >> $L
done
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log; tar czf $OUT/results.tgz -C $R .
cat $L
