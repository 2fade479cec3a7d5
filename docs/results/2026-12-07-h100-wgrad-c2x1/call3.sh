#!/bin/bash
# Call 3: the GPU tests that call 2 cut at its limit, on 2a1561f's wheel (.gpubuild/heur): the CUTLASS device-mode
# tests (the heuristic's ragged-k choice in test_cutlass_wgrad_long_k) and grouped_mlp's (its weight gradients).
set -u
S=$PWD; R=/tmp/c2x1c; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
wheels heur
gpu_tests heur $R/tests.log 140 -n 8 $S/tests/test_gpu_device_mode.py $S/tests/test_grouped_mlp.py -k "cutlass or grouped_mlp or mlp"
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log; tar czf $OUT/results.tgz -C $R .
cat $L
