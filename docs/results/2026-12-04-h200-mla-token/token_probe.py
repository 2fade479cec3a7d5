"""Session 44 probe: te_async.mla_token at DeepSeek-V2-Lite's shapes, 4096 cached tokens, 26 stacked
layers in a scan (as bench attention): wall clock and GPU busy per layer for the call with its
split count forced (0: splits_for's) against the unfused path (norm, rope, writes, einsums around
decode_attention's kernel). argv: mode ("time" or "ncu"), batch."""
import sys
import jax, jax.numpy as jnp
from te_async import mla_token, decode_attention
from te_async.mla_decode import mla_decode_unfused
from te_async.models.attention import LayerOf, linear, write
from te_async.models.mla import LATENT_NORM_EPS, _rope
from te_async.models.norm import rms_norm
from te_async.bench import timing

mode, batch = sys.argv[1], int(sys.argv[2])
L, N, H, pos, scale = 26, 4096, 16, 4095, 0.1
k = iter(jax.random.split(jax.random.key(0), 8))
x = lambda s, *shape: (s * jax.random.normal(next(k), shape)).astype(jnp.bfloat16)
q, kv_a, kv_norm, w_kv = x(1, batch, 1, H, 192), x(3, batch, 1, 576), x(0.1, 512) + 1, x(0.05, H, 256, 512)
wo = x(0.05, H * 128, 2048)
ckv, kpe = x(1, L, batch, N, 512), x(1, L, batch, N, 64)
cos, sin = jnp.cos(jnp.arange(64.0)), jnp.sin(jnp.arange(64.0))

def token(ckv, kpe):
    def body(c, layer):
        out, a, b = mla_token.mla_token_attention(q, kv_a, kv_norm, w_kv, wo, cos, sin, *c, pos, layer, scale=scale,
                                                  eps=LATENT_NORM_EPS, interleaved=True)
        return (a, b), out
    return jax.lax.scan(body, (ckv, kpe), jnp.arange(L, dtype=jnp.int32))

def unfused(ckv, kpe):
    def body(c, layer):
        ck, kp = c
        cc = rms_norm(kv_a[..., :512], kv_norm, LATENT_NORM_EPS)
        kk = _rope(kv_a[..., None, 512:], cos[None], sin[None], True)[:, :, 0]
        ck, kp = write(LayerOf(ck, layer), cc, pos).stack, write(LayerOf(kp, layer), kk, pos).stack
        out = mla_decode_unfused(q[..., :128], _rope(q[..., 128:], cos[None], sin[None], True), w_kv, ck, kp,
                                 jnp.int32(pos), layer, scale=scale, attention="te_async")
        return (ck, kp), linear(out.reshape(batch, 1, -1), wo)
    return jax.lax.scan(body, (ckv, kpe), jnp.arange(L, dtype=jnp.int32))

default = mla_token.splits_for
if mode == "ncu":
    f = jax.jit(token, donate_argnums=(0, 1))
    for _ in range(3):
        (ckv, kpe), out = f(ckv, kpe)
    out.block_until_ready()
    sys.exit()
for name, fn, splits in [("unfused", unfused, 0), ("token", token, 0), ("token", token, 32),
                         ("unfused", unfused, 0), ("token", token, 0)]:
    mla_token.splits_for = default if splits == 0 else (lambda b, n, s, k=splits: k)
    f = jax.jit(fn, donate_argnums=(0, 1))
    state = [(ckv, kpe)]
    def call(c):
        (a, b), out = f(*c)
        state[0] = (a, b)
        return out
    # each call donates the cache: feed it the last one's
    import time
    for _ in range(3):
        call(state[0]).block_until_ready()
    ts = []
    for _ in range(20):
        t0 = time.perf_counter()
        for _ in range(5):
            o = call(state[0])
        o.block_until_ready()
        ts.append((time.perf_counter() - t0) / 5)
    ts.sort()
    ckv, kpe = state[0]
    g = jax.jit(lambda c, k: fn(c, k)[1])  # not donated: XLA copies the cache in first (both paths alike)
    gpu = timing.device_time_s(g, [(ckv, kpe)])
    print(f"B={batch} {name:8s} splits {splits if splits else default(batch, N, (512, 64, 512, True)):4d}: "
          f"{1e6 * ts[len(ts) // 2] / L:7.2f} us per layer wall clock p50 (donated), "
          f"{1e6 * gpu / L:7.2f} us GPU busy (with the cache copy)", flush=True)
