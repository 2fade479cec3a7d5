# tm <setting> [suffix]: bench train-model on the installed wheel (this tree with CUTLASS) with
# TE_ASYNC_SEQUENCE_ATTENTION=<setting> (xla: the materialised attention as before; auto: cuDNN's flash
# attention), DeepSeek-V2-Lite's first 4 layers, one profiled step.
tm() {
  local d=$R/train_model_$1${2:-}; mkdir -p $d
  echo "=== $(date +%T) train-model $1${2:-} ($((SECONDS - T0)) s)"
  (cd / && env TE_ASYNC_SEQUENCE_ATTENTION=$1 timeout ${TM_LIMIT:-150} python3 -P -m te_async.bench train-model \
    --contenders device --layers 4 --reps 5 --no-plots --out $d) > $d/train_model.log 2>&1; echo "rc $?" >> $d/train_model.log
  grep -hE "^\| " $d/train_model.md 2>/dev/null | head -8 || tail -5 $d/train_model.log; tail -1 $d/train_model.log
}
