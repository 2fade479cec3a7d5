#!/bin/bash
# Device call 4 (carry .gpubuild/s56 and .whl): baseline = call 1's wheel (a674b15's C++), variant =
# this tree (wgrad strips). Fixed tests on the baseline; the variant built in the background while
# ncu reads the baseline's wgrads; the variant's ragged-k tests; prefill wgrads and bench train A/B
# alternating; ncu of the variant's skewed wgrads. $OUT/trial4.tgz.
set -u
R=/tmp/trial4; V=$PWD/.gpubuild/s56; mkdir -p $R $OUT/gpubuild; T0=$SECONDS
save() { tar czf $OUT/trial4.tgz -C $R .; }  # after each stage: a call cut short keeps what ran
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; git rev-parse HEAD; git status --short; } > $R/gpu.txt
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/cutlass')" .whl/nvidia_cutlass-*.whl
(CUTLASS_INCLUDE_DIR=/tmp/cutlass/cutlass_library/source/include CMAKE_BUILD_PARALLEL_LEVEL=12 python3 -m pip wheel --no-build-isolation --no-deps \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=ON \
  --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w $OUT/gpubuild . > $R/build.log 2>&1; echo "build rc $?" >> $R/build.log) &
BUILD=$!
python3 -m pip install -q --no-deps --force-reinstall $V/te_async-*.whl
site=$(cd / && python3 -c "import te_async, os; print(os.path.dirname(te_async.__file__))")
cp -r te_async/. $site/
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -P -m pytest -q -n 4 \
  -p no:cacheprovider --rootdir=. tests/test_loss.py tests/test_moe.py > $R/tests_fixed.log 2>&1
echo "pytest rc $?" >> $R/tests_fixed.log; tail -2 $R/tests_fixed.log; echo "=== $(date +%T) fixed tests at $((SECONDS - T0)) s"
P=$PWD/docs/trials/2026-12-06/wgrad_probe.py
M=gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum
prof() {  # prof <tag> <case> [PYTHONPATH]
  (cd / && PYTHONPATH=${3:-} XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 60 ncu --clock-control none \
    --kernel-name "regex:device_kernel|Setup|fusion" --launch-skip 2 --launch-count 6 --metrics $M --csv --page raw \
    python3 -P $P $2) > $R/ncu_$1_${2/:/_}.csv 2> $R/ncu_$1_${2/:/_}.err; echo "=== $(date +%T) ncu $1 $2 rc $? at $((SECONDS - T0)) s"
}
for c in fc1_wgrad:skewed fc1_wgrad:skewed_merged write fc2_wgrad:skewed fc1_wgrad:even; do [ $((SECONDS - T0)) -lt 150 ] && prof base $c; done; save
wait $BUILD; tail -3 $R/build.log; echo "=== $(date +%T) built at $((SECONDS - T0)) s"
mkdir -p /tmp/var && python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/var')" $OUT/gpubuild/te_async-*.whl || exit 1
cp -r te_async/. /tmp/var/te_async/
(cd / && PYTHONPATH=/tmp/var TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -P -m pytest -q -n 8 \
  -p no:cacheprovider --rootdir=$OLDPWD -k "cutlass or random_shapes or clamped" $OLDPWD/tests/test_gpu_device_mode.py) > $R/tests_var.log 2>&1
echo "pytest rc $?" >> $R/tests_var.log; tail -2 $R/tests_var.log; echo "=== $(date +%T) variant tests at $((SECONDS - T0)) s"; save
pre() {  # pre <tag> <run> [PYTHONPATH]
  (cd / && PYTHONPATH=${3:-} timeout 90 python3 -P -m te_async.bench prefill --gemms fc1_wgrad fc2_wgrad --contenders te_async_device \
    --reps 6 --out $R/pre_$1_$2) > $R/pre_$1_$2.log 2>&1; echo "=== $(date +%T) prefill $1 $2 at $((SECONDS - T0)) s"; grep -E "wgrad" $R/pre_$1_$2.log | head -4
}
pre base 1; pre var 2 /tmp/var; pre base 3; save
trn() {
  (cd / && PYTHONPATH=${3:-} timeout 100 python3 -P -m te_async.bench train --contenders device --reps 6 --out $R/train_$1_$2) > $R/train_$1_$2.log 2>&1
  echo "=== $(date +%T) train $1 $2 at $((SECONDS - T0)) s"; grep -A4 "^| contender" $R/train_$1_$2/train.md | tail -2
}
[ $((SECONDS - T0)) -lt 380 ] && trn base 1 && trn var 2 /tmp/var; save
[ $((SECONDS - T0)) -lt 470 ] && prof var fc1_wgrad:skewed /tmp/var && prof var fc2_wgrad:skewed /tmp/var
save
