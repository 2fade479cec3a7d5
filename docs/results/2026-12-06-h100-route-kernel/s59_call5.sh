#!/bin/bash
# Session 59 call 5: variant B (RouteKernel capped at 48 registers: 1024 threads x 48 fit beside
# other blocks on an SM; 64 need the whole register file) built in a copy of the tree with CUTLASS,
# in the background; meanwhile bench decode profiled at T=8 and 64 for old (s58) and new (s59a);
# then bench decode T=8/64 old, new, B alternating.
set -u
R=/tmp/s59r5; rm -rf $R /tmp/treeB; mkdir -p $R; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/cutlass')" .whl/nvidia_cutlass-*.whl
export CUTLASS_INCLUDE_DIR=/tmp/cutlass/cutlass_library/source/include
mkdir -p /tmp/treeB && cp -r CMakeLists.txt pyproject.toml csrc te_async README.md /tmp/treeB/ 2>/dev/null; cp -r LICENSE* /tmp/treeB/ 2>/dev/null
cp .gpubuild/scripts/moe_routing_maxnreg48.cu /tmp/treeB/csrc/cuda/moe_routing.cu
( cd /tmp/treeB && CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=ON \
  --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w /tmp/wheelB . > $R/buildB.log 2>&1; echo $? > $R/buildB.rc ) &
for v in old new; do
  d=/tmp/w_$v; rm -rf $d; mkdir -p $d; whl=.gpubuild/s58/te_async-*.whl; [ $v = new ] && whl=.gpubuild/s59a/te_async-*.whl
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" $whl $d
done
for T in 8 64; do for v in old new; do
  (cd / && PYTHONPATH=/tmp/w_$v XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true timeout 120 python3 -P -m te_async.bench decode \
    --modes device --batches $T --reps 5 --no-plots --profile --detail-batch $T --out $R/prof_${v}_T$T) > $R/prof_${v}_T$T.log 2>&1
  echo "prof $v T=$T: $(ls $R/prof_${v}_T$T | tr '\n' ' ')"
done; done
wait
echo "buildB rc $(cat $R/buildB.rc) at $((SECONDS - T0)) s"; tail -1 $R/buildB.log
rm -rf /tmp/w_B; mkdir -p /tmp/w_B && python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/w_B')" /tmp/wheelB/te_async-*.whl
for run in 1 2; do
  for v in old new B; do
    (cd / && PYTHONPATH=/tmp/w_$v timeout 110 python3 -P -m te_async.bench decode --modes device --batches 8 64 --reps 10 --no-plots \
      --out $R/decode_${v}_$run) > $R/decode_${v}_$run.log 2>&1
    echo "$v $run: $(grep -E '^\| (8|64) ' $R/decode_${v}_$run/decode.md | tr '\n' ' ')"
  done
done
echo "=== $(date +%T) done at $((SECONDS - T0)) s"
tar czf $OUT/s59_call5.tgz -C $R .
