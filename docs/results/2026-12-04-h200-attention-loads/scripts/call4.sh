#!/bin/bash
# Call 4 (aa0c869's wheel; the tree's C++ differs from it in comments only): where the B=1 step's
# GPU time goes now (a profiled step's kernel table), and the MLA split kernel's warp stalls per
# SASS instruction at B=64 (ncu source page), for the next session's work on #17.
set -u
export TE_ASYNC_COMMIT=${COMMIT:?}
R=/tmp/runs; mkdir -p $R
PREBUILT=$(ls .gpubuild/aa0c869/*.whl) OUT=$OUT bash tools/gpu_check.sh build > /dev/null
echo "=== $(date +%T) B=1 profile"
XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true timeout 150 python3 -P -m te_async.bench generate \
  --preset deepseek-v2-lite --steps 40 --batches 1 --modes device --detail-batch 1 --no-plots --out $R/b1 > $R/b1.log 2>&1
echo "rc $?"; grep -E "^\| 1 " $R/b1.log; head -n 30 $R/b1/generate_timeline_B1_kernels.md
echo "=== $(date +%T) ncu source"
timeout 200 ncu --clock-control none --set full --import-source no -f -o $R/ncu_mla_B64 -k regex:DecodeAttentionKernel \
  --launch-count 1 python3 -P docs/results/2026-12-04-h200-attention-waves/scripts/attn_once.py 64 mla > $R/ncu_source.log 2>&1; echo "rc $?"
ncu -i $R/ncu_mla_B64.ncu-rep --page source --csv --print-source sass > $R/ncu_mla_B64_sass.csv 2>&1
ncu -i $R/ncu_mla_B64.ncu-rep --page details > $R/ncu_mla_B64_details.txt 2>&1
grep -E "Duration|DRAM Throughput" $R/ncu_mla_B64_details.txt | head -n 4
rm -rf $R/b1/traces
tar czf $OUT/runs_call4.tgz -C $R .
