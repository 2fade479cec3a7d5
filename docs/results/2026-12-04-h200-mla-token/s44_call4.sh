#!/bin/bash
# Session 44 call 4: build 2ce7354 (sm_90a, no CUTLASS), GPU tests, the token probe at B=1 and 2,
# bench generate B=1 and 2 unfused vs auto alternating, one profiled B=1 auto run.
set -u
export TE_ASYNC_COMMIT=${COMMIT}
R=/tmp/r4; mkdir -p $R $OUT/gpubuild; T0=$SECONDS
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w $OUT/gpubuild . > $R/build.log 2>&1 || { tail -40 $R/build.log; exit 1; }
python3 -m pip install -q --no-deps --force-reinstall $OUT/gpubuild/te_async-*.whl >> $R/build.log 2>&1
echo "=== $(date +%T) built in $((SECONDS - T0)) s"
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 230 python3 -P -m pytest -q $x -p no:cacheprovider --rootdir=. tests/test_mla_token.py tests/test_decode_attention.py tests/test_mla_decode.py tests/test_token_ffn.py tests/test_token_moe.py tests/test_models_gpu.py > $R/tests.log 2>&1
grep -E "passed|failed|FAILED|Error" $R/tests.log | tail -15
for b in 1 2; do timeout 100 python3 -P .gpubuild/scripts/token_probe.py time $b 2>&1 | grep "us per layer"; done
for run in 1 2; do for v in unfused auto; do
  [ $((SECONDS - T0)) -gt 480 ] && break 2
  d=$R/generate_${v}_$run; mkdir -p $d
  echo "=== $(date +%T) generate $v $run"
  TE_ASYNC_MLA_DECODE=$v timeout 70 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 2 --modes device --steps 60 --no-profile --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md || tail -5 $d/generate.log
done; done
if [ $((SECONDS - T0)) -lt 510 ]; then
  d=$R/generate_auto_profiled; mkdir -p $d
  echo "=== $(date +%T) generate auto profiled"
  timeout 80 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --detail-batch 1 --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md; head -1 $d/*kernels.md
fi
tar czf $OUT/runs_call4.tgz -C $R .
