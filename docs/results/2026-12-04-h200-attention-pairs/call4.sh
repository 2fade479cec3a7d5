#!/bin/bash
# Session 43 call 4: main's kernels (19e4a1a's wheel, sm_90a, no CUTLASS). bench attention at 1-8
# pairs (MLA and GQA); B=2 loop scanned vs written out with te_async's attention; bench generate at
# B=1 and 2 (device) with 19e4a1a's Python (before) and the tree's (after: attention from 1 pair,
# layers written out from B=1), alternating while time allows.
set -u
export TE_ASYNC_COMMIT=${COMMIT}
R=/tmp/runs4; mkdir -p $R; T0=$SECONDS
PREBUILT=$(ls .gpubuild/19e4a1a/*.whl) OUT=$R bash tools/gpu_check.sh build | tail -1
python3 -m pip install -q --no-deps --target /tmp/before .gpubuild/19e4a1a/*.whl
for preset in deepseek-v2-lite qwen3-30b-a3b; do
  d=$R/attention_$preset; mkdir -p $d
  echo "=== $(date +%T) attention $preset"
  timeout 90 python3 -P -m te_async.bench attention --preset $preset --batches 1 2 4 8 --reps 10 --out $d > $d/attention.log 2>&1
  grep -E "^\| [0-9]" $d/attention.md
done
echo "=== $(date +%T) B=2 loop"
XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true timeout 120 python3 -P .gpubuild/scripts/b1_loop.py new 60 2 > $R/b2_new.log 2>&1
grep -v "^{" $R/b2_new.log | tail -4
for run in 1 2; do for t in before after; do
  [ $((SECONDS - T0)) -gt 430 ] && break 2
  pp=; [ $t = before ] && pp=/tmp/before
  d=$R/generate_${t}_$run; mkdir -p $d
  echo "=== $(date +%T) generate $t $run"
  PYTHONPATH=$pp timeout 110 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 2 --modes device --steps 60 --detail-batch 1 --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md
done; done
tar czf $OUT/runs_call4.tgz -C $R .
