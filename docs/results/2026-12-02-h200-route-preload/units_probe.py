"""Probe: 26 unrolled token_moe layers per jitted call, wall clock per call (median of 30, each
blocked on), for forced units per block against the planner's. Shapes: DeepSeek-V2-Lite's MoE with
its two shared experts, and Qwen3-30B-A3B's (128 experts, top-8, F=768, no shared). f32 routers."""
import json, sys, time, statistics
import jax, jax.numpy as jnp
from te_async import token_moe as tm, token_ffn as tf

L = 26
CONFIGS = {"deepseek_shared": (2048, 64, 1408, 6, 2816), "qwen3": (2048, 128, 768, 8, 0)}
plan = tf.plan_units
out = {}
for name, (H, E, F, K, FS) in CONFIGS.items():
    keys = iter(jax.random.split(jax.random.key(0), 8 * L + 1))
    layers = []
    for _ in range(L):
        layers.append(dict(
            scale=1 + 0.1 * jax.random.normal(next(keys), (H,), jnp.bfloat16),
            router=0.02 * jax.random.normal(next(keys), (H, E), jnp.float32),
            w1=0.02 * jax.random.normal(next(keys), (E, H, 2 * F), jnp.bfloat16),
            w2=0.02 * jax.random.normal(next(keys), (E, F, H), jnp.bfloat16),
            sh=(tf.Shared(0.02 * jax.random.normal(next(keys), (H, 2 * FS), jnp.bfloat16),
                          0.02 * jax.random.normal(next(keys), (FS, H), jnp.bfloat16)) if FS else None)))
    x = jax.random.normal(next(keys), (1, H), jnp.bfloat16)
    planned = plan(K, F, FS, H, 132, True)
    for units in [None] + [u for u in (16, 24, 32, 48, 64) if u != planned]:
        tf.plan_units = plan if units is None else (lambda *a, u=units, **k: u)

        def step(x, layers):
            for p in layers:
                x, _ = tm.token_moe(x, tm.Norm(p["scale"], 1e-6, True), tm.Router(p["router"], K, False),
                                    p["w1"], p["w2"], p["sh"], residual=True)
            return x
        f = jax.jit(step)
        for _ in range(3):
            f(x, layers).block_until_ready()
        ts = []
        for _ in range(30):
            t0 = time.perf_counter(); f(x, layers).block_until_ready(); ts.append(time.perf_counter() - t0)
        us = statistics.median(ts) * 1e6 / L
        label = f"{units or planned}{' (planned)' if units is None else ''}"
        out.setdefault(name, {})[label] = round(us, 2)
        print(f"{name} units {label}: {us:.2f} us per layer (median of 30 calls of {L} layers, wall clock)", flush=True)
    del layers
tf.plan_units = plan
json.dump(out, open(sys.argv[1], "w"), indent=1)
