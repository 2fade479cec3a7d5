#!/bin/bash
# One call on an H100 (kind nvidia-h100-x1), about 9 minutes. $OUT/summary.txt, results.tgz.
# token_ffn's items over thread-block clusters (this tree) without CUTLASS for sm_90a:
# 1. its GPU tests (test_token_ffn, test_token_moe; poisoned outputs);
# 2. bench decode T=1 (device) and bench generate B=1, each with the plan as planned ("new") and
#    with the plan without clusters ("old": plan_split(..., clusters=False), one block an item),
#    alternating new / old / new / old;
# 3. tools/token_ffn_probe.py: the forced (units, slices) sweep, in the time left.
set -u
R=/tmp/tfc; rm -rf $R; mkdir -p $R; T0=$SECONDS; S=$PWD; L=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
CMAKE_BUILD_PARALLEL_LEVEL=14 python3 -m pip wheel --no-build-isolation --no-deps \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF \
  --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w /tmp/wheel_new . > $R/build.log 2>&1
rm -rf /tmp/w_new; mkdir -p /tmp/w_new
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" /tmp/wheel_new/te_async-*.whl /tmp/w_new
echo "built at $((SECONDS - T0)) s: $(ls /tmp/wheel_new)" >> $L
x=; python3 -c "import xdist" 2>/dev/null && x="-n 4"
(cd / && PYTHONPATH=/tmp/w_new TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -P -m pytest -q $x \
  -p no:cacheprovider --rootdir=$S $S/tests/test_token_ffn.py $S/tests/test_token_moe.py) > $R/tests.log 2>&1
echo "tests (at $((SECONDS - T0)) s): $(tail -1 $R/tests.log)" >> $L
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true
# old: the same build, token_ffn's plan without clusters
OLD="import te_async.token_ffn as tf; o = tf.plan_split; tf.plan_split = lambda *a: o(*a[:5], False); "
bench() {  # bench <name> <old|new> <args...>
  local name=$1 which=$2; shift 2
  local pre=""; [ $which = old ] && pre="$OLD"
  (cd / && PYTHONPATH=/tmp/w_new timeout 100 python3 -P -c "${pre}import runpy, sys; sys.argv = ['te_async.bench'] + sys.argv[1:]; runpy.run_module('te_async.bench', run_name='__main__')" \
    "$@" --no-plots --out $R/$name) > $R/$name.log 2>&1
  echo "$name (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/$name/*.md | head -3 | tr '\n' ' ')" >> $L
}
for run in 1 2; do
  for w in new old; do bench decode_${w}_$run $w decode --modes device --batches 1 --reps 10 --detail-batch 1; done
done
for run in 1 2; do
  for w in new old; do bench generate_${w}_$run $w generate --preset deepseek-v2-lite --batches 1 --modes device --steps 60; done
done
left=$((575 - (SECONDS - T0))); [ $left -lt 20 ] && left=1
(cd / && PYTHONPATH=/tmp/w_new timeout $left python3 -P $S/tools/token_ffn_probe.py) > $R/probe.log 2>&1
cat $R/probe.log >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip $R/tests.log
tar czf $OUT/results.tgz -C $R --exclude='traces' .
cat $L
