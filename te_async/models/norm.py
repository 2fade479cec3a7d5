"""RMSNorm as transformers computes it: normalise in float32, cast back, then scale in the input's
dtype (the weight multiplies the already-rounded value)."""

import functools

import jax
import jax.numpy as jnp


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """Differentiated, it keeps x and weight alone and recomputes its float32 values in the
    backward (jax.checkpoint), where JAX would keep a float32 copy of x."""
    return _rms_norm(x, weight, eps)


@functools.partial(jax.checkpoint, static_argnums=(2,))
def _rms_norm(x, weight, eps):
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * y.astype(x.dtype)
