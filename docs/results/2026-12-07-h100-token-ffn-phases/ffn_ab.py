"""token_ffn at DeepSeek-V2-Lite's shapes on the installed wheel, 26 weight copies unrolled in one jit (none in L2):
GPU busy time a layer of the shared MLP alone (a dense MLP) and of the routed + shared experts (route()'s choice from
random logits), with the plan token_ffn gives (printed). argv: a label for the lines."""
import sys
import jax, jax.numpy as jnp
from te_async import token_ffn as tf
from te_async.bench import timing
from te_async.routing import route

L, H, E, F, K, FS = 26, 2048, 64, 1408, 6, 2816
key, bf = jax.random.key(0), jnp.bfloat16
x = jax.random.normal(key, (1, H), bf)
logits = [jax.random.normal(jax.random.fold_in(key, 100 + i), (1, E), jnp.float32) for i in range(L)]
W = [tuple(jax.random.normal(jax.random.fold_in(key, 10 * i + j), shape, bf) * 0.02
           for j, shape in enumerate([(E, H, 2 * F), (E, F, H), (H, 2 * FS), (FS, H)])) for i in range(L)]


def layer(x, lg, w, routed):
    r, _ = route(lg, K, renormalize=False)
    return tf.token_ffn(x, tf.Routed(r.experts, r.weights, w[0], w[1]) if routed else None, tf.Shared(w[2], w[3]))


for name, routed in (("dense MLP (the shared experts alone)", False), ("routed + shared", True)):
    call = jax.jit(lambda x, lg, w: [layer(x, l, c, routed) for l, c in zip(lg, w)])
    busy = timing.device_times(call, [(x, logits, W)])["busy_s"] / L
    plan = tf.plan_split(K if routed else 0, F if routed else 0, FS, H, 132, True)
    print(f"{sys.argv[1]}: {name}: {1e6 * busy:.2f} us GPU a layer (plan {tuple(plan)})", flush=True)
