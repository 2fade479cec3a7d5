#!/bin/bash
# Call 2 (same wheels as call.sh): what call 1 lost. Qwen3-30B-A3B at B=1 with 24 of its 48 layers (the whole
# model does not fit an H100's memory; call 1 ran out of it) new / main / main / new, a profiled main DeepSeek run
# (the trip table side by side with call 1's new one), then memcheck of each changed kernel's test file alone
# (call 1's memcheck of both files at once ended in a segfault of the sanitizer's process, no report).
set -u
S=$PWD; R=/tmp/split_stores2; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
mkdir -p .gpubuild/main && cp .gpubuild/prebuilt/te_async-*.whl .gpubuild/main/ && wheels main new
for run in "new qwen3_new_1 qwen3-30b-a3b --no-profile" "main qwen3_old_1 qwen3-30b-a3b --no-profile" \
  "main qwen3_old_2 qwen3-30b-a3b --no-profile" "new qwen3_new_2 qwen3-30b-a3b --no-profile" \
  "main deepseek_old_profiled deepseek-v2-lite"; do
  set -- $run
  layers=; [ "$3" = qwen3-30b-a3b ] && layers="--layers 24"
  PYTHONPATH=/tmp/w_$1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step 60 $R/generate_$2.log python3 -P -m te_async.bench \
    generate --preset $3 $layers --batches 1 --modes device --steps 60 --no-plots --out $R/generate_$2 ${4:-}
  echo "generate $2 (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/generate_$2/generate.md 2>/dev/null)" >> $L
done
for t in test_mla_token test_decode_attention; do
  PYTHONPATH=/tmp/w_new TE_ASYNC_POISON_OUTPUTS=1 step 90 $R/memcheck_$t.log compute-sanitizer --tool memcheck \
    --print-limit 20 python3 -P -m pytest -q -p no:cacheprovider --rootdir=$S $S/tests/$t.py -x
  echo "memcheck $t (at $((SECONDS - T0)) s): $(grep -E 'passed|failed' $R/memcheck_$t.log | tail -1) / $(grep 'ERROR SUMMARY' $R/memcheck_$t.log | tail -1)" >> $L
done
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log
tar czf $OUT/results.tgz -C $R --exclude=traces .
cat $L
