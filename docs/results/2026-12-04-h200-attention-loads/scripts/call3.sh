#!/bin/bash
# Call 3 (the wheel of aa0c869, the same C++, carried in .gpubuild/aa0c869): GPU tests of the files that run the models'
# decode attention; table G1 again; B=1 with the kernel's attention against auto's XLA attention
# (two pairs); ncu of the MLA split kernel at B=64.
set -u
export TE_ASYNC_COMMIT=${COMMIT:?}
R=/tmp/runs; mkdir -p $R
PREBUILT=$(ls .gpubuild/aa0c869/*.whl) OUT=$OUT bash tools/gpu_check.sh build > /dev/null
PYTEST_ARGS="tests/test_models_hf_parity.py tests/test_bench_generate.py tests/test_bench_harness.py tests/test_decode_moe_gpu.py" \
  OUT=$OUT bash tools/gpu_check.sh test | tail -n 3
cp $OUT/test.log $R/gpu_tests_more.log
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true
echo "=== $(date +%T) G1"
timeout 200 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --steps 40 --batches 1 8 64 \
  --modes device sync async --detail-batch 8 --out $R/generate > $R/generate.log 2>&1; echo "rc $?"
grep -E "^\| (1|8|64) " $R/generate.log
unset XLA_FLAGS
for run in 1 2; do for attn in te_async auto; do
  echo "=== $(date +%T) B=1 attention $attn run $run"
  TE_ASYNC_DECODE_ATTENTION=$attn timeout 80 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --steps 60 \
    --batches 1 --modes device --no-profile --no-plots --out $R/b1_${attn}_run$run > $R/b1_${attn}_run$run.log 2>&1
  echo "rc $?"; grep -E "^\| 1 " $R/b1_${attn}_run$run.log
done; done
echo "=== $(date +%T) ncu"
timeout 150 ncu --clock-control none -k regex:DecodeAttentionKernel --launch-count 1 --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats python3 -P docs/results/2026-12-04-h200-attention-waves/scripts/attn_once.py 64 mla > $R/ncu_B64_mla.txt 2>&1; echo "rc $?"
grep -E "Duration|DRAM Throughput|Registers Per|Issued Warp|Achieved Active" $R/ncu_B64_mla.txt
tar czf $OUT/runs_call3.tgz -C $R .
