# Helpers for a script that one device call runs (the run tool's command, at most 600 s): source it
# after setting L (the summary file). LIMIT: the seconds the script may use (default 575, leaving
# time to pack the results); T0: when it started (default now).
#   left                            seconds left
#   step <seconds> <log> <command>  the command from /, at most <seconds> and never past the limit,
#                                   output appended to <log>; skipped (noted in $L) with under 25 s left
#   wheels <name>...                each .gpubuild/<name>/te_async-*.whl installed in /tmp/w_<name>, with the
#                                   tree's Python copied over it (a trial's wheels: tools/build_device_wheel.sh);
#                                   AS_BUILT=1: each wheel keeps its own Python (a patch's wheel beside main's)
#   gpu_tests <name> <log> <seconds> <pytest args>...
#                                   pytest on wheel <name>, poisoned outputs, a line with its result in $L
#   gen <name> <out> <preset> <batch> [bench args]...
#                                   generate at batch <batch>, its timeline (unless --no-profile) of that batch
#   decode8 <name>                  bench decode T=8 in device mode, 26 MoE layers written out, on wheel <name>,
#                                   into $R/decode_<name>, a line with its row in $L
#   trip <out> [batch]              the profiled run $R/<out>'s trip at that batch (default 1: the kernels of one
#                                   layer, their ends) as a line in $L
#   pack                            the call's end: a last line in $L, the logs gzipped, $R (but traces) into
#                                   $OUT/results.tgz, $L printed
#   generate <name> <out> <preset> [bench args]...
#                                   bench generate at B=1 (or the args' --batches) in device mode, 60 steps, on wheel
#                                   <name>, into $R/<out> (R: the call's output folder), a line with its row in $L;
#                                   Qwen3-30B-A3B on 24 of its 48 layers, which is what fits an H100 beside the cache;
#                                   PRE: Python run first in the same process (a trial's forced plan)
T0=${T0:-$SECONDS}
LIMIT=${LIMIT:-575}
left() { echo $((LIMIT - (SECONDS - T0))); }
step() {
  local want=$1 log=$2
  shift 2
  local t
  t=$(left)
  if [ "$t" -lt 25 ]; then echo "skipped (no time): $*" >> "$L"; return 1; fi
  [ "$want" -gt $((t - 10)) ] && want=$((t - 10))
  (cd / && timeout "$want" "$@") >> "$log" 2>&1
}
wheels() {
  local w
  for w in "$@"; do
    python3 -m pip install -q --no-deps --target /tmp/w_$w $(ls .gpubuild/$w/te_async-*.whl) > /tmp/install_$w.log 2>&1
    [ "${AS_BUILT:-0}" = 1 ] && continue
    for d in . bench models; do cp te_async/$d/*.py /tmp/w_$w/te_async/$d/; done
  done
}
gpu_tests() {
  local w=$1 log=$2 secs=$3
  shift 3
  PYTHONPATH=/tmp/w_$w TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false step "$secs" "$log" python3 -P \
    -m pytest -q -p no:cacheprovider --rootdir="$PWD" "$@"
  echo "$(basename "$log") (at $((SECONDS - T0)) s): $(tail -1 "$log")" >> "$L"
  grep -E "^(FAILED|ERROR)|^E  " "$log" | head -20 >> "$L"
}
generate() {
  local w=$1 out=$2 preset=$3 layers=
  shift 3
  [ "$preset" = qwen3-30b-a3b ] && layers="--layers 24"
  PYTHONPATH=/tmp/w_$w XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 step 80 "$R/$out.log" python3 -P -c "${PRE:-}import runpy, \
sys; sys.argv = ['te_async.bench'] + sys.argv[1:]; runpy.run_module('te_async.bench', run_name='__main__')" generate \
    --preset "$preset" $layers --batches 1 --modes device --steps 60 --no-plots --out "$R/$out" "$@"
  echo "generate $out (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' "$R/$out/generate.md" 2>/dev/null)" >> "$L"
}
gen() {
  local w=$1 out=$2 preset=$3 b=$4
  shift 4
  generate "$w" "$out" "$preset" --batches "$b" --detail-batch "$b" "$@"
}
decode8() {
  PYTHONPATH=/tmp/w_$1 step 100 "$R/decode_$1.log" python3 -P -m te_async.bench decode --modes device --batches 8 \
    --reps 10 --no-plots --no-profile --out "$R/decode_$1"
  echo "decode $1 (at $((SECONDS - T0)) s): $(grep -E '^\| [0-9]' "$R/decode_$1/decode.md" 2>/dev/null)" >> "$L"
}
trip() {
  echo "$1: $(sed -n '/One trip/,$p' "$R/$1/generate_timeline_B${2:-1}_kernels.md" 2>/dev/null |
    grep -E 'Product|MlaToken|Route|TokenFfn|Reduce|Decode|Gqa' | tr '\n' ' ')" >> "$L"
}
pack() {
  echo "=== done at $((SECONDS - T0)) s" >> "$L"
  gzip -f "$R"/*.log
  tar czf "$OUT/results.tgz" -C "$R" --exclude=traces .
  cat "$L"
}
