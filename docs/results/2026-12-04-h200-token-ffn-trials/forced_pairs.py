"""token_moe at DeepSeek-V2-Lite's shapes, 26 layers unrolled in one jit, with forced (units, shared_units):
it ran on ad29e88's Python, whose plan_units returned that pair (main reverted it, 19e4a1a)."""
import sys
import jax, jax.numpy as jnp
from te_async import token_ffn as tf, token_moe as tm
from te_async.bench import timing
L, H, E, F, K, FS = 26, 2048, 64, 1408, 6, 2816
key, bf = jax.random.key(0), jnp.bfloat16
rnd = lambda i, shape, dtype=bf, s=0.02: (jax.random.normal(jax.random.fold_in(key, i), shape, jnp.float32) * s).astype(dtype)
x = rnd(1, (1, H), s=1.0)
W = [(rnd(1000 + i, (E, H, 2 * F)), rnd(2000 + i, (E, F, H)), rnd(3000 + i, (H, 2 * FS)), rnd(4000 + i, (FS, H)),
      rnd(5000 + i, (H, E), jnp.float32, 0.05), 1 + rnd(6000 + i, (H,), s=0.1)) for i in range(L)]
static = tm._Static(1e-6, True, K, False, 1.0, 1, 1, True, True)
orig = tf.plan_units
pairs = [tuple(map(int, p.split(","))) for p in sys.argv[1:]]
for units in pairs:
    tf.plan_units = lambda *a: units
    call = jax.jit(lambda x, ws: [tm._kernel(x, sc, r, w1, w2, tf.Shared(s1, s2), static)[0] for w1, w2, s1, s2, r, sc in ws])
    wall = timing.time_calls(call, [(x, W)], reps=20).median_s / L
    gpu = timing.device_times(call, [(x, W)])["busy_s"] / L
    print(f"token_moe units {units}: blocks {tf.blocks(K, F, FS, *units)} wall {1e6*wall:.2f} us GPU {1e6*gpu:.2f} us", flush=True)
