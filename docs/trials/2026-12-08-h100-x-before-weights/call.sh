#!/bin/bash
# One call, about 6 minutes (README.md): "xfirst" = main + x_before_weights.patch, "xroute" = main +
# route_x_first.patch, "main" = main's wheel, all built on the CPU machine. bench generate B=1 DeepSeek-V2-Lite and
# Qwen3-30B-A3B (24 of 48 layers) alternated xfirst / xroute / main / main / xroute / xfirst, GPU tests of the
# changed callers (poisoned outputs), the input projections' phases with xfirst (.gpubuild/xfirst_stamps: +
# p1_stamps.patch), profiled DeepSeek runs of xfirst and xroute (the trips).
set -u
S=$PWD; R=/tmp/xf; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
wheels main xfirst xroute xfirst_stamps
for p in "deepseek deepseek-v2-lite" "qwen3 qwen3-30b-a3b"; do
  set -- $p
  for v in xfirst_1 xroute_1 main_1 main_2 xroute_2 xfirst_2; do generate ${v%_*} $1_$v $2 --no-profile; done
done
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
gpu_tests xfirst $R/tests_xfirst.log 100 $x $S/tests/test_mla_token.py $S/tests/test_gqa_token.py $S/tests/test_models_gpu.py
gpu_tests xroute $R/tests_xroute.log 60 $x $S/tests/test_token_moe.py $S/tests/test_token_ffn.py
generate xfirst_stamps stamps_run deepseek-v2-lite --no-profile
python3 $S/docs/results/2026-12-07-h100-input-projections-phases/p1_summary.py $R/stamps_run.log >> $L 2>&1
for w in xfirst xroute; do
  generate $w deepseek_${w}_profiled deepseek-v2-lite
  echo "deepseek_${w}_profiled: $(sed -n '/One trip/,$p' $R/deepseek_${w}_profiled/generate_timeline_B1_kernels.md | grep -E 'Product|MlaToken|Route|TokenFfn|Reduce|Decode' | tr '\n' ' ')" >> $L
done
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log
tar czf $OUT/results.tgz -C $R --exclude=traces .
cat $L
