#!/bin/bash
# Third call (H100, about 5 minutes): plan_split as committed ("new") against main's plan before it
# ("old": one block an item, units 48 for the routed + shared experts, 32 routed alone, 48 for the
# dense first layer, 16 for the shared MLP alone), in bench generate B=1 and bench decode T=1,
# alternating new / old, twice; bench dense at one row once each (its shared MLP row: token_ffn);
# then the GPU tests.
set -u
R=/tmp/tfc3; rm -rf $R; mkdir -p $R; T0=$SECONDS; S=$PWD; L=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
CMAKE_BUILD_PARALLEL_LEVEL=14 python3 -m pip wheel --no-build-isolation --no-deps \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF \
  --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w /tmp/wheel_new . > $R/build.log 2>&1
rm -rf /tmp/w_new; mkdir -p /tmp/w_new
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" /tmp/wheel_new/te_async-*.whl /tmp/w_new
echo "built at $((SECONDS - T0)) s: $(ls /tmp/wheel_new)" >> $L
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true
OLD="import te_async.token_ffn as tf; old = {(6, 1408, 2816): 48, (6, 1408, 0): 32, (0, 0, 10944): 48, (0, 0, 2816): 16}; tf.plan_split = lambda k, f, fs, *a: tf.Split(old[(k, f, fs)], 1); "
bench() {  # bench <name> <old|new> <args...>
  local name=$1 which=$2; shift 2
  local pre=""; [ $which = old ] && pre="$OLD"
  (cd / && PYTHONPATH=/tmp/w_new timeout 100 python3 -P -c "${pre}import runpy, sys; sys.argv = ['te_async.bench'] + sys.argv[1:]; runpy.run_module('te_async.bench', run_name='__main__')" \
    "$@" --no-plots --out $R/$name) > $R/$name.log 2>&1
  echo "$name (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9a-z]' $R/$name/*.md | grep -v '^| kernel' | head -4 | tr '\n' ' ')" >> $L
}
for run in 1 2; do
  for w in new old; do bench generate_${w}_$run $w generate --preset deepseek-v2-lite --batches 1 --modes device --steps 60; done
  for w in new old; do bench decode_${w}_$run $w decode --modes device --batches 1 --reps 10 --detail-batch 1; done
done
for w in new old; do bench dense_$w $w dense --rows 1; done
x=; python3 -c "import xdist" 2>/dev/null && x="-n 4"
left=$((560 - (SECONDS - T0))); [ $left -lt 20 ] && left=1
(cd / && PYTHONPATH=/tmp/w_new TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout $left python3 -P -m pytest -q $x \
  -p no:cacheprovider --rootdir=$S $S/tests/test_token_ffn.py $S/tests/test_token_moe.py $S/tests/test_models_gpu.py \
  $S/tests/test_decode_moe_gpu.py $S/tests/test_models_hf_parity.py) > $R/tests.log 2>&1
echo "tests (at $((SECONDS - T0)) s): $(tail -1 $R/tests.log)" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip $R/tests.log
tar czf $OUT/results.tgz -C $R --exclude='traces' .
cat $L
