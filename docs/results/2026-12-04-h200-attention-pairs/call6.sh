#!/bin/bash
# Session 43 call 6: Qwen3-30B-A3B at B=1 (4 kv heads: 4 (sequence, kv head) pairs), device mode,
# XLA's attention against te_async's kernel (TE_ASYNC_DECODE_ATTENTION), 19e4a1a's wheel and Python.
set -u
export TE_ASYNC_COMMIT=${COMMIT}
R=/tmp/runs6; mkdir -p $R; T0=$SECONDS
PREBUILT=$(ls .gpubuild/19e4a1a/*.whl) OUT=$R bash tools/gpu_check.sh build | tail -1
site=$(cd / && python3 -c "import te_async, os; print(os.path.dirname(te_async.__file__))")
cp .gpubuild/variants/unroll2/decode_attention.py $site/ && cp .gpubuild/variants/attn2/model.py $site/models/
for run in 1 2; do for a in xla te_async; do
  [ $((SECONDS - T0)) -gt 250 ] && break 2
  d=$R/qwen3_${a}_$run; mkdir -p $d
  echo "=== $(date +%T) qwen3 B=1 $a $run"
  TE_ASYNC_DECODE_ATTENTION=$a XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 140 python3 -P -m te_async.bench generate --preset qwen3-30b-a3b --batches 1 --modes device --steps 60 --no-profile --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md || tail -3 $d/generate.log
done; done
tar czf $OUT/runs_call6.tgz -C $R .
