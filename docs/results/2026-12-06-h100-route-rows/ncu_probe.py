"""route_rows alone at DeepSeek-V2-Lite's shapes (H 2048, 64 experts, top-6, moe_block's options), T tokens
from argv, jitted and run 5 times, for ncu (stop 66: the kernel took 18 us a layer at T = 8 in bench decode)."""
import sys

import jax
import jax.numpy as jnp
import numpy as np

from te_async import route_rows
from te_async.token_moe import Norm, Router

t = int(sys.argv[1])
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((t, 2048)), jnp.bfloat16)
norm = Norm(jnp.ones((2048,), jnp.float32), 1e-6, False)
router = Router(jnp.asarray(rng.standard_normal((2048, 64)) / 45, jnp.bfloat16), 6, True, reads_normed=False)
assert route_rows.applies(x, norm, router)
fn = jax.jit(lambda x: route_rows.route_rows(x, norm, router))
for _ in range(5):
    jax.block_until_ready(fn(x))
print("ok", t)
