"""Would an L2 prefetch of the shared experts during the attention pay? 26 DeepSeek-V2-Lite token_moe
layers unrolled in one jit; before each, a reduction reads 34.6 MB: the layer's shared experts
(they are then in L2 when token_moe starts) or a dummy buffer of the same size (cold, the same
extra work). GPU busy per layer; the difference is token_moe's gain from finding its shared
experts in L2."""
import jax, jax.numpy as jnp
from te_async import token_moe as tm, token_ffn as tf
from te_async.bench import timing
L, H, E, F, K, FS = 26, 2048, 64, 1408, 6, 2816
k = jax.random.key(0); bf = jnp.bfloat16
x = jax.random.normal(k, (1, H), bf)
W = []
for i in range(L):
    f = lambda j: jax.random.fold_in(k, 10 * i + j)
    W.append(dict(w1=jax.random.normal(f(1), (E, H, 2 * F), bf) * 0.02, w2=jax.random.normal(f(2), (E, F, H), bf) * 0.02,
                  s1=jax.random.normal(f(3), (H, 2 * FS), bf) * 0.02, s2=jax.random.normal(f(4), (FS, H), bf) * 0.02,
                  d1=jax.random.normal(f(5), (H, 2 * FS), bf) * 0.02, d2=jax.random.normal(f(6), (FS, H), bf) * 0.02,
                  r=jax.random.normal(f(7), (H, E), bf) * 0.02))
norm = tm.Norm(jnp.ones((H,), bf), 1e-6, True)

def stack(x, W, warm):
    for w in W:
        scale = 1 + 0 * x[0, 0].astype(jnp.float32)  # the read runs after the previous layer
        a, b = (w["s1"], w["s2"]) if warm else (w["d1"], w["d2"])
        s = jnp.sum(a.astype(jnp.float32) * scale) + jnp.sum(b.astype(jnp.float32) * scale)
        x = x + (0 * s).astype(bf)
        x = tm.token_moe(x, norm, tm.Router(w["r"], K, False), w["w1"], w["w2"], tf.Shared(w["s1"], w["s2"]), residual=True)[0]
    return x

for rep in range(2):
    for warm in (False, True):
        call = jax.jit(lambda x, W, warm=warm: stack(x, W, warm))
        busy = timing.device_times(call, [(x, W)])["busy_s"] / L
        wall = timing.time_calls(call, [(x, W)], reps=10).median_s / L
        print(f"shared experts {'in L2 (read just before)' if warm else 'cold (a dummy read before)':34s} GPU busy {1e6*busy:6.2f} us, wall {1e6*wall:6.2f} us a layer", flush=True)
