#!/bin/bash
# Session 47 call 3: build the tree (167b083), the MoE and model GPU test files, generate B=1,2 65123b2 (old: main before the session, same kernels as a3c0bb2) against this tree (new) alternating, one profiled B=1 run.
set -u
export TE_ASYNC_COMMIT=${COMMIT}
R=/tmp/s47r3; rm -rf $R /tmp/old; mkdir -p $R $OUT/gpubuild; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w $OUT/gpubuild . > $R/build.log 2>&1 || { tail -40 $R/build.log; exit 1; }
python3 -m pip install -q --no-deps --force-reinstall $OUT/gpubuild/te_async-*.whl >> $R/build.log 2>&1
true
python3 -m pip install -q --no-deps --target /tmp/old .gpubuild/65123b2/te_async-*.whl >> $R/build.log 2>&1
echo "=== $(date +%T) built in $((SECONDS - T0)) s"
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 240 python3 -P -m pytest -q $x -p no:cacheprovider --rootdir=. tests/test_token_ffn.py tests/test_token_moe.py tests/test_decode_moe_gpu.py tests/test_models_gpu.py tests/test_mla_token.py > $R/tests.log 2>&1
grep -E "passed|failed|FAILED|Error" $R/tests.log | tail -15
echo "=== $(date +%T) tests done at $((SECONDS - T0)) s"
gen() {  # name, PYTHONPATH, extra env
  d=$R/generate_$1; mkdir -p $d
  echo "=== $(date +%T) generate $1"
  env PYTHONPATH=$2 ${3:-} timeout 70 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 2 --modes device --steps 60 --no-profile --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md || tail -5 $d/generate.log
}
for run in 1 2; do
  [ $((SECONDS - T0)) -gt 430 ] && break
  gen old_$run /tmp/old; gen new_$run ""
done
if [ $((SECONDS - T0)) -lt 510 ]; then
  d=$R/generate_new_profiled; mkdir -p $d
  echo "=== $(date +%T) generate new profiled"
  timeout 80 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --detail-batch 1 --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md; head -1 $d/*kernels.md
fi
tar czf $OUT/runs_call3.tgz -C $R .
