#!/usr/bin/env bash
# Builds te_async on the GPU machine (no registry access: the image's jax, nanobind and
# scikit-build-core build it), runs the GPU tests and the benchmarks, and writes logs and
# results under $OUT. Usage: tools/gpu_check.sh [stage ...], stages: build test example
# layer prefill decode stall (default: build test example layer prefill). Python runs with -P
# so that the installed package, not the source folder, is imported.
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
stages=${*:-build test example layer prefill}
export PYTHONUNBUFFERED=1
status=0

run() {  # run <name> <command...>: log to $OUT/<name>.log, keep going, remember failures
  local name=$1; shift
  echo "=== $(date +%T) $name: $*" | tee -a "$OUT/summary.log"
  local t0=$SECONDS
  if "$@" >"$OUT/$name.log" 2>&1; then echo "    ok (${name}, $((SECONDS - t0)) s)" | tee -a "$OUT/summary.log"; else
    echo "    FAILED (${name}, $((SECONDS - t0)) s); tail of $OUT/$name.log:" | tee -a "$OUT/summary.log"
    tail -n 25 "$OUT/$name.log"; status=1; fi
}

for stage in $stages; do
  case $stage in
    build)
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
      python3 -c "import jax; print('jax', jax.__version__, jax.devices())" | tee -a "$OUT/gpu.txt"
      run build python3 -m pip install --no-build-isolation --no-deps -v . ;;
    test)
      # Outputs start as NaN and every pinned read is cross-checked: see tests/test_gpu_host_sized.py.
      run test env TE_ASYNC_POISON_OUTPUTS=1 TE_ASYNC_VERIFY_HOST_SIZES=1 \
        python3 -P -m pytest -q -rs -p no:cacheprovider --rootdir=. tests/ ${PYTEST_ARGS:-}
      tail -n 3 "$OUT/test.log" ;;
    example) run example python3 examples/moe_decode.py --steps 20; tail -n 5 "$OUT/example.log" ;;
    layer) run layer python3 -P -m te_async.bench layer --out "$OUT"; cat "$OUT/layer.md" ;;
    prefill) run prefill python3 -P -m te_async.bench prefill --out "$OUT"; cat "$OUT/prefill.md" ;;
    decode) run decode python3 -P -m te_async.bench decode --out "$OUT" ${DECODE_ARGS:-}; cat "$OUT/decode.md" ;;
    stall) OUT=$OUT run stall python3 repro/stall/run_all.py; tail -n 30 "$OUT/stall.log" ;;
    *) echo "unknown stage $stage"; status=1 ;;
  esac
done
exit $status
