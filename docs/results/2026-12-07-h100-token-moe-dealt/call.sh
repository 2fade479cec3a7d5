#!/bin/bash
# One call, about 6 minutes (README.md): token_moe at up to 8 tokens with a persistent experts' kernel that deals
# the distinct experts' items after the routing ("dealt": .gpubuild/dealt, main + token_moe_dealt.patch, built on
# the CPU machine) against main (.gpubuild/main). Each wheel runs its own Python as built (no copy of the tree's
# over it); the patch's tests go into a copy of tests/. In the order of what matters most where the call's limit
# cuts (tools/device_call.sh): GPU tests of dealt (poisoned outputs); bench generate DeepSeek-V2-Lite B=8 dealt
# (profiled: its trip) and main; B=1 dealt, main, main, dealt (one token must not move); bench decode T=8 (26 MoE
# layers, written out) dealt and main; B=8 with the units forced to 40 and 128 (the plan's: 80); Qwen3-30B-A3B (24
# layers) B=8 dealt and main; DeepSeek-V2-Lite B=4 dealt and main.
set -u
S=$PWD; R=/tmp/td; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
T=$S/docs/trials/2026-12-09-token-moe-dealt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
for w in main dealt; do python3 -m pip install -q --no-deps --target /tmp/w_$w $(ls .gpubuild/$w/te_async-*.whl) > /tmp/install_$w.log 2>&1; done
rm -rf /tmp/tdt && mkdir -p /tmp/tdt && cp -r $S/tests /tmp/tdt/ && (cd /tmp/tdt && git apply --include='tests/*' $T/token_moe_dealt.patch) >> $L 2>&1
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
gpu_tests dealt $R/tests_dealt.log 150 $x /tmp/tdt/tests/test_token_moe.py /tmp/tdt/tests/test_token_ffn.py \
  /tmp/tdt/tests/test_models_gpu.py /tmp/tdt/tests/test_decode_moe_gpu.py
gen() {  # gen <wheel> <out> <preset> <batch> <python before the run> [args]: bench generate in device mode, 60 steps
  local w=$1 out=$2 preset=$3 b=$4 patch=$5 layers=
  shift 5
  [ "$preset" = qwen3-30b-a3b ] && layers="--layers 24"
  PYTHONPATH=/tmp/w_$w XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step 80 "$R/$out.log" python3 -P -c "${patch}import runpy, sys; \
sys.argv = ['te_async.bench'] + sys.argv[1:]; runpy.run_module('te_async.bench', run_name='__main__')" generate \
    --preset "$preset" $layers --batches $b --modes device --steps 60 --no-plots --detail-batch $b --out "$R/$out" "$@"
  echo "generate $out (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' "$R/$out/generate.md" 2>/dev/null)" >> "$L"
}
dec() {  # dec <wheel>: bench decode T=8, 26 MoE layers written out
  PYTHONPATH=/tmp/w_$1 step 100 $R/decode_$1.log python3 -P -m te_async.bench decode --modes device --batches 8 \
    --reps 10 --no-plots --no-profile --out $R/decode_$1
  echo "decode $1 (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/decode_$1/decode.md 2>/dev/null)" >> $L
}
# units(u): the several-token calls' units forced (at B=8 every MoE call is an 8-token one)
units() { echo "import te_async.token_ffn as tf; tf.plan_tokens = lambda *a: tf.Split($1, 1); "; }
gen dealt ds8_dealt deepseek-v2-lite 8 ""
echo "ds8_dealt trip: $(sed -n '/One trip/,$p' $R/ds8_dealt/generate_timeline_B8_kernels.md 2>/dev/null | grep -E '^\|' | head -40 | tr '\n' ' ')" >> $L
gen main ds8_main deepseek-v2-lite 8 "" --no-profile
for v in dealt_1 main_1 main_2 dealt_2; do gen ${v%_*} ds1_$v deepseek-v2-lite 1 "" --no-profile; done
dec dealt; dec main
gen dealt ds8_u40 deepseek-v2-lite 8 "$(units 40)" --no-profile
gen dealt ds8_u128 deepseek-v2-lite 8 "$(units 128)" --no-profile
gen dealt qw8_dealt qwen3-30b-a3b 8 "" --no-profile
gen main qw8_main qwen3-30b-a3b 8 "" --no-profile
gen dealt ds4_dealt deepseek-v2-lite 4 "" --no-profile
gen main ds4_main deepseek-v2-lite 4 "" --no-profile
pack
