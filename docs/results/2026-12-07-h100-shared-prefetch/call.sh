#!/bin/bash
# Call 2: "pf2" = main + the layer's shared experts' w_gate_up (and the router) prefetched into L2 by the
# attention call (mla_token.cu, TE_ASYNC_TRIAL_PREFETCH=<prep|merge|oproj>:<MiB>[:router]; unset: none),
# built on the CPU machine. bench generate B=1 DeepSeek-V2-Lite alternated over the variants, GPU tests
# (poisoned), a profiled run of each of off and oproj:22:router (the trip). Call 1 ran prep/merge (README).
set -u
S=$PWD; R=/tmp/pf; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
wheels pf2
gen() {  # name variant [extra]
  TE_ASYNC_TRIAL_PREFETCH=$2 PYTHONPATH=/tmp/w_pf2 XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step 70 $R/$1.log python3 -P \
    -m te_async.bench generate --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --no-plots --out $R/$1 ${3:-}
  echo "generate $1 [$2] (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/$1/generate.md 2>/dev/null)" >> $L
}
i=0
for v in off oproj:22 oproj:22:router oproj:0:router oproj:0:router oproj:22:router oproj:22 off; do
  i=$((i + 1)); gen g${i}_${v/:/_} $v --no-profile
done
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
TE_ASYNC_TRIAL_PREFETCH=oproj:22:router gpu_tests pf2 $R/tests.log 200 $x $S/tests/test_mla_token.py $S/tests/test_gqa_token.py \
  $S/tests/test_models_gpu.py
for v in off oproj:22:router; do
  gen prof_${v/:/_} $v
  echo "prof $v: $(sed -n '/One trip/,$p' $R/prof_${v/:/_}/generate_timeline_B1_kernels.md | grep -E 'Product|MlaToken|Route|TokenFfn|Reduce|Decode' | tr '\n' ' ')" >> $L
done
if grep -q H200 $R/gpu.txt; then  # the issues' H200 figures, prefetch off (pf2 off = main's kernels; README)
  export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true
  PYTHONPATH=/tmp/w_pf2 step 120 $R/decode_auto.log python3 -P -m te_async.bench decode --modes device torch_graph \
    --batches 1 8 64 --unroll auto --reps 10 --no-plots --detail-batch 8 --out $R/decode_auto
  echo "--- bench decode --unroll auto (at $((SECONDS - T0)) s)" >> $L; grep -E '^\| [0-9]' $R/decode_auto/decode.md >> $L
  PYTHONPATH=/tmp/w_pf2 XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step 90 $R/qwen3.log python3 -P -m te_async.bench generate \
    --preset qwen3-30b-a3b --batches 1 --modes device --steps 60 --no-plots --no-profile --out $R/qwen3
  echo "generate qwen3 (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/qwen3/generate.md 2>/dev/null)" >> $L
fi
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log
tar czf $OUT/results.tgz -C $R --exclude=traces .
cat $L
