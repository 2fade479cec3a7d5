#!/usr/bin/env bash
# Call B: build main without CUTLASS; GPU tests around token_moe; memcheck of its kernels; ncu of
# the two kernels; bench generate B=1 device (the whole model with token_moe).
set -u
export TE_ASYNC_COMMIT=$(cat .gpubuild/commit)
export OUT
WITH_CUTLASS=0 bash tools/gpu_check.sh build
cp $OUT/gpubuild/te_async-*.whl $OUT/
PYTEST_ARGS="tests/test_token_moe.py tests/test_token_ffn.py tests/test_decode_moe_gpu.py tests/test_models_gpu.py tests/test_routing.py tests/test_dense.py" \
  timeout 110 bash tools/gpu_check.sh test
P=$OUT/p; mkdir -p $P
(timeout 90 env XLA_PYTHON_CLIENT_ALLOCATOR=platform compute-sanitizer --tool memcheck --error-exitcode 99 \
  python3 -P -m pytest -q -p no:cacheprovider --rootdir=. tests/test_token_moe.py -k "kernels_against_float64 and bfloat16" > $P/sanitize_token_moe.log 2>&1; echo "sanitize rc $?" >> $P/sanitize_token_moe.log)
tail -n 4 $P/sanitize_token_moe.log
cp .gpubuild/route_probe.py /tmp/route_probe.py
(cd /tmp && timeout 80 ncu --clock-control none --set full --import-source no -f -o $P/ncu_tm \
   -k "regex:RouteToken|TokenFfn" --launch-skip 8 --launch-count 4 python3 -P route_probe.py 4 > $P/ncu.log 2>&1; echo "ncu rc $?")
ncu -i $P/ncu_tm.ncu-rep --page details > $P/ncu_details.txt 2>&1
grep -E "RouteToken|TokenFfn|Duration|DRAM Throughput|Registers Per|Achieved Occupancy" $P/ncu_details.txt | head -40
ncu -i $P/ncu_tm.ncu-rep --page source --csv --print-source sass -k regex:RouteToken --launch-count 1 > $P/route_sass.csv 2>&1
ncu -i $P/ncu_tm.ncu-rep --page source --csv --print-source sass -k regex:TokenFfn --launch-count 1 > $P/ffn_sass.csv 2>&1
tar czf $OUT/probeB1.tgz -C $OUT p
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true
mkdir -p $P/generate
(cd / && timeout 110 python3 -P -m te_async.bench generate --out "$P/generate" --preset deepseek-v2-lite --steps 60 --batches 1 --modes device --detail-batch 1 > "$P/generate/stdout.log" 2>&1; echo "rc $?" >> "$P/generate/stdout.log")
tail -n 8 "$P/generate/stdout.log"; head -24 $P/generate/*kernels*.md 2>/dev/null
tar czf $OUT/probeB.tgz -C $OUT p
