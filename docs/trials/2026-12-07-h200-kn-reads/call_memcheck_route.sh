#!/bin/bash
# memcheck of the routing kernel's grouped softmax form, one pytest process a test: call_b_h100.sh's
# memcheck crashed Python (rc 139, no report) at test_kernel_matches_reference[softmax-1-random-variant8]
# (12 experts, top-4, 3 groups, 2 kept) after 12 passed. Same test alone, its neighbours, T = 64.
set -u
R=/tmp/mr; rm -rf $R; mkdir -p $R; T0=$SECONDS; S=$PWD; L=$OUT/summary.txt
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real \
  -w /tmp/wheel_mr . > $R/build.log 2>&1 || { tail -5 $R/build.log; exit 1; }
rm -rf /tmp/w_mr; mkdir -p /tmp/w_mr
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" /tmp/wheel_mr/te_async-*.whl /tmp/w_mr
echo "built at $((SECONDS - T0)) s" > $L
for t in softmax-1-random-variant8 softmax-1-random-variant8 softmax-1-random-variant9 softmax-64-random-variant8 sigmoid-1-random-variant8 sigmoid_bias-64-random-variant0; do
  (cd / && PYTHONPATH=/tmp/w_mr XLA_PYTHON_CLIENT_ALLOCATOR=platform timeout 60 compute-sanitizer --tool memcheck \
    --error-exitcode 99 python3 -P -m pytest -q -p no:cacheprovider --rootdir=$S "$S/tests/test_routing.py::test_kernel_matches_reference[$t]") > $R/$t.log 2>&1
  echo "$t: rc $? $(grep -E 'passed|failed|ERROR SUMMARY' $R/$t.log | tr '\n' ' ') (at $((SECONDS - T0)) s)" >> $L
done
tar czf $OUT/logs.tgz -C $R .
cat $L
