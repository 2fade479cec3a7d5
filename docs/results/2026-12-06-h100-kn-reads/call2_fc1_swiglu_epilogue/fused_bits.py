"""te_async.decode_moe.fused_experts on fixed random inputs (bf16 and f32; T = 1, 5, 8, 16; E = 64,
H = 2048, F = 1408, top-6, the routing kernel's dispatch), every output saved to argv[1] (.npz), so
that two builds can be compared bit for bit: the swiglu epilogue computes what fc2's prologue did."""
import sys

import jax
import jax.numpy as jnp
import numpy as np

from te_async import decode_moe
from te_async.routing import route

out = {}
rng = np.random.default_rng(7)
E, H, F, K = 64, 2048, 1408, 6
for dtype in (jnp.bfloat16, jnp.float32):
    w1 = jnp.asarray(rng.standard_normal((E, H, 2 * F)) / np.sqrt(H), dtype)
    w2 = jnp.asarray(rng.standard_normal((E, F, H)) / np.sqrt(F), dtype)
    for tokens in (1, 5, 8, 16):
        x = jnp.asarray(rng.standard_normal((tokens, H)), dtype)
        routing, dispatch = route(jnp.asarray(rng.standard_normal((tokens, E)), jnp.float32), K, renormalize=True)
        assert decode_moe.can_fuse(tokens, K, w1, w2, mode="device", activation="swiglu")
        y = jax.jit(decode_moe.fused_experts)(x, routing, dispatch, w1, w2)
        out[f"{jnp.dtype(dtype).name}_T{tokens}"] = np.asarray(y.astype(jnp.float32))
np.savez(sys.argv[1], **out)
print("saved", sorted(out))
