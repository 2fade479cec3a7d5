#!/bin/bash
# One device call (carry .whl, the nvidia-cutlass 4.2.0.0 wheel): builds this tree (base) and this
# tree with wave_interleave.patch (var), both with CUTLASS for 90a-real, in parallel; the var's
# device-mode tests poisoned; ncu of the wgrads; prefill wgrads base var var base; bench train
# base var. Everything in $OUT/trial.tgz (saved after each stage), the wheels in $OUT/{base,var}.
set -u
R=/tmp/trial; P=$PWD/docs/results/2026-12-06-h100-wgrad-strips/wgrad_probe.py; mkdir -p $R $OUT/base $OUT/var; T0=$SECONDS
save() { tar czf $OUT/trial.tgz -C $R .; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c "import jax; print('jax', jax.__version__)"; git rev-parse HEAD; git status --short; } > $R/gpu.txt
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/cutlass')" .whl/nvidia_cutlass-*.whl
for v in base var; do rm -rf /tmp/src_$v && mkdir -p /tmp/src_$v && tar --exclude=./.git --exclude=./.gpubuild --exclude=./.whl --exclude=./.venv -cf - . | tar -xf - -C /tmp/src_$v; done
(cd /tmp/src_var && patch -p1 < $PWD/docs/trials/2026-12-07/wave_interleave.patch) > $R/patch.log 2>&1 || { cat $R/patch.log; exit 1; }
for v in base var; do
  (CUTLASS_INCLUDE_DIR=/tmp/cutlass/cutlass_library/source/include CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip wheel --no-build-isolation --no-deps \
    --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=ON \
    --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w $OUT/$v /tmp/src_$v > $R/build_$v.log 2>&1; echo "build rc $?" >> $R/build_$v.log) &
done
wait; tail -n 1 $R/build_*.log; echo "=== $(date +%T) built at $((SECONDS - T0)) s"
for v in base var; do mkdir -p /tmp/$v && python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" $OUT/$v/te_async-*.whl /tmp/$v || exit 1; done
(cd / && PYTHONPATH=/tmp/base TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 python3 -P -m pytest -q -n 2 -p no:cacheprovider \
  --rootdir=$OLDPWD -k "wgrad_long_k" $OLDPWD/tests/test_gpu_device_mode.py > $R/tests_base.log 2>&1; echo "pytest rc $?" >> $R/tests_base.log) &
(cd / && PYTHONPATH=/tmp/var TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 python3 -P -m pytest -q -n 8 -p no:cacheprovider \
  --rootdir=$OLDPWD -k "cutlass or random_shapes or clamped or wgrad" $OLDPWD/tests/test_gpu_device_mode.py $OLDPWD/tests/test_grouped_mlp.py \
  $OLDPWD/tests/test_ragged_dot.py) > $R/tests_var.log 2>&1
echo "pytest rc $?" >> $R/tests_var.log; wait; tail -2 $R/tests_var.log $R/tests_base.log; echo "=== $(date +%T) var tests at $((SECONDS - T0)) s"; save
M=gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed
prof() {  # prof <variant> <gemm:split>
  (cd / && PYTHONPATH=/tmp/$1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 60 ncu --clock-control none \
    --kernel-name "regex:device_kernel|Setup" --launch-skip 2 --launch-count 6 --metrics $M --csv --page raw \
    python3 -P $P $2) > $R/ncu_$1_${2/:/_}.csv 2> $R/ncu_$1_${2/:/_}.err; echo "=== $(date +%T) ncu $1 $2 rc $? at $((SECONDS - T0)) s"
}
for c in fc1_wgrad:skewed fc2_wgrad:skewed fc1_wgrad:even; do prof base $c; prof var $c; done; save
pre() {  # pre <variant> <run>
  (cd / && PYTHONPATH=/tmp/$1 timeout 90 python3 -P -m te_async.bench prefill --gemms fc1_wgrad fc2_wgrad --contenders te_async_device \
    --reps 6 --out $R/pre_$1_$2) > $R/pre_$1_$2.log 2>&1; echo "=== $(date +%T) prefill $1 $2 at $((SECONDS - T0)) s"; grep -E "wgrad" $R/pre_$1_$2.log | head -4
}
pre base 1; pre var 2; pre var 3; pre base 4; save
trn() {  # trn <variant> <run>
  (cd / && PYTHONPATH=/tmp/$1 timeout 100 python3 -P -m te_async.bench train --contenders device --reps 6 --out $R/train_$1_$2) > $R/train_$1_$2.log 2>&1
  echo "=== $(date +%T) train $1 $2 at $((SECONDS - T0)) s"; grep "^| device" $R/train_$1_$2/train.md
}
[ $((SECONDS - T0)) -lt 480 ] && trn base 1 && trn var 2; save
