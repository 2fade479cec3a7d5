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

`gqa_token_block` runs the whole attention half of a decoder layer, input_layernorm to the
residual add, in one call: the norm with the input projections (as mla_token's first kernel, csrc/
cuda/token_product.cuh), the three kernels above, and o_proj with the residual, each a programmatic
dependent of the one before (8 launches a Qwen3 layer where there were 12; docs/internals.md, table GB).
For hidden sizes and o_proj rows (H d) within GQA_TOKEN_BLOCK_ROWS and no projection biases
(Qwen3-30B-A3B's shapes; Mixtral's hidden size of 4096 is past it).

The models take them (`takes`, `block_takes`; the block up to BLOCK_MAX_BATCH sequences, the other
call where the block does not apply) under TE_ASYNC_DECODE_ATTENTION "te_async" (decode_attention's
kernel forced) at every batch, under "auto" (the default) up to AUTO_MAX_BATCH sequences where
decode_attention would run its kernel (decode_attention.wants_kernel), under "xla" never.
"""

from typing import Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi, plan
from .decode_attention import check_window_and_layer, default_kernel, splits_for, wants_kernel

GQA_TOKEN = "te_async_gqa_token"
GQA_TOKEN_BLOCK = "te_async_gqa_token_block"
# The batches "auto" takes the call at: those measured faster. Generate's loop per token, 4096 cached
# tokens, device mode, one H100, against the unfused path with decode_attention's kernel, alternating
# twice (docs/internals.md, table GT): Qwen3-30B-A3B (24 of its layers) B=1 2.244 / 2.242 against
# 2.479 / 2.481 ms (1.105x), B=8 4.118 / 4.158 against 4.044 / 3.991 (0.97x; blocked steps level);
# Mixtral-8x7B (8 of its layers) B=1 2.565 / 2.567 against 2.571 / 2.560 (level).
AUTO_MAX_BATCH = 1
# The batches gqa_token_block takes, whatever the setting: its product kernels hold two sequences a
# block and read the weights once per pair. Qwen3-30B-A3B (24 layers), B=8, the block forced, one
# H100: 5.742 ms a token in generate's loop against 3.927 unfused (docs/internals.md, table GB).
BLOCK_MAX_BATCH = 2
# What both calls need (applies), for their errors.
_CALL_NEEDS = ("a GPU of compute capability 9.0 or later with te_async's CUDA module, bf16, one token per sequence, "
               "heads of the dims of DECODE_ATTENTION_SHAPES' grouped-query shape, at most DECODE_ATTENTION_MAX_ROWS "
               "(16) query heads per kv head")


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


def block_applies(x: jax.Array, w_in: jax.Array, wo: jax.Array, k_cache: jax.Array, v_cache: jax.Array,
                  heads: int, norms: tuple = ()) -> bool:
    """Whether gqa_token_block runs here: where gqa_token_attention applies to x @ w_in, for x [B, 1,
    hidden] bf16, w_in [hidden, (heads + 2 Hkv) d] and wo [heads d, hidden], hidden and heads d
    multiples of GQA_TOKEN_BLOCK_ROWS' step within its limits (its products keep a block's weight rows
    in registers)."""
    module = _ffi.cuda_module()
    if module is None or x.ndim != 3 or w_in.ndim != 2 or wo.ndim != 2 or k_cache.ndim != 5:
        return False
    b, t, hidden = x.shape
    step, most_hidden, most_rows = module.GQA_TOKEN_BLOCK_ROWS
    rows = heads * k_cache.shape[-1]
    projected = jax.ShapeDtypeStruct((b, t, w_in.shape[1]), x.dtype)
    return (all(a.dtype == jnp.bfloat16 for a in (x, w_in, wo)) and w_in.shape[0] == hidden
            and wo.shape == (rows, hidden) and hidden % step == 0 and 0 < hidden <= most_hidden
            and rows % step == 0 and rows <= most_rows and applies(projected, k_cache, v_cache, heads, norms))


def _chosen(batch: int, kv_heads: int) -> bool:
    """TE_ASYNC_DECODE_ATTENTION's choice of the calls at `batch` sequences: decode_attention's kernel
    wanted, and under "auto" at most AUTO_MAX_BATCH sequences."""
    kernel = default_kernel()
    return wants_kernel(kernel, batch * kv_heads) and (kernel == "te_async" or batch <= AUTO_MAX_BATCH)


def takes(projected: jax.Array, k_cache: jax.Array, v_cache: jax.Array, heads: int, norms: tuple = ()) -> bool:
    """Whether te_async.models.attention decodes through gqa_token_attention: where the setting
    chooses it (module docstring) and the call applies."""
    return k_cache.ndim == 5 and _chosen(projected.shape[0], k_cache.shape[3]) and applies(
        projected, k_cache, v_cache, heads, norms)


def block_takes(x: jax.Array, w_in: jax.Array, wo: jax.Array, k_cache: jax.Array, v_cache: jax.Array, heads: int,
                norms: tuple = ()) -> bool:
    """Whether te_async.models.attention runs a layer's attention half as gqa_token_block: at most
    BLOCK_MAX_BATCH sequences, where the setting chooses it (module docstring) and the call applies."""
    return (k_cache.ndim == 5 and x.shape[0] <= BLOCK_MAX_BATCH and _chosen(x.shape[0], k_cache.shape[3])
            and block_applies(x, w_in, wo, k_cache, v_cache, heads, norms))


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
    norms = _norms(q_norm, k_norm)
    if not applies(projected, k_cache, v_cache, heads, norms):
        raise ValueError(f"gqa_token_attention needs {_CALL_NEEDS} and projected [B, 1, (heads + 2 Hkv) d]; got "
                         f"projected {projected.dtype} {projected.shape}, "
                         f"heads {heads}, k_cache {k_cache.dtype} {k_cache.shape}, v_cache {v_cache.shape}, norms "
                         f"{[(n.dtype, n.shape) for n in norms]}")
    check_window_and_layer(window, layer, k_cache.shape[0])
    b, d = projected.shape[0], k_cache.shape[-1]
    shapes = (jax.ShapeDtypeStruct((b, 1, heads, d), jnp.bfloat16), *_attention_outputs(b, heads, k_cache))
    out, k_cache, v_cache, *_ = jax.ffi.ffi_call(GQA_TOKEN, shapes, input_output_aliases={5: 1, 6: 2})(
        projected, *_attention_operands(q_norm, k_norm, cos, sin, k_cache, v_cache, layer, position),
        **_attention_attrs(scale, window, eps))
    return out, k_cache, v_cache


def gqa_token_block(x: jax.Array, norm: jax.Array, w_in: jax.Array, wo: jax.Array, k_cache: jax.Array,
                    v_cache: jax.Array, cos: jax.Array, sin: jax.Array, position, layer: Union[int, jax.Array] = 0, *,
                    heads: int, scale: float, eps: float, q_norm: Optional[jax.Array] = None,
                    k_norm: Optional[jax.Array] = None, window: Optional[int] = None) -> tuple:
    """(x + o_proj(attention) [B, 1, hidden], k_cache, v_cache): the residual stream after the
    attention half of a decoder layer for one new token per sequence at `position`, over layer
    `layer` of the stacked cache, with the token's key and value written into it first.

    x [B, 1, hidden] (the residual stream); norm [hidden] (input_layernorm's weight, applied with
    eps, as are q_norm and k_norm); w_in [hidden, (heads + 2 Hkv) d] (q, k and v's weights side by
    side, te_async.models' layout, no biases); wo [heads d, hidden] (o_proj's, no bias); the rest as
    in gqa_token_attention. Rounded as te_async.models rounds; no gradient.
    """
    norms = _norms(q_norm, k_norm)
    if not block_applies(x, w_in, wo, k_cache, v_cache, heads, norms):
        raise ValueError(f"gqa_token_block needs what gqa_token_attention needs ({_CALL_NEEDS}), x [B, 1, hidden], "
                         f"w_in [hidden, (heads + 2 Hkv) d] and wo [heads d, hidden] with "
                         f"(step, most hidden, most heads d) GQA_TOKEN_BLOCK_ROWS "
                         f"{getattr(_ffi.cuda_module(), 'GQA_TOKEN_BLOCK_ROWS', None)}; got x {x.dtype} {x.shape}, "
                         f"w_in {w_in.dtype} {w_in.shape}, wo {wo.dtype} {wo.shape}, heads {heads}, k_cache "
                         f"{k_cache.dtype} {k_cache.shape}, norms {[(n.dtype, n.shape) for n in norms]}")
    check_window_and_layer(window, layer, k_cache.shape[0])
    b, d = x.shape[0], k_cache.shape[-1]
    bf16 = jnp.bfloat16
    shapes = (jax.ShapeDtypeStruct(x.shape, bf16), *_attention_outputs(b, heads, k_cache),
              jax.ShapeDtypeStruct((b, 1, w_in.shape[1]), bf16),   # the input projections' output
              jax.ShapeDtypeStruct((b, 1, heads, d), bf16))        # the heads' outputs, o_proj's input
    out, k_cache, v_cache, *_ = jax.ffi.ffi_call(GQA_TOKEN_BLOCK, shapes, input_output_aliases={8: 1, 9: 2})(
        x, norm.astype(bf16), w_in, wo,
        *_attention_operands(q_norm, k_norm, cos, sin, k_cache, v_cache, layer, position),
        **_attention_attrs(scale, window, eps))
    return out, k_cache, v_cache


def _norms(q_norm, k_norm) -> tuple:
    if (q_norm is None) != (k_norm is None):
        raise ValueError("q_norm and k_norm come together")
    return () if q_norm is None else (q_norm, k_norm)


def _attention_outputs(b: int, heads: int, k_cache: jax.Array) -> tuple:
    """Both calls' cache outputs (aliased) and attention workspaces: the rotated query and the splits'
    partial outputs."""
    _, _, n, hkv, d = k_cache.shape
    splits = splits_for(b * hkv, n, (d, 0, d, False))
    rows = _ffi.cuda_module().DECODE_ATTENTION_MAX_ROWS
    return (jax.ShapeDtypeStruct(k_cache.shape, jnp.bfloat16), jax.ShapeDtypeStruct(k_cache.shape, jnp.bfloat16),
            jax.ShapeDtypeStruct((b, 1, heads, d), jnp.bfloat16),
            jax.ShapeDtypeStruct((splits, b * hkv, rows, d + 2), jnp.float32))


def _attention_operands(q_norm, k_norm, cos, sin, k_cache, v_cache, layer, position) -> tuple:
    empty = jnp.zeros((0,), jnp.bfloat16)
    return (empty if q_norm is None else q_norm, empty if k_norm is None else k_norm, cos.astype(jnp.float32),
            sin.astype(jnp.float32), k_cache, v_cache, jnp.asarray(layer, jnp.int32), jnp.asarray(position, jnp.int32))


def _attention_attrs(scale: float, window: Optional[int], eps: float) -> dict:
    return dict(scale=np.float32(scale), window=np.int64(window or 0), eps=np.float32(eps))
