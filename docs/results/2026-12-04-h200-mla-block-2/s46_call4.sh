#!/bin/bash
# Session 46 call 4 (no build): 65123b2's wheel (the session's kernels) installed; GPU tests of four files with poisoned outputs; generate B=1,2,4 38ab664 (old: main at the session's start) against it, alternating.
set -u
R=/tmp/s46r4; rm -rf $R /tmp/old; mkdir -p $R; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
python3 -m pip install -q --no-deps --force-reinstall .gpubuild/65123b2/te_async-*.whl > $R/build.log 2>&1
python3 -m pip install -q --no-deps --target /tmp/old .gpubuild/38ab664/te_async-*.whl >> $R/build.log 2>&1
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 110 python3 -P -m pytest -q $x -p no:cacheprovider --rootdir=. tests/test_mla_token.py tests/test_decode_attention.py tests/test_mla_decode.py tests/test_models_gpu.py > $R/tests.log 2>&1
grep -E "passed|failed|FAILED|Error" $R/tests.log | tail -8
echo "=== $(date +%T) tests done at $((SECONDS - T0)) s"
gen() {  # name, PYTHONPATH
  d=$R/generate_$1; mkdir -p $d
  echo "=== $(date +%T) generate $1"
  env PYTHONPATH=$2 TE_ASYNC_COMMIT=$3 timeout 60 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 2 4 --modes device --steps 40 --no-profile --no-plots --out $d > $d/generate.log 2>&1
  grep -E "^\| [0-9]" $d/generate.md || tail -5 $d/generate.log
}
for run in 1 2; do
  [ $((SECONDS - T0)) -gt 170 ] && break
  gen old_$run /tmp/old 38ab664; gen new_$run "" 65123b2
done
tar czf $OUT/runs_call4.tgz -C $R .
