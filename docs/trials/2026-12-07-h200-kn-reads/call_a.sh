#!/bin/bash
# Call A of two on an H200 (needs_h200, nothing carried), about 8 minutes. Stop 60 measured on H100s only:
# 1. the stripe read probe (docs/results/2026-12-06-h100-kn-reads/stripe_read_probe.cu), 34 and 64
#    experts: does the H200 read 256-byte pieces faster than 128 by more than the H100's 2-3 %?
# 2. main ("new", kKnCx = 16) against main with before_kn_cx16.patch ("old", 8 threads a k-row),
#    both without CUTLASS for sm_90a: bench decode device_unfused T = 2 4 8 16 once each;
#    bench dense --rows 1 2 (the dense path's split-K GEMMs, whose items the wider tiles halve) and
#    bench generate B = 2 (the model's 2-row dense GEMMs); the same bench dense for "mix" (main +
#    mix_split_128.patch: split calls back at 8 threads a k-row), and its tests in the time left.
# call_b.sh: main with CUTLASS. $OUT/summary.txt has the figures, results.tgz the files.
set -u
T=docs/trials/2026-12-07-h200-kn-reads; R=/tmp/h2a; rm -rf $R; mkdir -p $R; T0=$SECONDS; S=$PWD; L=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
nvcc -O3 -std=c++17 -arch=sm_90a docs/results/2026-12-06-h100-kn-reads/stripe_read_probe.cu -o $R/srp >> $L 2>&1
for n in 34 64 34 64; do $R/srp $n >> $R/probe.txt 2>&1; done; cat $R/probe.txt >> $L
for v in old new mix; do
  rm -rf /tmp/src_$v /tmp/wheel_$v; mkdir -p /tmp/src_$v && cp -r CMakeLists.txt pyproject.toml README.md LICENSE csrc te_async tests /tmp/src_$v/
done
(cd /tmp/src_old && patch -p1 < $S/$T/before_kn_cx16.patch) > $R/patch.log 2>&1 || exit 1
(cd /tmp/src_mix && patch -p1 < $S/$T/mix_split_128.patch) >> $R/patch.log 2>&1 || exit 1
build() {  # tree, WITH_CUTLASS ON/OFF, parallel jobs
  ( cd /tmp/src_$1 && CUTLASS_INCLUDE_DIR=/tmp/cutlass/cutlass_library/source/include CMAKE_BUILD_PARALLEL_LEVEL=$3 \
    python3 -m pip wheel --no-build-isolation --no-deps --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON \
    --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=$2 --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real \
    -w /tmp/wheel_$1 . > $R/build_$1.log 2>&1; rm -rf /tmp/w_$1; mkdir -p /tmp/w_$1
    python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" /tmp/wheel_$1/te_async-*.whl /tmp/w_$1 )
}
build old OFF 6 & build new OFF 6 & build mix OFF 6 &
wait
echo "built at $((SECONDS - T0)) s: $(ls /tmp/wheel_old /tmp/wheel_new /tmp/wheel_mix | tr '\n' ' ')" >> $L
for run in 1; do for v in old new; do
  (cd / && PYTHONPATH=/tmp/w_$v timeout 60 python3 -P -m te_async.bench decode --modes device_unfused --batches 2 4 8 16 \
    --reps 10 --no-plots --detail-batch 8 --out $R/decode_${v}_$run) > $R/decode_${v}_$run.log 2>&1
  echo "--- $v $run" >> $L; grep -E '^\| [0-9]' $R/decode_${v}_$run/decode.md >> $L
done; done
for v in old new; do echo "$v T=8: $(grep -h SmallGroupsKnKernel $R/decode_${v}_1/decode_timeline_T8_kernels.md | tr '\n' ' ')" >> $L; done
for v in old new mix; do  # the 1- and 2-row dense GEMMs (split K over clusters): 128-column tiles halve their items
  (cd / && PYTHONPATH=/tmp/w_$v timeout 90 python3 -P -m te_async.bench dense --rows 1 2 --out $R/dense_$v) > $R/dense_$v.log 2>&1
  echo "--- dense $v" >> $L; grep -E '^\| ' $R/dense_$v/*.md | head -24 >> $L
done
for v in old new; do
  (cd / && PYTHONPATH=/tmp/w_$v timeout 90 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 2 \
    --modes device --steps 40 --no-plots --no-profile --out $R/generate_b2_$v) > $R/generate_b2_$v.log 2>&1
  echo "generate B=2 $v: $(grep -E '^\| [0-9]' $R/generate_b2_$v/generate.md | tr '\n' ' ')" >> $L
done
left=$((560 - (SECONDS - T0)))
[ $left -lt 30 ] && left=1  # timeout 0 would mean no limit
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
(cd / && PYTHONPATH=/tmp/w_mix TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout $left python3 -P -m pytest -q $x \
  -p no:cacheprovider --rootdir=/tmp/src_mix /tmp/src_mix/tests/test_dense.py /tmp/src_mix/tests/test_gpu_device_mode.py) > $R/tests_mix.log 2>&1
echo "mix tests ($left s allowed): $(tail -1 $R/tests_mix.log)" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip $R/tests_mix.log
tar czf $OUT/results.tgz -C $R --exclude='traces' --exclude='srp' .
cat $L
