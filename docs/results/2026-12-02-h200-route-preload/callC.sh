#!/usr/bin/env bash
# Call C: build the routing-kernel change (no CUTLASS); GPU tests around token_moe; memcheck;
# bench decode T=1 new vs main's wheel (3848a7e); bench generate B=1 new; then the fc2 L2-prefetch
# variant (incremental rebuild) in bench decode.
set -u
export TE_ASYNC_COMMIT=$(cat .gpubuild/commit)
export OUT
WITH_CUTLASS=0 bash tools/gpu_check.sh build
mkdir -p $OUT/wheels; cp $OUT/gpubuild/te_async-*.whl $OUT/wheels/new.whl
PYTEST_ARGS="tests/test_token_moe.py tests/test_token_ffn.py tests/test_decode_moe_gpu.py tests/test_models_gpu.py" \
  timeout 100 bash tools/gpu_check.sh test
P=$OUT/p; mkdir -p $P
(timeout 60 env XLA_PYTHON_CLIENT_ALLOCATOR=platform compute-sanitizer --tool memcheck --error-exitcode 99 \
  python3 -P -m pytest -q -p no:cacheprovider --rootdir=. tests/test_token_moe.py -k "kernels_against_float64 and bfloat16" > $P/sanitize_token_moe.log 2>&1; echo "sanitize rc $?" >> $P/sanitize_token_moe.log)
tail -n 3 $P/sanitize_token_moe.log
# main's wheel in /tmp/old (its C++), the same Python
python3 -m pip install --no-deps --target /tmp/old .gpubuild/main_3848a7e.whl > /dev/null 2>&1
site=$(cd / && python3 -c "import te_async, os; print(os.path.dirname(te_async.__file__))")
cp -r $site/*.py $site/bench $site/models /tmp/old/te_async/
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true
dec() {  # dec <name> [PYTHONPATH]
  mkdir -p $P/$1
  (cd / && PYTHONPATH=${2:-} timeout 60 python3 -P -m te_async.bench decode --out "$P/$1" --modes device --batches 1 --detail-batch 1 --cmdbuf-during-profiling > "$P/$1/stdout.log" 2>&1; echo "rc $?" >> "$P/$1/stdout.log")
  echo "== $1"; grep -E "^\| 1 " $P/$1/decode.md; grep -E "RouteToken|TokenFfn" $P/$1/*kernels.md
}
dec decode_new; dec decode_old /tmp/old; dec decode_new2; dec decode_old2 /tmp/old
tar czf $OUT/probeC1.tgz -C $OUT p
mkdir -p $P/generate_new
(cd / && timeout 100 python3 -P -m te_async.bench generate --out "$P/generate_new" --preset deepseek-v2-lite --steps 60 --batches 1 --modes device --detail-batch 1 > "$P/generate_new/stdout.log" 2>&1; echo "rc $?" >> "$P/generate_new/stdout.log")
grep -E "^\| 1 " $P/generate_new/generate.md; grep -E "RouteToken|TokenFfn" $P/generate_new/*kernels.md
tar czf $OUT/probeC2.tgz -C $OUT p
patch -p0 csrc/cuda/token_ffn.cu < .gpubuild/fc2_prefetch.patch && WITH_CUTLASS=0 bash tools/gpu_check.sh build > $P/build_variant.log 2>&1
grep -E "build" $OUT/summary.log | tail -2; cp $OUT/gpubuild/te_async-*.whl $OUT/wheels/fc2_prefetch.whl
dec decode_prefetch
tar czf $OUT/probeC.tgz -C $OUT p wheels
rm -rf $OUT/p $OUT/gpubuild $OUT/wheels; ls $OUT
