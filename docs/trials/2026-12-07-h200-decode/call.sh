#!/bin/bash
# One call on an H200 (kind nvidia-h200, see README; carry .whl, and .gpubuild/prebuilt if it holds a wheel of main), about 9 minutes. $OUT/summary.txt, results.tgz.
# 1. stop 60's stripe read probe on the H200 (does it read 256-byte pieces faster than 128 by more
#    than the H100's 2-3 %?).
# 2. main built with CUTLASS for sm_90a: bench decode device T = 1 8 64 (the issues' H200 figures,
#    the layers written out by --unroll auto; PyTorch's CUDA-graph step beside it at --unroll auto) and T = 1 8 scanned (--unroll never),
#    each row also timed as a donated loop (loop_ms, since stop 61).
# 3. bench generate B = 1 (#17's figure), token_ffn's plan against main's before c79e423, alternating
#    twice; then GPU tests in the time left.
set -u
T=docs/trials/2026-12-07-h200-decode; R=/tmp/h2d; rm -rf $R; mkdir -p $R; T0=$SECONDS; S=$PWD; L=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
# A wheel of main built on the CPU machine (tools/build_device_wheel.sh, copied to .gpubuild/prebuilt/
# and carried) saves the build; else main is built here, beside the probe.
pre=$(ls .gpubuild/prebuilt/te_async-*.whl 2>/dev/null | head -n 1)
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/cutlass')" .whl/nvidia_cutlass-*.whl
if [ -n "$pre" ]; then mkdir -p /tmp/wheel_main && cp "$pre" /tmp/wheel_main/; else
  CUTLASS_INCLUDE_DIR=/tmp/cutlass/cutlass_library/source/include CMAKE_BUILD_PARALLEL_LEVEL=14 python3 -m pip wheel \
  --no-build-isolation --no-deps --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=ON --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real \
  -w /tmp/wheel_main . > $R/build.log 2>&1 &
fi
nvcc -O3 -std=c++17 -arch=sm_90a docs/results/2026-12-06-h100-kn-reads/stripe_read_probe.cu -o $R/srp > $R/probe_build.log 2>&1
for n in 34 64 34 64; do $R/srp $n >> $R/probe.txt 2>&1; done; cat $R/probe.txt >> $L
wait
rm -rf /tmp/w_main; mkdir -p /tmp/w_main
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" /tmp/wheel_main/te_async-*.whl /tmp/w_main
[ -n "$pre" ] && for d in . bench models; do cp te_async/$d/*.py /tmp/w_main/te_async/$d/; done  # the tree's Python, as PREBUILT
echo "built at $((SECONDS - T0)) s: $(ls /tmp/wheel_main)" >> $L
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true  # the profiled step keeps the timed step's graphs
for u in auto never; do
  b="1 8"; m=device; [ $u = auto ] && b="1 8 64" && m="device torch_graph"
  (cd / && PYTHONPATH=/tmp/w_main timeout 120 python3 -P -m te_async.bench decode --modes $m --batches $b --unroll $u \
    --reps 10 --no-plots --detail-batch 8 --out $R/decode_$u) > $R/decode_$u.log 2>&1
  echo "--- bench decode --unroll $u (at $((SECONDS - T0)) s)" >> $L; grep -E '^\| [0-9]' $R/decode_$u/decode.md >> $L
done
# generate B = 1 with token_ffn's plan (clusters of two blocks since c79e423) and, as "old", with
# main's plan before it forced (one block an item), alternating twice: is the H100's FILL right here?
OLD="import te_async.token_ffn as tf; old = {(6, 1408, 2816): 48, (0, 0, 10944): 48}; tf.plan_split = lambda k, f, fs, *a: tf.Split(old[(k, f, fs)], 1); "
for run in 1 2; do
  for w in new old; do
    pre=""; [ $w = old ] && pre="$OLD"
    (cd / && PYTHONPATH=/tmp/w_main timeout 120 python3 -P -c "${pre}import runpy, sys; sys.argv = ['te_async.bench'] + sys.argv[1:]; runpy.run_module('te_async.bench', run_name='__main__')" \
      generate --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --no-plots --out $R/generate_${w}_$run) > $R/generate_${w}_$run.log 2>&1
    echo "generate $w $run (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/generate_${w}_$run/generate.md)" >> $L
  done
done
# gqa_token (stop 67, table GT: Qwen3-30B-A3B B=1 1.105x on an H100 with 24 layers; since stop 68 the block, table GB):
# the whole model here, both calls on and off
GQA_OFF="import te_async.gqa_token as g; g.takes = g.block_takes = lambda *a, **k: False; "
for w in new old; do
  pre=""; [ $w = old ] && pre="$GQA_OFF"
  (cd / && PYTHONPATH=/tmp/w_main XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 timeout 90 python3 -P -c "${pre}import runpy, sys; sys.argv = ['te_async.bench'] + sys.argv[1:]; runpy.run_module('te_async.bench', run_name='__main__')" \
    generate --preset qwen3-30b-a3b --batches 1 --modes device --steps 60 --no-plots --no-profile --out $R/qwen3_gqa_$w) > $R/qwen3_gqa_$w.log 2>&1
  echo "qwen3 gqa_token $w (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/qwen3_gqa_$w/generate.md)" >> $L
done
left=$((570 - (SECONDS - T0))); [ $left -lt 30 ] && left=1  # timeout 0 would mean no limit
x=; python3 -c "import xdist" 2>/dev/null && x="-n 4"
(cd / && PYTHONPATH=/tmp/w_main TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout $left python3 -P -m pytest -q $x \
  -p no:cacheprovider --rootdir=$S $S/tests/test_bench_decode.py $S/tests/test_models_gpu.py $S/tests/test_decode_moe_gpu.py $S/tests/test_torch_decode_step.py) > $R/tests.log 2>&1
echo "tests ($left s allowed): $(tail -1 $R/tests.log)" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip $R/tests.log
tar czf $OUT/results.tgz -C $R --exclude='traces' --exclude='srp' .
cat $L
