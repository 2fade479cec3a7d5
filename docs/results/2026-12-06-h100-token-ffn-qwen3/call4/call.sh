#!/bin/bash
# stop 63 call 4: token_ffn's splits at Qwen3-30B-A3B's routed experts (probe, GPU us a layer), then bench generate
# B=1 (24 layers) with the probe's fastest split, main's plan_split (72, 2) and the old (32, 1), alternating, twice.
set -u
R=/tmp/tfq4; rm -rf $R; mkdir -p $R/w; T0=$SECONDS; L=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" .gpubuild/s63/wheel/te_async-*.whl $R/w
cp te_async/*.py $R/w/te_async/ && cp te_async/bench/*.py $R/w/te_async/bench/
(cd / && OUT=$R PYTHONPATH=$R/w timeout 240 python3 -P $OLDPWD/tools/token_ffn_probe.py qwen3) > $R/probe.log 2>&1
grep -E "plan|routed|best" $R/probe.log >> $L
read BU BS < $R/best_routed_split.txt || { BU=48; BS=1; }
echo "probe done at $((SECONDS - T0)) s; best $BU $BS" >> $L
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true XLA_PYTHON_CLIENT_MEM_FRACTION=0.9
force() { echo "import te_async.token_ffn as tf; tf.plan_split = lambda *a: tf.Split($1, $2); "; }
for run in 1 2; do
  for w in best new old; do
    case $w in best) pre=$(force $BU $BS);; new) pre="";; old) pre=$(force 32 1);; esac
    (cd / && PYTHONPATH=$R/w timeout 100 python3 -P -c "${pre}import runpy, sys; sys.argv = ['te_async.bench'] + sys.argv[1:]; runpy.run_module('te_async.bench', run_name='__main__')" \
      generate --preset qwen3-30b-a3b --layers 24 --batches 1 --modes device --steps 60 --no-plots --out $R/qwen3_${w}_$run) > $R/qwen3_${w}_$run.log 2>&1
    echo "qwen3 $w $run (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/qwen3_${w}_$run/generate.md)" >> $L
  done
done
echo "=== done at $((SECONDS - T0)) s" >> $L
tar czf $OUT/results.tgz -C $R --exclude='traces' --exclude=w .
cat $L
