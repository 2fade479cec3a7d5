#!/bin/bash
# Call 3 (the H100 branch when no H200 comes): bench read with each read cold (timing.COLD_BYTES), bench train
# with torch beside (JAX allocating on demand, so that torch's even split fits). carry .gpubuild/prebuilt.
set -u
S=$PWD; R=/tmp/pstream3; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
mkdir -p .gpubuild/main && cp .gpubuild/prebuilt/te_async-*.whl .gpubuild/main/ && wheels main
PYTHONPATH=/tmp/w_main step 60 $R/read.log python3 -P -m te_async.bench read --out $R/read
echo "--- read (at $((SECONDS - T0)) s)" >> $L; grep -E '^\| [0-9]' $R/read/read.md >> $L
PYTHONPATH=/tmp/w_main XLA_PYTHON_CLIENT_PREALLOCATE=false step 200 $R/train.log python3 -P -m te_async.bench train \
  --contenders device torch_grouped_mm --reps 6 --out $R/train
echo "--- train (at $((SECONDS - T0)) s)" >> $L; grep -E '^\| ' $R/train/train.md >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log; tar czf $OUT/results.tgz -C $R .
cat $L
