"""One case of the skewed-wgrad probe, for ncu: the ragged-k grouped GEMM (device mode) of
DeepSeek-V2-Lite's fc1 or fc2 weight gradient on the even or skewed split, or a write-only
kernel of the same output bytes (the HBM write ceiling). "skewed_merged": the skewed split with
its groups of 1-64 rows moved into the largest (the same FLOPs; those groups' outputs written by
the setup kernel's zero-fill instead of GEMM tiles). Three calls, after a warm-up."""
import sys

import jax
import jax.numpy as jnp
import numpy as np

from te_async import grouped_gemm
from te_async.bench import presets
from te_async.bench.prefill import gemms, splits

case = sys.argv[1]
model = presets.PRESETS[presets.GPU_DEFAULT]
if case == "write":
    out = jax.ShapeDtypeStruct((model.experts, model.hidden, 2 * model.ffn), jnp.bfloat16)
    fn = jax.jit(lambda s: jnp.full(out.shape, s, out.dtype))
    args = (jnp.float32(1.0),)
else:
    gemm, split = case.split(":")
    form, k, n = gemms(model)[gemm]
    sizes = np.asarray(splits(model, 4096)[split.removesuffix("_merged")], np.int32)
    if split.endswith("_merged"):  # the groups of 1-64 rows moved into the largest: empty, zero-filled
        tiny = (sizes > 0) & (sizes <= 64)
        sizes[np.argmax(sizes)] += sizes[tiny].sum()
        sizes[tiny] = 0
    rng = np.random.default_rng(0)
    m = int(sizes.sum())
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
    fn = jax.jit(lambda a, b, g: grouped_gemm(a, b, g, ragged="k", group_sizes_mode="device"))
    args = (lhs, rhs, jnp.asarray(sizes))
fn(*args).block_until_ready()
for _ in range(3):
    fn(*args).block_until_ready()
print(case, "done")
