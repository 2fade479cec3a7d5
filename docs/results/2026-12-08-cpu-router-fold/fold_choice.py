"""How often does the folded router (z = [a | x] @ [[Wo diag(g) R]; [diag(g) R]] in float32) choose other
experts than the model's path (h = bf16(x + a Wo), xn = bf16(g * bf16(h * r)), logits = xn @ R in float32)?
Qwen3-30B-A3B's shapes, random weights at init_params' scale (0.02), norm scales 1 +- 0.1, a residual of RMS ~ 1."""
import numpy as np, jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
rng = np.random.default_rng(0)
H, A, E, K, T = 2048, 4096, 128, 8, 4000
bf = lambda v: np.asarray(jnp.asarray(v, jnp.float32).astype(jnp.bfloat16).astype(jnp.float32))
Wo = bf(rng.standard_normal((A, H)) * 0.02)
R = (rng.standard_normal((H, E)) * 0.02).astype(np.float32)           # the models keep routers in float32
g = bf(1 + 0.1 * rng.standard_normal(H))
x = bf(rng.standard_normal((T, H)))
a = bf(rng.standard_normal((T, A)) * 0.5)
o = (a.astype(np.float64) @ Wo)                                         # o_proj's sum (float32 in the kernel)
h = bf(x + o)                                                            # the residual stream, bf16
r = 1 / np.sqrt(np.mean(h.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-6)
xn = bf(g * bf(h * r))                                                   # transformers' rounding
model = xn.astype(np.float32) @ R
Wz = np.concatenate([Wo.astype(np.float64) @ (g[:, None] * R), g[:, None] * R]).astype(np.float32)
folded = (np.concatenate([a, x], axis=1).astype(np.float32) @ Wz)
exact = (g * (x.astype(np.float64) + o)) @ R.astype(np.float64)        # no rounding at all
top = lambda z: np.sort(np.argsort(-z, axis=1)[:, :K], axis=1)
def differ(u, v): return float(np.mean(np.any(top(u) != top(v), axis=1)))
print(f"tokens whose top-{K} differs: model vs folded {differ(model, folded):.4f}, model vs exact {differ(model, exact):.4f}, "
      f"folded vs exact {differ(folded, exact):.4f}")
gap = np.sort(model, axis=1)[:, ::-1]
print("median logit gap between the 8th and 9th expert:", float(np.median((gap[:, K - 1] - gap[:, K]) / r[:, 0])),
      "; median |model/r - folded| :", float(np.median(np.abs(model / r - folded))))
