"""DeepSeek's multi-head latent attention for one new token per sequence: the attention half of a
decoder layer, from input_layernorm to the residual add, in one FFI call.

Between the residual stream and the residual add, te_async.models.mla normalises the token,
projects it to q and the compressed latent, normalises the latent, rotates both rope parts, writes
the cache, absorbs kv_b_proj into the query, attends over the latent cache, merges the key splits,
absorbs kv_b_proj into the output, applies o_proj and adds the residual: at batch 1 about 24
kernels and two copies of the layer's cache slice (docs/design-b1-attention-block.md).
`mla_token_block` runs csrc/cuda/mla_token.cu instead: five kernels, each after the first a
programmatic dependent launch of the one before (the norm with the input projections, the prep,
decode_attention's split kernel, the merge with the absorbed output, o_proj with the residual),
the dependents loading their weights while the kernels before them run, that write the new cache
row in place (the call's cache outputs alias its inputs, so that inside the decoder's scan the
stacked cache is updated where it lies). For bf16, DeepSeek-V2/V3's head shape (MLA_DECODE_DIMS)
without q_lora_rank, at most DECODE_ATTENTION_MAX_ROWS heads (V2-Lite's 16), a hidden size of at
most 2048 in steps of 128 (MLA_TOKEN_HIDDEN), no projection biases and one new token per sequence,
on a GPU of compute capability 9.0 or later.

TE_ASYNC_MLA_DECODE (te_async.mla_decode's setting) decides: "auto" (default) takes this call
where it applies and B <= AUTO_MAX_BATCH, "unfused" and "te_async" (mla_decode's cluster kernel)
never do.
"""

from typing import Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi, mla_decode, plan
from .decode_attention import check_window_and_layer, split_count

MLA_TOKEN = "te_async_mla_token"
# The batches "auto" takes the call at: those measured (B=3 lies between two of them). DeepSeek-V2-Lite,
# 4096 cached tokens, device mode, one H200, against the unfused path (generate's loop / blocked p50
# per token; docs/internals.md, table MT): B=1 1.19x / 1.17x, B=2 1.11x / 1.15x, B=4 (one pair of
# runs) 1.04x / 1.06x. B=8 ran with the call but not against the unfused path in the same call.
AUTO_MAX_BATCH = 4


def applies(x: jax.Array, w_in: jax.Array, w_kv: jax.Array, wo: jax.Array, ckv: jax.Array) -> bool:
    """Whether the call runs here: the CUDA module and a GPU backend of compute capability 9.0 or
    later (its kernels are chained by programmatic dependent launch), bf16, DeepSeek's dims, one new
    token per sequence, at most DECODE_ATTENTION_MAX_ROWS heads, a hidden size the call takes.
    x [B, 1, hidden], w_in [hidden, H * (dn + dr) + latent + dr], w_kv [H, dn + dv, latent], wo
    [H * dv, hidden], ckv [L, B, N, latent]."""
    module = _ffi.cuda_module()
    if module is None or not plan.on_gpu():
        return False
    dn, dr, latent, dv = module.MLA_DECODE_DIMS
    step, most = module.MLA_TOKEN_HIDDEN
    b, t, hidden = x.shape if x.ndim == 3 else (0, 0, 0)
    h = w_kv.shape[0]
    return (all(a.dtype == jnp.bfloat16 for a in (x, w_in, w_kv, wo, ckv)) and t == 1
            and 1 <= h <= module.DECODE_ATTENTION_MAX_ROWS and hidden % step == 0 and 0 < hidden <= most
            and w_in.shape == (hidden, h * (dn + dr) + latent + dr) and w_kv.shape[1:] == (dn + dv, latent)
            and wo.shape == (h * dv, hidden) and ckv.shape[1] == b and ckv.shape[-1] == latent
            and all(cc >= 90 for cc, _ in plan.local_gpu_kinds()))


def takes(x: jax.Array, w_in: jax.Array, w_kv: jax.Array, wo: jax.Array, ckv: jax.Array) -> bool:
    """Whether te_async.models.mla decodes through mla_token_block: TE_ASYNC_MLA_DECODE is "auto",
    the call applies and the batch is at most AUTO_MAX_BATCH."""
    return (mla_decode.default_kernel() == "auto" and x.shape[0] <= AUTO_MAX_BATCH
            and applies(x, w_in, w_kv, wo, ckv))


def mla_token_block(x: jax.Array, norm: jax.Array, w_in: jax.Array, kv_norm: jax.Array, w_kv: jax.Array,
                    wo: jax.Array, cos: jax.Array, sin: jax.Array, ckv: jax.Array, kpe: jax.Array, position,
                    layer: Union[int, jax.Array] = 0, *, eps: float, latent_eps: float, scale: float,
                    interleaved: bool, window: Optional[int] = None) -> tuple:
    """(x + o_proj(attention) [B, 1, hidden], ckv, kpe): the residual stream after the absorbed
    attention of one new token per sequence at `position` over layer `layer` of the stacked latent
    cache, with the token's normalised latent and rotated rope key written into it at `position` first.

    x [B, 1, hidden] (the residual stream); norm [hidden] (input_layernorm's weight, applied with
    eps); w_in [hidden, H * (dn + dr) + latent + dr] (q_proj's and kv_a_proj_with_mqa's weights side
    by side, te_async.models' layout); kv_norm [latent] (kv_a_layernorm's weight, applied with
    latent_eps); w_kv kv_b_proj's weight as [H, dn + dv, latent]; wo o_proj's [H * dv, hidden]; cos
    and sin [dr] float32, the position's rotation; ckv [L, B, N, latent] and kpe [L, B, N, dr],
    updated in place and returned. interleaved: the rope parts come as DeepSeek's interleaved pairs.
    Rounded as te_async.models rounds; no gradient.
    """
    if not applies(x, w_in, w_kv, wo, ckv):
        raise ValueError(f"mla_token_block needs a GPU of compute capability 9.0 or later with te_async's CUDA "
                         f"module, bf16, one token per sequence, at most DECODE_ATTENTION_MAX_ROWS (16) heads, a "
                         f"hidden size of at most 2048 in steps of 128 and DeepSeek's dims without q_lora_rank; got "
                         f"x {x.dtype} {x.shape}, w_in {w_in.shape}, w_kv {w_kv.shape}, wo {wo.shape}, ckv "
                         f"{ckv.dtype} {ckv.shape}")
    check_window_and_layer(window, layer, ckv.shape[0])
    b, _, hidden = x.shape
    _, _, n, latent = ckv.shape
    h, dr = w_kv.shape[0], kpe.shape[-1]
    dv = wo.shape[0] // h
    module = _ffi.cuda_module()
    # the call's split kernel (8 warps, a 64-key tile in 175 KB of shared memory) holds one block an SM
    splits = split_count(b, n, plan.local_sm_count(), 1, module.DECODE_ATTENTION_MAX_SPLITS)
    rows = module.DECODE_ATTENTION_MAX_ROWS
    bf16, f32 = jnp.bfloat16, jnp.float32
    shapes = (jax.ShapeDtypeStruct((b, 1, hidden), bf16), jax.ShapeDtypeStruct(ckv.shape, bf16),
              jax.ShapeDtypeStruct(kpe.shape, bf16),
              jax.ShapeDtypeStruct((b, 1, w_in.shape[1]), bf16),        # q and kv_a
              jax.ShapeDtypeStruct((b, 1, h, latent), bf16),            # the latent query
              jax.ShapeDtypeStruct((b, 1, h, dr), bf16),                # the rotated rope query
              jax.ShapeDtypeStruct((splits, b, rows, latent + 2), f32),  # the splits' partial outputs
              jax.ShapeDtypeStruct((module.MLA_TOKEN_LATENT_PARTS, b, h * dv), f32))  # the heads' outputs, in parts
    out, ckv, kpe, *_ = jax.ffi.ffi_call(MLA_TOKEN, shapes, input_output_aliases={8: 1, 9: 2})(
        x, norm.astype(bf16), w_in, kv_norm.astype(bf16), w_kv, wo, cos.astype(f32), sin.astype(f32), ckv, kpe,
        jnp.asarray(layer, jnp.int32), jnp.asarray(position, jnp.int32), scale=np.float32(scale),
        window=np.int64(window or 0), eps=np.float32(eps), latent_eps=np.float32(latent_eps),
        interleaved=bool(interleaved))
    return out, ckv, kpe
