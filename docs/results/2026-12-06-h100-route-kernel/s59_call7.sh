#!/bin/bash
# Session 59 call 7 (the last device time): RouteKernel old / new1 / new2 standalone, warm and cold;
# this tree (new2) built WITHOUT CUTLASS for sm_90a in the background; routing/token tests poisoned;
# bench decode T=8 (small_groups, no CUTLASS kernel on either side) old (s58) vs new2 alternating.
set -u
R=/tmp/s59r7; rm -rf $R; mkdir -p $R $OUT/gpubuild; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
( CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps \
  --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF \
  --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w $OUT/gpubuild . > $R/build.log 2>&1; echo $? > $R/build.rc ) &
K=.gpubuild/scripts/rk
for run in 1 2; do for v in old new new2; do echo "--- $v $run"; $K/rp_$v $R/bits_$v.bin; done; done > $R/route_probe.txt
grep -E "^---|T=(8|64) E=64" $R/route_probe.txt
cmp $R/bits_old.bin $R/bits_new2.bin && echo "bits: same" | tee -a $R/route_probe.txt
rm -rf /tmp/w; mkdir -p /tmp/w && python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/w')" .gpubuild/s58/te_async-*.whl
wait
echo "build rc $(cat $R/build.rc) at $((SECONDS - T0)) s"; tail -1 $R/build.log
rm -rf /tmp/wn; mkdir -p /tmp/wn && python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/wn')" $OUT/gpubuild/te_async-*.whl
S=$PWD; x=; python3 -c "import xdist" 2>/dev/null && x="-n 12"
(cd / && PYTHONPATH=/tmp/wn TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 120 python3 -P -m pytest -q $x \
  -p no:cacheprovider --rootdir=$S $S/tests/test_routing.py $S/tests/test_decode_moe_gpu.py $S/tests/test_token_moe.py \
  $S/tests/test_token_ffn.py) > $R/tests.log 2>&1
tail -2 $R/tests.log
echo "=== $(date +%T) tests done at $((SECONDS - T0)) s"
for run in 1 2; do
  for v in old new; do
    p=/tmp/w; [ $v = new ] && p=/tmp/wn
    (cd / && PYTHONPATH=$p timeout 60 python3 -P -m te_async.bench decode --modes device --batches 8 --reps 10 --no-plots \
      --out $R/decode_${v}_$run) > $R/decode_${v}_$run.log 2>&1
    echo "$v $run: $(grep -E '^\| 8 ' $R/decode_${v}_$run/decode.md | tr '\n' ' ')"
  done
done
echo "=== $(date +%T) done at $((SECONDS - T0)) s"
tar czf $OUT/s59_call7.tgz -C $R .
