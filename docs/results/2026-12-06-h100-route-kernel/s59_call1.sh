#!/bin/bash
# Session 59 call 1 (carry .gpubuild/s58 = 5180726's CUTLASS wheel, main's C++): the route-kernel
# trial, then ncu of mla_token's input ProductKernel at B=1 (full set, SASS stall samples).
set -u
R=/tmp/s59r1; rm -rf $R; mkdir -p $R; T0=$SECONDS
mkdir -p /tmp/w && python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/w')" .gpubuild/s58/te_async-*.whl
bash docs/trials/2026-12-07-route-kernel/call.sh
cp /tmp/nvcc.log $R/ 2>/dev/null
echo "=== $(date +%T) trial done at $((SECONDS - T0)) s"
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
S=$PWD
(cd / && PYTHONPATH=/tmp/w timeout 240 $ncu --clock-control none --set full --import-source no --kernel-name-base demangled \
  -k "regex:ProductKernel<32" --launch-skip 6 --launch-count 2 -f -o $R/product_b1 \
  python3 -P -m te_async.bench generate --preset deepseek-v2-lite --layers 4 --batches 1 --modes device --steps 4 \
  --check-tokens 1 --no-profile --no-plots --out $R/gen) > $R/ncu.log 2>&1
tail -3 $R/ncu.log
$ncu -i $R/product_b1.ncu-rep --page details > $R/product_b1_details.txt 2>&1
$ncu -i $R/product_b1.ncu-rep --page source --csv --print-source sass > $R/product_b1_sass.csv 2>&1
grep -E "Duration|DRAM Throughput|Warp Cycles Per Issued|SM Active|Elapsed" $R/product_b1_details.txt | head -20
echo "=== $(date +%T) ncu done at $((SECONDS - T0)) s"
tar czf $OUT/s59_call1.tgz -C $R .
