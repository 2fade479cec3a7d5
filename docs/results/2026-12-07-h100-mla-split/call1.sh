#!/bin/bash
# Stop 73, call 1: on an H200 the prepared decode trial (docs/trials/2026-12-07-h200-decode/call.sh); on an
# H100: (1) main's token-call GPU tests (2f9de9f's QueryCurrentDevice refactor was compiled, never run), (2) ncu
# --set full with per-instruction stall samples of one layer's five MLA-call kernels at B=1 (the split kernel's
# 10.4 us after the prep is the attention half's largest part; design-b1-attention-block.md's recorded next step).
# Carry .gpubuild/prebuilt (main's wheel built on the CPU machine) and .gpubuild/stamps (main + split_stamps.patch).
set -u
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash docs/trials/2026-12-07-h200-decode/call.sh
fi
S=$PWD; R=/tmp/c1; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
mkdir -p .gpubuild/main && cp .gpubuild/prebuilt/te_async-*.whl .gpubuild/main/ && wheels main
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
gpu_tests main $R/tests.log 200 $x $S/tests/test_token_ffn.py $S/tests/test_token_moe.py $S/tests/test_gqa_token.py \
  $S/tests/test_mla_token.py
# the split kernel's phases in the running pipeline (split_stamps.patch's wheel: thread 0's clock64 at each phase,
# printed for layer 13 of each trip)
mkdir -p .gpubuild/stamps_main && cp .gpubuild/stamps/te_async-*.whl .gpubuild/stamps_main/ && wheels stamps_main
for run in 1 2; do
  PYTHONPATH=/tmp/w_stamps_main step 90 $R/stamps_$run.log python3 -P $S/docs/results/2026-12-04-h200-mla-block/s45_probe.py 1
  echo "--- split kernel phases, run $run (at $((SECONDS - T0)) s)" >> $L
  python3 $S/docs/results/2026-12-07-h100-mla-split/stamps_summary.py $R/stamps_$run.log >> $L 2>&1
done
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
# the second scan trip's first layer: 26 layers x 5 kernels a trip
PYTHONPATH=/tmp/w_main step 200 $R/ncu.log $ncu --set full --import-source no -k "regex:ProductKernel|MlaToken|DecodeAttention" \
  --launch-skip 130 --launch-count 5 -o $R/mla_b1 python3 -P $S/docs/results/2026-12-04-h200-mla-block/s45_probe.py 1
echo "ncu (at $((SECONDS - T0)) s): $(tail -1 $R/ncu.log)" >> $L
if [ -f $R/mla_b1.ncu-rep ]; then
  $ncu -i $R/mla_b1.ncu-rep --page details --print-details all > $R/details.txt 2>&1
  $ncu -i $R/mla_b1.ncu-rep --page source --csv --print-source sass > $R/source_sass.csv 2>&1
  $ncu -i $R/mla_b1.ncu-rep --page raw --csv > $R/raw.csv 2>&1
  grep -E "^  [a-zA-Z].*\(|Duration  |Elapsed Cycles|SM Active Cycles|Warp Cycles Per Issued|Registers Per|Executed Instructions  " $R/details.txt >> $L
  gzip -f $R/source_sass.csv $R/raw.csv $R/details.txt
fi
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log
tar czf $OUT/results.tgz -C $R --exclude='*.ncu-rep' .
cp $R/mla_b1.ncu-rep $OUT/ 2>/dev/null
cat $L
