#!/bin/bash
# One call, about 2 minutes (README.md): TokenFfnKernel's routed blocks by phase inside the running model, with the
# probe's second form (.gpubuild/stamps2: main + ffn_stamps2.patch, nothing printed by the launches it measures), and
# main's wheel (.gpubuild/prebuilt) profiled beside it (the stamps' cost on the kernel's trip).
set -u
S=$PWD; R=/tmp/ffn3; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
mkdir -p .gpubuild/main && cp .gpubuild/prebuilt/te_async-*.whl .gpubuild/main/ && wheels main stamps2
gen() {  # wheel out-dir [extra]
  PYTHONPATH=/tmp/w_$1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step 60 $R/$2.log python3 -P -m te_async.bench generate \
    --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --no-plots --out $R/$2 ${3:-}
  echo "generate $2 (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/$2/generate.md 2>/dev/null)" >> $L
}
gen stamps2 stamps_run --no-profile
echo "--- TokenFfnKernel's phases (launches 1200 and 1201, printed by 1202 and 1203)" >> $L
python3 $S/docs/results/2026-12-07-h100-token-ffn-phases/stamps_summary.py $R/stamps_run.log >> $L 2>&1
gen stamps2 stamps_profiled; gen main main_profiled
for k in stamps_profiled main_profiled; do
  echo "$k: $(grep -E 'TokenFfnKernel|ReducePartials|RouteToken' $R/$k/generate_timeline_B1_kernels.md | tr '\n' ' ')" >> $L
done
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log
tar czf $OUT/results.tgz -C $R --exclude=traces .
cat $L
