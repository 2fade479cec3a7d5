"""Rotary position embeddings with transformers' conventions.

Mixtral and Qwen rotate the two halves of each head (rotate_half). DeepSeek-V2 rotates adjacent
pairs (x[2i], x[2i+1]) as complex numbers; permuting each head from interleaved to half layout
first turns that into the same rotate_half, and since q_pe and k_pe are permuted alike their dot
products, all attention reads, are unchanged. "yarn" scaling follows
transformers.modeling_rope_utils._compute_yarn_parameters (5.24), including its attention factor
on cos/sin.
"""

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from .config import YarnScaling, yarn_mscale


def inverse_frequencies(dim: int, theta: float, yarn: Optional[YarnScaling]) -> tuple:
    """(inv_freq float32 [dim/2], attention factor that scales cos and sin)."""
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    pos_freqs = np.float32(theta) ** exponents
    if yarn is None:
        return (1.0 / pos_freqs).astype(np.float32), 1.0
    factor = yarn.factor
    attention_factor = yarn.attention_factor
    if attention_factor is None:
        if yarn.mscale and yarn.mscale_all_dim:
            attention_factor = yarn_mscale(factor, yarn.mscale) / yarn_mscale(factor, yarn.mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)

    def correction_dim(rotations):
        return dim * math.log(yarn.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(yarn.beta_fast), correction_dim(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv.astype(np.float32), float(attention_factor)


def cos_sin(positions: jax.Array, dim: int, theta: float, yarn: Optional[YarnScaling]) -> tuple:
    """float32 cos and sin [S, dim] for int positions [S], duplicated over the two halves."""
    inv_freq, attention_factor = inverse_frequencies(dim, theta, yarn)
    freqs = positions.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq)[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb) * attention_factor, jnp.sin(emb) * attention_factor


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, S, heads, dim] rotated by rotate_half; cos/sin [S, dim]. Computed in float32."""
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return (xf * cos + rotated * sin).astype(x.dtype)


def interleaved_to_half(x: jax.Array) -> jax.Array:
    """[x0, x1, x2, x3, ...] -> [x0, x2, ..., x1, x3, ...]: DeepSeek's pairs become halves."""
    pairs = x.reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
    return jnp.swapaxes(pairs, -1, -2).reshape(x.shape)
