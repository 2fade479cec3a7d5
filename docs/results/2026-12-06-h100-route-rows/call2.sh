#!/bin/bash
# Stop 66, call 2: route_rows' second kernel (v2: the router's rows copied during the norm, every block its own
# sums of squares, thread (token, 16-byte vector of experts, group of rows) for the logits; .gpubuild/rr2)
# against call 1's (v1, .gpubuild/rr1, 18 us a layer at T = 8). 1. v2's GPU tests, poisoned; 2. bench decode
# device T = 2 4 8 16, v2 on ("new") and off ("old": applies() patched to False), alternating; 3. ncu of one
# RouteRowsKernel launch at T = 8, v1 and v2 (warp stalls, the hottest SASS); 4. a second alternation;
# 5. memcheck of route_rows' kernel tests on v2.
set -u
S=$PWD; R=/tmp/s66b; rm -rf $R; mkdir -p $R; T0=$SECONDS; L=$OUT/summary.txt; LIMIT=${LIMIT:-575}
left() { echo $((LIMIT - (SECONDS - T0))); }
step() {  # step <seconds it may take> <log> <command...>
  local want=$1 log=$2; shift 2; local t=$(left)
  if [ "$t" -lt 25 ]; then echo "skipped (no time): $*" >> $L; return 1; fi
  [ "$want" -gt $((t - 10)) ] && want=$((t - 10))
  (cd / && timeout $want "$@") >> $log 2>&1
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
for v in 1 2; do
  python3 -m pip install -q --no-deps --target /tmp/w$v $(ls .gpubuild/rr$v/te_async-*.whl) > $R/install$v.log 2>&1
  for d in . bench models; do cp te_async/$d/*.py /tmp/w$v/te_async/$d/; done
done
export PYTHONPATH=/tmp/w2
echo "installed at $((SECONDS - T0)) s: $(cd / && python3 -P -c 'import jax, te_async; print(jax.__version__, te_async.__file__)')" >> $L
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false step 140 $R/tests.log python3 -P -m pytest -q -n 12 \
  -p no:cacheprovider --rootdir=$S $S/tests/test_route_rows.py $S/tests/test_routing.py $S/tests/test_moe.py \
  $S/tests/test_decode_moe_gpu.py $S/tests/test_token_moe.py $S/tests/test_bench_decode.py
echo "tests (at $((SECONDS - T0)) s): $(tail -1 $R/tests.log)" >> $L; grep -E "^(FAILED|ERROR)|^E  " $R/tests.log | head -30 >> $L
export TE_ASYNC_COMMIT=${TE_ASYNC_COMMIT:-unknown}
OLD="import te_async.route_rows as rr; rr.applies = lambda *a, **k: False; "
decode() {  # decode <new|old> <run>
  local pre=""; [ $1 = old ] && pre="$OLD"
  XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true step 75 $R/decode_$1_$2.log python3 -P -c \
    "${pre}import runpy, sys; sys.argv = ['te_async.bench'] + sys.argv[1:]; runpy.run_module('te_async.bench', run_name='__main__')" \
    decode --modes device --batches 2 4 8 16 --reps 10 --no-plots --detail-batch 8 --out $R/decode_$1_$2
  echo "decode $1 run $2 (at $((SECONDS - T0)) s):" >> $L; grep -E '^\| [0-9]' $R/decode_$1_$2/decode.md >> $L 2>/dev/null
}
decode new 1; decode old 1
for w in new old; do echo "T8 kernels, $w:" >> $L; sed -n '1,20p' $R/decode_${w}_1/decode_timeline_T8_kernels.md >> $L 2>/dev/null; done
tar czf $OUT/partial.tgz -C $R --exclude=traces . 2>/dev/null
P=$S/docs/results/2026-12-06-h100-route-rows/ncu_probe.py
for v in 1 2; do
  PYTHONPATH=/tmp/w$v step 60 $R/ncu_v$v.txt ncu --clock-control none --kernel-name regex:RouteRows --launch-skip 2 \
    --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters python3 -P $P 8
  echo "--- ncu v$v T = 8 (at $((SECONDS - T0)) s)" >> $L
  grep -iE "duration|stall|warp cycles per|issued warp" $R/ncu_v$v.txt | cut -c1-220 | head -30 >> $L
done
decode old 2; decode new 2
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false step 100 $R/memcheck.log compute-sanitizer --tool memcheck \
  --print-limit 20 python3 -P -m pytest -q -p no:cacheprovider --rootdir=$S $S/tests/test_route_rows.py -k "kernel_against or adversarial"
echo "memcheck (at $((SECONDS - T0)) s): $(grep -E 'ERROR SUMMARY|passed|failed' $R/memcheck.log | tail -3 | tr '\n' ' ')" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log 2>/dev/null
tar czf $OUT/results.tgz -C $R --exclude=traces .
rm -f $OUT/partial.tgz
cat $L
