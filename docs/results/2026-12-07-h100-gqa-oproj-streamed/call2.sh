#!/bin/bash
# One device call (about 5 minutes at LIMIT=300; carry .gpubuild/streamed and .gpubuild/sliced0): bench
# generate Qwen3-30B-A3B (24 layers) B=1, main's wheel ("streamed": o_proj streamed, 09570b3 +
# oproj_streamed.patch, the C++ of main) against main + sliced_input.patch ("sliced0": the input
# projections by SlicedProductKernel in one wave of clusters), alternating, each run profiled; the GPU tests
# (poisoned outputs) of the token calls on sliced0; memcheck of the block's kernel tests on sliced0.
set -u
S=$PWD; R=/tmp/sliced0; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
export TE_ASYNC_COMMIT=${TE_ASYNC_COMMIT:-unknown}
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
wheels streamed sliced0
gen() {  # gen <wheel> <run>
  PYTHONPATH=/tmp/w_$1 XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 \
    step 45 $R/gen_$1_$2.log python3 -P -m te_async.bench generate --preset qwen3-30b-a3b --layers 24 \
    --batches 1 --modes device --steps 60 --no-plots --out $R/gen_$1_$2
  echo "$1 $2 (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/gen_$1_$2/generate.md 2>/dev/null)" >> $L
}
gen streamed 1; gen sliced0 1
for w in streamed sliced0; do echo "trip, $w:" >> $L; sed -n '/One trip/,$p' $R/gen_${w}_1/generate_timeline_B1_kernels.md >> $L 2>/dev/null; done
gpu_tests sliced0 $R/tests.log 120 -n 4 $S/tests/test_gqa_token.py $S/tests/test_mla_token.py
gen sliced0 2; gen streamed 2
PYTHONPATH=/tmp/w_sliced0 TE_ASYNC_POISON_OUTPUTS=1 step 60 $R/memcheck.log compute-sanitizer --tool memcheck \
  --print-limit 20 python3 -P -m pytest -q -p no:cacheprovider --rootdir=$S $S/tests/test_gqa_token.py -k "block and not model"
echo "memcheck (at $((SECONDS - T0)) s): $(grep -E 'passed|failed' $R/memcheck.log | tail -1) / $(grep 'ERROR SUMMARY' $R/memcheck.log | tail -1)" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log; tar czf $OUT/results.tgz -C $R .
cat $L
