#!/usr/bin/env bash
# Call D: build (shared blocks first; units planned for the routed blocks behind the routing);
# GPU tests; units probe (token_moe per layer, wall clock); bench generate B=1 x2 and with the
# previous plan (48 units) forced; bench decode T=1.
set -u
export TE_ASYNC_COMMIT=$(cat .gpubuild/commit)
export OUT
WITH_CUTLASS=0 bash tools/gpu_check.sh build
mkdir -p $OUT/wheels; cp $OUT/gpubuild/te_async-*.whl $OUT/wheels/
PYTEST_ARGS="tests/test_token_moe.py tests/test_token_ffn.py tests/test_decode_moe_gpu.py tests/test_models_gpu.py" \
  timeout 100 bash tools/gpu_check.sh test
P=$OUT/p; mkdir -p $P
cp .gpubuild/units_probe.py /tmp/
(cd /tmp && timeout 150 python3 -P units_probe.py $P/units_probe.json > $P/units_probe.log 2>&1; echo "rc $?" >> $P/units_probe.log)
cat $P/units_probe.log | grep -v Warning
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true
gen() {  # gen <name> [units]
  mkdir -p $P/$1
  (cd / && timeout 100 python3 -P -c "
import sys, runpy
from te_async import token_ffn as tf
u = '${2:-}'
if u: tf.plan_units = lambda *a, **k: int(u)
sys.argv = ['te_async.bench', 'generate', '--out', '$P/$1', '--preset', 'deepseek-v2-lite', '--steps', '60', '--batches', '1', '--modes', 'device', '--detail-batch', '1']
runpy.run_module('te_async.bench', run_name='__main__')
" > "$P/$1/stdout.log" 2>&1; echo "rc $?" >> "$P/$1/stdout.log")
  echo "== $1"; grep -E "^\| 1 " $P/$1/generate.md; grep -E "RouteToken|TokenFfn|\*\*device" $P/$1/*kernels.md
}
gen generate_new; gen generate_u48 48; gen generate_new2
tar czf $OUT/probeD1.tgz -C $OUT p
mkdir -p $P/decode_new
(cd / && timeout 60 python3 -P -m te_async.bench decode --out "$P/decode_new" --modes device --batches 1 --detail-batch 1 --cmdbuf-during-profiling > "$P/decode_new/stdout.log" 2>&1; echo "rc $?" >> "$P/decode_new/stdout.log")
grep -E "^\| 1 " $P/decode_new/decode.md; grep -E "RouteToken|TokenFfn" $P/decode_new/*kernels.md
tar czf $OUT/probeD.tgz -C $OUT p wheels
rm -rf $OUT/p $OUT/gpubuild $OUT/wheels; ls $OUT
