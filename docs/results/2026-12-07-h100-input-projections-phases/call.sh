#!/bin/bash
# One call, about 1 minute: the input projections' kernel (mla_token's kernel 1) by phase inside the running
# model, DeepSeek-V2-Lite B=1 (.gpubuild/p1: 42242ce + p1_stamps.patch), then a profiled run (the stamps' cost).
set -u
S=$PWD; R=/tmp/p1; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
wheels p1
gen() {  # name [extra]
  PYTHONPATH=/tmp/w_p1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step 60 $R/$1.log python3 -P -m te_async.bench generate \
    --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --no-plots --out $R/$1 ${2:-}
  echo "generate $1 (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/$1/generate.md 2>/dev/null)" >> $L
}
gen stamps_run --no-profile
python3 $S/docs/results/2026-12-07-h100-input-projections-phases/p1_summary.py $R/stamps_run.log >> $L 2>&1
gen stamps_profiled
echo "stamps_profiled: $(sed -n '/One trip/,$p' $R/stamps_profiled/generate_timeline_B1_kernels.md | grep -E 'Product|MlaToken|Route|TokenFfn|Reduce|Decode' | tr '\n' ' ')" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log
tar czf $OUT/results.tgz -C $R --exclude=traces .
cat $L
