#!/bin/bash
# Call 5: build this tree without CUTLASS for sm_90a only (the attention kernels do not use CUTLASS;
# one architecture to fit the session's last device minutes), the decode attention and fused MLA
# GPU tests, then bench attention against aa0c869's wheel and its own Python ("before", carried in
# .gpubuild/aa0c869), one process each, new first.
set -u
export TE_ASYNC_COMMIT=${COMMIT:?}
R=/tmp/runs; mkdir -p $R $OUT/gpubuild
echo "=== $(date +%T) build"
env CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip wheel --no-build-isolation --no-deps -q \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF \
  --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w $OUT/gpubuild . > $R/build.log 2>&1; echo "rc $?"
python3 -m pip install -q --no-deps --force-reinstall $OUT/gpubuild/te_async-*.whl
python3 -m pip install -q --no-deps --target /tmp/before .gpubuild/aa0c869/*.whl
echo "=== $(date +%T) tests"
TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 120 python3 -P -m pytest -v --tb=short \
  -p no:cacheprovider --rootdir=. -n 8 tests/test_decode_attention.py tests/test_mla_decode.py > $R/gpu_tests.log 2>&1
echo "rc $?"; tail -n 2 $R/gpu_tests.log
bench() {  # bench <tree> <name> <args...>
  local tree=$1 name=$2; shift 2
  local d=$R/${name}_$tree; mkdir -p $d
  echo "=== $(date +%T) $name $tree"
  local pp=; [ $tree = before ] && pp=/tmp/before
  PYTHONPATH=$pp timeout 100 python3 -P -m te_async.bench "$@" --out $d > $d/stdout.log 2>&1
  echo "rc $?"; grep -E "^\| [0-9]" $d/attention.md
}
for tree in new before; do bench $tree attention_mla attention --preset deepseek-v2-lite --batches 8 64 --reps 5; done
for tree in new before; do bench $tree attention_gqa attention --preset qwen3-30b-a3b --batches 64 --reps 5; done
tar czf $OUT/runs_call5.tgz -C $R .
