#!/bin/bash
# Stop 66, one call: the wheel built on the CPU machine from the tree with route_rows (.gpubuild/rr1, carried)
# and the tree's Python. 1. the GPU tests of route_rows and of the paths beside it, poisoned; 2. memcheck of
# route_rows' kernel tests; 3. the A/B on that one wheel, route_rows on ("new") and off ("old": applies()
# patched to False, moe_block's path before it), alternating: bench decode device T = 2 4 8 16 (T = 8
# profiled: kernels a layer); a second alternation in the time left.
set -u
S=$PWD; R=/tmp/s66; rm -rf $R; mkdir -p $R; T0=$SECONDS; L=$OUT/summary.txt; LIMIT=${LIMIT:-578}
left() { echo $((LIMIT - (SECONDS - T0))); }
step() {  # step <seconds it may take> <log> <command...>
  local want=$1 log=$2; shift 2; local t=$(left)
  if [ "$t" -lt 25 ]; then echo "skipped (no time): $*" >> $L; return 1; fi
  [ "$want" -gt $((t - 10)) ] && want=$((t - 10))
  (cd / && timeout $want "$@") >> $log 2>&1
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
python3 -m pip install --no-deps --force-reinstall $(ls .gpubuild/rr1/te_async-*.whl) > $R/install.log 2>&1
site=$(cd / && python3 -c "import te_async, os; print(os.path.dirname(te_async.__file__))")
cp te_async/*.py $site/ && cp te_async/bench/*.py $site/bench/ && cp te_async/models/*.py $site/models/
(cd / && python3 -P -c "import jax, te_async; from te_async import _ffi; print('jax', jax.__version__, 'cutlass', _ffi.cuda_module().CUTLASS_BUILT)") >> $L 2>&1
echo "installed at $((SECONDS - T0)) s" >> $L
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false step 150 $R/tests.log python3 -P -m pytest -q -n 12 \
  -p no:cacheprovider --rootdir=$S $S/tests/test_route_rows.py $S/tests/test_routing.py $S/tests/test_moe.py \
  $S/tests/test_decode_moe_gpu.py $S/tests/test_token_moe.py $S/tests/test_bench_decode.py
echo "tests (at $((SECONDS - T0)) s): $(tail -1 $R/tests.log)" >> $L; grep -E "^(FAILED|ERROR)" $R/tests.log | head -20 >> $L
grep -E "^E  " $R/tests.log | head -30 >> $L
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
for w in new old; do echo "T8 kernels, $w:" >> $L; head -14 $R/decode_${w}_1/decode_timeline_T8_kernels.md >> $L 2>/dev/null; done
tar czf $OUT/partial.tgz -C $R --exclude=traces . 2>/dev/null
decode old 2; decode new 2
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false step 120 $R/memcheck.log compute-sanitizer --tool memcheck \
  --print-limit 20 python3 -P -m pytest -q -p no:cacheprovider --rootdir=$S $S/tests/test_route_rows.py -k "kernel_against or adversarial"
echo "memcheck (at $((SECONDS - T0)) s): $(grep -E 'ERROR SUMMARY|passed|failed' $R/memcheck.log | tail -3 | tr '\n' ' ')" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log 2>/dev/null
tar czf $OUT/results.tgz -C $R --exclude=traces .
rm -f $OUT/partial.tgz
cat $L
