#!/bin/bash
# One device call (carry .gpubuild/s58: 5180726 built with CUTLASS for 90a-real in stop 58's first
# call, the C++ of main): main's training and decode figures on this GPU, then GPU tests.
# Everything in $OUT/call.tgz, saved after each stage.
set -u
R=/tmp/r; mkdir -p $R; T0=$SECONDS; S=$PWD
save() { tar czf $OUT/call.tgz -C $R .; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; python3 -c "import jax; print('jax', jax.__version__)"; git rev-parse HEAD; git status --short; } > $R/gpu.txt
mkdir -p /tmp/w && python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/w')" .gpubuild/s58/te_async-*.whl || exit 1
b() { (cd / && PYTHONPATH=/tmp/w timeout $1 python3 -P -m te_async.bench "${@:2}") ; }
for i in 1 2; do
  b 150 train-model --contenders device --layers 4 --reps 5 --no-plots --no-profile --out $R/train_model_$i > $R/train_model_$i.log 2>&1
  echo "=== $(date +%T) train-model $i at $((SECONDS - T0)) s"; grep "^| " $R/train_model_$i/train_model.md | head -4; save
done
b 150 train --contenders device te_async_ragged_dot torch_grouped_mm --reps 6 --out $R/train > $R/train.log 2>&1
echo "=== $(date +%T) train at $((SECONDS - T0)) s"; grep "^| " $R/train/train.md; save
b 120 generate --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --no-plots --no-profile --out $R/generate > $R/generate.log 2>&1
echo "=== $(date +%T) generate at $((SECONDS - T0)) s"; grep "^| " $R/generate/generate.md; save
(cd / && XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true PYTHONPATH=/tmp/w timeout 150 python3 -P -m te_async.bench decode \
  --modes device --batches 1 8 64 --reps 10 --no-plots --detail-batch 64 --out $R/decode) > $R/decode.log 2>&1; rm -rf $R/decode/traces
echo "=== $(date +%T) decode at $((SECONDS - T0)) s"; grep "^| " $R/decode/decode.md; save
(cd / && PYTHONPATH=/tmp/w TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout $((570 - SECONDS + T0)) python3 -P -m pytest -q -n 8 -p no:cacheprovider \
  --rootdir=$S $S/tests/test_loss.py $S/tests/test_grouped_mlp.py $S/tests/test_models_gpu.py "$S/tests/test_gpu_device_mode.py::test_cutlass_wgrad_long_k") > $R/tests.log 2>&1
echo "pytest rc $?" >> $R/tests.log; tail -n 3 $R/tests.log; save
