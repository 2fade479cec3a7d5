#!/bin/bash
# One call on one GPU (carry .gpubuild/prebuilt: main's wheel, built on the CPU machine), in the order of
# what a short call needs most, each step skipped where the call's time is out (tools/device_call.sh):
# 1. bench prefill, te_async device against torch._grouped_mm, DeepSeek-V2-Lite and Qwen3-30B-A3B (table PT's
#    command), now with the stream measure (30 calls blocked on once) beside batches of 3 calls and GPU time.
# 2. bench generate DeepSeek-V2-Lite B=1, device mode (#17's figure at main).
# 3. tools/token_ffn_probe.py: the shared MLP alone (#18's dense-MLP target), routed, routed + shared.
# 4. bench train, device against torch (table T's command).
set -u
S=$PWD; R=/tmp/pstream; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
mkdir -p .gpubuild/main && cp .gpubuild/prebuilt/te_async-*.whl .gpubuild/main/ && wheels main
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true
bench() {  # bench <name> <seconds> <args>...
  local name=$1 secs=$2
  shift 2
  PYTHONPATH=/tmp/w_main XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step $secs $R/$name.log python3 -P -m te_async.bench "$@" --out $R/$name
  echo "--- $name (at $((SECONDS - T0)) s)" >> $L
}
bench prefill_deepseek 110 prefill --contenders te_async_device torch_grouped_mm --reps 10
grep -E '^\| (te_async|torch)' $R/prefill_deepseek/prefill.md >> $L
bench prefill_qwen3 130 prefill --preset qwen3-30b-a3b --contenders te_async_device torch_grouped_mm --reps 10
grep -E '^\| (te_async|torch)' $R/prefill_qwen3/prefill.md >> $L
bench generate_b1 90 generate --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --no-plots
grep -E '^\| [0-9]' $R/generate_b1/generate.md >> $L
PYTHONPATH=/tmp/w_main OUT=$R step 150 $R/token_ffn_probe.log python3 -P $S/tools/token_ffn_probe.py
echo "token_ffn probe (at $((SECONDS - T0)) s):" >> $L; grep -E " us |HBM|max " $R/token_ffn_probe.log >> $L
bench train 150 train --contenders device torch_grouped_mm --reps 6
grep -E '^\| (te_async|`torch)' $R/train/train.md >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log; tar czf $OUT/results.tgz -C $R --exclude=traces .
cat $L
