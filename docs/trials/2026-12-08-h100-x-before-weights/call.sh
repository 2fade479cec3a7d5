#!/bin/bash
# One call, about 4 minutes (README.md): "xfirst" = main + x_before_weights.patch, "main" = main's wheel, both built
# on the CPU machine. bench generate B=1 DeepSeek-V2-Lite and Qwen3-30B-A3B (24 of 48 layers) alternated xfirst /
# main / main / xfirst, GPU tests of the changed callers (poisoned outputs), the input projections' phases with
# xfirst (.gpubuild/xfirst_stamps: + p1_stamps.patch), a profiled xfirst DeepSeek run (the trip).
set -u
S=$PWD; R=/tmp/xf; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
wheels main xfirst xfirst_stamps
for p in "deepseek deepseek-v2-lite" "qwen3 qwen3-30b-a3b"; do
  set -- $p
  generate xfirst $1_xfirst_1 $2 --no-profile; generate main $1_main_1 $2 --no-profile
  generate main $1_main_2 $2 --no-profile; generate xfirst $1_xfirst_2 $2 --no-profile
done
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
gpu_tests xfirst $R/tests.log 100 $x $S/tests/test_mla_token.py $S/tests/test_gqa_token.py $S/tests/test_models_gpu.py
generate xfirst_stamps stamps_run deepseek-v2-lite --no-profile
python3 $S/docs/results/2026-12-07-h100-input-projections-phases/p1_summary.py $R/stamps_run.log >> $L 2>&1
generate xfirst deepseek_xfirst_profiled deepseek-v2-lite
echo "deepseek_xfirst_profiled: $(sed -n '/One trip/,$p' $R/deepseek_xfirst_profiled/generate_timeline_B1_kernels.md | grep -E 'Product|MlaToken|Route|TokenFfn|Reduce|Decode' | tr '\n' ' ')" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log
tar czf $OUT/results.tgz -C $R --exclude=traces .
cat $L
