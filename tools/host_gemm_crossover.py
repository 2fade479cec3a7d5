"""Where one grouped cuBLAS call stops paying: async grouped_gemm, 64 groups of R rows each, at
DeepSeek-V2-Lite's expert shapes (fc1 [2048, 2816], fc2 [1408, 2048], and fc1's wgrad), wall clock
per call. Run it twice, plain and with TE_ASYNC_PER_GROUP_GEMMS=1, and compare the columns.
Usage: python -P tools/host_gemm_crossover.py [R ...]
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import te_async
from te_async.bench import timing

GROUPS = 64
SHAPES = {"fc1": (2048, 2816, "m"), "fc2": (1408, 2048, "m"), "fc1 wgrad": (2048, 2816, "k")}


def gemm_call(rows_per_group: int, k: int, n: int, ragged: str):
    rows = GROUPS * rows_per_group
    key = jax.random.PRNGKey(rows_per_group)
    lhs = jax.random.normal(key, (rows, k), jnp.bfloat16)
    rhs = (jax.random.normal(key, (GROUPS, k, n), jnp.bfloat16) if ragged == "m"
           else jax.random.normal(key, (rows, n), jnp.bfloat16))
    sizes = jnp.full((GROUPS,), rows_per_group, jnp.int32)
    f = jax.jit(lambda a, b, s: te_async.grouped_gemm(a, b, s, ragged=ragged, group_sizes_mode="async"))
    t = timing.time_calls(f, [(lhs, rhs, sizes)], reps=20, inner=5)
    return t.median_s * 1e6, 2 * rows * k * n / t.median_s / 1e12


per_group = os.environ.get("TE_ASYNC_PER_GROUP_GEMMS") == "1"
print(f"async, {'one GEMM per group' if per_group else 'one grouped call'}, 64 groups, wall clock us per call (TFLOP/s)")
for r in [int(a) for a in sys.argv[1:]] or [2, 8, 32, 64, 128, 256, 384]:
    cells = [f"{name} {us:8.1f} ({tf:5.1f})" for name, (k, n, rg) in SHAPES.items() for us, tf in [gemm_call(r, k, n, rg)]]
    print(f"R={r:4d}  " + "  ".join(cells), flush=True)
