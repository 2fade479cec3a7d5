#!/bin/bash
# One call (README.md): "res" = main + residual_before_wait.patch (.gpubuild/res), "main" = main's wheel
# (.gpubuild/prebuilt), both built on the CPU machine. bench generate B=1 DeepSeek-V2-Lite and Qwen3-30B-A3B
# (24 of 48 layers) alternated res / main / main / res, GPU tests of both callers (poisoned outputs), a profiled res
# DeepSeek run (the trip). What the call's limit cuts is skipped (tools/device_call.sh's LIMIT).
set -u
S=$PWD; R=/tmp/res; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
mkdir -p .gpubuild/main && cp .gpubuild/prebuilt/te_async-*.whl .gpubuild/main/ && wheels main res
gen() {  # wheel name preset [extra]
  local layers=; [ "$3" = qwen3-30b-a3b ] && layers="--layers 24"
  PYTHONPATH=/tmp/w_$1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step 60 $R/$2.log python3 -P -m te_async.bench generate \
    --preset $3 $layers --batches 1 --modes device --steps 60 --no-plots --out $R/$2 ${4:-}
  echo "generate $2 (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/$2/generate.md 2>/dev/null)" >> $L
}
for p in "deepseek deepseek-v2-lite" "qwen3 qwen3-30b-a3b"; do
  set -- $p
  gen res $1_res_1 $2 --no-profile; gen main $1_main_1 $2 --no-profile
  gen main $1_main_2 $2 --no-profile; gen res $1_res_2 $2 --no-profile
done
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
gpu_tests res $R/tests.log 100 $x $S/tests/test_mla_token.py $S/tests/test_gqa_token.py $S/tests/test_models_gpu.py
gen res deepseek_res_profiled deepseek-v2-lite
echo "deepseek_res_profiled: $(sed -n '/One trip/,$p' $R/deepseek_res_profiled/generate_timeline_B1_kernels.md | grep -E 'Product|MlaTokenOut' | tr '\n' ' ')" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log
tar czf $OUT/results.tgz -C $R --exclude=traces .
cat $L
