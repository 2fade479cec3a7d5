"""Stop 53 probe: cuDNN flash attention (jax.nn.dot_product_attention, implementation="cudnn") against
te_async's XLA attend at the models' full-sequence shapes: accuracy (float64 reference at S=512),
forward and forward+backward GPU time at S=4096. MLA (qk 192, v 128) by padding v to 192 with zeros."""
import functools, sys, time
import numpy as np, jax, jax.numpy as jnp
from te_async.bench.timing import time_calls, device_time_s

try:
    from jax._src.lib import cuda_versions
    print("cudnn", cuda_versions.cudnn_get_version(), "jax", jax.__version__, jax.devices()[0].device_kind)
except Exception as e:
    print("cudnn version unknown", e)

from te_async.sequence_attention import causal_attention
cudnn_attn = functools.partial(causal_attention, kernel="cudnn")
xla_attn = functools.partial(causal_attention, kernel="xla")

def ref64(q, k, v, scale, window=None):
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    b, s, h, d = q.shape; hkv = k.shape[2]; g = h // hkv
    k = np.repeat(k, g, axis=2); v = np.repeat(v, g, axis=2)
    sc = np.einsum("bshd,blhd->bhsl", q, k) * scale
    i, j = np.arange(s)[:, None], np.arange(s)[None, :]
    m = j <= i
    if window is not None: m &= j > i - window
    sc = np.where(m, sc, -np.inf); sc -= sc.max(-1, keepdims=True); p = np.exp(sc); p /= p.sum(-1, keepdims=True)
    return np.einsum("bhsl,blhd->bshd", p, v)

shapes = {"deepseek-v2-lite": (16, 16, 192, 128), "qwen3-30b-a3b": (32, 4, 128, 128), "mixtral": (32, 8, 128, 128)}
key = jax.random.key(0)
for name, (h, hkv, dk, dv) in shapes.items():
    for s, window in ((512, None), (512, 100), (37, None)):
        kq, kk, kv, kg = jax.random.split(jax.random.fold_in(key, s + (window or 0)), 4)
        q = jax.random.normal(kq, (2, s, h, dk), jnp.bfloat16); k = jax.random.normal(kk, (2, s, hkv, dk), jnp.bfloat16)
        v = jax.random.normal(kv, (2, s, hkv, dv), jnp.bfloat16); g = jax.random.normal(kg, (2, s, h, dv), jnp.bfloat16)
        scale = dk ** -0.5
        want = ref64(q, k, v, scale, window)
        try:
            errs = {}
            for impl, f in (("cudnn", cudnn_attn), ("xla", xla_attn)):
                out = jax.jit(functools.partial(f, scale=scale, window=window))(q, k, v)
                errs[impl] = float(np.abs(np.asarray(out, np.float64) - want).max())
                grads = jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v, scale, window).astype(jnp.float32) * g), argnums=(0, 1, 2)))(q, k, v)
                errs[impl + "_grads"] = grads
            gd = [float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max() / (np.abs(np.asarray(b, np.float64)).max()))
                  for a, b in zip(errs.pop("cudnn_grads"), errs.pop("xla_grads"))]
            print(f"{name} S={s} window={window}: max |out - f64| cudnn {errs['cudnn']:.3e} xla {errs['xla']:.3e}; grads cudnn vs xla rel (q,k,v) {gd}")
        except Exception as e:
            print(f"{name} S={s} window={window}: FAILED {type(e).__name__}: {str(e)[:400]}")
    s = 4096
    q = jax.random.normal(key, (1, s, h, dk), jnp.bfloat16); k = jax.random.normal(key, (1, s, hkv, dk), jnp.bfloat16)
    v = jax.random.normal(key, (1, s, hkv, dv), jnp.bfloat16); g = jax.random.normal(key, (1, s, h, dv), jnp.bfloat16)
    for impl, f in (("cudnn", cudnn_attn), ("xla", xla_attn)):
        try:
            fwd = jax.jit(lambda q, k, v, f=f: f(q, k, v, dk ** -0.5))
            both = jax.jit(jax.grad(lambda q, k, v, f=f: jnp.sum(f(q, k, v, dk ** -0.5).astype(jnp.float32) * g), argnums=(0, 1, 2)))
            tf = device_time_s(fwd, [(q, k, v)]); tb = device_time_s(both, [(q, k, v)])
            print(f"{name} S=4096 B=1 {impl}: forward {1e3*tf:.3f} ms, forward+backward {1e3*tb:.3f} ms (GPU busy)")
        except Exception as e:
            print(f"{name} S=4096 {impl}: FAILED {type(e).__name__}: {str(e)[:400]}")
