#!/bin/bash
# One device call: builds this tree without CUTLASS for 90a-real (B=1 decode runs no CUTLASS kernel),
# runs the GPU tests of what changed (poisoned), then bench generate at B=1, device mode, with the
# prefetch ("new": this tree) and without it ("old": the same wheel, models.model._next_input_weights
# patched to None, so every token_moe call gets an empty prefetch), alternating; then one profiled
# run each if time is left. Everything in $OUT/call.tgz, saved after each stage.
set -u
R=/tmp/r; S=$PWD; mkdir -p $R $OUT/wheel; T0=$SECONDS
save() { tar czf $OUT/call.tgz -C $R .; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c "import jax; print('jax', jax.__version__)"; git rev-parse HEAD; git status --short; } > $R/gpu.txt
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real \
  -w $OUT/wheel . > $R/build.log 2>&1; echo "build rc $?" | tee -a $R/build.log
mkdir -p /tmp/w && python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/w')" $OUT/wheel/te_async-*.whl || { save; exit 1; }
echo "=== $(date +%T) built at $((SECONDS - T0)) s"; save
(cd / && PYTHONPATH=/tmp/w TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -P -m pytest -q -n 8 -p no:cacheprovider \
  --rootdir=$S $S/tests/test_token_moe.py $S/tests/test_token_ffn.py $S/tests/test_mla_decode.py $S/tests/test_mla_token.py $S/tests/test_models_gpu.py) > $R/tests.log 2>&1
echo "pytest rc $?" >> $R/tests.log; tail -n 3 $R/tests.log; echo "=== $(date +%T) tests at $((SECONDS - T0)) s"; save
gen() {  # gen <new|old> <run> [profile]
  local patch=""; [ $1 = old ] && patch="import te_async.models.model as m; m._next_input_weights = lambda *a: None; "
  (cd / && PYTHONPATH=/tmp/w timeout 120 python3 -P -c "${patch}import runpy, sys; sys.argv = ['te_async.bench'] + sys.argv[1:]; runpy.run_module('te_async.bench', run_name='__main__')" \
    generate --preset deepseek-v2-lite --batches 1 --modes device --steps 60 --no-plots ${3:---no-profile} --out $R/generate_$1_$2) > $R/generate_$1_$2.log 2>&1
  echo "=== $(date +%T) generate $1 $2 at $((SECONDS - T0)) s"; grep "^| 1 " $R/generate_$1_$2/generate.md; rm -rf $R/generate_$1_$2/traces; save
}
gen new 1; gen old 2; gen old 3; gen new 4
[ $((SECONDS - T0)) -lt 420 ] && XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true gen new 5 --profile
[ $((SECONDS - T0)) -lt 500 ] && XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true gen old 6 --profile
