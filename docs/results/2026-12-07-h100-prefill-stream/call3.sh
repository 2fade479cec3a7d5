#!/bin/bash
# Call 2 (README): the stream's kernels and gaps, bench read, bench train with torch. carry .gpubuild/prebuilt.
set -u
S=$PWD; R=/tmp/pstream2; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
mkdir -p .gpubuild/main && cp .gpubuild/prebuilt/te_async-*.whl .gpubuild/main/ && wheels main
PYTHONPATH=/tmp/w_main step 90 $R/stream_gap_probe.log python3 -P $S/tools/stream_gap_probe.py
cat $R/stream_gap_probe.log >> $L
PYTHONPATH=/tmp/w_main step 60 $R/read.log python3 -P -m te_async.bench read --out $R/read
echo "--- read (at $((SECONDS - T0)) s)" >> $L; tail -25 $R/read.log >> $L
PYTHONPATH=/tmp/w_main step 200 $R/train.log python3 -P -m te_async.bench train --contenders device torch_grouped_mm --reps 6 --out $R/train
echo "--- train (at $((SECONDS - T0)) s)" >> $L; grep -E '^\| ' $R/train/train.md >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log; tar czf $OUT/results.tgz -C $R .
cat $L
