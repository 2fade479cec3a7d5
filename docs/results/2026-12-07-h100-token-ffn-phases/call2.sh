#!/bin/bash
# Stop 74, call 2: the shared experts' items cut finer beside routed choices (token_ffn.plan_split's shared_units:
# 56 units, 102 blocks, where 128 gave 44) and each shared block's first 256 rows of fc1 asked of the L2 before x's
# load and norm (PrefetchFirstRows), against main. Carry .gpubuild/new (main's wheel, 56b0272, installed with its own
# Python: the tree's passes an attribute main's kernel does not take) and .gpubuild/shared (the change).
# "pref": the change's wheel with shared_units forced to units (the prefetch alone).
set -u
S=$PWD; D=$S/docs/results/2026-12-07-h100-token-ffn-phases; R=/tmp/ffn2; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
wheels shared
python3 -m pip install -q --no-deps --target /tmp/w_main $(ls .gpubuild/new/te_async-*.whl) > /tmp/install_main.log 2>&1
PREF="import te_async.token_ffn as tf; o = tf.plan_split; tf.plan_split = lambda *a: o(*a)._replace(shared_units=o(*a).units); "
gen() {  # wheel name patch [extra]
  PYTHONPATH=/tmp/w_$1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step 60 $R/$2.log python3 -P -c "${3}import runpy, sys; \
sys.argv = ['te_async.bench'] + sys.argv[1:]; runpy.run_module('te_async.bench', run_name='__main__')" generate \
    --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --no-plots --out $R/$2 ${4:-}
  echo "generate $2 (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/$2/generate.md 2>/dev/null)" >> $L
}
gen shared new_1 "" --no-profile; gen main main_1 "" --no-profile; gen shared pref_1 "$PREF" --no-profile
gen main main_2 "" --no-profile; gen shared new_2 "" --no-profile; gen shared pref_2 "$PREF" --no-profile
gen shared new_profiled ""
echo "new_profiled: $(grep -E 'TokenFfnKernel|ReducePartials|RouteToken' $R/new_profiled/generate_timeline_B1_kernels.md | tr '\n' ' ')" >> $L
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
gpu_tests shared $R/tests.log 120 $x $S/tests/test_token_ffn.py $S/tests/test_token_moe.py $S/tests/test_models_gpu.py \
  $S/tests/test_decode_moe_gpu.py
for w in main shared; do PYTHONPATH=/tmp/w_$w step 60 $R/ffn_ab.txt python3 -P $D/ffn_ab.py $w; done
echo "--- ffn_ab (at $((SECONDS - T0)) s)" >> $L; grep -E "us GPU" $R/ffn_ab.txt >> $L
PYTHONPATH=/tmp/w_shared step 40 $R/ffn_ab.txt python3 -P -c "${PREF}import runpy, sys; sys.argv = ['x', 'pref']; \
runpy.run_path('$D/ffn_ab.py', run_name='__main__')"
grep -E "^pref" $R/ffn_ab.txt >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log
tar czf $OUT/results.tgz -C $R --exclude=traces .
cat $L
