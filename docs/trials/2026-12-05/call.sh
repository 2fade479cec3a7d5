#!/bin/bash
# One device call (carry .whl): build this tree with CUTLASS for sm_90a, run the cuDNN attention
# probe, the GPU tests of the attention and the models, then bench train-model with XLA's and
# cuDNN's attention alternating (README.md beside this file). Usage: bash docs/trials/2026-12-05/call.sh
set -u
here=docs/trials/2026-12-05; R=/tmp/trial; mkdir -p $R $OUT/gpubuild; T0=$SECONDS
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c "import jax; print('jax', jax.__version__)"; git rev-parse HEAD; git status --short; } | tee $R/gpu.txt
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/cutlass')" .whl/nvidia_cutlass-*.whl
CUTLASS_INCLUDE_DIR=/tmp/cutlass/cutlass_library/source/include CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=ON \
  --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w $OUT/gpubuild . > $R/build.log 2>&1 || { tail -30 $R/build.log; exit 1; }
echo "=== $(date +%T) built at $((SECONDS - T0)) s"
python3 -m pip install -q --no-deps --force-reinstall $OUT/gpubuild/te_async-*.whl
(cd / && timeout 100 python3 -P $OLDPWD/$here/probe_cudnn.py) > $R/probe_cudnn.log 2>&1; echo "probe rc $?" >> $R/probe_cudnn.log
grep -v Warning $R/probe_cudnn.log | tail -25
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TE_ASYNC_SEQUENCE_ATTENTION=auto timeout 110 python3 -P -m pytest -q -n 10 \
  -p no:cacheprovider --rootdir=. tests/test_sequence_attention.py tests/test_models_gpu.py tests/test_models_hf_parity.py > $R/tests.log 2>&1
echo "pytest rc $?" >> $R/tests.log; grep -E "passed|failed|FAILED|rc " $R/tests.log | tail -12
echo "=== $(date +%T) tests done at $((SECONDS - T0)) s"
. $here/train_ab.sh
for s in xla auto auto xla; do [ $((SECONDS - T0)) -lt 480 ] && TM_LIMIT=$((585 - (SECONDS - T0))) tm $s _$((SECONDS - T0)); done
tar czf $OUT/trial.tgz -C $R .
