#!/bin/bash
# Stop 66, call 3: main's GPU tests not run since stop 62 (route_rows reverted: main's C++ is ff4eda7's, the
# CPU-built wheel of 789c51f in .gpubuild/prebuilt), poisoned, 12 workers, cut by LIMIT.
set -u
S=$PWD; R=/tmp/s66c; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt; LIMIT=${LIMIT:-300}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $L
python3 -m pip install -q --no-deps --target /tmp/wm $(ls .gpubuild/prebuilt/te_async-*.whl) > $R/install.log 2>&1
for d in . bench models; do cp te_async/$d/*.py /tmp/wm/te_async/$d/; done
T="test_bad_sizes test_bench_harness test_decode_moe test_dispatch_gradients test_gpu_size_errors test_grouped_gemm test_plan
   test_sequence_attention test_trace test_ragged_dot test_loss test_mixed_precision test_grouped_mlp test_models_gpu test_scan_vjp
   test_embedding test_training_residuals test_moe test_decode_moe_gpu test_routing"
(cd / && PYTHONPATH=/tmp/wm TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout $LIMIT python3 -P -m pytest -q \
  -n 12 -p no:cacheprovider --rootdir=$S $(for t in $T; do echo $S/tests/$t.py; done)) > $R/tests.log 2>&1
echo "tests (rc $?): $(tail -1 $R/tests.log)" >> $L; grep -E "^(FAILED|ERROR)" $R/tests.log | head -30 >> $L
gzip -f $R/tests.log; tar czf $OUT/results.tgz -C $R .
cat $L
