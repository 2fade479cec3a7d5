#!/bin/bash
# One call, about 6 minutes (README.md). Wheels built on the CPU machine from 9d9960c's C++ (main's kernels):
# "main"; "pf" = + next_layer_prefetch.patch; "pfall" = pf + pfall.patch (every block asks for its share, not only
# the shared experts'). The tree's Python is main's: the patch's Python goes over pf's and pfall's wheels, its tests
# into a copy of tests/. In the order of what matters most where the call's limit cuts (tools/device_call.sh): bench
# generate B=1 DeepSeek-V2-Lite pf and main alternated (3 each), a profiled run of each with its trip, GPU tests of pf
# (poisoned outputs), pfall 3 times, Qwen3-30B-A3B on 24 layers (no shared experts, so pf and pfall are alike there)
# 2 each of pf and main.
set -u
S=$PWD; R=/tmp/pf; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
T=$S/docs/trials/2026-12-08-h100-next-layer-prefetch
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
wheels main pf pfall
for w in pf pfall; do (cd /tmp/w_$w && git apply --include='te_async/*' $T/next_layer_prefetch.patch) >> $L 2>&1; done
rm -rf /tmp/pft && mkdir -p /tmp/pft && cp -r $S/tests /tmp/pft/ && (cd /tmp/pft && git apply --include='tests/*' $T/next_layer_prefetch.patch) >> $L 2>&1
for v in pf_1 main_1 main_2 pf_2 pf_3 main_3; do generate ${v%_*} deepseek_$v deepseek-v2-lite --no-profile; done
for w in pf main; do generate $w deepseek_${w}_profiled deepseek-v2-lite; trip deepseek_${w}_profiled; done
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
gpu_tests pf $R/tests_pf.log 150 $x /tmp/pft/tests/test_token_moe.py /tmp/pft/tests/test_token_ffn.py \
  /tmp/pft/tests/test_mla_decode.py /tmp/pft/tests/test_models_gpu.py
for v in pfall_1 pfall_2 pfall_3; do generate ${v%_*} deepseek_$v deepseek-v2-lite --no-profile; done
for v in pf_1 main_1 main_2 pf_2; do generate ${v%_*} qwen3_$v qwen3-30b-a3b --no-profile; done
pack
