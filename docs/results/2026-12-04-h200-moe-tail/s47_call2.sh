#!/bin/bash
set -u
R=$OUT/r; mkdir -p $R; T0=$SECONDS
nvcc -std=c++17 -arch=sm_90a -O3 -o /tmp/bw_probe2 .gpubuild/probe/bw_probe2.cu && /tmp/bw_probe2 | tee $R/bw_probe2.txt
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
$NCU --import .gpubuild/probe/ffn.ncu-rep --page source --csv --kernel-name regex:RouteTokenKernel > $R/route_source.csv 2>&1
$NCU --import .gpubuild/probe/ffn.ncu-rep --page raw --csv > $R/raw.csv 2>&1
echo "=== done $((SECONDS - T0)) s"; ls -la $R
