"""te_async.token_ffn against the paths it replaces, one token at DeepSeek-V2-Lite's shapes (64
experts of [2048, 2x1408] + [1408, 2048], top-6, routed by te_async.routing.route from random
logits; 2 shared experts as one [2048, 2x2816] + [2816, 2048] MLP): the routed and shared experts
together, each alone. Old paths: the routed experts through decode_moe.fused_experts (fc1, fc2 with
the permutation fused, an XLA sum), the shared MLP through dense.linear's two small-M kernels. Each
call runs 26 weight copies unrolled in one jit (one CUDA graph, as bench dense), so no layer finds
its weights in L2; per layer: wall clock (bench.timing.time_calls) and GPU busy time (a profile).
Both include the routing kernel where experts are routed, and token_ffn's XLA sum of its blocks'
partials. Then token_ffn with its plan (units per item, blocks per item's cluster) forced (calling
its kernel branch directly: jax caches the traced branches of platform_dependent), among them the
plan without clusters. `qwen3` as the argument takes Qwen3-30B-A3B's routed experts instead (128 of
[2048, 2x768] + [768, 2048], top-8, no shared experts) and writes the fastest routed split by GPU
time to $OUT/best_routed_split.txt (or ./). Usage: python3 -P tools/token_ffn_probe.py [qwen3]"""
import os, sys
import jax, jax.numpy as jnp, numpy as np
from te_async import token_ffn as tf, decode_moe
from te_async.models.ffn import swiglu_mlp
from te_async.routing import route
from te_async.bench import timing

if sys.argv[1:] not in ([], ["qwen3"]):
    raise SystemExit(f"usage: python3 -P tools/token_ffn_probe.py [qwen3], got {sys.argv[1:]}")
QWEN3 = sys.argv[1:] == ["qwen3"]
L, H, E, F, K, FS = (26, 2048, 128, 768, 8, 0) if QWEN3 else (26, 2048, 64, 1408, 6, 2816)
key = jax.random.key(0)
bf = jnp.bfloat16
hbm = timing.hbm_bandwidth()
x = jax.random.normal(key, (1, H), bf)
logits = [jax.random.normal(jax.random.fold_in(key, 100 + i), (1, E), jnp.float32) for i in range(L)]
W = [(jax.random.normal(jax.random.fold_in(key, i), (E, H, 2 * F), bf) * 0.02,
      jax.random.normal(jax.random.fold_in(key, 50 + i), (E, F, H), bf) * 0.02,
      jax.random.normal(jax.random.fold_in(key, 200 + i), (H, 2 * FS), bf) * 0.02,
      jax.random.normal(jax.random.fold_in(key, 250 + i), (FS, H), bf) * 0.02) for i in range(L)]
routed_bytes = K * 3 * H * F * 2
shared_bytes = 3 * H * FS * 2
orig = tf.plan_split

def measure(name, fn, floor_bytes):
    call = jax.jit(lambda x, lg, w: [fn(x, l, *c) for l, c in zip(lg, w)])
    wall = timing.time_calls(call, [(x, logits, W)], reps=20).median_s / L
    gpu = timing.device_times(call, [(x, logits, W)])["busy_s"] / L
    floor = floor_bytes / hbm
    print(f"{name:44s} wall {1e6*wall:7.2f} us  GPU {1e6*gpu:7.2f} us  floor {1e6*floor:6.2f}  ({gpu/floor:.2f}x GPU)", flush=True)
    return call, gpu

def tok(forced=None, routed=True, shared=True):
    def f(x, lg, w1, w2, s1, s2):
        tf.plan_split = (lambda *a: tf.Split(*forced)) if forced else orig
        r, _ = route(lg, K, renormalize=False)
        # a forced plan: the kernel's branch called directly (jax caches platform_dependent's traces)
        run = tf._kernel if forced else tf.token_ffn
        return run(x, tf.Routed(r.experts, r.weights, w1, w2) if routed else None, tf.Shared(s1, s2) if shared else None)
    return f

def old(routed=True, shared=True):
    def f(x, lg, w1, w2, s1, s2):
        y = 0
        if routed:
            r, d = route(lg, K, renormalize=False)
            y = decode_moe.fused_experts(x, r, d, w1, w2)
        if shared:
            y = y + swiglu_mlp({"w_gate_up": s1, "w_down": s2}, x, kernel="te_async")
        return y
    return f

def sweep(name, plans, **which):
    """GPU seconds a layer per forced plan."""
    floor_bytes = (routed_bytes if which.get("routed", True) else 0) + (shared_bytes if which.get("shared", True) else 0)
    return {p: measure(f"{name}: token_ffn units {p[0]} slices {p[1]}", tok(p, **which), floor_bytes)[1] for p in plans}

unclustered = lambda k, f, fs: tuple(orig(k, f, fs, H, 132, False))
print(f"HBM read {hbm/1e12:.2f} TB/s; plan: routed+shared {orig(K, F, FS, H, 132, True)}, routed {orig(K, F, 0, H, 132, True)}, "
      f"shared {orig(0, 0, FS, H, 132, True)}; without clusters {unclustered(K, F, FS)}, {unclustered(K, F, 0)}, {unclustered(0, 0, FS)}", flush=True)
def agreement(shared):
    c_new, _ = measure(f"{'routed+shared' if shared else 'routed'}: token_ffn (plan)", tok(shared=shared), routed_bytes + shared_bytes * shared)
    c_old, _ = measure(f"{'routed+shared: fused fc1, fc2 + shared 2 kernels' if shared else 'routed: fused fc1, fc2'}", old(shared=shared), routed_bytes + shared_bytes * shared)
    ref = np.asarray(c_old(x, logits, W)[0], np.float32); got = np.asarray(c_new(x, logits, W)[0], np.float32)
    print("  max |new - old| / max|old|:", float(np.abs(got - ref).max() / np.abs(ref).max()))

if FS:  # the shared MLP alone first: a dense MLP at one token, the fused-decode issue's target (<= 1.3x its floor)
    measure("shared alone (a dense MLP): token_ffn (plan)", tok(routed=False), shared_bytes)
    measure("shared alone: two small-M kernels", old(routed=False), shared_bytes)
    agreement(True)
    sweep("routed+shared", [unclustered(K, F, FS), (88, 2), (96, 2), (128, 2), (176, 4), (88, 4)])
agreement(False)
plans = [(32, 1), (24, 1), (48, 1), (64, 1), (32, 2), (48, 2), (64, 2), (72, 2), (96, 2), (128, 2)] if QWEN3 else \
        [unclustered(K, F, 0), (48, 1), (64, 2), (128, 4), (176, 4), (128, 2)]
routed = sweep("routed", plans, shared=False)
best = min(routed, key=routed.get)
print("best routed split:", best, f"{1e6 * routed[best]:.2f} us", flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "best_routed_split.txt"), "w") as f:
    f.write(f"{best[0]} {best[1]}\n")
if FS:
    measure("shared: token_ffn (plan)", tok(routed=False), shared_bytes)
    measure("shared: te_async 2 kernels", old(routed=False), shared_bytes)
    sweep("shared", [unclustered(0, 0, FS), (48, 1), (96, 8), (128, 8), (64, 4), (48, 4), (88, 8)], routed=False)
