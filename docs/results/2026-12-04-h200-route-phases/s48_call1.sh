#!/bin/bash
# Session 48 call 1: route phase stamps of old / slots / new; build the tree; GPU tests of the MoE,
# routing and model files; bench decode T=1 and generate B=1 A/B, old (167b083's wheel with HEAD's
# Python = main before the session) against the tree.
set -u
R=/tmp/s48r1; rm -rf $R /tmp/old; mkdir -p $R $OUT/gpubuild; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
(CMAKE_BUILD_PARALLEL_LEVEL=14 python3 -m pip wheel --no-build-isolation --no-deps --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w $OUT/gpubuild . > $R/build.log 2>&1; echo "build rc $?" >> $R/build.log) &
BUILD=$!
cd .gpubuild/probe
for v in old:old_csrc/csrc slots:../../csrc new:../../csrc; do n=${v%%:*}; i=${v#*:}; nvcc -std=c++17 -arch=sm_90a -O3 -diag-suppress 940,2473,177 -I$i -o /tmp/rp_$n route_phases_$n.cu & done; wait %2 %3 %4 2>/dev/null
cd ../..
for run in 1 2; do for n in old slots new; do echo "### $n run $run"; /tmp/rp_$n 1 | sed 1d; done; done 2>&1 | tee $R/route_phases.txt
wait $BUILD; tail -1 $R/build.log; grep -q "build rc 0" $R/build.log || { tail -30 $R/build.log; exit 1; }
echo "=== $(date +%T) built at $((SECONDS - T0)) s"
python3 -m pip install -q --no-deps --force-reinstall $OUT/gpubuild/te_async-*.whl >> $R/build.log 2>&1
python3 -m pip install -q --no-deps --target /tmp/old .gpubuild/167b083/te_async-*.whl >> $R/build.log 2>&1
cp te_async/*.py /tmp/old/te_async/ && cp -r te_async/models te_async/bench /tmp/old/te_async/
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 python3 -P -m pytest -q $x -p no:cacheprovider --rootdir=. tests/test_token_ffn.py tests/test_token_moe.py tests/test_routing.py tests/test_decode_moe_gpu.py tests/test_models_gpu.py > $R/tests.log 2>&1
grep -E "passed|failed|FAILED|Error" $R/tests.log | tail -15
echo "=== $(date +%T) tests done at $((SECONDS - T0)) s"
dec() {  # name, PYTHONPATH, commit
  d=$R/decode_$1; mkdir -p $d
  echo "=== $(date +%T) decode $1"
  env PYTHONPATH=$2 TE_ASYNC_COMMIT=$3 timeout 60 python3 -P -m te_async.bench decode --modes device --batches 1 --no-profile --no-plots --out $d > $d/decode.log 2>&1
  grep -E "^\| [0-9]" $d/decode.md || tail -3 $d/decode.log
}
gen() {
  d=$R/generate_$1; mkdir -p $d
  echo "=== $(date +%T) generate $1"
  env PYTHONPATH=$2 TE_ASYNC_COMMIT=$3 timeout 60 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --no-profile --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md || tail -3 $d/generate.log
}
for run in 1 2; do
  [ $((SECONDS - T0)) -gt 470 ] && break
  dec old_$run /tmp/old $BASE; dec new_$run "" $COMMIT
  gen old_$run /tmp/old $BASE; gen new_$run "" $COMMIT
done
tar czf $OUT/runs_call1.tgz -C $R .
