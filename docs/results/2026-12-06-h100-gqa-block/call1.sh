#!/bin/bash
# gqa_token_block (the whole grouped-query attention half of a layer in one call) on the GPU: its tests
# and mla_token's (the product kernel moved to token_product.cuh) with poisoned outputs, memcheck of
# the block's kernel tests, then bench generate Qwen3-30B-A3B (24 layers) B=1 with the block ("block")
# against gqa_token_attention's call alone ("call": block_takes patched off, main's path), alternating
# twice, each profiled; then Qwen3 B=8 forced (TE_ASYNC_DECODE_ATTENTION=te_async, the block) and off.
# Carry .gpubuild (the wheel in .gpubuild/block).
set -u
S=$PWD; R=/tmp/gqablk; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
export TE_ASYNC_COMMIT=${TE_ASYNC_COMMIT:-unknown}
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
python3 -m pip install -q --no-deps --target /tmp/w_blk $(ls .gpubuild/block/te_async-*.whl) > $R/install.log 2>&1
for d in . bench models; do cp te_async/$d/*.py /tmp/w_blk/te_async/$d/; done
export PYTHONPATH=/tmp/w_blk
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false step 170 $R/tests.log python3 -P -m pytest -q -n 4 \
  -p no:cacheprovider --rootdir=$S $S/tests/test_gqa_token.py $S/tests/test_mla_token.py $S/tests/test_models_gpu.py
echo "tests (at $((SECONDS - T0)) s): $(tail -1 $R/tests.log)" >> $L; grep -E "^(FAILED|ERROR)|^E  " $R/tests.log | head -20 >> $L
gen() {  # gen <name> <batch> <python prefix> [env]
  XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 \
    step 60 $R/gen_$1_B$2.log env ${4:-X=} python3 -P -c "$3import runpy, sys; sys.argv = ['te_async.bench'] + sys.argv[1:]; runpy.run_module('te_async.bench', run_name='__main__')" \
    generate --preset qwen3-30b-a3b --layers 24 --batches $2 --modes device --steps 60 --no-plots --out $R/gen_$1_B$2
  echo "$1 B=$2 ${4:-} (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/gen_$1_B$2/generate.md 2>/dev/null)" >> $L
}
CALL="import te_async.gqa_token as g; g.block_takes = lambda *a, **k: False; "
gen block1 1 ""; gen call1 1 "$CALL"; gen call2 1 "$CALL"; gen block2 1 ""
for w in block1 call1; do echo "B1 trip, $w:" >> $L; sed -n '/One trip/,$p' $R/gen_${w}_B1/generate_timeline_B1_kernels.md >> $L 2>/dev/null; done
TE_ASYNC_POISON_OUTPUTS=1 step 80 $R/memcheck.log compute-sanitizer --tool memcheck --print-limit 20 \
  python3 -P -m pytest -q -p no:cacheprovider --rootdir=$S $S/tests/test_gqa_token.py -k "block and not model"
echo "memcheck (at $((SECONDS - T0)) s): $(grep -E 'ERROR SUMMARY|passed|failed' $R/memcheck.log | tail -3 | tr '\n' ' ')" >> $L
gen forced 8 "" TE_ASYNC_DECODE_ATTENTION=te_async; gen off 8 ""
for w in forced off; do echo "B8 trip, $w:" >> $L; sed -n '/One trip/,$p' $R/gen_${w}_B8/generate_timeline_B8_kernels.md >> $L 2>/dev/null; done
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log; tar czf $OUT/results.tgz -C $R --exclude=traces .
cat $L
