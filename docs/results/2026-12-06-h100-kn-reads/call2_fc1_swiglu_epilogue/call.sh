#!/bin/bash
# One device call (about 7 minutes, nothing carried): main (this tree) and main + fc1_swiglu_epilogue.patch,
# each built without CUTLASS for sm_90a in its own copy (../build_pair.sh), in parallel (T <= 16 runs no CUTLASS kernel);
# fused_experts' outputs of both compared bit for bit; bench decode at T = 1, 2, 4, 8, 16 with the
# fused path allowed at every T (decode_moe.FUSE_MAX_TOKENS = 64 in the process), modes device
# (fused) and device_unfused, old then new, twice; then the GPU tests of the new build, poisoned.
# Outputs under $OUT (summary.txt, results.tgz).
set -u
T=docs/trials/2026-12-07-fc1-swiglu-epilogue; R=/tmp/fse; rm -rf $R; mkdir -p $R; T0=$SECONDS
S=$PWD; L=$OUT/summary.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
bash docs/trials/build_pair.sh $T/fc1_swiglu_epilogue.patch $R >> $R/build.log 2>&1 || { tail -5 $R/build.log; exit 1; }
echo "built at $((SECONDS - T0)) s: $(ls /tmp/wheel_old /tmp/wheel_new | tr '\n' ' ')" >> $L
for v in old new; do (cd / && PYTHONPATH=/tmp/w_$v timeout 120 python3 -P $S/$T/fused_bits.py $R/bits_$v.npz) >> $R/bits.log 2>&1; done
python3 -c "
import numpy as np, sys
a, b = np.load('$R/bits_old.npz'), np.load('$R/bits_new.npz')
print('fused_experts, new against old:', {k: 'same bits' if np.array_equal(a[k], b[k]) else f'DIFFERENT (max {np.abs(a[k]-b[k]).max():.3g})' for k in a})
" >> $L 2>&1
bench='import sys, runpy; import te_async.decode_moe as d; d.FUSE_MAX_TOKENS = 64; sys.argv = ["te_async.bench"] + sys.argv[1:]; runpy.run_module("te_async.bench", run_name="__main__")'
for run in 1 2; do for v in old new; do
  (cd / && PYTHONPATH=/tmp/w_$v timeout 150 python3 -P -c "$bench" decode --modes device device_unfused --batches 1 2 4 8 16 \
    --reps 10 --no-plots --detail-batch 8 --out $R/decode_${v}_$run) > $R/decode_${v}_$run.log 2>&1
  echo "--- $v $run" >> $L; grep -E '^\| [0-9]' $R/decode_${v}_$run/decode.md >> $L
done; done
echo "=== bench done at $((SECONDS - T0)) s" >> $L
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
(cd / && PYTHONPATH=/tmp/w_new TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 python3 -P -m pytest -q $x \
  -p no:cacheprovider --rootdir=/tmp/src_new /tmp/src_new/tests/test_decode_moe_gpu.py /tmp/src_new/tests/test_decode_moe.py \
  /tmp/src_new/tests/test_dense.py /tmp/src_new/tests/test_gpu_device_mode.py) > $R/tests.log 2>&1
tail -2 $R/tests.log >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
tar czf $OUT/results.tgz -C $R --exclude='traces' .
cat $L
