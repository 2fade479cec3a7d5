#!/usr/bin/env bash
# Call F: the final tree (6d15655's wheel, e87773a's Python): bench generate, Qwen3-30B-A3B, B=1, device.
set -u
export TE_ASYNC_COMMIT=$(cat .gpubuild/commit)
export OUT
PREBUILT=.gpubuild/te_async-0.1.0-cp312-cp312-linux_x86_64.whl bash tools/gpu_check.sh build > /dev/null 2>&1
P=$OUT/p; mkdir -p $P/qwen3
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true
(cd / && XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 185 python3 -P -m te_async.bench generate --out "$P/qwen3" --preset qwen3-30b-a3b --steps 30 --batches 1 --modes device --detail-batch 1 > "$P/qwen3/stdout.log" 2>&1; echo "rc $?" >> "$P/qwen3/stdout.log")
tail -n 12 $P/qwen3/stdout.log; head -12 $P/qwen3/*kernels.md
rm -rf $P/qwen3/traces; tar czf $OUT/probeF.tgz -C $OUT p; rm -rf $OUT/p; ls $OUT
