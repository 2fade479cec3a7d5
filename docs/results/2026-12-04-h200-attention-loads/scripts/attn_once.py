"""One decode_attention kernel call, three times (for ncu): python attn_once.py B mla|gqa [context]."""
import sys

import jax
import jax.numpy as jnp

from te_async.decode_attention import decode_attention

b, kind = int(sys.argv[1]), sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
k = jax.random.split(jax.random.key(0), 5)
x = lambda key, *s: jax.random.normal(key, s, jnp.bfloat16)
if kind == "mla":
    args = (x(k[0], b, 1, 16, 512), x(k[1], 1, b, n, 1, 512), None, x(k[2], b, 1, 16, 64), x(k[3], 1, b, n, 1, 64))
else:
    args = (x(k[0], b, 1, 32, 128), x(k[1], 1, b, n, 4, 128), x(k[2], 1, b, n, 4, 128), None, None)
f = jax.jit(lambda q, kk, v, qr, kr: decode_attention(q, kk, v, n - 1, scale=0.05, layer=0, q_rope=qr, key_rope=kr,
                                                       kernel="te_async"))
for _ in range(3):
    f(*args).block_until_ready()
print("ok", b, kind)
