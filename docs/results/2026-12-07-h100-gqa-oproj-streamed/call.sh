#!/bin/bash
# The trial of README.md, one device call (about 9 minutes at LIMIT=560): bench generate Qwen3-30B-A3B
# (24 layers) B=1, each run profiled, main's wheel ("base") against main + oproj_streamed.patch ("streamed")
# and + route_preload.patch too ("streamed_route"), twice each; the GPU tests (poisoned outputs) of the
# patched kernels' files and the chained token calls' on streamed_route; RouteTokenKernel's phases alone
# at Qwen3's router, main's and the patch's; product_probe.cu (the two products alone in every form);
# memcheck of the block's and token_moe's kernel tests on streamed_route. Ordered so that a short call
# gets one run each and the tests first (under LIMIT=300: base and streamed_route only); what does not
# fit is skipped (tools/device_call.sh's LIMIT).
# Carry .gpubuild (.gpubuild/base, streamed and streamed_route; README: how to build them).
set -u
S=$PWD; R=/tmp/gqaoproj; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
export TE_ASYNC_COMMIT=${TE_ASYNC_COMMIT:-unknown}
. tools/device_call.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
SHORT=; [ "$LIMIT" -lt 300 ] && SHORT=1  # a short call: main against both patches, their kernels' tests
if [ -n "$SHORT" ]; then wheels base streamed_route; else wheels base streamed streamed_route; fi
gen() {  # gen <wheel> <run>
  PYTHONPATH=/tmp/w_$1 XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 \
    step 45 $R/gen_$1_$2.log python3 -P -m te_async.bench generate --preset qwen3-30b-a3b --layers 24 \
    --batches 1 --modes device --steps 60 --no-plots --out $R/gen_$1_$2
  echo "$1 $2 (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/gen_$1_$2/generate.md 2>/dev/null)" >> $L
}
FIRST="base streamed streamed_route"; [ -n "$SHORT" ] && FIRST="base streamed_route"
SECOND=$(echo $FIRST | tr " " "\n" | tac | tr "\n" " ")  # the second runs in the other order
for w in $FIRST; do gen $w 1; done
for w in $FIRST; do echo "trip, $w:" >> $L; sed -n '/One trip/,$p' $R/gen_${w}_1/generate_timeline_B1_kernels.md >> $L 2>/dev/null; done
MORE="$S/tests/test_mla_token.py $S/tests/test_decode_attention.py"; [ -n "$SHORT" ] && MORE=
gpu_tests streamed_route $R/tests.log 150 -n 4 $S/tests/test_gqa_token.py $S/tests/test_token_moe.py $MORE
for w in $SECOND; do gen $w 2; done
# RouteTokenKernel's phases alone at Qwen3's router (route_phases.py: %globaltimer stamps), main's and the patch's
# (stop 48's probe, generalised by route_phases_generalised.patch; the tree here is a copy)
T=$S/docs/trials/2026-12-08-gqa-block-oproj-streamed; P=$S/docs/results/2026-12-04-h200-route-phases/probes
git apply $T/route_phases_generalised.patch; cd $R
python3 $P/route_phases.py $S/csrc/cuda/token_ffn.cu base && (cd $S && git apply $T/route_preload.patch) &&
  python3 $P/route_phases.py $S/csrc/cuda/token_ffn.cu route; (cd $S && git apply -R $T/route_preload.patch); cd $S
for n in base route; do step 90 $R/route_phases_build.log nvcc -std=c++17 -arch=sm_90a -O3 -diag-suppress 940,2473,177 \
  --expt-relaxed-constexpr -I$S/csrc -I$(python3 -c "import jax.ffi; print(jax.ffi.include_dir())") -DPROBE_E=128 -DPROBE_K=8 -DPROBE_SLOTS=4 -DPROBE_RENORM=true -o $R/rp_$n $R/route_phases_$n.cu & done; wait
for run in 1 2; do for n in base route; do echo "### $n run $run" >> $R/route_phases.txt; step 20 $R/route_phases.txt $R/rp_$n 1; done; done
echo "route phases (at $((SECONDS - T0)) s):" >> $L; cat $R/route_phases.txt >> $L 2>/dev/null
# the two products alone, each form (product_probe.cu, against the patched header; the tree here is a copy)
git apply docs/trials/2026-12-08-gqa-block-oproj-streamed/oproj_streamed.patch && step 60 $R/probe.log nvcc -O3 -std=c++17 \
  -arch=sm_90a --expt-relaxed-constexpr -I$S/csrc -I$(python3 -c "import jax.ffi; print(jax.ffi.include_dir())") \
  $S/docs/trials/2026-12-08-gqa-block-oproj-streamed/product_probe.cu -o $R/probe && step 30 $R/probe.log $R/probe
echo "probe (at $((SECONDS - T0)) s):" >> $L; grep -E " us " $R/probe.log >> $L
PYTHONPATH=/tmp/w_streamed_route TE_ASYNC_POISON_OUTPUTS=1 step 90 $R/memcheck.log compute-sanitizer --tool memcheck \
  --print-limit 20 python3 -P -m pytest -q -p no:cacheprovider --rootdir=$S $S/tests/test_gqa_token.py $S/tests/test_token_moe.py -k "block and not model or kernels"
echo "memcheck (at $((SECONDS - T0)) s): $(grep -E 'passed|failed' $R/memcheck.log | tail -1) / $(grep 'ERROR SUMMARY' $R/memcheck.log | tail -1)" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip -f $R/*.log; tar czf $OUT/results.tgz -C $R --exclude=traces --exclude=probe --exclude='rp_*' .
cat $L
