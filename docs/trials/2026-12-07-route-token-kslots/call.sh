#!/bin/bash
# One device call (about 6 minutes, nothing carried): main (this tree) and main + route_token_kslots.patch,
# each built without CUTLASS for sm_90a in its own copy, in parallel (../build_pair.sh; B = 1 runs no CUTLASS kernel);
# the route probe of RouteTokenKernel is the step itself: bench generate at B = 1, device mode,
# old / new alternating three times, one profiled run each; then the token tests of the new build,
# poisoned. Outputs under $OUT (summary.txt, results.tgz).
set -u
T=docs/trials/2026-12-07-route-token-kslots; R=/tmp/rtk; rm -rf $R; mkdir -p $R; T0=$SECONDS
L=$OUT/summary.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
bash docs/trials/build_pair.sh $T/route_token_kslots.patch $R >> $R/build.log 2>&1 || { tail -5 $R/build.log; exit 1; }
echo "built at $((SECONDS - T0)) s: $(ls /tmp/wheel_old /tmp/wheel_new | tr '\n' ' ')" >> $L
gen() {  # wheel, run label, extra args
  (cd / && PYTHONPATH=/tmp/w_$1 timeout 90 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 \
    --modes device --steps 60 --no-plots $3 --out $R/gen_$1_$2) > $R/gen_$1_$2.log 2>&1
  echo "$1 $2: $(grep -E '^\| [0-9]' $R/gen_$1_$2/generate.md | head -2 | tr '\n' ' ')" >> $L
}
for run in 1 2 3; do for v in old new; do gen $v $run --no-profile; done; done
for v in old new; do gen $v p --profile; grep -h "RouteTokenKernel" $R/gen_${v}_p/generate_timeline_B1_kernels.md >> $L; done
echo "=== bench done at $((SECONDS - T0)) s" >> $L
S=$PWD; x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
(cd / && PYTHONPATH=/tmp/w_new TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -P -m pytest -q $x \
  -p no:cacheprovider --rootdir=$S $S/tests/test_token_moe.py $S/tests/test_token_ffn.py $S/tests/test_routing.py) > $R/tests.log 2>&1
tail -2 $R/tests.log >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
tar czf $OUT/results.tgz -C $R --exclude='traces' .
cat $L
