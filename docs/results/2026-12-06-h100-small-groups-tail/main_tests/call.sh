#!/bin/bash
# Stop 65, call 2: main (dbc0426's C++ = ff4eda7's, the CPU-built wheel of .gpubuild/prebuilt) with the tree's
# Python: the GPU test files not run since stop 62, poisoned, 12 workers.
set -u
S=$PWD; R=/tmp/s65m; rm -rf $R; mkdir -p $R; L=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $L
python3 -m pip install --no-deps --force-reinstall $(ls .gpubuild/prebuilt/te_async-*.whl) > $R/install.log 2>&1
site=$(cd / && python3 -c "import te_async, os; print(os.path.dirname(te_async.__file__))")
cp te_async/*.py $site/ && cp te_async/bench/*.py $site/bench/ && cp te_async/models/*.py $site/models/
git show dbc0426:tests/test_gpu_device_mode.py > $R/test_gpu_device_mode.py
files="$S/tests/test_dense.py $S/tests/test_routing.py $S/tests/test_token_ffn.py $S/tests/test_token_moe.py $S/tests/test_mla_decode.py $S/tests/test_mla_token.py $S/tests/test_decode_attention.py $S/tests/test_gpu_host_sized.py $S/tests/test_gpu_slot_identity.py"
cp $R/test_gpu_device_mode.py $S/tests/test_gpu_device_mode.py
(cd / && TE_ASYNC_POISON_OUTPUTS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout ${LIMIT:-300} python3 -P -m pytest -q -n 12 -p no:cacheprovider \
  --rootdir=$S $S/tests/test_gpu_device_mode.py $files) > $R/tests.log 2>&1
echo "tests: $(tail -1 $R/tests.log)" >> $L; grep -E "^(FAILED|ERROR)" $R/tests.log | head -20 >> $L
gzip -f $R/tests.log; tar czf $OUT/results.tgz -C $R tests.log.gz
cat $L
