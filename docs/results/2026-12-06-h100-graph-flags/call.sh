#!/bin/bash
# One call on an H100 (nothing carried), when no H200 comes: call_a.sh's risk check and call_b.sh's
# XLA_FLAGS question without CUTLASS (T = 1 and 8 run no CUTLASS kernel), most important first:
# 1. main ("new") without CUTLASS: bench decode device T = 1 8 under three XLA_FLAGS (call_b.sh's).
# 2. bench dense --rows 1 2 for old / new / mix (call_a.sh's), then generate B = 2 old / new.
# 3. mix's tests in the time left. $OUT/summary.txt, results.tgz.
set -u
T=docs/trials/2026-12-07-h200-kn-reads; R=/tmp/h1; rm -rf $R; mkdir -p $R; T0=$SECONDS; S=$PWD; L=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
for v in old new mix; do
  rm -rf /tmp/src_$v /tmp/wheel_$v; mkdir -p /tmp/src_$v && cp -r CMakeLists.txt pyproject.toml README.md LICENSE csrc te_async tests /tmp/src_$v/
done
(cd /tmp/src_old && patch -p1 < $S/$T/before_kn_cx16.patch) > $R/patch.log 2>&1 || exit 1
(cd /tmp/src_mix && patch -p1 < $S/$T/mix_split_128.patch) >> $R/patch.log 2>&1 || exit 1
build() {  # tree, parallel jobs
  ( cd /tmp/src_$1 && CMAKE_BUILD_PARALLEL_LEVEL=$2 \
    python3 -m pip wheel --no-build-isolation --no-deps --config-settings=cmake.define.TE_ASYNC_WITH_CUDA=ON \
    --config-settings=cmake.define.TE_ASYNC_WITH_CUTLASS=OFF --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real \
    -w /tmp/wheel_$1 . > $R/build_$1.log 2>&1; rm -rf /tmp/w_$1; mkdir -p /tmp/w_$1
    python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" /tmp/wheel_$1/te_async-*.whl /tmp/w_$1 )
}
build old 5 & build new 6 & build mix 5 &
wait
echo "built at $((SECONDS - T0)) s: $(ls /tmp/wheel_old /tmp/wheel_new /tmp/wheel_mix | tr '\n' ' ')" >> $L
P=--xla_enable_command_buffers_during_profiling=true  # the profiled step keeps the timed step's graphs
flags_default="$P"; flags_min1="$P --xla_gpu_graph_min_graph_size=1"
flags_while="$P --xla_gpu_graph_min_graph_size=1 --xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"
for f in default min1 while; do
  eval xf=\$flags_$f
  (cd / && PYTHONPATH=/tmp/w_new XLA_FLAGS="$xf" timeout 80 python3 -P -m te_async.bench decode --modes device --batches 1 8 \
    --reps 10 --no-plots --detail-batch 1 --out $R/decode_$f) > $R/decode_$f.log 2>&1
  echo "--- new, XLA_FLAGS='$xf' (at $((SECONDS - T0)) s)" >> $L; grep -E '^\| [0-9]' $R/decode_$f/decode.md >> $L
  python3 -c "import json; print([(r['batch'], r.get('n_graph_launches'), r.get('n_kernels')) for r in json.load(open('$R/decode_$f/decode.json'))['results']])" >> $L 2>&1
done
for v in old new mix; do  # the 1- and 2-row dense GEMMs (split K over clusters): 128-column tiles halve their items
  (cd / && PYTHONPATH=/tmp/w_$v timeout 90 python3 -P -m te_async.bench dense --rows 1 2 --out $R/dense_$v) > $R/dense_$v.log 2>&1
  echo "--- dense $v (at $((SECONDS - T0)) s)" >> $L; grep -hE '^\| ' $R/dense_$v/*.md | head -24 >> $L
done
for v in old new; do
  (cd / && PYTHONPATH=/tmp/w_$v timeout 90 python3 -P -m te_async.bench generate --preset deepseek-v2-lite --batches 2 \
    --modes device --steps 40 --no-plots --no-profile --out $R/generate_b2_$v) > $R/generate_b2_$v.log 2>&1
  echo "generate B=2 $v (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' $R/generate_b2_$v/generate.md | tr '\n' ' ')" >> $L
done
left=$((570 - (SECONDS - T0))); [ $left -lt 30 ] && left=1  # timeout 0 would mean no limit
x=; python3 -c "import xdist" 2>/dev/null && x="-n 8"
(cd / && PYTHONPATH=/tmp/w_mix TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout $left python3 -P -m pytest -q $x \
  -p no:cacheprovider --rootdir=/tmp/src_mix /tmp/src_mix/tests/test_dense.py /tmp/src_mix/tests/test_gpu_device_mode.py) > $R/tests_mix.log 2>&1
echo "mix tests ($left s allowed): $(tail -1 $R/tests_mix.log)" >> $L
echo "=== done at $((SECONDS - T0)) s" >> $L
gzip $R/tests_mix.log
tar czf $OUT/results.tgz -C $R --exclude='traces' .
cat $L
