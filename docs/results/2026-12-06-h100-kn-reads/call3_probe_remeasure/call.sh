#!/bin/bash
# One device call (carry .whl): the stripe read probe (34 and 64 active experts, twice each); the SASS of
# small_groups' bf16 [G,K,N] kernels with the row table (main's Fuse::kRows, the fc1 trial's
# kRowsSwigluOut) for where its spills sit; then main built with CUTLASS for sm_90a: bench decode
# T = 1 / 8 / 64 (profiled T = 64 trip), bench generate B = 1, and GPU tests around the routing.
set -u
P=docs/trials/stripe_probe; R=/tmp/sp; rm -rf $R; mkdir -p $R; T0=$SECONDS; S=$PWD; L=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
nvcc -O3 -std=c++17 -arch=sm_90a $P/stripe_read_probe.cu -o $R/srp >> $L 2>&1
for n in 34 64 34 64; do $R/srp $n >> $R/probe.txt 2>&1; done; cat $R/probe.txt >> $L
# main built with CUTLASS, in the background while the SASS is compiled
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/cutlass')" .whl/nvidia_cutlass-*.whl
( CUTLASS_INCLUDE_DIR=/tmp/cutlass/cutlass_library/source/include CMAKE_BUILD_PARALLEL_LEVEL=14 python3 -m pip wheel \
  --no-build-isolation --no-deps --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=ON --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real \
  -w /tmp/wheel_main . > $R/build_main.log 2>&1; rm -rf /tmp/w_main; mkdir -p /tmp/w_main
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" /tmp/wheel_main/te_async-*.whl /tmp/w_main ) &
J=$(python3 -c "import jaxlib, os; print(os.path.join(os.path.dirname(jaxlib.__file__), 'include'))")
rm -rf /tmp/src_p && mkdir -p /tmp/src_p && cp -r csrc /tmp/src_p/ && (cd /tmp/src_p && patch -p1 < $S/docs/trials/2026-12-07-fc1-swiglu-epilogue/fc1_swiglu_epilogue.patch) > $R/patch.log 2>&1
(cd /tmp/src_p && nvcc -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -O3 -cubin -I csrc -I $J csrc/cuda/small_group_gemm.cu -o $R/sg.cubin) > $R/sass_build.log 2>&1
cuobjdump -sass $R/sg.cubin | awk '/Function :/ {keep = ($0 ~ /SmallGroupsKnKernelI13__nv_bfloat16S._Lb1ELb0ELNS._4FuseE[14]E/)} keep' > $R/sass_kn_rows.txt
echo "sass: $(grep -c 'Function' $R/sass_kn_rows.txt) functions, LDL $(grep -c LDL $R/sass_kn_rows.txt), STL $(grep -c STL $R/sass_kn_rows.txt)" >> $L
wait
echo "built at $((SECONDS - T0)) s: $(ls /tmp/wheel_main)" >> $L
(cd / && PYTHONPATH=/tmp/w_main timeout 120 python3 -P -m te_async.bench decode --modes device --batches 1 8 64 --reps 10 \
  --no-plots --detail-batch 64 --out $R/decode) > $R/decode.log 2>&1
grep -E '^\| [0-9]' $R/decode/decode.md >> $L
(cd / && PYTHONPATH=/tmp/w_main timeout 120 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 \
  --modes device --steps 60 --no-plots --out $R/generate) > $R/generate.log 2>&1
grep -E '^\| [0-9]' $R/generate/generate.md >> $L
echo "=== bench done at $((SECONDS - T0)) s" >> $L
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
(cd / && PYTHONPATH=/tmp/w_main TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -P -m pytest -q $x \
  -p no:cacheprovider --rootdir=$S $S/tests/test_models_gpu.py $S/tests/test_decode_moe_gpu.py) > $R/tests.log 2>&1
tail -2 $R/tests.log >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip $R/tests.log; tar czf $OUT/results.tgz -C $R --exclude='traces' --exclude='srp' --exclude='sg.cubin' .
cat $L
