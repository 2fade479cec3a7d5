#!/bin/bash
# memcheck of stop 59/60's kernels (the routing kernels per top-k form, the 256-byte [G,K,N] kernel) on
# an H100: main built without CUTLASS for sm_90a (those kernels need none; the CUTLASS tests skip),
# call_b.sh's sanitize selection. $OUT/summary.txt, sanitize.log.gz.
set -u
R=/tmp/mc; rm -rf $R; mkdir -p $R; T0=$SECONDS; S=$PWD; L=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real \
  -w /tmp/wheel_mc . > $R/build.log 2>&1 || { tail -5 $R/build.log; exit 1; }
rm -rf /tmp/w_mc; mkdir -p /tmp/w_mc
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" /tmp/wheel_mc/te_async-*.whl /tmp/w_mc
echo "built at $((SECONDS - T0)) s" >> $L
left=$((560 - (SECONDS - T0))); [ $left -lt 30 ] && left=1  # timeout 0 would mean no limit
(cd / && PYTHONPATH=/tmp/w_mc XLA_PYTHON_CLIENT_ALLOCATOR=platform timeout $left compute-sanitizer --tool memcheck \
  --error-exitcode 99 python3 -P -m pytest -q -p no:cacheprovider --rootdir=$S $S/tests/test_gpu_device_mode.py \
  $S/tests/test_decode_moe_gpu.py $S/tests/test_routing.py $S/tests/test_dense.py $S/tests/test_token_ffn.py \
  -k "test_kernel_gpu or odd_widths or split_k or clamped or (fused_matches and bfloat16) or kernel_at_its_limits or (kernel_against_float64 and bfloat16)") \
  > $R/sanitize.log 2>&1
echo "memcheck rc $? ($left s allowed): $(grep -E 'passed|failed|ERROR SUMMARY' $R/sanitize.log | tr '\n' ' ')" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -c $R/sanitize.log > $OUT/sanitize.log.gz
cat $L
