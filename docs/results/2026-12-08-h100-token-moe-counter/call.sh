#!/bin/bash
# One call, about 8 minutes (README.md): token_moe at up to 8 tokens with the routed items taken from a counter
# ("counter": .gpubuild/counter, main + token_moe_counter.patch) against main (.gpubuild/main), and the per-item
# trace of the experts' kernel ("trace": .gpubuild/trace, counter + trace_items.patch). Each wheel runs its own
# Python as built; the patch's tests go into a copy of tests/. In the order of what matters most where the call's
# limit cuts (tools/device_call.sh): GPU tests of counter (poisoned outputs); the trace (tokens near one another,
# then independent); bench generate DeepSeek-V2-Lite B=8 counter (profiled: its trip) and main; B=1 counter, main,
# main, counter (one token must not move); Qwen3-30B-A3B (24 layers) B=8 counter and main; bench decode T=8 (26 MoE
# layers, written out) counter and main; B=8 with 64 units (128-byte pieces; the plan's: 80); the trace at 64 units;
# DeepSeek-V2-Lite B=4 counter and main. SHORT=1: the shared-tokens trace and B=8 against main only.
set -u
S=$PWD; R=/tmp/td; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
T=$S/docs/results/2026-12-08-h100-token-moe-counter
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
for w in main counter trace; do python3 -m pip install -q --no-deps --target /tmp/w_$w $(ls .gpubuild/$w/te_async-*.whl) > /tmp/install_$w.log 2>&1; done
rm -rf /tmp/tdt && mkdir -p /tmp/tdt && cp -r $S/tests /tmp/tdt/ && (cd /tmp/tdt && git apply --include='tests/*' $T/token_moe_counter.patch) >> $L 2>&1
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
trace() {  # trace <case> [units]: the experts' kernel's per-item lines, summarised into $L
  local out=$R/trace_$1${2:+_u$2}.txt
  PYTHONPATH=/tmp/w_trace step 60 $out python3 -P $T/trace_items.py run "$@"
  python3 $T/trace_items.py summarize $out >> $L 2>&1
}
gen() {  # gen <wheel> <out> <preset> <batch> [bench args]: bench generate (tools/device_call.sh) at B=<batch>
  local w=$1 out=$2 preset=$3 b=$4
  shift 4
  generate "$w" "$out" "$preset" --batches "$b" --detail-batch "$b" "$@"
}
dec() {  # dec <wheel>: bench decode T=8, 26 MoE layers written out
  PYTHONPATH=/tmp/w_$1 step 100 $R/decode_$1.log python3 -P -m te_async.bench decode --modes device --batches 8 \
    --reps 10 --no-plots --no-profile --out $R/decode_$1
  echo "decode $1 (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/decode_$1/decode.md 2>/dev/null)" >> $L
}
# PRE for the several-token calls' units forced (at B=8 every MoE call is an 8-token one)
units() { echo "import te_async.token_ffn as tf; tf.plan_tokens = lambda *a: tf.Split($1, 1); "; }
if [ "${SHORT:-0}" = 1 ]; then  # a short call (under 4 minutes): the trace, then B=8 against main
  trace shared; gen counter ds8_counter deepseek-v2-lite 8 --no-profile; gen main ds8_main deepseek-v2-lite 8 --no-profile
  pack; exit
fi
gpu_tests counter $R/tests_counter.log 150 $x /tmp/tdt/tests/test_token_moe.py /tmp/tdt/tests/test_token_ffn.py \
  /tmp/tdt/tests/test_models_gpu.py /tmp/tdt/tests/test_decode_moe_gpu.py
trace shared
trace independent
gen counter ds8_counter deepseek-v2-lite 8
echo "ds8_counter trip: $(sed -n '/One trip/,$p' $R/ds8_counter/generate_timeline_B8_kernels.md 2>/dev/null | grep -E '^\|' | head -40 | tr '\n' ' ')" >> $L
gen main ds8_main deepseek-v2-lite 8 --no-profile
for v in counter_1 main_1 main_2 counter_2; do gen ${v%_*} ds1_$v deepseek-v2-lite 1 --no-profile; done
gen counter qw8_counter qwen3-30b-a3b 8 --no-profile
gen main qw8_main qwen3-30b-a3b 8 --no-profile
dec counter; dec main
PRE=$(units 64) gen counter ds8_u64 deepseek-v2-lite 8 --no-profile
trace shared 64
gen counter ds4_counter deepseek-v2-lite 4 --no-profile
gen main ds4_main deepseek-v2-lite 4 --no-profile
pack
