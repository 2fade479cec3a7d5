#!/bin/bash
# A/B of this folder's patches on the GPU machine, from a checkout of main where they apply (made
# against 2c4f148; README.md). Two calls of `device` (each under its 10-minute limit):
#   bash docs/trials/2026-12-04/ab_call.sh build   # both wheels (old: the tree; new: the tree + the
#                                                  # patches), poisoned GPU tests of new, memcheck
#   bash docs/trials/2026-12-04/ab_call.sh bench   # old and new alternating, bench read, then one
#                                                  # profiled step of new
# Between them, copy the wheels/ folder that call 1 returns to .gpubuild/ab/wheels/ and carry
# .gpubuild/ab (git ignores .gpubuild). PATCHES (default: every *.patch here) chooses new's patches.
set -u
here=$(cd "$(dirname "$0")" && pwd); R=/tmp/ab; mkdir -p "$R" "$OUT"; T0=$SECONDS
patches=${PATCHES:-$(cd "$here" && ls *.patch)}
build() {  # tree, name: a wheel without CUTLASS for sm_90a into $OUT/wheels/<name>/
  (cd "$1" && CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip wheel --no-build-isolation --no-deps \
    --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF \
    --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -w "$OUT/wheels/$2" .) > "$R/build_$2.log" 2>&1 \
    || { echo "build $2 failed"; tail -30 "$R/build_$2.log"; }
}
case ${1:-build} in
  build)
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
    rm -rf /tmp/new && mkdir /tmp/new && tar cf - --exclude=./.git --exclude=./build --exclude=./.venv --exclude=./.gpubuild . | tar xf - -C /tmp/new
    for p in $patches; do (cd /tmp/new && { patch -p1 -s < "$here/$p" || git apply "$here/$p"; }) || { echo "patch $p failed"; exit 1; }; done
    build . old & build /tmp/new new & wait
    echo "=== $(date +%T) built at $((SECONDS - T0)) s"; ls "$OUT"/wheels/*
    python3 -m pip install -q --no-deps --force-reinstall "$OUT"/wheels/new/te_async-*.whl
    x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
    (cd /tmp/new && TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 240 python3 -P -m pytest -q $x \
      -p no:cacheprovider --rootdir=. tests/test_mla_token.py tests/test_decode_attention.py tests/test_mla_decode.py \
      tests/test_token_ffn.py tests/test_token_moe.py tests/test_routing.py tests/test_models_gpu.py) > "$R/tests_new.log" 2>&1
    grep -E "passed|failed|FAILED|Error" "$R/tests_new.log" | tail -15
    echo "=== $(date +%T) tests done at $((SECONDS - T0)) s"
    (cd /tmp/new && XLA_PYTHON_CLIENT_ALLOCATOR=platform timeout 120 compute-sanitizer --tool memcheck --error-exitcode 99 \
      python3 -P -m pytest -q -p no:cacheprovider --rootdir=. tests/test_mla_token.py tests/test_token_moe.py -k \
      "matches_the_unfused or kernels_against_float64") > "$R/sanitize_new.log" 2>&1; echo "sanitize rc $?" | tee -a "$R/sanitize_new.log"
    tail -3 "$R/sanitize_new.log"
    ;;
  bench)
    old=$(ls .gpubuild/ab/wheels/old/te_async-*.whl) new=$(ls .gpubuild/ab/wheels/new/te_async-*.whl) || exit 1
    rm -rf /tmp/old && python3 -m pip install -q --no-deps --target /tmp/old "$old"
    python3 -m pip install -q --no-deps --force-reinstall "$new"
    gen() {  # name, PYTHONPATH, extra args
      d=$R/generate_$1; mkdir -p "$d"; echo "=== $(date +%T) generate $1"
      env PYTHONPATH=$2 timeout 150 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 1 2 4 \
        --modes device --steps 60 --no-plots --out "$d" ${3:---no-profile} > "$d/generate.log" 2>&1
      grep -E "^\| [0-9]" "$d/generate.md" || tail -3 "$d/generate.log"
    }
    dec() {
      d=$R/decode_$1; mkdir -p "$d"; echo "=== $(date +%T) decode $1"
      env PYTHONPATH=$2 timeout 60 python3 -P -m te_async.bench decode --modes device --batches 1 --no-profile \
        --no-plots --out "$d" > "$d/decode.log" 2>&1
      grep -E "^\| [0-9]" "$d/decode.md" || tail -3 "$d/decode.log"
    }
    # What one kernel reads at a layer's sizes, against the 2 GiB floor (python -m te_async.bench read)
    python3 -P -m te_async.bench read --out "$R/read" > "$R/read.log" 2>&1; cat "$R/read/read.md"
    for run in 1 2; do gen "old_$run" /tmp/old; gen "new_$run" ""; dec "old_$run" /tmp/old; dec "new_$run" ""; done
    echo "=== $(date +%T) benches done at $((SECONDS - T0)) s"
    [ $((SECONDS - T0)) -lt 420 ] && gen new_profiled "" "--detail-batch 1"
    grep -hE "DecodeAttention|MlaToken|Route|TokenFfn|Reduce" "$R"/generate_new_profiled/*kernels.md 2>/dev/null | head -12
    ;;
esac
tar czf "$OUT/ab_${1:-build}.tgz" -C "$R" .
