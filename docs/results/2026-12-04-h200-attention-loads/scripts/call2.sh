#!/bin/bash
# Call 2: the attention loads A/B in one machine session. "new": this tree's wheel (call 1's build,
# carried in .gpubuild/$COMMIT); "before": c05bad7's wheel (main's kernels before this change) with
# this tree's Python, its resident-blocks query answered by with_resident.py (same key splits).
# Processes alternate new, before, new, before.
set -u
export TE_ASYNC_COMMIT=${COMMIT:?}
S=docs/results/2026-12-04-h200-attention-loads/scripts
R=/tmp/runs; mkdir -p $R
python3 -m pip install -q --no-deps --force-reinstall .gpubuild/$COMMIT/*.whl
python3 -m pip install -q --no-deps --target /tmp/before .gpubuild/c05bad7/*.whl
cp te_async/*.py /tmp/before/te_async/ && cp te_async/bench/*.py /tmp/before/te_async/bench/ && cp te_async/models/*.py /tmp/before/te_async/models/
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $R/gpu.txt
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" >> $R/gpu.txt
bench() {  # bench <tree> <run> <name> <args...>
  local tree=$1 run=$2 name=$3; shift 3
  local d=$R/${name}_${tree}_run$run; mkdir -p $d
  echo "=== $(date +%T) $name $tree run $run"
  if [ $tree = new ]; then timeout 200 python3 -P -m te_async.bench "$@" --out $d > $d/stdout.log 2>&1
  else PYTHONPATH=/tmp/before timeout 200 python3 -P $S/with_resident.py "$@" --out $d > $d/stdout.log 2>&1; fi
  echo "rc $?"; tail -n 12 $d/*.md 2>/dev/null | head -n 30
}
for run in 1 2; do for tree in new before; do
  bench $tree $run attention_mla attention --preset deepseek-v2-lite --batches 1 8 16 64 --reps 10
done; done
for tree in new before; do
  bench $tree 1 attention_gqa attention --preset qwen3-30b-a3b --batches 8 64 --reps 10
done
for tree in new before; do
  bench $tree 1 generate generate --preset deepseek-v2-lite --batches 8 64 --modes device --steps 30 --no-profile --no-plots
done
tar czf $OUT/runs_call2.tgz -C $R .
