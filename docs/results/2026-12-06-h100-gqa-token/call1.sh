#!/bin/bash
# Stop 67, call 1 (kind nvidia-h200 asked; an H100 is what usually comes): 90a97c9's wheel (.gpubuild/90a97c9).
# 1. GPU tests, poisoned: test_gqa_token, test_decode_attention, test_mla_token, test_models_gpu, and main's files
#    that have not run on a GPU since before stop 62 (test_bench_generate, test_torch_decode_step, test_models,
#    test_models_hf_parity, test_flax, test_sharding, test_manual_axes, test_import_from_source) and test_moe
#    (509b6fa's fix). 2. bench generate B=1, gqa_token on ("new") and off ("old": gqa_token.takes patched to False),
#    alternating twice: Qwen3-30B-A3B 24 layers, Mixtral-8x7B 8 layers; DeepSeek-V2-Lite once.
set -u
S=$PWD; R=/tmp/s67a; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
python3 -m pip install -q --no-deps --target /tmp/w67 $(ls .gpubuild/90a97c9/te_async-*.whl) > $R/install.log 2>&1
for d in . bench models; do cp te_async/$d/*.py /tmp/w67/te_async/$d/; done
export PYTHONPATH=/tmp/w67 TE_ASYNC_COMMIT=451b767
echo "installed at $((SECONDS - T0)) s: $(cd / && python3 -P -c 'import jax, te_async; print(jax.__version__, te_async.__file__)')" >> $L
OLD="import te_async.gqa_token as g; g.takes = lambda *a, **k: False; "
gen() {  # gen <new|old> <run> <preset> <layers> [extra]
  local pre=""; [ $1 = old ] && pre="$OLD"
  XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step 100 \
    $R/$3_$1_$2.log python3 -P -c \
    "${pre}import runpy, sys; sys.argv = ['te_async.bench'] + sys.argv[1:]; runpy.run_module('te_async.bench', run_name='__main__')" \
    generate --preset $3 --layers $4 --batches 1 --modes device --steps 60 --no-plots --out $R/$3_$1_$2 ${5:-}
  echo "$3 $1 $2 (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/$3_$1_$2/generate.md 2>/dev/null)" >> $L
}
gen new 1 qwen3-30b-a3b 24; gen old 1 qwen3-30b-a3b 24
for w in new old; do echo "qwen3 B1 trip, $w:" >> $L; sed -n '/One trip/,$p' $R/qwen3-30b-a3b_${w}_1/generate_timeline_B1_kernels.md >> $L 2>/dev/null; done
tar czf $OUT/partial.tgz -C $R --exclude=traces . 2>/dev/null
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false step 260 $R/tests.log python3 -P -m pytest -q -n 8 \
  -p no:cacheprovider --rootdir=$S $S/tests/test_gqa_token.py $S/tests/test_decode_attention.py $S/tests/test_mla_token.py \
  $S/tests/test_models_gpu.py $S/tests/test_bench_generate.py $S/tests/test_torch_decode_step.py $S/tests/test_models.py \
  $S/tests/test_models_hf_parity.py $S/tests/test_flax.py $S/tests/test_sharding.py $S/tests/test_manual_axes.py \
  $S/tests/test_import_from_source.py $S/tests/test_moe.py
echo "tests (at $((SECONDS - T0)) s): $(tail -1 $R/tests.log)" >> $L; grep -E "^(FAILED|ERROR)|^E  " $R/tests.log | head -30 >> $L
gen old 2 qwen3-30b-a3b 24 --no-profile; gen new 2 qwen3-30b-a3b 24 --no-profile
gen new 1 mixtral-8x7b 8; gen old 1 mixtral-8x7b 8
gen old 2 mixtral-8x7b 8 --no-profile; gen new 2 mixtral-8x7b 8 --no-profile
gen new 1 deepseek-v2-lite 27 --no-profile
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log 2>/dev/null
tar czf $OUT/results.tgz -C $R --exclude=traces .
rm -f $OUT/partial.tgz
cat $L
