#!/bin/bash
# One call, at most 9.5 minutes (README.md): token_moe at up to 8 tokens ("new": .gpubuild/new, main + the patch,
# built on the CPU machine) against main ("main": .gpubuild/main). Each wheel runs its own Python as built (no
# copy of the tree's over it); the patch's tests go into a copy of tests/. In the order of what matters most where
# the call's limit cuts (tools/device_call.sh): GPU tests of new (poisoned outputs); bench generate
# DeepSeek-V2-Lite B=8 new (profiled: its trip) and main, then B=1 (no regression at one token); bench decode T=8
# (26 MoE layers, written out) new and main; B=8 with the split forced to 128 units in 1 slice and 208 in 2 (the
# plan's choice at 8 tokens is 208 in 1); Qwen3-30B-A3B (24 layers) B=8 new and main.
set -u
S=$PWD; R=/tmp/tm; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
T=$S/docs/trials/2026-12-08-token-moe-tokens
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
for w in main new; do python3 -m pip install -q --no-deps --target /tmp/w_$w $(ls .gpubuild/$w/te_async-*.whl) > /tmp/install_$w.log 2>&1; done
rm -rf /tmp/tmt && mkdir -p /tmp/tmt && cp -r $S/tests /tmp/tmt/ && (cd /tmp/tmt && git apply --include='tests/*' $T/token_moe_tokens.patch) >> $L 2>&1
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
gpu_tests new $R/tests_new.log 170 $x /tmp/tmt/tests/test_token_moe.py /tmp/tmt/tests/test_token_ffn.py \
  /tmp/tmt/tests/test_models_gpu.py /tmp/tmt/tests/test_decode_moe_gpu.py /tmp/tmt/tests/test_bench_decode.py
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
# plan(units, slices): every call's split forced (at B=8 every MoE call is an 8-token one)
plan() { echo "import te_async.token_ffn as tf; tf.plan_split = lambda *a: tf.Split($1, $2); "; }
gen new ds8_new deepseek-v2-lite 8 ""
echo "ds8_new trip: $(sed -n '/One trip/,$p' $R/ds8_new/generate_timeline_B8_kernels.md 2>/dev/null | grep -E '^\|' | head -40 | tr '\n' ' ')" >> $L
gen main ds8_main deepseek-v2-lite 8 "" --no-profile
gen new ds1_new deepseek-v2-lite 1 "" --no-profile
gen main ds1_main deepseek-v2-lite 1 "" --no-profile
dec new; dec main
gen new ds8_u128s1 deepseek-v2-lite 8 "$(plan 128 1)" --no-profile
gen new ds8_u208s2 deepseek-v2-lite 8 "$(plan 208 2)" --no-profile
gen new qw8_new qwen3-30b-a3b 8 "" --no-profile
gen main qw8_main qwen3-30b-a3b 8 "" --no-profile
pack
