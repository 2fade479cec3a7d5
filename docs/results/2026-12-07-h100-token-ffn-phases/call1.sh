#!/bin/bash
# Stop 74, call 1 (one H100): where token_moe's experts kernel (TokenFfnKernel, 54 us of an 84 us B=1 DeepSeek-V2-Lite
# layer, for 138 MB a plain read takes 46 us of) spends its time, block by block, inside the running model. (The copy
# that ran had the two read probes beside it; this one points at their folder.)
# Carry .gpubuild/new (main's C++ at 56b0272) and .gpubuild/stamps (the same + ffn_stamps.patch). On an H200 (the
# issues' card, none since stop 58) it first measures main's #17 and #18 figures: bench generate B=1 DeepSeek-V2-Lite
# (twice) and Qwen3-30B-A3B (all 48 layers), bench decode device T = 1 / 8 / 64 with the layers written out.
# 1. bench generate B=1 DeepSeek-V2-Lite on the stamps wheel (FFNSTAMP lines for 4 consecutive launches), a profiled
#    run of each wheel (the stamps' cost on the kernel), 2. the H200 session's one-wave read probes of fc1's pattern
#    (bw_probe.cu, bw_probe2.cu) on this H100, 3. ncu --set full with source counters of one TokenFfnKernel launch.
set -u
S=$PWD; D=$S/docs/results/2026-12-07-h100-token-ffn-phases; R=/tmp/ffn; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
mkdir -p .gpubuild/main && cp .gpubuild/new/te_async-*.whl .gpubuild/main/ && wheels main stamps
gen() {  # wheel name out-dir [extra]
  PYTHONPATH=/tmp/w_$1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step 60 $R/$2.log python3 -P -m te_async.bench generate \
    --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --no-plots --out $R/$2 ${3:-}
  echo "generate $2 (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/$2/generate.md 2>/dev/null)" >> $L
}
if grep -q H200 $R/gpu.txt; then
  gen main main_1 --no-profile; gen main main_2 --no-profile
  PYTHONPATH=/tmp/w_main XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step 60 $R/qwen3.log python3 -P -m te_async.bench generate \
    --preset qwen3-30b-a3b --batches 1 --modes device --steps 60 --no-plots --no-profile --out $R/qwen3
  echo "generate qwen3 (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/qwen3/generate.md 2>/dev/null)" >> $L
  XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true PYTHONPATH=/tmp/w_main step 150 $R/decode.log python3 -P \
    -m te_async.bench decode --modes device --batches 1 8 64 --unroll auto --reps 10 --no-plots --detail-batch 8 --out $R/decode
  echo "--- bench decode --unroll auto (at $((SECONDS - T0)) s)" >> $L; grep -E '^\| [0-9]' $R/decode/decode.md >> $L
fi
gen stamps stamps_run --no-profile
echo "--- TokenFfnKernel's phases (stamps wheel)" >> $L
python3 $D/stamps_summary.py $R/stamps_run.log >> $L 2>&1
gen stamps stamps_profiled; gen main main_profiled
for k in stamps_profiled main_profiled; do
  echo "$k: $(grep -E 'TokenFfnKernel|ReducePartials|RouteToken' $R/$k/generate_timeline_B1_kernels.md | tr '\n' ' ')" >> $L
done
for p in bw_probe bw_probe2; do
  step 60 $R/$p.txt nvcc -O3 -std=c++17 -arch=sm_90a -o $R/$p $S/docs/results/2026-12-04-h200-moe-tail/probes/$p.cu &&
    step 40 $R/$p.txt $R/$p
  echo "--- $p (at $((SECONDS - T0)) s)" >> $L; grep -E "TB/s" $R/$p.txt >> $L
done
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
PYTHONPATH=/tmp/w_main XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step 200 $R/ncu.log $ncu --set full --import-source no \
  -k "regex:TokenFfnKernel" --launch-skip 400 --launch-count 1 -o $R/ffn python3 -P -m te_async.bench generate \
  --preset deepseek-v2-lite --batches 1 --modes device --steps 20 --no-plots --no-profile --out $R/ncu_generate
echo "ncu (at $((SECONDS - T0)) s): $(tail -1 $R/ncu.log)" >> $L
if [ -f $R/ffn.ncu-rep ]; then
  $ncu -i $R/ffn.ncu-rep --page details --print-details all > $R/details.txt 2>&1
  $ncu -i $R/ffn.ncu-rep --page source --csv --print-source sass > $R/source_sass.csv 2>&1
  grep -E "^  [a-zA-Z].*\(|Duration  |DRAM Throughput|Elapsed Cycles|SM Active Cycles|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|stall_long_sb  |stall_lg  |stall_barrier  |# Samples" $R/details.txt >> $L
  gzip -f $R/source_sass.csv $R/details.txt
fi
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log
tar czf $OUT/results.tgz -C $R --exclude='*.ncu-rep' --exclude=bw_probe --exclude=bw_probe2 .
cat $L
