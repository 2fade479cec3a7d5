#!/bin/bash
# Call B on an H200 (needs_h200; carry .whl), about 8 minutes: main built with CUTLASS for sm_90a;
# bench decode device T = 1 4 8 16 (64) with the layers written out as the models write them
# (--unroll auto) and scanned, and bench generate B = 1: the issues' H200 figures after stops 60 and
# 61; then memcheck of the routing kernels' forms in the time left.
# $OUT/summary.txt, results.tgz.
set -u
R=/tmp/h2b; rm -rf $R; mkdir -p $R; T0=$SECONDS; L=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/cutlass')" .whl/nvidia_cutlass-*.whl
CUTLASS_INCLUDE_DIR=/tmp/cutlass/cutlass_library/source/include CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel \
  --no-build-isolation --no-deps --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=ON --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real \
  -w /tmp/wheel_cutlass . > $R/build.log 2>&1 || { tail -5 $R/build.log; exit 1; }
rm -rf /tmp/w_cutlass; mkdir -p /tmp/w_cutlass
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" /tmp/wheel_cutlass/te_async-*.whl /tmp/w_cutlass
echo "built at $((SECONDS - T0)) s" >> $L
# bench decode's step with its layers written out where the models write them out (--unroll auto:
# device mode at T = 1 and 4-16) against scanned (--unroll never), alternating, twice; T = 64 stays
# scanned (the figure). XLA's graph flags changed nothing on an H100 (call_h100.sh).
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true  # the profiled step keeps the timed step's graphs
for run in 1 2; do for u in auto never; do
  b="1 4 8 16"; [ $u = auto ] && [ $run = 1 ] && b="1 4 8 16 64"
  (cd / && PYTHONPATH=/tmp/w_cutlass timeout 120 python3 -P -m te_async.bench decode --modes device --batches $b \
    --unroll $u --reps 10 --no-plots --detail-batch 1 --out $R/decode_${u}_$run) > $R/decode_${u}_$run.log 2>&1
  echo "--- main with CUTLASS, --unroll $u, run $run (at $((SECONDS - T0)) s)" >> $L; grep -E '^\| [0-9]' $R/decode_${u}_$run/decode.md >> $L
done; done
(cd / && PYTHONPATH=/tmp/w_cutlass timeout 120 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 \
  --modes device --steps 60 --no-plots --out $R/generate) > $R/generate.log 2>&1
grep -E '^\| [0-9]' $R/generate/generate.md >> $L
S=$PWD
(cd / && PYTHONPATH=/tmp/w_cutlass TE_ASYNC_POISON_OUTPUTS=1 timeout 150 python3 -P -m pytest -q -p no:cacheprovider \
  --rootdir=$S $S/tests/test_bench_decode.py) > $R/tests.log 2>&1
echo "test_bench_decode (poisoned): $(tail -1 $R/tests.log)" >> $L
# memcheck of the routing kernels' top-k forms (stop 59/60; the [G,K,N] kernel and the routing kernel at
# its limits passed memcheck on an H100, call_h100_memcheck.sh) in the time left
left=$((570 - (SECONDS - T0))); [ $left -lt 30 ] && left=1  # timeout 0 would mean no limit
(cd / && PYTHONPATH=/tmp/w_cutlass XLA_PYTHON_CLIENT_ALLOCATOR=platform timeout $left compute-sanitizer --tool memcheck \
  --error-exitcode 99 python3 -P -m pytest -q -p no:cacheprovider --rootdir=$S $S/tests/test_routing.py $S/tests/test_token_moe.py \
  -k "(kernel_matches_reference and -64-random) or (kernel_matches_reference and -1-random) or sigmoid_groups or kernels_against_float64") \
  > $R/sanitize.log 2>&1
echo "memcheck rc $? ($left s allowed): $(grep -E 'passed|failed|ERROR SUMMARY' $R/sanitize.log | tr '\n' ' ')" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
tar czf $OUT/results.tgz -C $R --exclude='traces' --exclude='srp' .
cat $L
