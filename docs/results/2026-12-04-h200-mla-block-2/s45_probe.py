"""Session 45 probe for ncu: te_async.mla_token.mla_token_block alone at DeepSeek-V2-Lite's shapes,
4096 cached tokens, 26 stacked layers in a scan, three jitted trips over the layers. argv: batch."""
import sys
import jax, jax.numpy as jnp
from te_async import mla_token
from te_async.models.mla import LATENT_NORM_EPS

batch = int(sys.argv[1])
L, N, H, pos, scale = 26, 4096, 16, 4095, 0.1
k = iter(jax.random.split(jax.random.key(0), 8))
r = lambda s, *shape: (s * jax.random.normal(next(k), shape)).astype(jnp.bfloat16)
x, norm, w_in = r(1, batch, 1, 2048), r(0.1, 2048) + 1, r(0.03, 2048, H * 192 + 576)
kv_norm, w_kv, wo = r(0.1, 512) + 1, r(0.05, H, 256, 512), r(0.05, H * 128, 2048)
ckv, kpe = r(1, L, batch, N, 512), r(1, L, batch, N, 64)
cos, sin = jnp.cos(jnp.arange(64.0)), jnp.sin(jnp.arange(64.0))

def token(ckv, kpe):
    def body(c, layer):
        out, a, b = mla_token.mla_token_block(x, norm, w_in, kv_norm, w_kv, wo, cos, sin, *c, pos, layer, eps=1e-6,
                                              latent_eps=LATENT_NORM_EPS, scale=scale, interleaved=True)
        return (a, b), out
    return jax.lax.scan(body, (ckv, kpe), jnp.arange(L, dtype=jnp.int32))

f = jax.jit(token, donate_argnums=(0, 1))
for _ in range(3):
    (ckv, kpe), out = f(ckv, kpe)
out.block_until_ready()
