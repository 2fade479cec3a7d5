#!/bin/bash
# One call, about 9 minutes (README.md). Wheels, all built on the CPU machine: "main" = main's; "xfirst" = main +
# x_before_weights.patch; "xmoe" = main + moe_x_first.patch; "xturn" = main + moe_x_first_fc2_ahead.patch; "sh64" =
# main + shared_sectors.patch (its Python applied over the wheel's, its tests in a copy of tests/); "xfirst_stamps" =
# xfirst + p1_stamps.patch. bench generate B=1: DeepSeek-V2-Lite alternated xfirst / xmoe / xturn / sh64 / main /
# main / sh64 / xturn / xmoe / xfirst, Qwen3-30B-A3B (24 of 48 layers, no shared experts) xfirst / xmoe / main / main
# / xmoe / xfirst; GPU tests of each change (poisoned outputs); the input projections' phases with xfirst; profiled
# DeepSeek runs of each (the trips). What the call's limit cuts is skipped (tools/device_call.sh).
set -u
S=$PWD; R=/tmp/xf; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
wheels main xfirst xmoe xturn sh64
T=$S/docs/results/2026-12-07-h100-x-before-weights
(cd /tmp/w_sh64 && git apply --include='te_async/*' $T/shared_sectors.patch) >> $L 2>&1
rm -rf /tmp/sh64t && mkdir -p /tmp/sh64t && cp -r $S/tests /tmp/sh64t/ && (cd /tmp/sh64t && git apply --include='tests/*' $T/shared_sectors.patch) >> $L 2>&1
for v in xfirst_1 xmoe_1 xturn_1 sh64_1 main_1 main_2 sh64_2 xturn_2 xmoe_2 xfirst_2; do
  generate ${v%_*} deepseek_$v deepseek-v2-lite --no-profile
done
for v in xfirst_1 xmoe_1 main_1 main_2 xmoe_2 xfirst_2; do generate ${v%_*} qwen3_$v qwen3-30b-a3b --no-profile; done
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
gpu_tests xfirst $R/tests_xfirst.log 100 $x $S/tests/test_mla_token.py $S/tests/test_gqa_token.py $S/tests/test_models_gpu.py
gpu_tests xmoe $R/tests_xmoe.log 60 $x $S/tests/test_token_moe.py $S/tests/test_token_ffn.py
gpu_tests xturn $R/tests_xturn.log 60 $x $S/tests/test_token_moe.py $S/tests/test_token_ffn.py
gpu_tests sh64 $R/tests_sh64.log 90 $x /tmp/sh64t/tests/test_token_ffn.py /tmp/sh64t/tests/test_token_moe.py \
  /tmp/sh64t/tests/test_models_gpu.py
if [ -d .gpubuild/xfirst_stamps ]; then  # carried only where the tree leaves room (64 MiB with the rest)
  wheels xfirst_stamps
  generate xfirst_stamps stamps_run deepseek-v2-lite --no-profile
  python3 $S/docs/results/2026-12-07-h100-input-projections-phases/p1_summary.py $R/stamps_run.log >> $L 2>&1
fi
for w in xfirst xmoe xturn sh64; do generate $w deepseek_${w}_profiled deepseek-v2-lite; trip deepseek_${w}_profiled; done
pack
