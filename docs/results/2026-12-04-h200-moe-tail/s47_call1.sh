#!/bin/bash
set -u
R=$OUT/r; mkdir -p $R; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
nvcc -std=c++17 -arch=sm_90a -O3 -o /tmp/bw_probe .gpubuild/probe/bw_probe.cu && /tmp/bw_probe | tee $R/bw_probe.txt
echo "=== probe done $((SECONDS - T0)) s"
python3 -m pip install -q --no-deps --force-reinstall .gpubuild/65123b2/te_async-*.whl > $R/install.log 2>&1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
timeout 200 $NCU --kernel-name regex:"TokenFfnKernel|RouteTokenKernel" --launch-skip 4 --launch-count 2 --set full --import-source yes -o $R/ffn python3 -P .gpubuild/probe/ffn_ncu.py > $R/ncu.log 2>&1
tail -3 $R/ncu.log
$NCU --import $R/ffn.ncu-rep --page details > $R/ffn_details.txt 2>&1
$NCU --import $R/ffn.ncu-rep --page source --csv --kernel-name regex:TokenFfnKernel > $R/ffn_source.csv 2>&1
echo "=== ncu done $((SECONDS - T0)) s"; ls -la $R
