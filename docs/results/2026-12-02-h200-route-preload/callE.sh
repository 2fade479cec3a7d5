#!/usr/bin/env bash
# Call E: 6d15655's wheel (C++ as final) with the final Python; GPU tests; bench generate B=1:
# main's start (3848a7e: wheel + Python) then the final tree twice; bench decode T=1.
set -u
export TE_ASYNC_COMMIT=$(cat .gpubuild/commit)
export OUT
PREBUILT=.gpubuild/te_async-0.1.0-cp312-cp312-linux_x86_64.whl bash tools/gpu_check.sh build
PYTEST_ARGS="tests/test_token_moe.py tests/test_token_ffn.py tests/test_decode_moe_gpu.py tests/test_models_gpu.py" \
  timeout 100 bash tools/gpu_check.sh test
P=$OUT/p; mkdir -p $P
python3 -m pip install --no-deps --target /tmp/old .gpubuild/oldwheel/te_async-0.1.0-cp312-cp312-linux_x86_64.whl > $P/old_install.log 2>&1
cp -r .gpubuild/old_src/te_async/* /tmp/old/te_async/ && echo "old tree ready"
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true
gen() {  # gen <name> [PYTHONPATH]
  mkdir -p $P/$1
  (cd / && PYTHONPATH=${2:-} TE_ASYNC_COMMIT=${3:-$TE_ASYNC_COMMIT} timeout 100 python3 -P -m te_async.bench generate --out "$P/$1" --preset deepseek-v2-lite --steps 60 --batches 1 --modes device --detail-batch 1 > "$P/$1/stdout.log" 2>&1; echo "rc $?" >> "$P/$1/stdout.log")
  echo "== $1"; grep -E "^\| 1 " $P/$1/generate.md; grep -E "RouteToken|TokenFfn|\*\*device" $P/$1/*kernels.md
}
gen generate_before /tmp/old 3848a7e; gen generate_final; gen generate_final2
tar czf $OUT/probeE1.tgz -C $OUT p
mkdir -p $P/decode_final
(cd / && timeout 60 python3 -P -m te_async.bench decode --out "$P/decode_final" --modes device --batches 1 --detail-batch 1 --cmdbuf-during-profiling > "$P/decode_final/stdout.log" 2>&1; echo "rc $?" >> "$P/decode_final/stdout.log")
grep -E "^\| 1 " $P/decode_final/decode.md; grep -E "RouteToken|TokenFfn" $P/decode_final/*kernels.md
tar czf $OUT/probeE.tgz -C $OUT p
rm -rf $OUT/p $OUT/gpubuild; ls $OUT
