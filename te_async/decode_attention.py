"""Decode attention over a stacked KV cache, read in place.

A decoder that scans over its layers keeps each run's cache as one array [L, B, N, ...] in the
scan's carry. XLA's attention reads layer l of it through a dynamic slice that it materialises,
copying the whole layer's cache in every step (4.78 of 20.6 ms of GPU time in DeepSeek-V2-Lite's
B=64 step). `decode_attention` takes the stacked array and the layer index instead. On the GPU,
for bf16, the head shapes of DeepSeek-V2's MLA and of 128-dim grouped-query heads, and at least
AUTO_MIN_PAIRS (sequence, kv head) pairs (at one, XLA's attention measured as fast in the whole
model), it runs csrc/cuda/decode_attention.cu: flash decoding on the tensor cores that reads each
visible key once, in two kernels (the splits, then their merge), inside the step's CUDA graph.
Elsewhere it runs `decode_attention_reference`, plain JAX, which is also what the kernel is checked
against.

TE_ASYNC_DECODE_ATTENTION (read once): "auto" (default), "xla" (always the reference, for
comparison) or "te_async" (the kernel; an error where it cannot run).
"""

import functools
import math
from typing import Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi, mixed_precision, plan

DECODE_ATTENTION = "te_async_decode_attention"
KERNEL_ENV = "TE_ASYNC_DECODE_ATTENTION"
KERNELS = ("auto", "te_async", "xla")
KEY_TILE = 32  # keys per tile of the kernel: a split's chunk is a multiple of it
MIN_CHUNK = 2 * KEY_TILE  # so that a split loads its next tile while it computes one
# "auto" takes the kernel from this many (sequence, kv head) pairs up. The whole model on an H200,
# 4096 cached tokens, device mode, generate's loop per token against XLA's attention
# (docs/internals.md, table AP): DeepSeek-V2-Lite at 1 pair (B=1) even (2.765 against 2.759 ms,
# table AL's notes), at 2 pairs (B=2) 1.06x faster; Qwen3-30B-A3B at 4 pairs (B=1) 1.06x faster;
# DeepSeek-V2-Lite at 8 and 64 pairs 1.08x and 1.21x faster (table A).
AUTO_MIN_PAIRS = 2


@functools.lru_cache(maxsize=None)
def default_kernel() -> str:
    """TE_ASYNC_DECODE_ATTENTION, read once."""
    return plan.kernel_setting(KERNEL_ENV, KERNELS)


def wants_kernel(kernel: str, pairs: int) -> bool:
    """Whether setting `kernel` asks for the kernel at `pairs` (sequence, kv head) pairs: "te_async"
    always, "auto" from AUTO_MIN_PAIRS, "xla" never (the calls that chain it, gqa_token, ask too)."""
    return kernel == "te_async" or (kernel == "auto" and pairs >= AUTO_MIN_PAIRS)


def causal_mask(q_pos: jax.Array, k_pos: jax.Array, window: Optional[int]) -> jax.Array:
    """bool [S, L]: key j is visible to query i (transformers' sliding window: q - k < window)."""
    mask = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        mask &= k_pos[None, :] > q_pos[:, None] - window
    return mask


def decode_attention(q: jax.Array, keys: jax.Array, values: Optional[jax.Array], position, *, scale: float,
                     layer: Union[int, jax.Array] = 0, q_rope: Optional[jax.Array] = None,
                     key_rope: Optional[jax.Array] = None, window: Optional[int] = None,
                     kernel: Optional[str] = None) -> jax.Array:
    """Attention of T new tokens over layer `layer` of a stacked cache: [B, T, H, dv] in q's dtype.

    q [B, T, H, dk] at positions position .. position + T - 1; keys [L, B, N, Hkv, dk]; values
    [L, B, N, Hkv, dv], or None when the keys are the values (MLA's latent); q_rope [B, T, H, dr]
    with key_rope [L, B, N, Hkv, dr] add a second score term (MLA's rope key). The H query heads
    share the Hkv key heads in groups. Query t sees keys j <= position + t (and j > position + t -
    window). Scores and softmax in float32; a query that sees no key gives NaN. kernel: None (the
    TE_ASYNC_DECODE_ATTENTION setting), "auto", "te_async" or "xla". The kernel path has no
    gradient: differentiate through kernel="xla".
    """
    kernel = default_kernel() if kernel is None else kernel
    _check(q, keys, values, q_rope, key_rope, kernel)
    check_window_and_layer(window, layer, keys.shape[0])
    args = (q, keys, values, jnp.asarray(position, jnp.int32), jnp.asarray(layer, jnp.int32), q_rope, key_rope)
    opts = dict(scale=float(scale), window=window)
    applies = kernel_applies(q, keys, values, q_rope)
    if not wants_kernel(kernel, q.shape[0] * keys.shape[3]) or (kernel == "auto" and not applies):
        return decode_attention_reference(*args, **opts)
    if kernel == "te_async":
        if not (applies and plan.on_gpu()):
            raise ValueError(f"kernel='te_async' needs a GPU, bf16 operands, (key dims, rope dims, value dims, values "
                             f"are keys) in {_shapes()} and at most {_max_rows()} query heads per kv head x new "
                             f"tokens; got q {q.dtype} {q.shape}, keys {keys.shape}")
        return _kernel(*args, **opts)
    return jax.lax.platform_dependent(*args, cuda=functools.partial(_kernel, **opts),
                                      default=functools.partial(decode_attention_reference, **opts))


def decode_attention_reference(q, keys, values, position, layer, q_rope=None, key_rope=None, *, scale: float,
                               window: Optional[int] = None) -> jax.Array:
    """decode_attention in plain JAX (the layer read through a dynamic slice)."""
    k = jax.lax.dynamic_index_in_dim(keys, layer, axis=0, keepdims=False)
    v = k if values is None else jax.lax.dynamic_index_in_dim(values, layer, axis=0, keepdims=False)
    k_rope = None if key_rope is None else jax.lax.dynamic_index_in_dim(key_rope, layer, axis=0, keepdims=False)
    mask = causal_mask(position + jnp.arange(q.shape[1], dtype=jnp.int32), jnp.arange(k.shape[1], dtype=jnp.int32),
                       window)
    return attend(q, k, v, mask, scale, q_rope, k_rope, out_dtype=q.dtype)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float, q_rope=None, k_rope=None,
           out_dtype=None) -> jax.Array:
    """Softmax attention, q [B,S,H,d], k [B,L,Hkv,d], v [B,L,Hkv,dv] -> [B,S,H,dv] in out_dtype
    (default v's); the H query heads share the Hkv key heads in groups (repeat_kv); q_rope
    [B,S,H,dr] with k_rope [B,L,Hkv,dr] add a second score term (MLA's rope key); mask [S, L].
    Scores and softmax in float32. Differentiated, it keeps its inputs alone and recomputes the
    scores and probabilities in its backward (jax.checkpoint), where JAX would keep them in float32
    and bf16 (B*H*S*L*6 bytes: 1.6 GB a DeepSeek-V2-Lite layer at 4096 tokens); the gradient's
    products read q's and v's dtype (te_async.mixed_precision)."""
    return _attend(q, k, v, mask, scale, q_rope, k_rope, out_dtype)


@functools.partial(jax.checkpoint, static_argnums=(4, 7))
def _attend(q, k, v, mask, scale, q_rope, k_rope, out_dtype):
    b, s, h, _ = q.shape
    hkv = k.shape[2]

    def scores_of(query, key):
        return mixed_precision.einsum("bsngd,blnd->bngsl", query.reshape(b, s, hkv, h // hkv, -1), key)

    scores = scores_of(q, k)
    if q_rope is not None:
        scores = scores + scores_of(q_rope, k_rope)
    probs = jax.nn.softmax(jnp.where(mask, scores * scale, -jnp.inf), axis=-1).astype(v.dtype)
    out = mixed_precision.einsum("bngsl,blnd->bsngd", probs, v)
    return out.astype(v.dtype if out_dtype is None else out_dtype).reshape(b, s, h, v.shape[-1])


def kernel_applies(q, keys, values, q_rope) -> bool:
    """Whether the CUDA kernel is built and takes these operands (decode_attention runs it where
    the call is lowered for a GPU)."""
    module = _ffi.cuda_module()
    if module is None:
        return False
    b, t, h, dk = q.shape
    hkv = keys.shape[3]
    dr = 0 if q_rope is None else q_rope.shape[-1]
    dv = dk if values is None else values.shape[-1]
    operands = [q, keys] + [x for x in (values, q_rope) if x is not None]
    return (all(x.dtype == jnp.bfloat16 for x in operands) and b * hkv <= 65535
            and (dk, dr, dv, values is None) in module.DECODE_ATTENTION_SHAPES
            and h // hkv * t <= module.DECODE_ATTENTION_MAX_ROWS)


@functools.lru_cache(maxsize=None)
def _blocks_per_sm(shape: tuple) -> int:
    """Blocks of the kernel for this head shape, (key dims, rope dims, value dims, values are keys),
    that one SM holds at once (the CUDA occupancy query)."""
    return _ffi.cuda_module().decode_attention_blocks_per_sm(*shape)


def splits_for(blocks: int, max_len: int, shape: tuple) -> int:
    """Key chunks per (sequence, kv head) on the local GPUs, for a head shape of DECODE_ATTENTION_SHAPES."""
    return split_count(blocks, max_len, plan.local_sm_count(), _blocks_per_sm(shape),
                       _ffi.cuda_module().DECODE_ATTENTION_MAX_SPLITS)


def split_count(blocks: int, max_len: int, sm_count: int, resident: int, max_splits: int) -> int:
    """Key chunks per (sequence, kv head) for `blocks` such pairs: about two blocks per SM in all, but
    no more than one wave of the `resident` blocks an SM holds (a partial second wave costs about
    as much as the first: DeepSeek-V2-Lite's MLA at B=64, 2 resident, took 233 us of GPU time per
    layer in 5 splits, 1.2 waves, and 165 in 4; docs/internals.md, table AW), and at least
    MIN_CHUNK keys each (every split adds its partial output to the merge's reads)."""
    want = min(max_splits, math.ceil(max_len / MIN_CHUNK), math.ceil(2 * sm_count / blocks),
               max(1, resident * sm_count // blocks))
    chunk = math.ceil(math.ceil(max_len / want) / KEY_TILE) * KEY_TILE
    return math.ceil(max_len / chunk)


def _kernel(q, keys, values, position, layer, q_rope=None, key_rope=None, *, scale, window):
    b, t, h, _ = q.shape
    _, _, n, hkv, _ = keys.shape
    values_are_keys = values is None
    if q_rope is None:
        q_rope, key_rope = jnp.zeros((b, t, h, 0), q.dtype), jnp.zeros(keys.shape[:4] + (0,), keys.dtype)
    dv = keys.shape[-1] if values_are_keys else values.shape[-1]
    splits = splits_for(b * hkv, n, (keys.shape[-1], q_rope.shape[-1], dv, values_are_keys))
    rows = _ffi.cuda_module().DECODE_ATTENTION_MAX_ROWS
    out, _ = jax.ffi.ffi_call(DECODE_ATTENTION, (jax.ShapeDtypeStruct((b, t, h, dv), q.dtype),
                                                 jax.ShapeDtypeStruct((splits, b * hkv, rows, dv + 2), jnp.float32)))(
        q, q_rope, keys, key_rope, keys if values_are_keys else values, layer, position,
        scale=np.float32(scale), window=np.int64(window or 0), values_are_keys=values_are_keys)
    return out


def check_window_and_layer(window, layer, layers: int) -> None:
    """A window of None or a positive number of keys, and a static layer inside the stack of
    `layers` (a traced layer past it gives NaN on the GPU); mla_decode checks the same."""
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be None or a positive number of keys, got {window!r}")
    if isinstance(layer, int) and not 0 <= layer < layers:
        raise ValueError(f"layer {layer} is outside the stack of {layers} layers")


def _check(q, keys, values, q_rope, key_rope, kernel) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if q.ndim != 4 or keys.ndim != 5:
        raise ValueError(f"q must be [B, T, H, dk] and keys [L, B, N, Hkv, dk], got {q.shape} and {keys.shape}")
    b, _, h, dk = q.shape
    _, kb, _, hkv, kdk = keys.shape
    if kb != b or kdk != dk or hkv < 1 or h % hkv:
        raise ValueError(f"keys {keys.shape} do not fit q {q.shape}: keys must be [L, B, N, Hkv, dk] with H a multiple "
                         "of Hkv")
    if values is not None and (values.ndim != 5 or values.shape[:4] != keys.shape[:4]):
        raise ValueError(f"values must be [L, B, N, Hkv, dv] like keys {keys.shape}, got {values.shape}")
    if (q_rope is None) != (key_rope is None):
        raise ValueError("q_rope and key_rope come together")
    if q_rope is not None and (q_rope.shape[:3] != q.shape[:3] or key_rope.shape[:4] != keys.shape[:4]
                               or q_rope.shape[-1] != key_rope.shape[-1] or q_rope.ndim != 4 or key_rope.ndim != 5):
        raise ValueError(f"q_rope must be [B, T, H, dr] and key_rope [L, B, N, Hkv, dr] beside q {q.shape} and keys "
                         f"{keys.shape}, got {q_rope.shape} and {key_rope.shape}")


def _shapes() -> list:
    module = _ffi.cuda_module()
    return [] if module is None else list(module.DECODE_ATTENTION_SHAPES)


def _max_rows() -> int:
    module = _ffi.cuda_module()
    return 0 if module is None else module.DECODE_ATTENTION_MAX_ROWS
