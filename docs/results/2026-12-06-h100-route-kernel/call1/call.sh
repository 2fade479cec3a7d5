#!/bin/bash
# One device call: the RouteKernel phase probe and its two candidate variants (route_kernel_phases.py),
# built from main's csrc/cuda/moe_routing.cu and run twice; the output in $OUT/route_kernel_phases.txt.
set -u
D=docs/trials/2026-12-07-route-kernel; J=$(python3 -c "import jaxlib, os; print(os.path.dirname(jaxlib.__file__))")
cd /tmp && python3 $OLDPWD/$D/route_kernel_phases.py $OLDPWD/csrc/cuda/moe_routing.cu && \
  nvcc -O3 -std=c++17 -arch=sm_90a -I $OLDPWD/csrc -I $J/include route_kernel_phases.cu -o rkp 2> nvcc.log && \
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; ./rkp; ./rkp; } | tee $OUT/route_kernel_phases.txt
tail -3 /tmp/nvcc.log
