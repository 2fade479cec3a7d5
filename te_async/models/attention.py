"""Grouped-query attention (Mixtral, Qwen2-MoE, Qwen3-MoE) with a preallocated KV cache.

Called two ways. `position=None`: a whole sequence from position 0 (forward, prefill), attending to
its own keys; with a cache, the keys and values are also written at 0. `position` set: new tokens
at `position` (decode); their keys and values are written into the cache there and the queries
attend to the whole cache, masked to the positions before them. The cache holds k (after q/k norm
and rope) and v, [B, max_len, kv_heads, head_dim] each; inside the decoder's scan over a run of
layers each is a LayerOf the run's stacked array, which `write` updates in place (only the new
entries) and decode_attention reads in place.
"""

from typing import NamedTuple, Optional, Union

import jax
import jax.numpy as jnp

from .. import dense, gqa_token
from ..decode_attention import decode_attention
from ..sequence_attention import causal_attention
from .norm import rms_norm
from .params import input_projections
from .rope import apply_rope


def linear(x: jax.Array, w: jax.Array, b: Optional[jax.Array] = None) -> jax.Array:
    """x @ w (+ b) with float32 accumulation, in x's dtype; w is [in, out]. te_async.dense.linear:
    at decode sizes te_async's small-M kernel reads the weights, elsewhere XLA's GEMM."""
    return _add_bias(dense.linear(x, w, preferred_element_type=jnp.float32), b, x.dtype)


def _add_bias(y: jax.Array, b: Optional[jax.Array], dtype) -> jax.Array:
    """A float32 product plus its bias (if any) in float32, then rounded to dtype."""
    return (y if b is None else y + b.astype(jnp.float32)).astype(dtype)


def project_input(x: jax.Array, p: dict, cfg) -> dict:
    """{name: x @ w (+ b)} for each of params.input_projections(cfg), in x's dtype, from one GEMM
    over their side-by-side weights w_in (float32 accumulation; each bias, "b" + name, added in
    float32 before the rounding, as in linear()): at decode sizes one small-M kernel reads
    them all instead of one per projection."""
    y = dense.linear(x, p["w_in"], preferred_element_type=jnp.float32)
    out, start = {}, 0
    for name, width in input_projections(cfg).items():
        out[name] = _add_bias(y[..., start:start + width], p.get(f"b{name}"), x.dtype)
        start += width
    return out


class LayerOf(NamedTuple):
    """Layer `index` of a stacked cache array [layers, B, max_len, ...] (cache.py)."""

    stack: jax.Array
    index: Union[int, jax.Array]


def write(cache_array, new: jax.Array, position):
    """new [B, S, ...] into cache_array [B, max_len, ...] at `position` along axis 1; a LayerOf
    gets new written into its layer of the stack (a dynamic_update_slice of the new entries alone)."""
    zero = jnp.zeros((), jnp.int32)
    if isinstance(cache_array, LayerOf):
        stack, index = cache_array
        start = (jnp.asarray(index, jnp.int32), zero, jnp.asarray(position, jnp.int32)) + (zero,) * (stack.ndim - 3)
        return LayerOf(jax.lax.dynamic_update_slice(stack, new[None].astype(stack.dtype), start), index)
    start = (zero, jnp.asarray(position, jnp.int32)) + (zero,) * (cache_array.ndim - 2)
    return jax.lax.dynamic_update_slice(cache_array, new.astype(cache_array.dtype), start)


def stacked(cache_array) -> tuple:
    """(stack [layers, B, max_len, ...], layer index) of a cache entry, for decode_attention, which
    reads the layer in place (a plain [B, max_len, ...] array is a stack of one)."""
    if isinstance(cache_array, LayerOf):
        return cache_array.stack, cache_array.index
    return cache_array[None], 0


def restacked(cache_array, stack: jax.Array):
    """The cache entry `cache_array` with its stack replaced by `stack` (stacked()'s inverse)."""
    if isinstance(cache_array, LayerOf):
        return LayerOf(stack, cache_array.index)
    return stack[0]


def gqa_sublayer(p: dict, cfg, x: jax.Array, norm: jax.Array, cos: jax.Array, sin: jax.Array,
                 cache: Optional[dict], position, window: Optional[int]) -> tuple:
    """(x + gqa_attention(rms_norm(x, norm)), cache): a decoder layer's attention half. One new token
    per sequence without projection biases, where te_async.gqa_token.block_takes it, runs as that one
    FFI call (gqa_token_block), which writes the cache rows itself."""
    if position is not None and x.shape[1] == 1 and not {"bq", "bk", "bv", "bo"} & p.keys():
        keys, values, layer, heads, norms = _token_operands(p, cfg, cache, x.dtype)
        if gqa_token.block_takes(x, p["w_in"], p["wo"], keys, values, heads, norms):
            q_norm, k_norm = norms if norms else (None, None)
            out, keys, values = gqa_token.gqa_token_block(
                x, norm, p["w_in"], p["wo"], keys, values, cos[0], sin[0], position, layer, heads=heads,
                scale=cfg.head_dim ** -0.5, eps=cfg.rms_norm_eps, q_norm=q_norm, k_norm=k_norm, window=window)
            return out, {"k": restacked(cache["k"], keys), "v": restacked(cache["v"], values)}
    a, cache = gqa_attention(p, cfg, rms_norm(x, norm, cfg.rms_norm_eps), cos, sin, cache, position, window)
    return x + a, cache


def gqa_attention(p: dict, cfg, x: jax.Array, cos: jax.Array, sin: jax.Array, cache: Optional[dict],
                  position, window: Optional[int]) -> tuple:
    """(output [B,S,hidden], cache) for x [B,S,hidden]; see the module docstring. One new token per
    sequence goes through te_async.gqa_token's call where it takes the shapes."""
    b, s, _ = x.shape
    scale = cfg.head_dim ** -0.5
    fused = None
    if position is not None and s == 1:
        fused = _token_attention(p, cfg, x, cos, sin, cache, position, scale, window)
    out, cache = fused or _heads_attention(p, cfg, x, cos, sin, cache, position, scale, window)
    return linear(out.reshape(b, s, -1), p["wo"], p.get("bo")), cache


def _heads_attention(p: dict, cfg, x: jax.Array, cos: jax.Array, sin: jax.Array, cache: Optional[dict], position,
                     scale: float, window: Optional[int]) -> tuple:
    """(the heads' outputs [B,S,H,d], cache), each step in XLA but decode_attention's."""
    b, s, _ = x.shape
    proj = project_input(x, p, cfg)
    q = proj["q"].reshape(b, s, cfg.num_attention_heads, cfg.head_dim)
    k = proj["k"].reshape(b, s, cfg.num_key_value_heads, cfg.head_dim)
    v = proj["v"].reshape(b, s, cfg.num_key_value_heads, cfg.head_dim)
    if cfg.qk_norm:
        q, k = rms_norm(q, p["q_norm"], cfg.rms_norm_eps), rms_norm(k, p["k_norm"], cfg.rms_norm_eps)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if position is None:
        out = causal_attention(q, k, v, scale, window)
        if cache is not None:
            cache = {"k": write(cache["k"], k, 0), "v": write(cache["v"], v, 0)}
    else:
        cache = {"k": write(cache["k"], k, position), "v": write(cache["v"], v, position)}
        (keys, layer), (values, _) = stacked(cache["k"]), stacked(cache["v"])
        out = decode_attention(q, keys, values, position, scale=scale, layer=layer, window=window)
    return out, cache


def _token_attention(p: dict, cfg, x: jax.Array, cos: jax.Array, sin: jax.Array, cache: dict, position,
                     scale: float, window: Optional[int]) -> Optional[tuple]:
    """_heads_attention of one new token per sequence through gqa_token_attention (the norms, the
    rope, the cache write and the attention in one call), or None where gqa_token.takes does not."""
    keys, values, layer, heads, norms = _token_operands(p, cfg, cache, x.dtype)
    projected = jax.ShapeDtypeStruct((x.shape[0], 1, p["w_in"].shape[1]), x.dtype)
    if not gqa_token.takes(projected, keys, values, heads, norms):
        return None
    bias = jnp.concatenate([p["bq"], p["bk"], p["bv"]]) if cfg.qkv_bias else None
    projected = _add_bias(dense.linear(x, p["w_in"], preferred_element_type=jnp.float32), bias, x.dtype)
    q_norm, k_norm = norms if norms else (None, None)
    out, keys, values = gqa_token.gqa_token_attention(
        projected, keys, values, cos[0], sin[0], position, layer, heads=heads, scale=scale, q_norm=q_norm,
        k_norm=k_norm, eps=cfg.rms_norm_eps, window=window)
    return out, {"k": restacked(cache["k"], keys), "v": restacked(cache["v"], values)}


def _token_operands(p: dict, cfg, cache: dict, dtype) -> tuple:
    """(stacked keys, stacked values, layer index, query heads, (q_norm, k_norm) in dtype or ()): what
    gqa_token's calls take besides the token."""
    (keys, layer), (values, _) = stacked(cache["k"]), stacked(cache["v"])
    norms = (p["q_norm"].astype(dtype), p["k_norm"].astype(dtype)) if cfg.qk_norm else ()
    return keys, values, layer, cfg.num_attention_heads, norms
