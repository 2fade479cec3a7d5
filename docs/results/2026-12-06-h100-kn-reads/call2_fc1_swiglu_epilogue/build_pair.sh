#!/bin/bash
# Shared by the prepared trials here: builds this tree ("old") and this tree with a patch ("new"),
# each in its own copy (/tmp/src_old, /tmp/src_new, tests included), without CUTLASS for sm_90a, in
# parallel, and unpacks the wheels into /tmp/w_old and /tmp/w_new for PYTHONPATH.
# Usage: bash docs/trials/build_pair.sh PATCH LOGDIR (from the repository root).
set -u
patch_file=$(realpath "$1"); logs=$2
rm -rf /tmp/src_old /tmp/src_new /tmp/wheel_old /tmp/wheel_new
for v in old new; do
  mkdir -p /tmp/src_$v && cp -r CMakeLists.txt pyproject.toml README.md LICENSE csrc te_async tests /tmp/src_$v/
done
(cd /tmp/src_new && patch -p1 < "$patch_file") > "$logs/patch.log" 2>&1 || { cat "$logs/patch.log"; exit 1; }
for v in old new; do
  ( cd /tmp/src_$v && CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip wheel --no-build-isolation --no-deps \
    --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF \
    --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w /tmp/wheel_$v . > "$logs/build_$v.log" 2>&1
    rm -rf /tmp/w_$v; mkdir -p /tmp/w_$v
    python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" /tmp/wheel_$v/te_async-*.whl /tmp/w_$v ) &
done
wait
ls /tmp/wheel_old/te_async-*.whl /tmp/wheel_new/te_async-*.whl
