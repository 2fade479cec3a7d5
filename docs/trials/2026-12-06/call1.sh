#!/bin/bash
# Device call 1 (carry .whl): build with CUTLASS for 90a-real, GPU tests of the changed paths,
# examples/train.py, one train-model of this tree. Everything lands in $OUT/trial1.tgz; the wheel
# in $OUT/gpubuild/.
set -u
R=/tmp/trial1; mkdir -p $R $OUT/gpubuild; T0=$SECONDS
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c "import jax; print('jax', jax.__version__)"; git rev-parse HEAD; git status --short; } | tee $R/gpu.txt
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/cutlass')" .whl/nvidia_cutlass-*.whl
CUTLASS_INCLUDE_DIR=/tmp/cutlass/cutlass_library/source/include CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=ON \
  --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w $OUT/gpubuild . > $R/build.log 2>&1 || { tail -30 $R/build.log; exit 1; }
echo "=== $(date +%T) built at $((SECONDS - T0)) s"
python3 -m pip install -q --no-deps --force-reinstall $OUT/gpubuild/te_async-*.whl
TE_ASYNC_POISON_OUTPUTS=1 TE_ASYNC_VERIFY_HOST_SIZES=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 240 python3 -P -m pytest -q -n 12 \
  -p no:cacheprovider --rootdir=. tests/test_loss.py tests/test_grouped_mlp.py tests/test_moe.py tests/test_training_residuals.py \
  tests/test_dispatch_gradients.py tests/test_mixed_precision.py tests/test_scan_vjp.py tests/test_routing.py \
  tests/test_models_gpu.py tests/test_models_hf_parity.py tests/test_bench_harness.py > $R/tests.log 2>&1
echo "pytest rc $?" >> $R/tests.log; grep -E "passed|failed|FAILED|rc " $R/tests.log | tail -15
echo "=== $(date +%T) tests done at $((SECONDS - T0)) s"
timeout 90 python3 examples/train.py > $R/example_train.log 2>&1; echo "rc $?" >> $R/example_train.log; tail -6 $R/example_train.log
(cd / && timeout $((570 - (SECONDS - T0))) python3 -P -m te_async.bench train-model --contenders device --layers 4 --reps 5 \
  --no-plots --out $R/tm_C) > $R/tm_C.log 2>&1; cat $R/tm_C/train_model.md
tar czf $OUT/trial1.tgz -C $R . && ls -la $OUT $OUT/gpubuild
