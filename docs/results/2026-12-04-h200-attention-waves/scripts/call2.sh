#!/bin/bash
# Call 2: ncu of the decode attention split kernel, 7093db6 (installed from call 1's wheel) and the
# 7c91134 wheel, DeepSeek-V2-Lite MLA at B=1 and 64 and Qwen3 GQA at B=64, 4096 keys.
set -u
export TE_ASYNC_COMMIT=${COMMIT:-7093db6}
R=/tmp/runs2; mkdir -p $R
PREBUILT=$(ls .gpubuild/w7093db6/*.whl) OUT=$OUT bash tools/gpu_check.sh build > /dev/null 2>&1
python3 -m pip install -q --no-deps --target /tmp/before .gpubuild/7c91134-nocutlass/*.whl
for tree in new before; do
  pp=; [ $tree = before ] && pp=/tmp/before
  for c in "64 mla" "1 mla" "64 gqa"; do
    set -- $c
    echo "=== $(date +%T) $tree B=$1 $2"
    PYTHONPATH=$pp timeout 100 ncu --clock-control none -k regex:DecodeAttentionKernel -s 2 -c 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
      --section LaunchStats --section MemoryWorkloadAnalysis \
      python3 -P .gpubuild/scripts/attn_once.py $1 $2 > $R/ncu_${tree}_B$1_$2.txt 2>&1
    grep -E "Duration|DRAM Throughput|Issue Slots Busy|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Stall|No Eligible|Block Limit" $R/ncu_${tree}_B$1_$2.txt | head -40
  done
done
tar czf $OUT/runs_call2.tgz -C $R .
