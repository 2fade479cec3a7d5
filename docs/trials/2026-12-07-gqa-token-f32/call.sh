#!/bin/bash
# The trial of README.md: the patched wheel's GPU tests (poisoned) and memcheck, bench generate B=1 patched
# ("f32") against main ("base") alternating twice (Qwen3-30B-A3B 24 layers), then the profiled B=8 step with
# gqa_token forced (TE_ASYNC_DECODE_ATTENTION=te_async) and off, on main's wheel.
set -u
S=$PWD; R=/tmp/gqaf32; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
export TE_ASYNC_COMMIT=${TE_ASYNC_COMMIT:-5731464}  # the bench JSONs: main (base); f32 is main with the patch
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
git apply docs/trials/2026-12-07-gqa-token-f32/prep_reads_f32.patch
mkdir -p /tmp/py_f32; cp -r te_async /tmp/py_f32/; git apply -R docs/trials/2026-12-07-gqa-token-f32/prep_reads_f32.patch
for w in base f32; do
  python3 -m pip install -q --no-deps --target /tmp/w_$w $(ls .gpubuild/$w/te_async-*.whl) > $R/install_$w.log 2>&1
done
for d in . bench models; do cp te_async/$d/*.py /tmp/w_base/te_async/$d/; cp /tmp/py_f32/te_async/$d/*.py /tmp/w_f32/te_async/$d/; done
git apply docs/trials/2026-12-07-gqa-token-f32/prep_reads_f32.patch  # the patched tests for the f32 wheel
PYTHONPATH=/tmp/w_f32 TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false step 150 $R/tests.log python3 -P -m pytest \
  -q -n 4 -p no:cacheprovider --rootdir=$S $S/tests/test_gqa_token.py $S/tests/test_models_gpu.py
echo "f32 tests (at $((SECONDS - T0)) s): $(tail -1 $R/tests.log)" >> $L; grep -E "^(FAILED|ERROR)|^E  " $R/tests.log | head -20 >> $L
PYTHONPATH=/tmp/w_f32 TE_ASYNC_POISON_OUTPUTS=1 step 80 $R/memcheck.log compute-sanitizer --tool memcheck --print-limit 20 \
  python3 -P -m pytest -q -p no:cacheprovider --rootdir=$S $S/tests/test_gqa_token.py -k "unfused_path or bad_position"
echo "memcheck (at $((SECONDS - T0)) s): $(grep -E 'ERROR SUMMARY|passed|failed' $R/memcheck.log | tail -3 | tr '\n' ' ')" >> $L
git apply -R docs/trials/2026-12-07-gqa-token-f32/prep_reads_f32.patch
gen() {  # gen <wheel> <run> <batch> [env]
  PYTHONPATH=/tmp/w_$1 XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 \
    step 60 $R/gen_$1_$2_B$3.log env ${4:-X=} python3 -P -m te_async.bench generate --preset qwen3-30b-a3b --layers 24 \
    --batches $3 --modes device --steps 60 --no-plots --out $R/gen_$1_$2_B$3
  echo "$1 $2 B=$3 ${4:-} (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/gen_$1_$2_B$3/generate.md 2>/dev/null)" >> $L
}
gen f32 1 1; gen base 1 1; gen base 2 1; gen f32 2 1
gen base forced 8 TE_ASYNC_DECODE_ATTENTION=te_async; gen base off 8
for w in forced off; do echo "B8 trip, $w:" >> $L; sed -n '/One trip/,$p' $R/gen_base_${w}_B8/generate_timeline_B8_kernels.md >> $L 2>/dev/null; done
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log; tar czf $OUT/results.tgz -C $R --exclude=traces .
cat $L
