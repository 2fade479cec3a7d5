#!/bin/bash
# Session 47 call 5 (no build): 167b083's wheel with HEAD's Python over it (the C++ is 167b083's); the L2 probe for the shared experts; generate B=1,2 65123b2 (old) against HEAD alternating; one profiled B=1 run of HEAD (generate's loop, layers written out); the models' GPU tests.
set -u
R=/tmp/s47r5; rm -rf $R /tmp/old; mkdir -p $R; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
python3 -m pip install -q --no-deps --force-reinstall .gpubuild/167b083/te_async-*.whl > $R/build.log 2>&1
SP=$(cd /tmp && python3 -c "import te_async, os; print(os.path.dirname(te_async.__file__))")
cp te_async/*.py $SP/ && cp -r te_async/models te_async/bench $SP/
python3 -m pip install -q --no-deps --target /tmp/old .gpubuild/65123b2/te_async-*.whl >> $R/build.log 2>&1
export TE_ASYNC_COMMIT=$COMMIT
echo "=== $(date +%T) L2 probe"
timeout 150 python3 -P .gpubuild/probe/l2_moe_probe.py 2>&1 | grep -v Warning | tail -6 | tee $R/l2_moe_probe.txt
gen() {  # name, PYTHONPATH, commit
  d=$R/generate_$1; mkdir -p $d
  echo "=== $(date +%T) generate $1"
  env PYTHONPATH=$2 TE_ASYNC_COMMIT=$3 timeout 80 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 2 --modes device --steps 60 --no-profile --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md || tail -5 $d/generate.log
}
for run in 1 2; do
  [ $((SECONDS - T0)) -gt 330 ] && break
  gen old_$run /tmp/old 65123b2; gen new_$run "" $COMMIT
done
d=$R/generate_new_profiled; mkdir -p $d
echo "=== $(date +%T) generate new profiled"
timeout 90 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --detail-batch 1 --no-plots --out $d > $d/generate.log 2>&1
grep -E "^\| [0-9]" $d/generate.md; head -1 $d/*kernels.md; sed -n '/One trip/,$p' $d/*kernels.md
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
[ $((SECONDS - T0)) -lt 500 ] && TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 90 python3 -P -m pytest -q $x -p no:cacheprovider --rootdir=. tests/test_models_gpu.py tests/test_bench_generate.py > $R/tests.log 2>&1
grep -E "passed|failed|FAILED|Error" $R/tests.log | tail -5
tar czf $OUT/runs_call5.tgz -C $R .
