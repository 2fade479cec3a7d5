"""One token_moe call (DeepSeek-V2-Lite's routed + shared experts), run a few times for ncu."""
import jax, jax.numpy as jnp
from te_async import token_moe as tm, token_ffn as tf
H, E, F, K, FS = 2048, 64, 1408, 6, 2816
k = jax.random.key(0); bf = jnp.bfloat16
x = jax.random.normal(k, (1, H), bf)
w1 = jax.random.normal(jax.random.fold_in(k, 1), (E, H, 2 * F), bf) * 0.02
w2 = jax.random.normal(jax.random.fold_in(k, 2), (E, F, H), bf) * 0.02
sh = tf.Shared(jax.random.normal(jax.random.fold_in(k, 3), (H, 2 * FS), bf) * 0.02,
               jax.random.normal(jax.random.fold_in(k, 4), (FS, H), bf) * 0.02)
norm = tm.Norm(jnp.ones((H,), bf), 1e-6, True)
router = tm.Router(jax.random.normal(jax.random.fold_in(k, 5), (H, E), bf) * 0.02, K, False, 1.0, 1, 1)
f = jax.jit(lambda x: tm.token_moe(x, norm, router, w1, w2, sh, residual=True)[0])
for _ in range(5):
    y = f(x)
y.block_until_ready(); print("ok", float(jnp.abs(y).sum()))
