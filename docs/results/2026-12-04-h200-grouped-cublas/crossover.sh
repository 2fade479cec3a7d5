#!/usr/bin/env bash
set -uo pipefail
OUT=$OUT PREBUILT=$(ls .gpubuild/e84644d/*.whl) bash tools/gpu_check.sh build >/dev/null 2>&1
cp tools/host_gemm_crossover.py /tmp/ && cd /tmp
python3 -P host_gemm_crossover.py 2>&1 | grep -v Warning | tee "$OUT/crossover_grouped.txt"
TE_ASYNC_PER_GROUP_GEMMS=1 python3 -P host_gemm_crossover.py 2>&1 | grep -v Warning | tee "$OUT/crossover_per_group.txt"
