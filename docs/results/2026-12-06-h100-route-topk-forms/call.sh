#!/bin/bash
# One device call (about 7 minutes, nothing carried): main (this tree) and main + route_topk_forms.patch,
# each built without CUTLASS for sm_90a in its own copy, in parallel (../build_pair.sh); bench generate
# B = 1 and bench decode T = 8 / 64, old and new alternating, with profiled runs; then the routing and
# token tests of the new build, poisoned. Outputs under $OUT (summary.txt, results.tgz).
set -u
T=docs/trials/2026-12-07-route-topk-forms; R=/tmp/rtf; rm -rf $R; mkdir -p $R; T0=$SECONDS
S=$PWD; L=$OUT/summary.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
bash docs/trials/build_pair.sh $T/route_topk_forms.patch $R >> $R/build.log 2>&1 || { tail -5 $R/build.log; exit 1; }
echo "built at $((SECONDS - T0)) s: $(ls /tmp/wheel_old /tmp/wheel_new | tr '\n' ' ')" >> $L
gen() {  # wheel, run label, --profile or --no-profile
  (cd / && PYTHONPATH=/tmp/w_$1 timeout 90 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 \
    --modes device --steps 60 --no-plots $3 --out $R/gen_$1_$2) > $R/gen_$1_$2.log 2>&1
  echo "generate $1 $2: $(grep -E '^\| [0-9]' $R/gen_$1_$2/generate.md | head -2 | tr '\n' ' ')" >> $L
}
dec() {  # wheel, run label, batch, --profile or --no-profile
  (cd / && PYTHONPATH=/tmp/w_$1 XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true timeout 60 python3 -P -m te_async.bench \
    decode --modes device --batches $3 --reps 10 --no-plots $4 --detail-batch $3 --out $R/dec_$1_$2_T$3) > $R/dec_$1_$2_T$3.log 2>&1
  echo "decode $1 $2 T=$3: $(grep -E '^\| [0-9]' $R/dec_$1_$2_T$3/decode.md | tr '\n' ' ')" >> $L
}
for run in 1 2 3; do for v in old new; do gen $v $run --no-profile; done; done
for v in old new; do gen $v p --profile; grep -h "RouteTokenKernel" $R/gen_${v}_p/generate_timeline_B1_kernels.md >> $L; done
for run in 1 2; do for v in old new; do dec $v $run 8 --no-profile; dec $v $run 64 --no-profile; done; done
for v in old new; do for b in 8 64; do dec $v p $b --profile; grep -h "RouteKernel" $R/dec_${v}_p_T$b/decode_timeline_T${b}_kernels.md >> $L; done; done
echo "=== bench done at $((SECONDS - T0)) s" >> $L
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
(cd / && PYTHONPATH=/tmp/w_new TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -P -m pytest -q $x \
  -p no:cacheprovider --rootdir=$S $S/tests/test_routing.py $S/tests/test_token_moe.py $S/tests/test_token_ffn.py \
  $S/tests/test_decode_moe_gpu.py) > $R/tests.log 2>&1
tail -2 $R/tests.log >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
tar czf $OUT/results.tgz -C $R --exclude='traces' .
cat $L
