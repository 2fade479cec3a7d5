#!/bin/bash
# Stop 65, one call: the wheel built on the CPU machine from ab34202 (main + the small_groups tail split,
# .gpubuild/s65/wheel) with the tree's Python; the GPU tests that reach small_groups, poisoned; then the A/B
# on that one wheel, TE_ASYNC_SMALL_GROUPS_TAIL_SLICES = 1 (each last-round item on one block: the kernel
# before), 2 (the default) and 4, alternating: bench decode-gemm device T = 2 4 8 16 (the expert GEMMs of a
# layer against their floor; CUTLASS from 32), bench decode device T = 2 8 16 (the T = 8 step profiled);
# a second alternation of both in the time left.
set -u
S=$PWD; R=/tmp/s65; rm -rf $R; mkdir -p $R; T0=$SECONDS; L=$OUT/summary.txt; LIMIT=${LIMIT:-578}
left() { echo $((LIMIT - (SECONDS - T0))); }
step() {  # step <seconds it may take> <log> <command...>
  local want=$1 log=$2; shift 2; local t=$(left)
  if [ "$t" -lt 25 ]; then echo "skipped (no time): $*" >> $L; return 1; fi
  [ "$want" -gt $((t - 10)) ] && want=$((t - 10))
  (cd / && timeout $want "$@") >> $log 2>&1
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
python3 -m pip install --no-deps --force-reinstall $(ls .gpubuild/s65/wheel/te_async-*.whl) > $R/install.log 2>&1
site=$(cd / && python3 -c "import te_async, os; print(os.path.dirname(te_async.__file__))")
cp te_async/*.py $site/ && cp te_async/bench/*.py $site/bench/ && cp te_async/models/*.py $site/models/
(cd / && python3 -P -c "import jax, te_async; from te_async import _ffi; print('jax', jax.__version__, 'cutlass', _ffi.cuda_module().CUTLASS_BUILT)") >> $L 2>&1
echo "installed at $((SECONDS - T0)) s" >> $L
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false step 170 $R/tests.log python3 -P -m pytest -q -n 12 \
  -p no:cacheprovider --rootdir=$S $S/tests/test_gpu_device_mode.py $S/tests/test_dense.py $S/tests/test_decode_moe_gpu.py \
  $S/tests/test_models_gpu.py
echo "tests (at $((SECONDS - T0)) s): $(tail -1 $R/tests.log)" >> $L; grep -E "^(FAILED|ERROR)" $R/tests.log | head -20 >> $L
export TE_ASYNC_COMMIT=ab34202
gemm() {  # gemm <slices> <run>
  TE_ASYNC_SMALL_GROUPS_TAIL_SLICES=$1 step 50 $R/gemm_$1_$2.log python3 -P -m te_async.bench decode-gemm \
    --modes device --batches 2 4 8 16 --reps 10 --out $R/gemm_$1_$2
  echo "decode-gemm slices $1 run $2 (at $((SECONDS - T0)) s):" >> $L; grep -E '^\| [0-9]' $R/gemm_$1_$2/*.md >> $L 2>/dev/null
}
decode() {  # decode <slices> <run>
  XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true TE_ASYNC_SMALL_GROUPS_TAIL_SLICES=$1 step 60 \
    $R/decode_$1_$2.log python3 -P -m te_async.bench decode --modes device --batches 2 8 16 --reps 10 --no-plots \
    --detail-batch 8 --out $R/decode_$1_$2
  echo "decode slices $1 run $2 (at $((SECONDS - T0)) s):" >> $L; grep -E '^\| [0-9]' $R/decode_$1_$2/decode.md >> $L 2>/dev/null
}
for n in 1 2 4; do gemm $n 1; done
for n in 1 2 4; do decode $n 1; done
for n in 1 2; do echo "T8 kernels, slices $n:" >> $L; head -12 $R/decode_${n}_1/decode_timeline_T8_kernels.md >> $L 2>/dev/null; done
tar czf $OUT/partial.tgz -C $R --exclude=traces . 2>/dev/null
for n in 4 2 1; do gemm $n 2; done
for n in 4 2 1; do decode $n 2; done
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log 2>/dev/null
tar czf $OUT/results.tgz -C $R --exclude=traces .
rm -f $OUT/partial.tgz
cat $L
