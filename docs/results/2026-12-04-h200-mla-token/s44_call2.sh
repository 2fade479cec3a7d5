#!/bin/bash
# Session 44 call 2: the mla_token call alone (token_probe.py): split counts at B=1 and 2, against
# the unfused path; ncu of its four kernels at B=1 (serialised: each kernel's own time).
set -u
R=/tmp/r2; mkdir -p $R; T0=$SECONDS
python3 -m pip install -q --no-deps --force-reinstall .gpubuild/s44a/te_async-*.whl > $R/install.log 2>&1
for b in 1 2; do timeout 100 python3 -P .gpubuild/scripts/token_probe.py time $b 2>&1 | grep -v Warning | tail -8; done
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
echo "ncu: $ncu  $(( SECONDS - T0 )) s"
timeout 200 $ncu --clock-control none --set full -k "regex:MlaToken|DecodeAttention|Combine" --launch-skip 8 --launch-count 4 -o $R/token_b1 python3 -P .gpubuild/scripts/token_probe.py ncu 1 > $R/ncu.log 2>&1
tail -3 $R/ncu.log
$ncu -i $R/token_b1.ncu-rep --page details > $R/token_b1_details.txt 2>&1
grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Block Limit Shared|Theoretical Occ" $R/token_b1_details.txt | head -60
tar czf $OUT/runs_call2.tgz -C $R .
