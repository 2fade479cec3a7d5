"""Grouped-query attention (Mixtral, Qwen2-MoE, Qwen3-MoE) for one new token per sequence, from the
input projections' output to the heads' outputs, in one FFI call.

Between its input projections and decode_attention, te_async.models.attention normalises each q
and k head (Qwen3's q_norm and k_norm), rotates both, and writes k and v into the cache: at batch 1
XLA ran that as about five kernels, each launched after the one before had ended, before the
attention's two. `gqa_token_attention` runs csrc/cuda/gqa_token.cu instead: a prep kernel (the
norms, the rope, the cache row written in place: the call's cache outputs alias its inputs), then
decode_attention's split kernel and its merge, each a programmatic dependent launch of the one
before (the split kernel loads the keys before the new token's while the prep runs). The split and
merge are decode_attention's, given the same query and cache: the heads' outputs are those of the
unfused path with decode_attention's kernel. For bf16 heads of 128 dims (DECODE_ATTENTION_SHAPES),
the rope over the whole head, at most DECODE_ATTENTION_MAX_ROWS query heads per kv head and one
new token per sequence, on a GPU of compute capability 9.0 or later.

The models take it (`takes`) under TE_ASYNC_DECODE_ATTENTION "te_async" (decode_attention's kernel
forced) at every batch, under "auto" (the default) up to AUTO_MAX_BATCH sequences where
decode_attention would run its kernel (from decode_attention.AUTO_MIN_PAIRS (sequence, kv head)
pairs), under "xla" never.
"""

from typing import Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi, plan
from .decode_attention import AUTO_MIN_PAIRS, check_window_and_layer, default_kernel, splits_for

GQA_TOKEN = "te_async_gqa_token"
# The batches "auto" takes the call at: those measured faster. Generate's loop per token, 4096 cached
# tokens, device mode, one H100, against the unfused path with decode_attention's kernel, alternating
# twice (docs/benchmarks.md, table GT): Qwen3-30B-A3B (24 of its layers) B=1 2.244 / 2.242 against
# 2.479 / 2.481 ms (1.105x), B=8 4.118 / 4.158 against 4.044 / 3.991 (0.97x; blocked steps level);
# Mixtral-8x7B (8 of its layers) B=1 2.565 / 2.567 against 2.571 / 2.560 (level).
AUTO_MAX_BATCH = 1


def applies(projected: jax.Array, k_cache: jax.Array, v_cache: jax.Array, heads: int,
            norms: tuple = ()) -> bool:
    """Whether the call runs here: the CUDA module and a GPU backend of compute capability 9.0 or
    later (its kernels are chained by programmatic dependent launch), bf16 operands, one new token
    per sequence, heads of the kernel's dims, at most DECODE_ATTENTION_MAX_ROWS query heads per kv
    head. projected [B, 1, (heads + 2 Hkv) d]; caches [L, B, N, Hkv, d]; norms: the q_norm and
    k_norm weights given."""
    module = _ffi.cuda_module()
    if module is None or not plan.on_gpu() or projected.ndim != 3 or k_cache.ndim != 5:
        return False
    b, t, width = projected.shape
    _, cb, _, hkv, d = k_cache.shape
    return (all(x.dtype == jnp.bfloat16 for x in (projected, k_cache, v_cache, *norms)) and t == 1 and cb == b
            and (d, 0, d, False) in module.DECODE_ATTENTION_SHAPES and v_cache.shape == k_cache.shape
            and width == (heads + 2 * hkv) * d and heads % hkv == 0
            and heads // hkv <= module.DECODE_ATTENTION_MAX_ROWS and b * hkv <= 65535
            and all(n.shape == (d,) for n in norms) and all(cc >= 90 for cc, _ in plan.local_gpu_kinds()))


def takes(projected: jax.Array, k_cache: jax.Array, v_cache: jax.Array, heads: int, norms: tuple = ()) -> bool:
    """Whether te_async.models.attention decodes through gqa_token_attention: TE_ASYNC_DECODE_ATTENTION
    "te_async", or "auto" at most AUTO_MAX_BATCH sequences and AUTO_MIN_PAIRS (sequence, kv head)
    pairs, where the call applies."""
    kernel, batch = default_kernel(), projected.shape[0]
    pairs = batch * k_cache.shape[3] if k_cache.ndim == 5 else 0
    auto = kernel == "auto" and batch <= AUTO_MAX_BATCH and pairs >= AUTO_MIN_PAIRS
    return (kernel == "te_async" or auto) and applies(projected, k_cache, v_cache, heads, norms)


def gqa_token_attention(projected: jax.Array, k_cache: jax.Array, v_cache: jax.Array, cos: jax.Array,
                        sin: jax.Array, position, layer: Union[int, jax.Array] = 0, *, heads: int, scale: float,
                        q_norm: Optional[jax.Array] = None, k_norm: Optional[jax.Array] = None, eps: float = 1e-6,
                        window: Optional[int] = None) -> tuple:
    """(out [B, 1, heads, d], k_cache, v_cache): the attention of one new token per sequence at
    `position` over layer `layer` of the stacked cache, with the token's key and value written into
    it at `position` first.

    projected [B, 1, (heads + 2 Hkv) d]: the input projections' output, q's heads, then k's, then
    v's (te_async.models' w_in, biases added); q_norm and k_norm [d] (per-head RMSNorm weights
    applied with eps, both or neither); cos and sin [d] float32, the position's rotation over the
    halves (rotate_half); k_cache and v_cache [L, B, N, Hkv, d], updated in place and returned.
    Rounded as te_async.models rounds; no gradient.
    """
    if (q_norm is None) != (k_norm is None):
        raise ValueError("q_norm and k_norm come together")
    norms = () if q_norm is None else (q_norm, k_norm)
    if not applies(projected, k_cache, v_cache, heads, norms):
        raise ValueError(f"gqa_token_attention needs a GPU of compute capability 9.0 or later with te_async's CUDA "
                         f"module, bf16, one token per sequence, heads of the dims of DECODE_ATTENTION_SHAPES' "
                         f"grouped-query shape, at most DECODE_ATTENTION_MAX_ROWS (16) query heads per kv head and "
                         f"projected [B, 1, (heads + 2 Hkv) d]; got projected {projected.dtype} {projected.shape}, "
                         f"heads {heads}, k_cache {k_cache.dtype} {k_cache.shape}, v_cache {v_cache.shape}, norms "
                         f"{[(n.dtype, n.shape) for n in norms]}")
    check_window_and_layer(window, layer, k_cache.shape[0])
    b, d, (_, _, n, hkv, _) = projected.shape[0], k_cache.shape[-1], k_cache.shape
    splits = splits_for(b * hkv, n, (d, 0, d, False))
    rows = _ffi.cuda_module().DECODE_ATTENTION_MAX_ROWS
    bf16, f32 = jnp.bfloat16, jnp.float32
    empty = jnp.zeros((0,), bf16)
    shapes = (jax.ShapeDtypeStruct((b, 1, heads, d), bf16), jax.ShapeDtypeStruct(k_cache.shape, bf16),
              jax.ShapeDtypeStruct(v_cache.shape, bf16),
              jax.ShapeDtypeStruct((b, 1, heads, d), bf16),                 # the rotated query
              jax.ShapeDtypeStruct((splits, b * hkv, rows, d + 2), f32))    # the splits' partial outputs
    out, k_cache, v_cache, *_ = jax.ffi.ffi_call(GQA_TOKEN, shapes, input_output_aliases={5: 1, 6: 2})(
        projected, empty if q_norm is None else q_norm, empty if k_norm is None else k_norm, cos.astype(f32),
        sin.astype(f32), k_cache, v_cache, jnp.asarray(layer, jnp.int32), jnp.asarray(position, jnp.int32),
        scale=np.float32(scale), window=np.int64(window or 0), eps=np.float32(eps))
    return out, k_cache, v_cache
