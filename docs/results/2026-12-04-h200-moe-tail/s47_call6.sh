#!/bin/bash
# Session 47 call 6: build HEAD (the L2 prefetch); GPU tests (poisoned); generate B=1 acb1f5c (old: 167b083's wheel with acb1f5c's Python) against HEAD alternating; one profiled B=1 run of HEAD.
set -u
export TE_ASYNC_COMMIT=${COMMIT}
R=/tmp/s47r6; rm -rf $R /tmp/old; mkdir -p $R $OUT/gpubuild; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w $OUT/gpubuild . > $R/build.log 2>&1 || { tail -40 $R/build.log; exit 1; }
python3 -m pip install -q --no-deps --force-reinstall $OUT/gpubuild/te_async-*.whl >> $R/build.log 2>&1
python3 -m pip install -q --no-deps --target /tmp/old .gpubuild/167b083/te_async-*.whl >> $R/build.log 2>&1
cp .gpubuild/acb1f5c_py/te_async/*.py /tmp/old/te_async/ && cp -r .gpubuild/acb1f5c_py/te_async/models .gpubuild/acb1f5c_py/te_async/bench /tmp/old/te_async/
echo "=== $(date +%T) built in $((SECONDS - T0)) s"
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -P -m pytest -q $x -p no:cacheprovider --rootdir=. tests/test_mla_token.py tests/test_models_gpu.py tests/test_decode_moe_gpu.py > $R/tests.log 2>&1
grep -E "passed|failed|FAILED|Error" $R/tests.log | tail -8
echo "=== $(date +%T) tests done at $((SECONDS - T0)) s"
gen() {  # name, PYTHONPATH, commit
  d=$R/generate_$1; mkdir -p $d
  echo "=== $(date +%T) generate $1"
  env PYTHONPATH=$2 TE_ASYNC_COMMIT=$3 timeout 60 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --no-profile --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md || tail -5 $d/generate.log
}
for run in 1 2 3; do
  [ $((SECONDS - T0)) -gt 400 ] && break
  gen old_$run /tmp/old acb1f5c; gen new_$run "" $COMMIT
done
if [ $((SECONDS - T0)) -lt 470 ]; then
  d=$R/generate_new_profiled; mkdir -p $d
  echo "=== $(date +%T) generate new profiled"
  timeout 70 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --detail-batch 1 --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md; sed -n '/One trip/,$p' $d/*kernels.md
fi
tar czf $OUT/runs_call6.tgz -C $R .
