#!/bin/bash
# Device call 2 (carry .gpubuild/s56, holding call 1's wheel and prep.sh's trees): bench
# train-model for A, B, C, C, B, A on one wheel. Everything lands in $OUT/trial2.tgz.
set -u
R=/tmp/trial2; V=$PWD/.gpubuild/s56; mkdir -p $R; T0=$SECONDS
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c "import jax; print('jax', jax.__version__)"; git rev-parse HEAD; } | tee $R/gpu.txt
python3 -m pip install -q --no-deps --force-reinstall $V/te_async-*.whl
site=$(cd / && python3 -c "import te_async, os; print(os.path.dirname(te_async.__file__))")
cp -r te_async/. $site/   # C: this tree's Python
for v in A B; do mkdir -p /tmp/$v && cp -r $site /tmp/$v/ && cp -r $V/$v/te_async/. /tmp/$v/te_async/; done
tm() {  # tm <variant> <run>: one train-model of a variant (A and B through PYTHONPATH)
  local path=; [ $1 = C ] || path=/tmp/$1
  (cd / && PYTHONPATH=$path timeout 150 python3 -P -m te_async.bench train-model --contenders device --layers 4 --reps 5 \
    --no-plots --no-profile --out $R/tm_$1_$2) > $R/tm_$1_$2.log 2>&1
  echo "=== $(date +%T) $1 run $2 at $((SECONDS - T0)) s"; tail -n 2 $R/tm_$1_$2/train_model.md
}
i=0; for v in A B C C B A; do i=$((i + 1)); [ $((SECONDS - T0)) -lt 440 ] && tm $v $i; done
tar czf $OUT/trial2.tgz -C $R .
