#!/bin/bash
# Fourth call (H100, about 5 minutes): c79e423's tree (plan_split as committed) without CUTLASS for
# sm_90a. 1. compute-sanitizer memcheck of token_ffn's kernel tests: every forced split (clusters of
# 2, 3, 4 and 8 blocks, uneven shares), bf16 against float64, the bad expert. 2. bench generate
# --preset qwen3-30b-a3b B=1 with plan_split's choice ("new": 72 units in clusters of 2) against
# main's plan before it ("old": 32 units, one block an item), alternating, twice: a shape the rule
# was not fitted on.
set -u
R=/tmp/tfc4; rm -rf $R; mkdir -p $R; T0=$SECONDS; S=$PWD; L=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
CMAKE_BUILD_PARALLEL_LEVEL=14 python3 -m pip wheel --no-build-isolation --no-deps \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF \
  --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w /tmp/wheel_new . > $R/build.log 2>&1
rm -rf /tmp/w_new; mkdir -p /tmp/w_new
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" /tmp/wheel_new/te_async-*.whl /tmp/w_new
echo "built at $((SECONDS - T0)) s: $(ls /tmp/wheel_new)" >> $L
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true
OLD="import te_async.token_ffn as tf; tf.plan_split = lambda k, f, fs, *a: tf.Split({(8, 768, 0): 32}[(k, f, fs)], 1); "
bench() {  # bench <name> <old|new> <args...>
  local name=$1 which=$2; shift 2
  local pre=""; [ $which = old ] && pre="$OLD"
  (cd / && PYTHONPATH=/tmp/w_new timeout 100 python3 -P -c "${pre}import runpy, sys; sys.argv = ['te_async.bench'] + sys.argv[1:]; runpy.run_module('te_async.bench', run_name='__main__')" \
    "$@" --no-plots --out $R/$name) > $R/$name.log 2>&1
  echo "$name (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/$name/generate.md | head -2 | tr '\n' ' ')" >> $L
}
for run in 1 2; do
  for w in new old; do bench qwen3_${w}_$run $w generate --preset qwen3-30b-a3b --batches 1 --modes device --steps 40; done
done
left=$((300 - (SECONDS - T0))); [ $left -lt 20 ] && left=1
(cd / && PYTHONPATH=/tmp/w_new XLA_PYTHON_CLIENT_ALLOCATOR=platform TE_ASYNC_POISON_OUTPUTS=1 timeout $left \
  compute-sanitizer --tool memcheck --error-exitcode 99 python3 -P -m pytest -q -p no:cacheprovider --rootdir=$S \
  $S/tests/test_token_ffn.py -k "forced_splits or (kernel_against_float64 and bfloat16) or bad_expert") > $R/memcheck.log 2>&1
echo "memcheck rc $? (at $((SECONDS - T0)) s): $(grep -hE 'passed|failed|ERROR SUMMARY' $R/memcheck.log | tr '\n' ' ')" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip $R/memcheck.log
tar czf $OUT/results.tgz -C $R --exclude='traces' .
cat $L
