#!/usr/bin/env bash
# Training forward + backward after e84644d: sync, async (one grouped cuBLAS call per GEMM) and
# device, unrolled and scanned with per-layer sizes; then async with TE_ASYNC_PER_GROUP_GEMMS=1.
set -uo pipefail
export TE_ASYNC_COMMIT=${TE_ASYNC_COMMIT:-e84644d}
OUT=$OUT PREBUILT=$(ls .gpubuild/e84644d/*.whl) bash tools/gpu_check.sh build >/dev/null 2>&1
cd /
t() {  # t <name> <args...>
  local name=$1; shift
  echo "=== $(date +%T) $name"
  timeout 170 python3 -P -m te_async.bench train --reps 10 --out "$OUT/$name" "$@" > "$OUT/$name.log" 2>&1; echo "rc $?"
  grep -E "^\||^- |rror" "$OUT/$name.log" | head -n 20
}
t train --contenders sync async device
t train_scan_per_layer --contenders sync async device --scan --sizes-per-layer
TE_ASYNC_PER_GROUP_GEMMS=1 t train_per_group --contenders async
cd "$OUT" && tar czf results.tgz train* && echo packed
