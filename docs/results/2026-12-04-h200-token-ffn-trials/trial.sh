#!/bin/bash
# Session 43, calls 1 and 8: build a token_ffn trial (COMMIT; no CUTLASS, sm_90a), its GPU tests,
# the MoE-layer A/B against the wheel in BEFORE (run with its own Python), alternating. Call 1:
# COMMIT=ad29e88 BEFORE=.gpubuild/aa0c869; call 8: COMMIT=bed35e2 BEFORE=.gpubuild/19e4a1a (main's
# kernels, the same build options), with the tests under `timeout 90` and shorter output tails.
set -u
export TE_ASYNC_COMMIT=${COMMIT}
R=/tmp/runs_$COMMIT; mkdir -p $R $OUT/gpubuild
t0=$SECONDS
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF \
  --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w $OUT/gpubuild . > $R/build.log 2>&1 || tail -40 $R/build.log
echo "build $((SECONDS - t0)) s"
PREBUILT=$(ls $OUT/gpubuild/*.whl) OUT=$R bash tools/gpu_check.sh build | tail -3
python3 -m pip install -q --no-deps --target /tmp/before $BEFORE/*.whl
PYTEST_ARGS="tests/test_token_ffn.py tests/test_token_moe.py" OUT=$R bash tools/gpu_check.sh test | tail -5
for i in 1 2; do for t in before new; do
  pp=; [ $t = before ] && pp=/tmp/before
  echo "=== $(date +%T) ab $t $i"
  PYTHONPATH=$pp timeout 100 python3 -P docs/results/2026-12-04-h200-token-ffn-trials/moe_ab.py ${t}_$i > $R/ab_${t}_$i.log 2>&1
  tail -n 1 $R/ab_${t}_$i.log
done; done
tar czf $OUT/runs_$COMMIT.tgz -C $R .
