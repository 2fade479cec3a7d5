#!/bin/bash
# One call on an H100 or H200 (no CUTLASS needed), about 5 minutes. $OUT/summary.txt, results.tgz.
# token_ffn's plan_split (c79e423) off the shapes it was fitted on: Qwen3-30B-A3B at B=1, bench
# generate, plan_split's 72 units in clusters of 2 ("new") against main's plan before c79e423, 32
# units, one block an item ("old"), alternating, twice. Stop 62's try ran out of memory at Qwen3's
# initialisation under JAX's 75 % pool: here 24 of its 48 layers and a 90 % pool.
set -u
R=/tmp/tfq; rm -rf $R; mkdir -p $R; T0=$SECONDS; S=$PWD; L=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
mkdir -p /tmp/wheel_new; cp .gpubuild/s63/wheel/*.whl /tmp/wheel_new/  # stop 63: call 1 wheel (c030f4b, CUTLASS)
rm -rf /tmp/w_new; mkdir -p /tmp/w_new
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" /tmp/wheel_new/te_async-*.whl /tmp/w_new
echo "built at $((SECONDS - T0)) s: $(ls /tmp/wheel_new)" >> $L
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true XLA_PYTHON_CLIENT_MEM_FRACTION=0.9
OLD="import te_async.token_ffn as tf; old = {(8, 768, 0): 32}; tf.plan_split = lambda k, f, fs, *a: tf.Split(old[(k, f, fs)], 1); "
for run in 1 2; do
  for w in new old; do
    pre=""; [ $w = old ] && pre="$OLD"
    (cd / && PYTHONPATH=/tmp/w_new timeout 120 python3 -P -c "${pre}import runpy, sys; sys.argv = ['te_async.bench'] + sys.argv[1:]; runpy.run_module('te_async.bench', run_name='__main__')" \
      generate --preset qwen3-30b-a3b --layers 24 --batches 1 --modes device --steps 60 --no-plots --out $R/qwen3_${w}_$run) > $R/qwen3_${w}_$run.log 2>&1
    echo "qwen3 $w $run (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/qwen3_${w}_$run/generate.md)" >> $L
  done
done
echo "=== done at $((SECONDS - T0)) s" >> $L
tar czf $OUT/results.tgz -C $R --exclude='traces' .
cat $L
