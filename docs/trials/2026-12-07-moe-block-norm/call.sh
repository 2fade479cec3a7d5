#!/bin/bash
# One call on an H100 or H200 (carry .whl), about 8 minutes. $OUT/summary.txt, results.tgz.
# Prepared by stop 63 (its device time ran out): main built with CUTLASS for sm_90a; the GPU tests of the files
# that stop 63's Python touched; moe_block forward and training step with main's moe.py ("new", 45d2fc6: the norm
# on the tokens) and with the one before it ("old": the norm on the gathered rows), alternating twice; bench decode
# device against torch_graph at T = 1 8 64 (since stop 63 T = 64 is written out too).
set -u
S=$PWD; T=docs/trials/2026-12-07-moe-block-norm; R=/tmp/mbn; rm -rf $R; mkdir -p $R/new $R/old; T0=$SECONDS; L=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/cutlass')" .whl/nvidia_cutlass-*.whl
CUTLASS_INCLUDE_DIR=/tmp/cutlass/cutlass_library/source/include CMAKE_BUILD_PARALLEL_LEVEL=14 python3 -m pip wheel \
  --no-build-isolation --no-deps --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=ON -w /tmp/wheel_main . > $R/build.log 2>&1
for w in new old; do
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" /tmp/wheel_main/te_async-*.whl $R/$w
done
git show 45d2fc6~1:te_async/moe.py > $R/old/te_async/moe.py || { echo "no git history here: old = new" >> $L; }
echo "built at $((SECONDS - T0)) s: $(ls /tmp/wheel_main)" >> $L
(cd / && PYTHONPATH=$R/new TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -P -m pytest -q -n 8 \
  -p no:cacheprovider --rootdir=$S $S/tests/test_models_gpu.py $S/tests/test_decode_moe_gpu.py $S/tests/test_torch_decode_step.py \
  $S/tests/test_bench_decode.py $S/tests/test_moe.py $S/tests/test_bench_generate.py $S/tests/test_grouped_mlp.py) > $R/tests.log 2>&1
echo "tests (at $((SECONDS - T0)) s): $(tail -1 $R/tests.log)" >> $L
for run in 1 2; do
  for w in new old; do
    (cd / && PYTHONPATH=$R/$w timeout 60 python3 -P $S/$T/moe_block_step.py ${w}_$run $R) >> $R/moe_block.log 2>&1
  done
done
grep -E "^(new|old)" $R/moe_block.log >> $L
python3 -c "
import numpy as np
for a in ('out', 'dx'):
    n, o = (np.load(f'$R/{a}_{w}_1.npy') for w in ('new', 'old'))
    print(a, 'new against old: max |diff|', float(np.abs(n - o).max()), 'rel', float(np.linalg.norm(n - o) / np.linalg.norm(o)))" >> $L 2>&1
(cd / && PYTHONPATH=$R/new timeout 90 python3 -P -m te_async.bench decode --modes device torch_graph --batches 1 8 64 --reps 10 \
  --detail-batch 8 --no-plots --out $R/decode) > $R/decode.log 2>&1
grep -E '^\| [0-9]' $R/decode/decode.md >> $L; head -1 $R/decode/decode_timeline_T8_kernels.md >> $L 2>/dev/null
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip $R/tests.log; rm -f $R/*.npy
tar czf $OUT/results.tgz -C $R --exclude=new --exclude=old --exclude=traces .
cat $L
