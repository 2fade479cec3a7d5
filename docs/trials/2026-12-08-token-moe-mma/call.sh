#!/bin/bash
# One call, about 8 minutes (README.md): token_moe at up to 8 tokens with the items of several tokens on the tensor
# cores ("mma": .gpubuild/mma, main + token_moe_mma.patch) against main (.gpubuild/main). Each wheel runs its own
# Python as built; the patch's tests go into a copy of tests/. In the order of what matters most where the call's
# limit cuts (tools/device_call.sh): GPU tests of mma (poisoned outputs; test_dense for dense_mma.cu's shared
# fragments); bench generate DeepSeek-V2-Lite B=8 mma (profiled: its trip) and main; Qwen3-30B-A3B (24 layers) B=8
# mma and main; bench decode T=8 (26 MoE layers, written out) mma and main; DeepSeek-V2-Lite B=4 mma and main; B=1
# mma and main; B=8 with 64 units (two full tiles of 8 vectors in fc1; the plan's 80 give 8 + 8 + 4); DeepSeek-V2-Lite
# and Qwen3-30B-A3B B=8 with one-entry items on the tensor cores too ("allmma": + all_items_mma.patch); Qwen3 B=8
# with 32 and 64 units (full tiles of 8 vectors; the plan's 40 leave fc1's second tile 2 vectors wide). SHORT=1: the
# kernels' tests, DeepSeek-V2-Lite and Qwen3-30B-A3B B=8 against main only.
set -u
S=$PWD; R=/tmp/tm; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
T=$S/docs/trials/2026-12-08-token-moe-mma
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
AS_BUILT=1 wheels main mma allmma
rm -rf /tmp/tdt && mkdir -p /tmp/tdt && cp -r $S/tests /tmp/tdt/ && (cd /tmp/tdt && git apply --include='tests/*' $T/token_moe_mma.patch) >> $L 2>&1
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
units() { echo "import te_async.token_ffn as tf; tf.plan_tokens = lambda *a: tf.Split($1, 1); "; }  # a forced plan, for PRE
if [ "${SHORT:-0}" = 1 ]; then  # a short call (under 4 minutes): the kernel tests, then B=8 against main
  gpu_tests mma $R/tests_mma.log 60 $x /tmp/tdt/tests/test_token_moe.py /tmp/tdt/tests/test_token_ffn.py /tmp/tdt/tests/test_dense.py
  gen mma ds8_mma deepseek-v2-lite 8 --no-profile; gen main ds8_main deepseek-v2-lite 8 --no-profile
  gen mma qw8_mma qwen3-30b-a3b 8 --no-profile; gen main qw8_main qwen3-30b-a3b 8 --no-profile
  pack; exit
fi
gpu_tests mma $R/tests_mma.log 150 $x /tmp/tdt/tests/test_token_moe.py /tmp/tdt/tests/test_token_ffn.py \
  /tmp/tdt/tests/test_dense.py /tmp/tdt/tests/test_models_gpu.py /tmp/tdt/tests/test_decode_moe_gpu.py
gen mma ds8_mma deepseek-v2-lite 8
trip ds8_mma 8
gen main ds8_main deepseek-v2-lite 8 --no-profile
gen mma qw8_mma qwen3-30b-a3b 8 --no-profile
gen main qw8_main qwen3-30b-a3b 8 --no-profile
decode8 mma; decode8 main
gen mma ds4_mma deepseek-v2-lite 4 --no-profile
gen main ds4_main deepseek-v2-lite 4 --no-profile
gen mma ds1_mma deepseek-v2-lite 1 --no-profile
gen main ds1_main deepseek-v2-lite 1 --no-profile
PRE=$(units 64) gen mma ds8_u64 deepseek-v2-lite 8 --no-profile
gen allmma ds8_allmma deepseek-v2-lite 8 --no-profile
gen allmma qw8_allmma qwen3-30b-a3b 8 --no-profile
for u in 32 64; do  # Qwen3's plan: 40 units, fc1's 10 vectors a row a tile of 8 and one of 2
  PRE=$(units $u) gen mma qw8_u$u qwen3-30b-a3b 8 --no-profile
done
pack
