set -u
pip install -q --no-deps --target /tmp/w_new $(ls .gpubuild/new/te_async-*.whl) >/dev/null 2>&1
M="gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__block_size,launch__shared_mem_per_block_dynamic,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_membar.ratio,smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio,smsp__average_warp_latency_issue_stalled_lg_throttle.ratio,smsp__average_warp_latency_issue_stalled_mio_throttle.ratio,smsp__average_warp_latency_issue_stalled_no_instruction.ratio,smsp__inst_executed.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed"
for c in "ds 1" "ds 2" "ds 4" "ds 8" "qw 1" "qw 8"; do
  echo "=== $c" >> $OUT/ncu.txt
  (cd / && PYTHONPATH=/tmp/w_new timeout 80 ncu --clock-control none -k "regex:RouteToken|TokenFfn|ReducePartials" --launch-skip 15 --launch-count 3 --metrics $M --csv python3 -P $OLDPWD/probe/tokmoe_probe.py $c) >> $OUT/ncu.txt 2>&1
done
grep -c . $OUT/ncu.txt
