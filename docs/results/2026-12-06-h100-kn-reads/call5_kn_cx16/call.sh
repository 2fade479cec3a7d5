#!/bin/bash
# One device call (nothing carried, about 7 minutes): main ("old"), main + kn_cx16.patch ("b": 16
# threads x 16 bytes a k-row) and main + kn_cx16_swiglu_out.patch ("c": b + swiglu in fc1's
# epilogue, gate and linear halves of a tile as 128-byte pieces), each built without CUTLASS for
# sm_90a in its own copy, in parallel; fused_experts' outputs of b and c compared bit for bit;
# bench decode T = 1, 2, 4, 8, 16 with the fused path allowed at every T (FUSE_MAX_TOKENS = 64),
# device (fused) and device_unfused, old b c once (T = 2-16); GPU tests of c, poisoned. $OUT/summary.txt.
set -u
T=docs/trials/2026-12-06-kn-cx16; R=/tmp/kn; rm -rf $R; mkdir -p $R; T0=$SECONDS
S=$PWD; L=$OUT/summary.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
for v in old b c; do
  rm -rf /tmp/src_$v /tmp/wheel_$v; mkdir -p /tmp/src_$v && cp -r CMakeLists.txt pyproject.toml README.md LICENSE csrc te_async tests /tmp/src_$v/
done
(cd /tmp/src_b && patch -p1 < $S/$T/kn_cx16.patch) > $R/patch_b.log 2>&1 || exit 1
(cd /tmp/src_c && patch -p1 < $S/$T/kn_cx16_swiglu_out.patch) > $R/patch_c.log 2>&1 || exit 1
for v in old b c; do
  ( cd /tmp/src_$v && CMAKE_BUILD_PARALLEL_LEVEL=6 python3 -m pip wheel --no-build-isolation --no-deps \
    --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF \
    --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w /tmp/wheel_$v . > $R/build_$v.log 2>&1
    rm -rf /tmp/w_$v; mkdir -p /tmp/w_$v
    python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" /tmp/wheel_$v/te_async-*.whl /tmp/w_$v ) &
done
wait
echo "built at $((SECONDS - T0)) s: $(ls /tmp/wheel_old /tmp/wheel_b /tmp/wheel_c | tr '\n' ' ')" >> $L
for v in b c; do (cd / && PYTHONPATH=/tmp/w_$v timeout 60 python3 -P $S/$T/fused_bits.py $R/bits_$v.npz) >> $R/bits.log 2>&1; done
python3 -c "
import numpy as np
a, b = np.load('$R/bits_b.npz'), np.load('$R/bits_c.npz')
print('fused_experts, c against b:', {k: 'same bits' if np.array_equal(a[k], b[k]) else f'DIFFERENT (max {np.abs(a[k]-b[k]).max():.3g})' for k in a})
" >> $L 2>&1
bench='import sys, runpy; import te_async.decode_moe as d; d.FUSE_MAX_TOKENS = 64; sys.argv = ["te_async.bench"] + sys.argv[1:]; runpy.run_module("te_async.bench", run_name="__main__")'
for run in 1; do for v in old b c; do
  (cd / && PYTHONPATH=/tmp/w_$v timeout 60 python3 -P -c "$bench" decode --modes device device_unfused --batches 2 4 8 16 \
    --reps 10 --no-plots --detail-batch 8 --out $R/decode_${v}_$run) > $R/decode_${v}_$run.log 2>&1
  echo "--- $v $run" >> $L; grep -E '^\| [0-9]' $R/decode_${v}_$run/decode.md >> $L
done; done
for v in old b c; do echo "$v T=8 small_groups: $(grep -h SmallGroupsKnKernel $R/decode_${v}_1/decode_timeline_T8_kernels.md | tr '\n' ' ')" >> $L; done
echo "=== bench done at $((SECONDS - T0)) s" >> $L
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
(cd / && PYTHONPATH=/tmp/w_c TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -P -m pytest -q $x \
  -p no:cacheprovider --rootdir=/tmp/src_c /tmp/src_c/tests/test_decode_moe_gpu.py /tmp/src_c/tests/test_decode_moe.py \
  /tmp/src_c/tests/test_dense.py /tmp/src_c/tests/test_gpu_device_mode.py) > $R/tests.log 2>&1
tail -2 $R/tests.log >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip $R/tests.log; tar czf $OUT/results.tgz -C $R --exclude='traces' --exclude='*.npz' .
cat $L
