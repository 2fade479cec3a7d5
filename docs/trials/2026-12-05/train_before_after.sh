#!/usr/bin/env bash
# bench train-model with the training path as it was at 5457eb1 (JAX's own derivatives: float32
# GEMMs in every dense backward, row scatter-adds, float32 residuals) and as it is now, one after
# the other in one call, on the installed te_async (tools/gpu_check.sh build first). Python-only:
# the "before" package is the installed one with 5457eb1's versions of the files this session
# changed in the training path laid over it (git needed: the device copy carries .git).
# Usage: bash docs/trials/2026-12-05/train_before_after.sh [train-model args...]
set -euo pipefail
OUT=${OUT:-$PWD/out}
site=$(cd / && python3 -c 'import os, te_async; print(os.path.dirname(te_async.__file__))')
before=$(mktemp -d)
cp -r "$site" "$before/"
changed="te_async/routing.py te_async/moe.py te_async/mlp.py te_async/dense.py te_async/decode_attention.py
  te_async/decode_moe.py te_async/expert_parallel.py te_async/bench/decode.py te_async/models/model.py
  te_async/models/mla.py te_async/models/moe_layer.py te_async/models/norm.py"
git archive 5457eb1 $changed | tar -x -C "$before"
args=("$@")
# Default: device mode at 4 layers, 5 x 3 timed steps: 4 compiles of a 4-layer step (not timed
# yet on a GPU; budget a few minutes of the 10-minute call).
[ ${#args[@]} -gt 0 ] || args=(--contenders device --layers 4 --reps 5)
for run in before after after_again before_again; do
  case $run in before*) path=$before ;; *) path= ;; esac
  echo "== $run"
  (cd / && PYTHONPATH=$path python3 -P -m te_async.bench train-model --out "$OUT/train_model_$run" "${args[@]}")
done
