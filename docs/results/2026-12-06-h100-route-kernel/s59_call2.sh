#!/bin/bash
# Session 59 call 2: build this tree (RouteKernel with pairs and chunks) with CUTLASS for sm_90a in
# the background; meanwhile ncu of mla_token's input ProductKernel at B=1 (s45_probe.py, main's
# wheel .gpubuild/s58); then the routing and token tests of the new build, poisoned.
set -u
R=/tmp/s59r2; rm -rf $R; mkdir -p $R $OUT/gpubuild; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/cutlass')" .whl/nvidia_cutlass-*.whl
export CUTLASS_INCLUDE_DIR=/tmp/cutlass/cutlass_library/source/include
( CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=ON \
  --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w $OUT/gpubuild . > $R/build.log 2>&1; echo $? > $R/build.rc ) &
mkdir -p /tmp/w && python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/w')" .gpubuild/s58/te_async-*.whl
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
S=$PWD
(cd / && PYTHONPATH=/tmp/w timeout 200 $ncu --clock-control none --set full --import-source no --kernel-name-base demangled \
  -k "regex:ProductKernel<32" --launch-skip 30 --launch-count 2 -f -o $R/product_b1 python3 -P $S/.gpubuild/scripts/s45_probe.py 1) > $R/ncu.log 2>&1
tail -3 $R/ncu.log
$ncu -i $R/product_b1.ncu-rep --page details > $R/product_b1_details.txt 2>&1
$ncu -i $R/product_b1.ncu-rep --page source --csv --print-source sass > $R/product_b1_sass.csv 2>&1
grep -E "Duration|DRAM Throughput|Warp Cycles Per Issued|SM Active|Elapsed" $R/product_b1_details.txt | head -12
echo "=== $(date +%T) ncu done at $((SECONDS - T0)) s"
wait
echo "build rc $(cat $R/build.rc) at $((SECONDS - T0)) s"; tail -3 $R/build.log
mkdir -p /tmp/wn && python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/wn')" $OUT/gpubuild/te_async-*.whl
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
(cd / && PYTHONPATH=/tmp/wn TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 python3 -P -m pytest -q $x \
  -p no:cacheprovider --rootdir=$S $S/tests/test_routing.py $S/tests/test_decode_moe_gpu.py $S/tests/test_token_moe.py \
  $S/tests/test_token_ffn.py) > $R/tests.log 2>&1
tail -3 $R/tests.log
echo "=== $(date +%T) tests done at $((SECONDS - T0)) s"
tar czf $OUT/s59_call2.tgz -C $R .
