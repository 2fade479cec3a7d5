#!/bin/bash
# stop 63 call 8: call 6 at B = 2 (written out: UNROLL_BATCHES + (2,))
# stops at 16 "until that is measured"): bench generate, device mode, DeepSeek-V2-Lite, 4096 cached tokens,
# written out ("out": UNROLL_BATCHES + (2,)) against scanned ("scan": main), alternating, twice.
set -u
R=/tmp/un8; rm -rf $R; mkdir -p $R/w; T0=$SECONDS; L=$OUT/summary.txt
export TE_ASYNC_COMMIT=80aa36b
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt > $L
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" .gpubuild/s63/wheel/te_async-*.whl $R/w
cp te_async/*.py $R/w/te_async/ && cp te_async/bench/*.py $R/w/te_async/bench/ && cp te_async/models/*.py $R/w/te_async/models/
export XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
OUTP="import te_async.models.model as mm; mm.UNROLL_BATCHES = mm.UNROLL_BATCHES + (2,); "
for run in 1 2; do
  for w in out scan; do
    pre=""; [ $w = out ] && pre="$OUTP"
    (cd / && PYTHONPATH=$R/w timeout 200 python3 -P -c "${pre}import runpy, sys; sys.argv = ['te_async.bench'] + sys.argv[1:]; runpy.run_module('te_async.bench', run_name='__main__')" \
      generate --preset deepseek-v2-lite --batches 2 --modes device --steps 60 --no-plots --no-profile --out $R/gen_${w}_$run) > $R/gen_${w}_$run.log 2>&1
    echo "generate $w $run (at $((SECONDS - T0)) s):" >> $L; grep -E '^\| [0-9]' $R/gen_${w}_$run/generate.md >> $L
  done
done
echo "=== done at $((SECONDS - T0)) s" >> $L
tar czf $OUT/results.tgz -C $R --exclude=w .
cat $L
