#!/bin/bash
# The rest of call_b_h100.sh's memcheck selection in shorter processes (one long process crashed Python
# after 12 tests; each test of call_memcheck_route.sh alone passed with 0 errors).
set -u
R=/tmp/mr2; rm -rf $R; mkdir -p $R; T0=$SECONDS; S=$PWD; L=$OUT/summary.txt; : > $L
for k in "kernel_matches_reference and -1-random and softmax" "kernel_matches_reference and -1-random and sigmoid" \
         "kernel_matches_reference and -64-random and softmax" "kernel_matches_reference and -64-random and sigmoid" \
         "kernels_against_float64"; do
  n=$(echo "$k" | tr -c 'a-z0-9' '_')
  (cd / && PYTHONPATH=/tmp/w_mr XLA_PYTHON_CLIENT_ALLOCATOR=platform timeout 75 compute-sanitizer --tool memcheck \
    --error-exitcode 99 python3 -P -m pytest -q -p no:cacheprovider --rootdir=$S $S/tests/test_routing.py $S/tests/test_token_moe.py -k "$k") > $R/$n.log 2>&1
  echo "$k: rc $? $(grep -E 'passed|failed|ERROR SUMMARY' $R/$n.log | tr '\n' ' ') (at $((SECONDS - T0)) s)" >> $L
done
tar czf $OUT/logs.tgz -C $R .
cat $L
