#!/usr/bin/env bash
# stack_on_timeout.sh SECONDS COMMAND...: runs COMMAND; if it is still running after SECONDS,
# prints every host thread's backtrace (cuda-gdb, the GPU image has no gdb) and kills it.
# For telling a hang from a slow run on the GPU machine.
set -u
limit=$1; shift
"$@" &
pid=$!
for _ in $(seq "$limit"); do
  kill -0 "$pid" 2>/dev/null || { wait "$pid"; exit $?; }
  sleep 1
done
stacks=${OUT:-.}/stacks_$pid.txt
echo "=== still running after ${limit}s: backtraces of pid $pid in $stacks; threads not parked in a pool:"
cuda-gdb -p "$pid" -batch -ex "thread apply all bt 40" >"$stacks" 2>&1
awk '/^Thread /{if (t != "" && t !~ /WaitForWork|processTasks/) print t; t=$0; next} {t=t "\n" $0} END{print t}' "$stacks" | head -150
kill -9 "$pid"
exit 124
