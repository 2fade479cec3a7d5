"""Probe: token_moe at T tokens (trial wheel), DeepSeek-V2-Lite / Qwen3-30B-A3B MoE shapes, bf16. Run under ncu."""
import sys
import jax, jax.numpy as jnp, numpy as np
from te_async import token_moe as tm, token_ffn
name, T = sys.argv[1], int(sys.argv[2])
H, E, F, k, SF = {"ds": (2048, 64, 1408, 6, 2816), "qw": (2048, 128, 768, 8, 0)}[name]
rng = np.random.default_rng(0)
bf = jnp.bfloat16
def w(*s): return jnp.asarray(rng.standard_normal(s, np.float32) / np.sqrt(s[-2]), bf)
x = jnp.asarray(rng.standard_normal((T, H), np.float32), bf)
norm = tm.Norm(jnp.ones((H,), bf), 1e-6, True)
router = tm.Router(w(H, E), k, name == "qw")
shared = token_ffn.Shared(w(H, 2 * SF), w(SF, H)) if SF else None
w1, w2 = w(E, H, 2 * F), w(E, F, H)
print("applies", tm.applies(x, norm, router, w1, w2, shared))
f = jax.jit(lambda x: tm.token_moe(x, norm, router, w1, w2, shared)[0])
for _ in range(8): y = f(x)
y.block_until_ready(); print("ok", float(jnp.abs(y.astype(jnp.float32)).mean()))
