#!/bin/bash
# Session 43 call 5: which of call 4's two changes gave B=2's gain: bench generate at B=1 and 2
# (device) with the attention kernel from 2 pairs alone (attn2) and the layers written out from B=2
# alone (unroll2), on 19e4a1a's wheel, alternating.
set -u
export TE_ASYNC_COMMIT=${COMMIT}
R=/tmp/runs5; mkdir -p $R; T0=$SECONDS
PREBUILT=$(ls .gpubuild/19e4a1a/*.whl) OUT=$R bash tools/gpu_check.sh build | tail -1
site=$(cd / && python3 -c "import te_async, os; print(os.path.dirname(te_async.__file__))")
for run in 1 2; do for v in attn2 unroll2; do
  [ $((SECONDS - T0)) -gt 200 ] && break 2
  cp .gpubuild/variants/$v/decode_attention.py $site/ && cp .gpubuild/variants/$v/model.py $site/models/
  d=$R/generate_${v}_$run; mkdir -p $d
  echo "=== $(date +%T) generate $v $run"
  timeout 80 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 2 --modes device --steps 60 --no-profile --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md
done; done
tar czf $OUT/runs_call5.tgz -C $R .
