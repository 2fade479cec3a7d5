#!/bin/bash
# One call on any GPU (the H100 fallback of the H200 trial): main's whole GPU suite on the CPU-built wheel in
# .gpubuild/prebuilt (carry it), poisoned outputs, 8 workers; then compute-sanitizer memcheck of the
# decode kernels' tests where time is left. $OUT/summary.txt, results.tgz.
set -u
S=$PWD; R=/tmp/suite; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
mkdir -p .gpubuild/main && cp .gpubuild/prebuilt/te_async-*.whl .gpubuild/main/ && wheels main
gpu_tests main $R/tests.log $((LIMIT - 90)) -n 8 $S/tests
PYTHONPATH=/tmp/w_main TE_ASYNC_POISON_OUTPUTS=1 step 80 $R/memcheck.log compute-sanitizer --tool memcheck \
  --print-limit 20 python3 -P -m pytest -q -p no:cacheprovider --rootdir=$S $S/tests/test_gqa_token.py $S/tests/test_token_moe.py \
  $S/tests/test_mla_token.py -k "block and not model or kernels"
echo "memcheck (at $((SECONDS - T0)) s): $(grep -E 'passed|failed' $R/memcheck.log | tail -1) / $(grep 'ERROR SUMMARY' $R/memcheck.log | tail -1)" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log; tar czf $OUT/results.tgz -C $R .
cat $L
