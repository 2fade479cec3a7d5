#!/bin/bash
# Session 45 call 4 (38ab664's wheel): ncu of the MLA call's five kernels at B=1 (serialised: each
# kernel's own time), then bench generate at B=4 and 8 with the call (AUTO_MAX_BATCH raised to 8)
# against the unfused path, alternating.
set -u
export TE_ASYNC_COMMIT=${COMMIT}
R=/tmp/r4; rm -rf $R; mkdir -p $R; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
python3 -m pip install -q --no-deps --force-reinstall .gpubuild/38ab664/te_async-*.whl > $R/install.log 2>&1
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
timeout 150 $ncu --clock-control none --set full -k "regex:ProductKernel|MlaToken|DecodeAttention" --launch-skip 10 --launch-count 5 -o $R/call_b1 python3 -P .gpubuild/scripts/s45_probe.py 1 > $R/ncu.log 2>&1
tail -2 $R/ncu.log
$ncu -i $R/call_b1.ncu-rep --page details > $R/ncu_call_b1.txt 2>&1
grep -E "^  [a-zA-Z].*\(|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy" $R/ncu_call_b1.txt | head -40
echo "=== $(date +%T) ncu done at $((SECONDS - T0)) s"
for run in 1 2; do for v in unfused auto8; do
  [ $((SECONDS - T0)) -gt 330 ] && break 2
  d=$R/generate_${v}_$run; mkdir -p $d
  echo "=== $(date +%T) generate $v $run"
  if [ $v = unfused ]; then
    TE_ASYNC_MLA_DECODE=unfused timeout 90 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 4 8 --modes device --steps 40 --no-profile --no-plots --out $d > $d/generate.log 2>&1
  else
    timeout 90 python3 -P .gpubuild/scripts/s45_auto8.py generate --preset deepseek-v2-lite --batches 4 8 --modes device --steps 40 --no-profile --no-plots --out $d > $d/generate.log 2>&1
  fi
  grep -E "^\| [0-9]" $d/generate.md || tail -5 $d/generate.log
done; done
rm -f $R/call_b1.ncu-rep
tar czf $OUT/runs_call4.tgz -C $R .
