"""One token's MoE layer at DeepSeek-V2-Lite's shapes (64 experts of [2048, 2x1408] + [1408, 2048],
top-6, 2 shared experts as one [2048, 2x2816] + [2816, 2048] MLP, bf16) through the installed
te_async, with its own plan: te_async.token_moe (norm, router and top-k in the call: the models'
B=1 path) and te_async.token_ffn (the routing given, by te_async.routing.route from random
logits). 26 weight copies unrolled in one jit (one CUDA graph, none in L2); per layer: wall clock
(bench.timing.time_calls) and GPU busy time (a profile). Only public calls, so that two builds run
it alike (PYTHONPATH picks the build). Usage: python3 -P moe_ab.py LABEL; prints one JSON line."""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from te_async import token_ffn as tf, token_moe as tm
from te_async.routing import route
from te_async.bench import timing

L, H, E, F, K, FS = 26, 2048, 64, 1408, 6, 2816
key, bf = jax.random.key(0), jnp.bfloat16
rnd = lambda i, shape, dtype=bf, s=0.02: (jax.random.normal(jax.random.fold_in(key, i), shape, jnp.float32) * s).astype(dtype)
x = rnd(1, (1, H), s=1.0)
logits = [rnd(100 + i, (1, E), jnp.float32, 1.0) for i in range(L)]
W = [(rnd(1000 + i, (E, H, 2 * F)), rnd(2000 + i, (E, F, H)), rnd(3000 + i, (H, 2 * FS)), rnd(4000 + i, (FS, H)),
      rnd(5000 + i, (H, E), jnp.float32, 0.05), 1 + rnd(6000 + i, (H,), s=0.1)) for i in range(L)]
floor_bytes = (K * 3 * H * F + 3 * H * FS) * 2
hbm = timing.hbm_bandwidth()


def moe(x, ws):
    return [tm.token_moe(x, tm.Norm(sc, 1e-6, True), tm.Router(r, K, False), w1, w2, tf.Shared(s1, s2), residual=True)[0]
            for w1, w2, s1, s2, r, sc in ws]


def ffn(x, lg, ws):
    out = []
    for l, (w1, w2, s1, s2, _, _) in zip(lg, ws):
        r, _ = route(l, K, renormalize=False)
        out.append(tf.token_ffn(x, tf.Routed(r.experts, r.weights, w1, w2), tf.Shared(s1, s2)))
    return out


result = {"label": sys.argv[1], "hbm_TBps": hbm / 1e12, "floor_us": 1e6 * floor_bytes / hbm}
for name, fn, args in (("token_moe", moe, (x, W)), ("token_ffn", ffn, (x, logits, W))):
    call = jax.jit(fn)
    wall = timing.time_calls(call, [args], reps=20).median_s / L
    gpu = timing.device_times(call, [args])["busy_s"] / L
    y = np.asarray(call(*args)[-1], np.float32)
    result[name] = {"wall_us": 1e6 * wall, "gpu_us": 1e6 * gpu, "last_layer_out": y[0, :4].tolist(),
                    "last_layer_abs_sum": float(np.abs(y).sum())}
print(json.dumps(result), flush=True)
