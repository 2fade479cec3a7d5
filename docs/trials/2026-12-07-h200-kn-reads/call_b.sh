#!/bin/bash
# Call B of two on an H200 (needs_h200; carry .whl), about 7 minutes: main built with CUTLASS for
# sm_90a; bench decode device T = 1 8 64 (profiled T = 1 trip) under three XLA_FLAGS (default;
# min graph size 1; and the while loop in the command buffer) and bench generate B = 1: the issues'
# H200 figures after stop 60, and whether XLA's graphs take the idle out of the scanned step; then
# memcheck of the routing kernels' forms in the time left.
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
# The scan's trips as XLA sees them: by default a trip's thunks form a command buffer only from 5 of
# them (T = 1's token_moe trip is fewer: stop 60 saw 0 graph launches there, the host launching its
# kernels), and the while loop itself is never one (a graph launch, and its update, per trip).
P=--xla_enable_command_buffers_during_profiling=true  # the profiled step keeps the timed step's graphs
flags_default="$P"; flags_min1="$P --xla_gpu_graph_min_graph_size=1"
flags_while="$P --xla_gpu_graph_min_graph_size=1 --xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"
for f in default min1; do  # +WHILE,+CONDITIONAL changed nothing on an H100 (27 launches, call_h100.sh)
  eval xf=\$flags_$f
  (cd / && PYTHONPATH=/tmp/w_cutlass XLA_FLAGS="$xf" timeout 120 python3 -P -m te_async.bench decode --modes device --batches 1 8 64 \
    --reps 10 --no-plots --detail-batch 1 --out $R/decode_$f) > $R/decode_$f.log 2>&1
  echo "--- main with CUTLASS, XLA_FLAGS='$xf'" >> $L; grep -E '^\| [0-9]' $R/decode_$f/decode.md >> $L
  python3 -c "import json; print([(r['batch'], r['n_graph_launches'], r['n_kernels']) for r in json.load(open('$R/decode_$f/decode.json'))['results']])" >> $L 2>&1
done
(cd / && PYTHONPATH=/tmp/w_cutlass timeout 120 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 \
  --modes device --steps 60 --no-plots --out $R/generate) > $R/generate.log 2>&1
grep -E '^\| [0-9]' $R/generate/generate.md >> $L
# memcheck of the routing kernels' top-k forms (stop 59/60; the [G,K,N] kernel and the routing kernel at
# its limits passed memcheck on an H100, call_h100_memcheck.sh) in the time left
left=$((570 - (SECONDS - T0))); [ $left -lt 30 ] && left=1  # timeout 0 would mean no limit
S=$PWD
(cd / && PYTHONPATH=/tmp/w_cutlass XLA_PYTHON_CLIENT_ALLOCATOR=platform timeout $left compute-sanitizer --tool memcheck \
  --error-exitcode 99 python3 -P -m pytest -q -p no:cacheprovider --rootdir=$S $S/tests/test_routing.py $S/tests/test_token_moe.py \
  -k "(kernel_matches_reference and -64-random) or (kernel_matches_reference and -1-random) or sigmoid_groups or kernels_against_float64") \
  > $R/sanitize.log 2>&1
echo "memcheck rc $? ($left s allowed): $(grep -E 'passed|failed|ERROR SUMMARY' $R/sanitize.log | tr '\n' ' ')" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
tar czf $OUT/results.tgz -C $R --exclude='traces' --exclude='srp' .
cat $L
