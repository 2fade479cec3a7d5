#!/usr/bin/env bash
# Whole-model decode after e84644d (async: one grouped cuBLAS call per GEMM), then async with
# TE_ASYNC_PER_GROUP_GEMMS=1 (one GEMM per group, as before) at B=8, same wheel, same machine.
set -uo pipefail
export TE_ASYNC_COMMIT=${TE_ASYNC_COMMIT:-e84644d}
OUT=$OUT PREBUILT=$(ls .gpubuild/e84644d/*.whl) bash tools/gpu_check.sh build >/dev/null 2>&1
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true
cd /
echo "=== $(date +%T) generate"
timeout 420 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --steps 40 --batches 1 8 64 \
  --modes device sync async --detail-batch 8 --out "$OUT/generate" > "$OUT/generate.log" 2>&1; echo "rc $?"
tail -n 12 "$OUT/generate.log"
echo "=== $(date +%T) per-group A/B"
TE_ASYNC_PER_GROUP_GEMMS=1 timeout 150 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --steps 40 \
  --batches 8 --modes async --no-profile --no-plots --out "$OUT/generate_per_group" > "$OUT/generate_per_group.log" 2>&1; echo "rc $?"
tail -n 6 "$OUT/generate_per_group.log"
cd "$OUT" && tar czf results.tgz generate generate_per_group generate.log generate_per_group.log && echo packed
