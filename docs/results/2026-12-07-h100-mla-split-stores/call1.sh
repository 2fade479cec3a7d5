#!/bin/bash
# One H100 or H200 call, about 4 minutes (README.md): "new" = main with split_stores.patch (.gpubuild/new), "main" =
# main's own wheel (.gpubuild/prebuilt), both built on the CPU machine. GPU tests of the split kernel's callers on
# new (poisoned outputs), bench generate B=1 DeepSeek-V2-Lite alternated new / main / main / new (60 steps, not
# profiled, about 12 s a run), a profiled new run (the trip table), Qwen3-30B-A3B B=1 new / main, then memcheck of
# the changed kernel's tests; what the call's limit cuts is skipped (tools/device_call.sh's LIMIT).
set -u
S=$PWD; R=/tmp/split_stores; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
mkdir -p .gpubuild/main && cp .gpubuild/prebuilt/te_async-*.whl .gpubuild/main/ && wheels main new
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
gpu_tests new $R/tests.log 120 $x $S/tests/test_mla_token.py $S/tests/test_decode_attention.py $S/tests/test_gqa_token.py \
  $S/tests/test_models_gpu.py
for run in "new deepseek_new_1 deepseek-v2-lite --no-profile" "main deepseek_old_1 deepseek-v2-lite --no-profile" \
  "main deepseek_old_2 deepseek-v2-lite --no-profile" "new deepseek_new_2 deepseek-v2-lite --no-profile" \
  "new deepseek_new_profiled deepseek-v2-lite" "new qwen3_new qwen3-30b-a3b --no-profile" \
  "main qwen3_old qwen3-30b-a3b --no-profile"; do
  set -- $run
  PYTHONPATH=/tmp/w_$1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step 60 $R/generate_$2.log python3 -P -m te_async.bench \
    generate --preset $3 --batches 1 --modes device --steps 60 --no-plots --out $R/generate_$2 ${4:-}
  echo "generate $2 (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/generate_$2/generate.md 2>/dev/null)" >> $L
done
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
PYTHONPATH=/tmp/w_new TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false step 90 $R/memcheck.log $sanitizer \
  --tool memcheck --error-exitcode 9 python3 -P -m pytest -q -p no:cacheprovider --rootdir=$S $S/tests/test_mla_token.py \
  $S/tests/test_decode_attention.py -x
echo "memcheck (at $((SECONDS - T0)) s): $(grep -E 'ERROR SUMMARY|passed|failed' $R/memcheck.log | tail -2 | tr '\n' ' ')" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log
tar czf $OUT/results.tgz -C $R --exclude=traces .
cat $L
