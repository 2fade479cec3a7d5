#!/bin/bash
# Stop 67, call 3, on call 1's machine: bench generate Qwen3-30B-A3B (24 layers) at B = 8 and 64, gqa_token on
# ("new") and off ("old"), alternating twice, no profile: the call runs at every batch, not only at B = 1.
set -u
S=$PWD; R=/tmp/s67c; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt; LIMIT=${LIMIT:-280}
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
export PYTHONPATH=/tmp/w67 TE_ASYNC_COMMIT=451b767
OLD="import te_async.gqa_token as g; g.takes = lambda *a, **k: False; "
gen() {  # gen <new|old> <run>
  local pre=""; [ $1 = old ] && pre="$OLD"
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step 70 $R/qwen3_$1_$2.log python3 -P -c \
    "${pre}import runpy, sys; sys.argv = ['te_async.bench'] + sys.argv[1:]; runpy.run_module('te_async.bench', run_name='__main__')" \
    generate --preset qwen3-30b-a3b --layers 24 --batches 8 64 --modes device --steps 40 --no-plots --no-profile --out $R/qwen3_$1_$2
  echo "qwen3 $1 $2 (at $((SECONDS - T0)) s):" >> $L; grep -E '^\| [0-9]' $R/qwen3_$1_$2/generate.md >> $L 2>/dev/null
}
gen new 1; gen old 1; gen old 2; gen new 2
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log; tar czf $OUT/results.tgz -C $R .
cat $L
