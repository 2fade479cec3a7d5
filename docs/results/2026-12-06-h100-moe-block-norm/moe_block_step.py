"""te_async.moe.moe_block at DeepSeek-V2-Lite's expert shapes, 4096 tokens, top-6, device mode, bf16:
forward and forward + backward (jax.grad of sum(y**2) in x, w_fc1, w_fc2, norm_scale), wall clock (median of 20 samples
of 3 calls, two rotated inputs) and GPU busy; the forward output saved for the old/new comparison. Usage: moe_block_step.py TAG OUTDIR"""
import sys
import jax, jax.numpy as jnp, numpy as np
from te_async.moe import moe_block
from te_async.bench import timing
T, E, H, F, K = 4096, 64, 2048, 1408, 6
key, bf = jax.random.key(0), jnp.bfloat16
xs = [jax.random.normal(jax.random.fold_in(key, i), (T, H), bf) for i in range(2)]
router = jax.random.normal(jax.random.fold_in(key, 10), (H, E), bf) / H ** 0.5
w1 = jax.random.normal(jax.random.fold_in(key, 11), (E, H, 2 * F), bf) / H ** 0.5
w2 = jax.random.normal(jax.random.fold_in(key, 12), (E, F, H), bf) / F ** 0.5
scale = 1 + 0.1 * jax.random.normal(jax.random.fold_in(key, 13), (H,), jnp.float32)
block = lambda x, w1, w2, scale: moe_block(x, router, w1, w2, top_k=K, norm_scale=scale, group_sizes_mode="device")
fwd = jax.jit(block)
step = jax.jit(jax.grad(lambda *a: jnp.sum(block(*a).astype(jnp.float32) ** 2), argnums=(0, 1, 2, 3)))
sets = [(x, w1, w2, scale) for x in xs]
tf, tb = (timing.time_calls(f, sets, reps=20, inner=3) for f in (fwd, step))
bf_s, bb_s = ((timing.device_times(f, sets) or {"busy_s": float("nan")})["busy_s"] for f in (fwd, step))  # None off a GPU
np.save(f"{sys.argv[2]}/out_{sys.argv[1]}.npy", np.asarray(fwd(*sets[0]), np.float32))
np.save(f"{sys.argv[2]}/dx_{sys.argv[1]}.npy", np.asarray(step(*sets[0])[0], np.float32))
print(f"{sys.argv[1]}: forward {1e3 * tf.median_s:.3f} ms (GPU busy {1e3 * bf_s:.3f}), "
      f"forward + backward {1e3 * tb.median_s:.3f} ms (GPU busy {1e3 * bb_s:.3f})", flush=True)
