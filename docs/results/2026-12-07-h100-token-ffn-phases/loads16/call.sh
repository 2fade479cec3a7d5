#!/bin/bash
# One call: "u16" = main + TokenFfnKernel's products with 16 loads in flight a thread (kFfnLoads; main: 8),
# "main" = 42242ce's wheel, both built on the CPU machine. bench generate B=1 DeepSeek-V2-Lite and Qwen3-30B-A3B
# (24 of 48 layers) alternated u16 / main / main / u16, then GPU tests of token_ffn and token_moe (poisoned).
set -u
S=$PWD; R=/tmp/u16; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
mkdir -p .gpubuild/main && cp .gpubuild/42242ce/te_async-*.whl .gpubuild/main/ && wheels main u16
gen() {  # wheel name preset
  local layers=; [ "$3" = qwen3-30b-a3b ] && layers="--layers 24"
  PYTHONPATH=/tmp/w_$1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step 60 $R/$2.log python3 -P -m te_async.bench generate \
    --preset $3 $layers --batches 1 --modes device --steps 60 --no-plots --no-profile --out $R/$2
  echo "generate $2 (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/$2/generate.md 2>/dev/null)" >> $L
}
for p in "deepseek deepseek-v2-lite" "qwen3 qwen3-30b-a3b"; do
  set -- $p
  gen u16 $1_u16_1 $2; gen main $1_main_1 $2; gen main $1_main_2 $2; gen u16 $1_u16_2 $2
done
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
gpu_tests u16 $R/tests.log 100 $x $S/tests/test_token_ffn.py $S/tests/test_token_moe.py
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log
tar czf $OUT/results.tgz -C $R .
cat $L
