#!/usr/bin/env bash
# Build and test c05bad7, then the decode and training benchmarks on its wheel.
set -uo pipefail
export TE_ASYNC_COMMIT=c05bad7
OUT=$OUT PYTEST_ARGS="tests/test_gpu_host_sized.py tests/test_gpu_slot_identity.py tests/test_grouped_gemm.py tests/test_grouped_mlp.py tests/test_ragged_dot.py" bash tools/gpu_check.sh build test 2>&1 | grep -E "ok \(|FAILED|passed|failed|cutlass" | tail -8
B=/tmp/b; mkdir -p $B; cd /
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true
echo "=== $(date +%T) generate"
timeout 170 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --steps 40 --batches 1 8 64 \
  --modes device sync async --detail-batch 8 --out "$B/generate" > "$B/generate.log" 2>&1; echo "rc $?"
grep -E "^\| (1|8|64) " "$B/generate.log"
echo "=== $(date +%T) per-group A/B"
TE_ASYNC_PER_GROUP_GEMMS=1 timeout 60 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --steps 40 \
  --batches 8 --modes async --no-profile --no-plots --out "$B/generate_per_group" > "$B/generate_per_group.log" 2>&1; echo "rc $?"
grep -E "^\| 8 " "$B/generate_per_group.log"
unset XLA_FLAGS
t() {  # t <name> <args...>
  local name=$1; shift
  echo "=== $(date +%T) $name"
  timeout 60 python3 -P -m te_async.bench train --reps 10 --out "$B/$name" "$@" > "$B/$name.log" 2>&1; echo "rc $?"
  grep -E "^\| (sync|async|device) |^- " "$B/$name.log" | head -n 12
}
t train --contenders sync async device
t train_scan_per_layer --contenders sync async device --scan --sizes-per-layer
cd $B && tar czf "$OUT/bench.tgz" --exclude=traces . && echo packed
