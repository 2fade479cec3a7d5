"""DeepSeek's multi-head latent attention at decode, absorbed, in one kernel.

Decode attends straight over MLA's compressed cache: kv_b_proj's key half is absorbed into the
query (q_latent = q_nope W_uk per head) and its value half into the output (out = (P c) W_uv).
Unfused that is an einsum, `decode_attention` over the latent cache and a second einsum: at one
token about 17 of XLA's kernels per layer, each a launch and a DRAM round trip for a few MB.
`mla_decode_attention` runs csrc/cuda/mla_decode.cu instead, one kernel whose thread-block
clusters each take a (sequence, token, group of 16 heads) through all three steps, for bf16 and
DeepSeek-V2/V3's head shape (MLA_DECODE_DIMS) on a GPU of compute capability 9.0 or later.

TE_ASYNC_MLA_DECODE (read once) also decides the models' decode step (te_async.models.mla): "auto"
(default) runs one new token per sequence through te_async.mla_token's call at the batches it
measured faster at (the layer's attention half from its norm to the residual add, the cache write
included) and everything else
through the einsums around decode_attention, "unfused" always through the einsums, "te_async"
through this module's kernel (an error where it cannot run). "auto" does not take this kernel
because it lost to the unfused path (H200, docs/internals.md table A3, GPU µs per layer
at 4096 cached tokens): DeepSeek-V2-Lite 29.4 against 24.5 at B=1 and 56.2 against 48.7 at B=8;
DeepSeek-V3 54.0 against XLA's 55.1 at B=1 but 63.97 against 59.07 µs of wall clock, and far
behind from B=2. Its fixed work per block (W_uk staged for the latent query, the merge across the
cluster) costs more than the launches it saves.
"""

import functools
from typing import Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi, plan
from .decode_attention import check_window_and_layer, decode_attention

MLA_DECODE = "te_async_mla_decode"
KERNEL_ENV = "TE_ASYNC_MLA_DECODE"
KERNELS = ("auto", "te_async", "unfused")


@functools.lru_cache(maxsize=None)
def default_kernel() -> str:
    """TE_ASYNC_MLA_DECODE, read once."""
    return plan.kernel_setting(KERNEL_ENV, KERNELS)


def mla_decode_attention(q_nope: jax.Array, q_pe: jax.Array, w_kv: jax.Array, ckv: jax.Array, kpe: jax.Array,
                         position, *, scale: float, layer: Union[int, jax.Array] = 0, window: Optional[int] = None,
                         kernel: Optional[str] = None) -> jax.Array:
    """Absorbed MLA attention of T new tokens over layer `layer` of a stacked latent cache:
    [B, T, H, dv] in q_nope's dtype.

    q_nope [B, T, H, dn] and q_pe [B, T, H, dr] (rotated) at positions position .. position + T - 1;
    w_kv, kv_b_proj's weight as [H, dn + dv, latent] (transformers' [H * (dn + dv), latent], reshaped:
    te_async.models.mla says why); ckv [L, B, N, latent] (normalised latents) and kpe
    [L, B, N, dr] (rotated rope keys). Query t sees keys j <= position + t (and j > position + t -
    window). kernel: None (the TE_ASYNC_MLA_DECODE setting), "auto", "te_async" or "unfused" (see
    the module's docstring for which "auto" takes). The kernel has no gradient: differentiate
    through kernel="unfused".
    """
    kernel = default_kernel() if kernel is None else kernel
    _check(q_nope, q_pe, w_kv, ckv, kpe, kernel)
    check_window_and_layer(window, layer, ckv.shape[0])
    args = (q_nope, q_pe, w_kv, ckv, kpe, jnp.asarray(position, jnp.int32), jnp.asarray(layer, jnp.int32))
    opts = dict(scale=float(scale), window=window)
    if kernel != "te_async":
        return mla_decode_unfused(*args, **opts)
    if not (kernel_applies(q_nope, q_pe, w_kv, ckv, kpe) and plan.on_gpu()):
        raise ValueError(f"kernel='te_async' needs a GPU of compute capability 9.0 or later with te_async's CUDA "
                         f"module and bf16 operands of (dn, dr, latent, dv) = {_dims()}; got q_nope {q_nope.dtype} "
                         f"{q_nope.shape}, q_pe {q_pe.shape}, w_kv {w_kv.dtype} {w_kv.shape}, ckv {ckv.shape}")
    return _kernel(*args, **opts)


def mla_decode_unfused(q_nope, q_pe, w_kv, ckv, kpe, position, layer, *, scale: float, window: Optional[int] = None,
                       attention: Optional[str] = None) -> jax.Array:
    """mla_decode_attention as an einsum, decode_attention (kernel=`attention`) over the latent
    cache, and a second einsum; the latent query and output rounded to q_nope's dtype."""
    f32, dtype, nope = jnp.float32, q_nope.dtype, q_nope.shape[-1]
    # (w_kv first: XLA's CPU runtime refuses the bf16 product with q_nope first, "Unsupported element type
    # for DotThunk::Execute: BF16 x BF16 = F32", jax 0.10.2)
    q_latent = jnp.einsum("hdr,bshd->bshr", w_kv[:, :nope], q_nope, preferred_element_type=f32).astype(dtype)
    out_latent = decode_attention(q_latent, ckv[..., None, :], None, position, scale=scale, layer=layer, q_rope=q_pe,
                                  key_rope=kpe[..., None, :], window=window, kernel=attention)
    return jnp.einsum("bshr,hdr->bshd", out_latent, w_kv[:, nope:], preferred_element_type=f32).astype(dtype)


def kernel_applies(q_nope, q_pe, w_kv, ckv, kpe) -> bool:
    """Whether the CUDA kernel is built and takes these operands on every local GPU (what
    kernel="te_async" needs)."""
    module = _ffi.cuda_module()
    if module is None or not _ffi.gpu_present():
        return False
    dn, dr, latent, dv = module.MLA_DECODE_DIMS
    return (all(x.dtype == jnp.bfloat16 for x in (q_nope, q_pe, w_kv, ckv, kpe))
            and (q_nope.shape[-1], q_pe.shape[-1], ckv.shape[-1], w_kv.shape[1] - q_nope.shape[-1]) == (dn, dr, latent, dv)
            and all(cc >= 90 for cc, _ in plan.local_gpu_kinds()))


def split_capacity(tokens: int, heads: int) -> int:
    """The partial buffer's splits for B * T = `tokens` new tokens of `heads` heads, in head groups of
    DECODE_ATTENTION_MAX_ROWS (a cluster's MMA rows): as many clusters of 8 blocks as fill the SMs in
    one wave, from 1 to MLA_DECODE_MAX_SPLITS. The kernel takes at most this many, fewer where its
    clusters would not all be resident."""
    module = _ffi.cuda_module()
    head_groups = tokens * -(-heads // module.DECODE_ATTENTION_MAX_ROWS)
    return max(1, min(module.MLA_DECODE_MAX_SPLITS, plan.local_sm_count() // (8 * head_groups)))


def _kernel(q_nope, q_pe, w_kv, ckv, kpe, position, layer, *, scale, window, cluster: int = 0, splits: int = 0):
    """The FFI call; cluster: blocks per thread-block cluster, 8 or 16, and splits: clusters per
    head group (0: the kernel chooses each). The kernel reads kv_b_proj as [latent, H, dn + dv], a
    transposed copy made by XLA here (4 MB a layer at DeepSeek-V2-Lite's shapes)."""
    b, t, h, _ = q_nope.shape
    dv, latent = w_kv.shape[1] - q_nope.shape[-1], ckv.shape[-1]
    w_kv = jnp.transpose(w_kv, (2, 0, 1))
    capacity = splits or split_capacity(b * t, h)
    out, _ = jax.ffi.ffi_call(MLA_DECODE, (jax.ShapeDtypeStruct((b, t, h, dv), q_nope.dtype),
                                           jax.ShapeDtypeStruct((capacity, b * t * h, latent + 2), jnp.float32)))(
        q_nope, q_pe, w_kv, ckv, kpe, layer, position, scale=np.float32(scale), window=np.int64(window or 0),
        cluster=np.int64(cluster), splits=np.int64(splits))
    return out


def _check(q_nope, q_pe, w_kv, ckv, kpe, kernel) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if q_nope.ndim != 4 or q_pe.ndim != 4 or w_kv.ndim != 3 or ckv.ndim != 4 or kpe.ndim != 4:
        raise ValueError(f"q_nope and q_pe must be [B, T, H, d], w_kv [H, dn + dv, latent], ckv and kpe [L, B, N, d]; got "
                         f"{q_nope.shape}, {q_pe.shape}, {w_kv.shape}, {ckv.shape}, {kpe.shape}")
    b, t, h, dn = q_nope.shape
    if q_pe.shape[:3] != (b, t, h):
        raise ValueError(f"q_pe {q_pe.shape} must be [B, T, H, dr] like q_nope {q_nope.shape}")
    if w_kv.shape[0] != h or w_kv.shape[2] != ckv.shape[-1] or w_kv.shape[1] <= dn:
        raise ValueError(f"w_kv {w_kv.shape} must be [H, dn + dv, latent] for ckv {ckv.shape} and q_nope {q_nope.shape}")
    if ckv.shape[1] != b or kpe.shape[:3] != ckv.shape[:3] or kpe.shape[-1] != q_pe.shape[-1]:
        raise ValueError(f"ckv {ckv.shape} and kpe {kpe.shape} must be [L, B, N, latent] and [L, B, N, dr] for q_nope "
                         f"{q_nope.shape} and q_pe {q_pe.shape}")


def _dims() -> tuple:
    module = _ffi.cuda_module()
    return () if module is None else tuple(module.MLA_DECODE_DIMS)
