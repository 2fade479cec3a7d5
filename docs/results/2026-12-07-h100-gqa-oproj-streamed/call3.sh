#!/bin/bash
# Call 3 (where an H100 comes; an H200 runs docs/trials/2026-12-07-h200-decode/call.sh instead): main at its
# end (cc875e7's wheel, .gpubuild/prebuilt) as one build: the token calls' GPU tests (poisoned outputs),
# bench generate Qwen3-30B-A3B B=1, memcheck of the block's kernel tests.
set -u
S=$PWD; R=/tmp/call3; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
export TE_ASYNC_COMMIT=${TE_ASYNC_COMMIT:-unknown}
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
mkdir -p .gpubuild/main && cp .gpubuild/prebuilt/te_async-*.whl .gpubuild/main/ && wheels main
gpu_tests main $R/tests.log 90 -n 4 $S/tests/test_gqa_token.py $S/tests/test_mla_token.py
PYTHONPATH=/tmp/w_main XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step 30 $R/gen.log python3 -P -m te_async.bench generate \
  --preset qwen3-30b-a3b --layers 24 --batches 1 --modes device --steps 60 --no-plots --no-profile --out $R/gen
echo "generate (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/gen/generate.md 2>/dev/null)" >> $L
PYTHONPATH=/tmp/w_main TE_ASYNC_POISON_OUTPUTS=1 step 40 $R/memcheck.log compute-sanitizer --tool memcheck \
  --print-limit 20 python3 -P -m pytest -q -p no:cacheprovider --rootdir=$S $S/tests/test_gqa_token.py -k "block and not model"
echo "memcheck (at $((SECONDS - T0)) s): $(grep -E 'passed|failed' $R/memcheck.log | tail -1) / $(grep 'ERROR SUMMARY' $R/memcheck.log | tail -1)" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log; tar czf $OUT/results.tgz -C $R .
cat $L
