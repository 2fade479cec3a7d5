#!/bin/bash
# Stop 65, call 3 (same machine, main's wheel installed by call 2): compute-sanitizer memcheck of main's kernels
# since ff4eda7's launch refactor: token_ffn's and token_moe's tests, then the dense split-K tests.
set -u
S=$PWD; R=/tmp/s65c; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt; : > $L
git show dbc0426:tests/test_gpu_device_mode.py > $S/tests/test_gpu_device_mode.py
run() {  # run <seconds> <name> <pytest args...>
  local t=$1 n=$2; shift 2
  (cd / && TE_ASYNC_POISON_OUTPUTS=1 timeout $t compute-sanitizer --tool memcheck --print-limit 20 python3 -P -m pytest -q \
    -p no:cacheprovider --rootdir=$S "$@") > $R/memcheck_$n.log 2>&1
  echo "memcheck $n: $(grep -E 'ERROR SUMMARY|passed|failed' $R/memcheck_$n.log | tail -2 | tr '\n' ' ')" >> $L
}
run 150 token_ffn $S/tests/test_token_ffn.py $S/tests/test_token_moe.py -x
run 100 split_k $S/tests/test_gpu_device_mode.py -k "split_k or decode_shapes" -x
gzip -f $R/*.log; tar czf $OUT/results.tgz -C $R .
cat $L
