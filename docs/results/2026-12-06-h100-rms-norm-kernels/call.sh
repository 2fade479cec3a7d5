#!/bin/bash
# Stop 64, one call (carry .whl and .gpubuild/s64; machine starts kept failing, so calls A and B in one,
# each step skipped when the 600 s limit would cut it). The wheel built on the CPU machine (cp312, CUDA
# 13.0, CUTLASS for sm_90a; main's C++ plus csrc/cuda/rms_norm.cu), installed (built here if it does not
# load). GPU tests, poisoned; bench train device mode with grouped_mlp's norm through te_async.norm's
# kernels ("new") against main's mlp.py before them ("old": XLA's norm); kernel_times of the training
# layer both ways; the moe-block-norm trial (docs/trials/2026-12-07-moe-block-norm): moe_block "new"
# (45d2fc6: the norm on the tokens), "old" (45d2fc6~1's moe.py and the old mlp.py: XLA's norm on the
# gathered rows), "oldk" (45d2fc6~1's moe.py with this mlp.py: the rows' norm through the kernels);
# a second alternation of both A/Bs; bench decode device against torch_graph if time is left.
set -u
S=$PWD; D=.gpubuild/s64; T=docs/trials/2026-12-07-moe-block-norm; R=/tmp/s64; rm -rf $R; mkdir -p $R; T0=$SECONDS
L=$OUT/summary.txt; LIMIT=${LIMIT:-585}
left() { echo $((LIMIT - (SECONDS - T0))); }
step() {  # step <seconds it may take> <log> <command...>: run it under a timeout that ends before the limit
  local want=$1 log=$2; shift 2; local t=$(left)
  if [ "$t" -lt 25 ]; then echo "skipped (no time): $*" >> $L; return 1; fi
  [ "$want" -gt $((t - 10)) ] && want=$((t - 10))
  (cd / && timeout $want "$@") >> $log 2>&1
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
W=$(ls $D/norm/te_async-*.whl)
probe='import jax, te_async; from te_async import _ffi; m = _ffi.cuda_module(); print("jax", jax.__version__, "cutlass", m.CUTLASS_BUILT, "rmsnorm blocks/SM fwd, bwd (bf16, 2048):", m.rms_norm_blocks_per_sm(2, 2048, False), m.rms_norm_blocks_per_sm(2, 2048, True))'
python3 -m pip install --no-deps --force-reinstall $W > $R/install.log 2>&1
if ! (cd / && python3 -P -c "$probe") >> $L 2>&1; then
  echo "the CPU-built wheel does not load: building here" >> $L
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/cutlass')" .whl/nvidia_cutlass-*.whl
  CUTLASS_INCLUDE_DIR=/tmp/cutlass/cutlass_library/source/include CMAKE_BUILD_PARALLEL_LEVEL=14 python3 -m pip wheel \
    --no-build-isolation --no-deps --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON \
    --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=ON -w /tmp/wheel_here . > $R/build.log 2>&1
  W=$(ls /tmp/wheel_here/te_async-*.whl); python3 -m pip install --no-deps --force-reinstall $W >> $R/install.log 2>&1
  mkdir -p $OUT/gpubuild && cp $W $OUT/gpubuild/
  (cd / && python3 -P -c "$probe") >> $L 2>&1
fi
site=$(cd / && python3 -c "import te_async, os; print(os.path.dirname(te_async.__file__))")
cp te_async/*.py $site/ && cp te_async/bench/*.py $site/bench/ && cp te_async/models/*.py $site/models/
cp $site/mlp.py $R/mlp_new.py; cp $D/norm/mlp_old.py $R/mlp_old.py
for w in new old oldk; do mkdir -p $R/$w && cp -r $site $R/$w/; done
git show 45d2fc6~1:te_async/moe.py > $R/old/te_async/moe.py && cp $R/old/te_async/moe.py $R/oldk/te_async/moe.py
cp $R/mlp_old.py $R/old/te_async/mlp.py
echo "$W installed at $((SECONDS - T0)) s" >> $L
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false step 170 $R/tests.log python3 -P -m pytest -q -n 8 \
  -p no:cacheprovider --rootdir=$S $S/tests/test_norm.py $S/tests/test_grouped_mlp.py $S/tests/test_training_residuals.py \
  $S/tests/test_scan_vjp.py $S/tests/test_moe.py $S/tests/test_models_gpu.py $S/tests/test_decode_moe_gpu.py \
  $S/tests/test_torch_decode_step.py $S/tests/test_bench_decode.py $S/tests/test_bench_generate.py
echo "tests (at $((SECONDS - T0)) s): $(tail -1 $R/tests.log)" >> $L; grep -E "^(FAILED|ERROR)" $R/tests.log | head -12 >> $L
train() {  # train <new|old> <run>
  cp $R/mlp_$1.py $site/mlp.py
  step 70 $R/train_$1_$2.log python3 -P -m te_async.bench train --contenders device --reps 6 --out $R/train_$1_$2
  echo "train $1 $2 (at $((SECONDS - T0)) s):" >> $L; grep -E '^\| te_async' $R/train_$1_$2/train.md >> $L 2>/dev/null
}
moe() {  # moe <run>
  for w in new old oldk; do PYTHONPATH=$R/$w step 45 $R/moe_block.log python3 -P $S/$T/moe_block_step.py ${w}_$1 $R; done
  grep -E "^(new|old|oldk)_$1" $R/moe_block.log >> $L
}
train new 1; train old 1; tar czf $OUT/partial.tgz -C $R --exclude=new --exclude=old --exclude=oldk --exclude="*.npy" . 2>/dev/null
for w in new old; do
  cp $R/mlp_$w.py $site/mlp.py
  step 50 $R/kernels_$w.log python3 -P $S/tools/kernel_times.py --batches --train even skewed --calls 3
  echo "kernels $w:" >> $L; grep -E "^== |RmsNorm|fusion" $R/kernels_$w.log >> $L
done
cp $R/mlp_new.py $site/mlp.py
moe 1
python3 -c "
import numpy as np
for a in ('out', 'dx'):
    n = np.load(f'$R/{a}_new_1.npy')
    for w in ('old', 'oldk'):
        o = np.load(f'$R/{a}_{w}_1.npy')
        print(a, 'new against', w, ': max |diff|', float(np.abs(n - o).max()), 'rel', float(np.linalg.norm(n - o) / np.linalg.norm(o)))" >> $L 2>&1
train new 2; train old 2
cp $R/mlp_new.py $site/mlp.py
moe 2
step 100 $R/decode.log python3 -P -m te_async.bench decode --modes device torch_graph --batches 1 8 64 --reps 10 \
  --detail-batch 8 --no-plots --out $R/decode && { grep -E '^\| [0-9]' $R/decode/decode.md >> $L; head -1 $R/decode/decode_timeline_T8_kernels.md >> $L; }
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip $R/tests.log; rm -f $R/*.npy; rm -rf $R/new $R/old $R/oldk
tar czf $OUT/results.tgz -C $R .
cat $L
