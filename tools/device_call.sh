# Helpers for a script that one device call runs (the run tool's command, at most 600 s): source it
# after setting L (the summary file). LIMIT: the seconds the script may use (default 575, leaving
# time to pack the results); T0: when it started (default now).
#   left                            seconds left
#   step <seconds> <log> <command>  the command from /, at most <seconds> and never past the limit,
#                                   output appended to <log>; skipped (noted in $L) with under 25 s left
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
