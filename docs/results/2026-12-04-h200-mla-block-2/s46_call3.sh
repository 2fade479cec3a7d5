#!/bin/bash
# Session 46 call 3: build the tree (65123b2: no carveout preference), test_mla_token, generate B=1,2 74e9afc (old: call 1) against it alternating, then ncu (a few sections) of the call's five kernels at B=1, serialised.
set -u
export TE_ASYNC_COMMIT=${COMMIT}
R=/tmp/s46r3; rm -rf $R /tmp/old; mkdir -p $R $OUT/gpubuild; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w $OUT/gpubuild . > $R/build.log 2>&1 || { tail -40 $R/build.log; exit 1; }
python3 -m pip install -q --no-deps --force-reinstall $OUT/gpubuild/te_async-*.whl >> $R/build.log 2>&1
python3 -m pip install -q --no-deps --target /tmp/old .gpubuild/74e9afc/te_async-*.whl >> $R/build.log 2>&1
echo "=== $(date +%T) built in $((SECONDS - T0)) s"
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 120 python3 -P -m pytest -q $x -p no:cacheprovider --rootdir=. tests/test_mla_token.py > $R/tests.log 2>&1
grep -E "passed|failed|FAILED|Error" $R/tests.log | tail -15
echo "=== $(date +%T) tests done at $((SECONDS - T0)) s"
gen() {  # name, PYTHONPATH
  d=$R/generate_$1; mkdir -p $d
  echo "=== $(date +%T) generate $1"
  env PYTHONPATH=$2 timeout 70 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 2 --modes device --steps 60 --no-profile --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md || tail -5 $d/generate.log
}
for run in 1 2; do
  [ $((SECONDS - T0)) -gt 330 ] && break
  gen old_$run /tmp/old; gen new_$run ""
done
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
echo "=== $(date +%T) ncu at $((SECONDS - T0)) s"
timeout 170 $ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy -k "regex:ProductKernel|MlaToken|DecodeAttention" --launch-skip 10 --launch-count 5 -o $R/call_b1 python3 -P .gpubuild/scripts/s45_probe.py 1 > $R/ncu.log 2>&1
tail -2 $R/ncu.log
$ncu -i $R/call_b1.ncu-rep --page details > $R/ncu_call_b1.txt 2>&1
grep -E "^  [a-zA-Z].*\(|Duration|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|Issued Instructions  " $R/ncu_call_b1.txt | head -40
echo "=== $(date +%T) ncu done at $((SECONDS - T0)) s"
rm -f $R/call_b1.ncu-rep
tar czf $OUT/runs_call3.tgz -C $R .
