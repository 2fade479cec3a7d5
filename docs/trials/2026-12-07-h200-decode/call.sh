#!/bin/bash
# One call on an H200 (kind nvidia-h200, see README; carry .whl and .gpubuild/prebuilt, a wheel of main built
# on the CPU machine), about 9 minutes. $OUT/summary.txt, results.tgz. In the order of what a short call
# needs most (what does not fit the call's time is skipped: tools/device_call.sh's LIMIT):
# 1. bench decode device and PyTorch's CUDA-graph step, T = 1 8 64, the layers written out (--unroll auto):
#    #18's H200 figures, each row also timed as a donated loop (loop_ms).
# 2. bench generate B = 1, DeepSeek-V2-Lite (#17's figure), token_ffn's plan ("new") against main's before
#    c79e423 ("old"); Qwen3-30B-A3B (all 48 layers) with gqa_token_block and gqa_token_attention's call
#    on ("new") and off ("old").
# 3. GPU tests (poisoned outputs); bench decode T = 1 8 scanned (--unroll never); the second generate
#    pair; stop 60's stripe read probe (does the H200 read 256-byte pieces faster than 128 by more than
#    the H100's 2-3 %?).
set -u
S=$PWD; R=/tmp/h2d; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
mkdir -p .gpubuild/main && cp .gpubuild/prebuilt/te_async-*.whl .gpubuild/main/ && wheels main
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true  # the profiled step keeps the timed step's graphs
decode() {  # decode <unroll> <modes> <batches>
  PYTHONPATH=/tmp/w_main step 120 $R/decode_$1.log python3 -P -m te_async.bench decode --modes $2 --batches $3 \
    --unroll $1 --reps 10 --no-plots --detail-batch 8 --out $R/decode_$1
  echo "--- bench decode --unroll $1 (at $((SECONDS - T0)) s)" >> $L; grep -E '^\| [0-9]' $R/decode_$1/decode.md >> $L
}
# PREs for tools/device_call.sh's generate (bench generate B = 1 on wheel main): main's plan before c79e423, and
# gqa_token's calls off
OLD_PLAN="import te_async.token_ffn as tf; old = {(6, 1408, 2816): 48, (0, 0, 10944): 48}; tf.plan_split = lambda k, f, fs, *a: tf.Split(old[(k, f, fs)], 1); "
GQA_OFF="import te_async.gqa_token as g; g.takes = g.block_takes = lambda *a, **k: False; "
decode auto "device torch_graph" "1 8 64"
generate main generate_new_1 deepseek-v2-lite; PRE=$OLD_PLAN generate main generate_old_1 deepseek-v2-lite
generate main generate_qwen3_gqa_new qwen3-30b-a3b --layers 48 --no-profile
PRE=$GQA_OFF generate main generate_qwen3_gqa_old qwen3-30b-a3b --layers 48 --no-profile
x=; python3 -c "import xdist" 2>/dev/null && x="-n 4"
gpu_tests main $R/tests.log 150 $x $S/tests/test_bench_decode.py $S/tests/test_models_gpu.py \
  $S/tests/test_decode_moe_gpu.py $S/tests/test_torch_decode_step.py
decode never device "1 8"
PRE=$OLD_PLAN generate main generate_old_2 deepseek-v2-lite; generate main generate_new_2 deepseek-v2-lite
# token_ffn at one token (tools/token_ffn_probe.py): the shared MLP alone is #18's dense-MLP target, last measured
# at d57aedb (2.35x), before token_ffn's clusters (c79e423)
PYTHONPATH=/tmp/w_main OUT=$R step 150 $R/token_ffn_probe.log python3 -P $S/tools/token_ffn_probe.py
echo "token_ffn probe (at $((SECONDS - T0)) s):" >> $L; grep -E " us |HBM|max " $R/token_ffn_probe.log >> $L
step 60 $R/probe_build.log nvcc -O3 -std=c++17 -arch=sm_90a $S/docs/results/2026-12-06-h100-kn-reads/stripe_read_probe.cu -o $R/srp &&
  for n in 34 64 34 64; do step 20 $R/probe.txt $R/srp $n; done; cat $R/probe.txt >> $L 2>/dev/null
# the read probe by size, each read cold (since stop 72): a kernel of a decode weight's size against the floor
PYTHONPATH=/tmp/w_main step 60 $R/read.log python3 -P -m te_async.bench read --out $R/read
echo "--- read (at $((SECONDS - T0)) s)" >> $L; grep -E '^\| [0-9]' $R/read/read.md >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log; tar czf $OUT/results.tgz -C $R --exclude='traces' --exclude='srp' .
cat $L
