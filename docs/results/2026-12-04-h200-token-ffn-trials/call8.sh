#!/bin/bash
# Session 43 call 8: token_ffn with each phase's first loads issued ahead (sm_90a, no CUTLASS):
# its GPU tests and the MoE-layer A/B against 19e4a1a's wheel (main's kernels, same build options).
set -u
export TE_ASYNC_COMMIT=${COMMIT}
R=/tmp/runs8; mkdir -p $R $OUT/gpubuild
t0=$SECONDS
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF \
  --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w $OUT/gpubuild . > $R/build.log 2>&1 || tail -40 $R/build.log
echo "build $((SECONDS - t0)) s"
PREBUILT=$(ls $OUT/gpubuild/*.whl) OUT=$R bash tools/gpu_check.sh build | tail -1
python3 -m pip install -q --no-deps --target /tmp/before .gpubuild/19e4a1a/*.whl
PYTEST_ARGS="tests/test_token_ffn.py tests/test_token_moe.py" OUT=$R timeout 90 bash tools/gpu_check.sh test | tail -2
for i in 1 2; do for t in before new; do
  pp=; [ $t = before ] && pp=/tmp/before
  echo "=== $(date +%T) ab $t $i"
  PYTHONPATH=$pp timeout 60 python3 -P docs/results/2026-12-04-h200-token-ffn-trials/moe_ab.py ${t}_$i > $R/ab_${t}_$i.log 2>&1
  tail -n 1 $R/ab_${t}_$i.log | cut -c1-400
done; done
tar czf $OUT/runs_call8.tgz -C $R .
