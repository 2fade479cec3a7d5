#!/bin/bash
# Session 48 final call: build the tree; GPU tests (poisoned) of the MoE, routing and model files;
# memcheck on the routing kernels; bench decode T=1 (DeepSeek-V2-Lite, and Qwen3-30B-A3B's 12
# layers) and generate B=1 A/B, old (167b083's wheel with HEAD's Python = main before the session)
# against the tree, alternating; one profiled generate B=1 of the tree.
set -u
R=/tmp/s48r2; rm -rf $R /tmp/old; mkdir -p $R $OUT/gpubuild; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w $OUT/gpubuild . > $R/build.log 2>&1 || { tail -30 $R/build.log; exit 1; }
echo "=== $(date +%T) built at $((SECONDS - T0)) s"
python3 -m pip install -q --no-deps --force-reinstall $OUT/gpubuild/te_async-*.whl >> $R/build.log 2>&1
python3 -m pip install -q --no-deps --target /tmp/old .gpubuild/167b083/te_async-*.whl >> $R/build.log 2>&1
cp te_async/*.py /tmp/old/te_async/ && cp -r te_async/models te_async/bench /tmp/old/te_async/
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 python3 -P -m pytest -q $x -p no:cacheprovider --rootdir=. tests/test_token_ffn.py tests/test_token_moe.py tests/test_routing.py tests/test_decode_moe_gpu.py tests/test_models_gpu.py > $R/tests.log 2>&1
grep -E "passed|failed|FAILED|Error" $R/tests.log | tail -15
echo "=== $(date +%T) tests done at $((SECONDS - T0)) s"
dec() {  # name, PYTHONPATH, commit, extra args
  d=$R/decode_$1; mkdir -p $d
  echo "=== $(date +%T) decode $1"
  env PYTHONPATH=$2 TE_ASYNC_COMMIT=$3 timeout 60 python3 -P -m te_async.bench decode --modes device --batches ${5:-1 8} --no-profile --no-plots --out $d ${4:-} > $d/decode.log 2>&1
  grep -E "^\| [0-9]" $d/decode.md || tail -3 $d/decode.log
}
gen() {
  d=$R/generate_$1; mkdir -p $d
  echo "=== $(date +%T) generate $1"
  env PYTHONPATH=$2 TE_ASYNC_COMMIT=$3 timeout 60 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --no-profile --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md || tail -3 $d/generate.log
}
for run in 1 2; do
  dec old_$run /tmp/old $BASE; dec new_$run "" $COMMIT
  gen old_$run /tmp/old $BASE; gen new_$run "" $COMMIT
done
dec qwen3_old /tmp/old $BASE "--preset qwen3-30b-a3b --layers 12" 1; dec qwen3_new "" $COMMIT "--preset qwen3-30b-a3b --layers 12" 1
echo "=== $(date +%T) benches done at $((SECONDS - T0)) s"
if [ $((SECONDS - T0)) -lt 470 ]; then
  d=$R/generate_new_profiled; mkdir -p $d
  TE_ASYNC_COMMIT=$COMMIT timeout 60 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --detail-batch 1 --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md; grep -E "Route|TokenFfn|Reduce" $d/*kernels.md | head -8
fi
if [ $((SECONDS - T0)) -lt 500 ]; then
  XLA_PYTHON_CLIENT_ALLOCATOR=platform timeout 90 compute-sanitizer --tool memcheck --error-exitcode 99 python3 -P -m pytest -q -p no:cacheprovider --rootdir=. tests/test_token_moe.py tests/test_routing.py -k "kernels_against_float64 and bfloat16 or kernels_break_ties or kernel_at_its_limits" > $R/sanitize.log 2>&1; echo "sanitize rc $?" >> $R/sanitize.log
  tail -4 $R/sanitize.log
fi
tar czf $OUT/runs_call2.tgz -C $R .
