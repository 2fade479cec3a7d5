"""(Call 2, written for aa0c869's Python.) Runs `python -m te_async.bench ARGS` on a wheel built
before 2ddc559, whose CUDA module has no decode_attention_blocks_per_sm: the query is answered
from its measured values at compute capability 9.0 (tests/test_decode_attention.py::
test_blocks_per_sm: 2 blocks per SM for MLA's 576 score dims, 5 for the 128-dim heads), so that
both wheels run the same key splits."""
import runpy
import sys

import te_async.decode_attention as da

da._blocks_per_sm = lambda score_dims, value_dims, values_are_keys: {576: 2, 128: 5}[score_dims]
sys.argv = ["te_async.bench"] + sys.argv[1:]
runpy.run_module("te_async.bench", run_name="__main__")
