#!/bin/bash
# What ran, in three calls on one warm H200 (carry .gpubuild/s58: 5180726 built with CUTLASS for
# 90a-real in stop 58's first call, on an H100; the same C++ as main): main's training and decode
# figures, then GPU tests of that wheel. The calls wrote /tmp/r2, /tmp/r3 and the tests' log.
set -u
mkdir -p /tmp/w2 && python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/w2')" .gpubuild/s58/te_async-*.whl
b() { (cd / && PYTHONPATH=/tmp/w2 timeout $1 python3 -P -m te_async.bench "${@:2}"); }
# call 1
b 170 train-model --contenders device --layers 4 --reps 5 --no-plots --no-profile --out /tmp/r2/train_model > /tmp/r2/train_model.log 2>&1
b 120 train --contenders device te_async_ragged_dot torch_grouped_mm --reps 6 --out /tmp/r2/train > /tmp/r2/train.log 2>&1
# call 2
b 120 train-model --contenders device --layers 4 --reps 5 --no-plots --no-profile --out /tmp/r3/train_model > /tmp/r3/train_model.log 2>&1
XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true b 150 decode --modes device --batches 1 8 64 --reps 10 --no-plots \
  --detail-batch 64 --out /tmp/r3/decode > /tmp/r3/decode.log 2>&1
# call 3
S=$PWD; (cd / && PYTHONPATH=/tmp/w2 TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 python3 -P -m pytest -q -n 8 \
  -p no:cacheprovider --rootdir=$S $S/tests/test_grouped_mlp.py $S/tests/test_loss.py "$S/tests/test_gpu_device_mode.py::test_cutlass_wgrad_long_k")
