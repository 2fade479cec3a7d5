"""One token's SwiGLU feed-forward in one kernel: the routed experts it chose plus the shared experts,
or a dense MLP alone (csrc/cuda/token_ffn.cu).

At one token per step (decode at batch 1) a feed-forward's time is the read of its weights, and
each kernel between them costs a few µs of fixed latency. The fused decode path
(te_async.decode_moe) runs the routed experts as fc1, fc2 and a sum, and the shared experts as two
more GEMMs. Here every output unit u of an expert (gate column u, linear column u, row u of fc2)
needs only the token, so the kernel gives each thread block a block of units of one expert and
runs fc1, the activation and fc2 for it alone: one launch with no grid-wide barrier. Expert ids
and routing weights are read on the GPU (from te_async.routing.route), so a step stays one CUDA
graph. Each block writes its float32 partial of the output; a second kernel of the call, a
programmatic dependent of the first, sums them in a fixed order and rounds to x's dtype (it
replaced an XLA reduction and conversion; a sum inside the first kernel, by the last block of each
group of items and then the last group, measured slower: docs/internals.md, table TM).
te_async.token_moe runs the same kernels behind the norm and the routing.

On an H200 (docs/internals.md, table TF) it runs DeepSeek-V2-Lite's routed and shared experts at
one token 1.31x faster than the four kernels it replaces (43.9 against 57.6 us per layer, with the
routing kernel and the sum; 1.48x the weights' read floor), the whole model's B=1 step 1.10x
faster; a dense MLP alone measured even with te_async.dense.linear's two kernels (17.4 against
17.3 us). Two 256-thread blocks per SM measured as fast as one 512-thread block and faster than
four. Where clusters exist (compute capability 9.0), plan_split may give an item's units a
cluster of two blocks, each reading half of fc1's rows and writing half of fc2's columns: wide
units with the SMs still filled, DeepSeek-V2-Lite's B=1 generate loop 4.9 % faster on an H100.

The rounding is the unfused path's: fc1's output and the activation are rounded to x's dtype
(grouped_mlp, te_async.mlp.activate); the routed experts and the shared experts are then summed in
float32 and rounded once, where the unfused path rounds each part. Gradients, if asked for, are those
of reference (a jax.custom_vjp): decode needs none.
"""

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from . import _ffi, plan
from .mlp import activate

TOKEN_FFN = "te_async_token_ffn"
DTYPES = ("bfloat16", "float16")
MAX_HIDDEN = 4096  # csrc/cuda/token_ffn.cu: x is held in shared memory as float32
MAX_UNITS = 256
VEC = 8  # 16-bit elements per 16-byte load: H, F and the units of a block are multiples of it
BLOCKS_PER_SM = 2  # csrc/cuda/token_ffn.cu's thread blocks resident per SM
SLICES = (1, 2)  # blocks of an item's thread-block cluster (plan_split says why no more)
WIDE_UNITS = 128  # 256 bytes of a row's gate (or linear) slice: wider pieces read no faster
FILL = 2 / 3  # the share of a wave of blocks that keeps enough loads in flight (plan_split)


class Split(NamedTuple):
    units: int  # output units of an item: fc1's gate and linear columns, fc2's rows
    slices: int  # thread blocks of an item's cluster, each on a share of H (1: no cluster)


class Routed(NamedTuple):
    experts: jax.Array  # int32 [1, k], route()'s choice
    weights: jax.Array  # float32 [1, k]
    w_fc1: jax.Array  # [E, H, 2F], [gate | linear]
    w_fc2: jax.Array  # [E, F, H]


class Shared(NamedTuple):
    w_gate_up: jax.Array  # [H, 2Fs], [gate | linear]
    w_down: jax.Array  # [Fs, H]
    scale: Optional[jax.Array] = None  # float32, one entry (Qwen2-MoE's sigmoid gate); None: 1


def applies(x: jax.Array, routed: Optional[Routed] = None, shared: Optional[Shared] = None) -> bool:
    """Whether token_ffn runs the kernel for these operands (else callers keep their own path)."""
    weights = _weights(routed, shared)
    ffns = [w.shape[-2] for w in weights[1::2]]
    return (bool(weights) and plan.on_gpu() and x.ndim == 2 and x.shape[0] == 1 and x.dtype.name in DTYPES
            and all(w.dtype == x.dtype for w in weights) and x.shape[1] % VEC == 0 and x.shape[1] <= MAX_HIDDEN
            and all(f % VEC == 0 and f > 0 for f in ffns))


def plan_split(top_k: int, ffn: int, shared_ffn: int, hidden: int, sms: int, clusters: bool) -> Split:
    """The fewest waves of BLOCKS_PER_SM blocks per SM; then blocks filling at least FILL of a wave,
    so that enough loads are in flight; then the widest units up to WIDE_UNITS (and F), so that fc1's rows
    are read in wide pieces and there are few items (each adds a row of partials and its fixed
    costs); then the fewest units and slices. A cluster of slices splits an item's rows of fc1 and
    columns of fc2, so wide units still fill the SMs.

    Measured on an H100 (2026-12-06, docs/results/2026-12-06-h100-token-ffn-clusters): DeepSeek-V2-Lite's
    routed and shared experts at one token, GPU us a layer with the routing, 55.5 at 128 units in
    2 slices (176 blocks) against 56.7 / 57.5 at 96 / 88 units in 2 (240 / 256 blocks) and 58.3 at 48
    in 1 (239, the plan without clusters); clusters of 4 and 8 blocks lost 10-20 us at a full wave
    (fewer of them are resident at once: a cluster's blocks share a GPC), hence SLICES. Its routed
    experts alone: 44.8 at 64 units in 2 (264 blocks), 45.5 at 128 in 2 (132), 45.6 at 48 in 1. On
    an H200 without clusters (2026-12-02) 48 units (239 blocks) beat 64 (176) by 4 %: FILL is the
    H100's."""
    slots, widest = BLOCKS_PER_SM * sms, min(WIDE_UNITS, math.ceil(max(ffn, shared_ffn) / VEC) * VEC)

    def cost(p: Split):
        grid = blocks(top_k, ffn, shared_ffn, p.units) * p.slices
        return math.ceil(grid / slots), grid < FILL * slots, -min(p.units, widest), p.units, p.slices
    slices = [s for s in SLICES if (clusters or s == 1) and s <= hidden // VEC]
    return min((Split(u, s) for u in range(VEC, MAX_UNITS + 1, VEC) for s in slices), key=cost)


def blocks(top_k: int, ffn: int, shared_ffn: int, units: int) -> int:
    """Thread blocks of a call: each routed choice's F units and the shared experts' Fs, in blocks."""
    return top_k * math.ceil(ffn / units) + math.ceil(shared_ffn / units)


def token_ffn(x: jax.Array, routed: Optional[Routed] = None, shared: Optional[Shared] = None) -> jax.Array:
    """x [1, H] -> sum_c weights[c] * expert_{experts[c]}(x) + scale * shared(x), [1, H] in x's dtype,
    each part a SwiGLU MLP (down(silu(x @ gate) * (x @ linear))). Call it where applies() holds."""
    _check(x, routed, shared)
    return _token_ffn(x, routed, shared)


def _check(x, routed, shared):
    if routed is None and shared is None:
        raise ValueError("token_ffn needs routed experts, shared experts or both")
    if x.ndim != 2 or x.shape[0] != 1:
        raise ValueError(f"x must be [1, H] (one token), got {x.shape}")
    h = x.shape[1]
    if routed is not None:
        k, (e, f) = routed.experts.shape[-1], routed.w_fc2.shape[:2]
        if routed.experts.shape != (1, k) or routed.weights.shape != (1, k):
            raise ValueError(f"experts and weights must be [1, k], got {routed.experts.shape}, {routed.weights.shape}")
        if not jnp.issubdtype(routed.experts.dtype, jnp.integer):
            raise TypeError(f"experts must be integer expert ids, got {routed.experts.dtype}")
        if routed.w_fc1.shape != (e, h, 2 * f) or routed.w_fc2.shape != (e, f, h):
            raise ValueError(f"need w_fc1 [E, H, 2F] and w_fc2 [E, F, H] for H = {h}, got {routed.w_fc1.shape}, "
                             f"{routed.w_fc2.shape}")
    if shared is not None:
        fs = shared.w_down.shape[0]
        if shared.w_gate_up.shape != (h, 2 * fs) or shared.w_down.shape != (fs, h):
            raise ValueError(f"need shared w_gate_up [H, 2Fs] and w_down [Fs, H] for H = {h}, got "
                             f"{shared.w_gate_up.shape}, {shared.w_down.shape}")
        if shared.scale is not None and shared.scale.size != 1:
            raise ValueError(f"the shared scale must have one entry, got {shared.scale.shape}")
    for w in _weights(routed, shared):
        if w.dtype != x.dtype:
            raise TypeError(f"x and every weight must share one dtype, got {x.dtype} and {w.dtype}")


def _weights(routed, shared):
    return ([] if routed is None else [routed.w_fc1, routed.w_fc2]) + ([] if shared is None else [shared.w_gate_up, shared.w_down])


def plan_call(x: jax.Array, top_k: int, ffn: int, shared_ffn: int) -> tuple:
    """(the call's attributes, units and slices; its outputs: y [1, H] in x's dtype and the float32
    [items, H] partials it sums, each item's) of a call on x [1, H]."""
    # The fewest SMs and the lowest compute capability of the local GPUs (clusters from 9.0);
    # without a GPU (the kernel's branch is traced, never run) any.
    kinds = plan.local_gpu_kinds() if _ffi.gpu_present() else {(0, 1)}
    sms, clusters = min(s for _, s in kinds), min(cc for cc, _ in kinds) >= 90
    p = plan_split(top_k, ffn, shared_ffn, x.shape[1], sms, clusters)
    partials = jax.ShapeDtypeStruct((blocks(top_k, ffn, shared_ffn, p.units), x.shape[1]), jnp.float32)
    return p._asdict(), (jax.ShapeDtypeStruct(x.shape, x.dtype), partials)


def _kernel(x, routed, shared):
    h = x.shape[1]
    none = jnp.zeros((0, h, 0), x.dtype), jnp.zeros((0, 0, h), x.dtype)
    experts, weights, w_fc1, w_fc2 = (
        (jnp.zeros((0,), jnp.int32), jnp.zeros((0,), jnp.float32), *none) if routed is None else
        (routed.experts.reshape(-1).astype(jnp.int32), routed.weights.reshape(-1).astype(jnp.float32), routed.w_fc1,
         routed.w_fc2))
    w_gate_up, w_down, scale = ((jnp.zeros((h, 0), x.dtype), jnp.zeros((0, h), x.dtype), None) if shared is None
                                else shared)
    scale = jnp.ones((1,), jnp.float32) if scale is None else scale.reshape(1).astype(jnp.float32)
    attrs, out = plan_call(x, experts.shape[0], w_fc2.shape[1], w_down.shape[0])
    y, _ = jax.ffi.ffi_call(TOKEN_FFN, out)(x, w_fc1, w_fc2, experts, weights, w_gate_up, w_down, scale, **attrs)
    return y


def _swiglu(x, w_gate_up, w_down):
    """[..., H] -> [..., H] in float32: fc1 and the activation rounded to x's dtype, fc2 not."""
    h = jnp.einsum("...h,...hf->...f", x, w_gate_up, preferred_element_type=jnp.float32).astype(x.dtype)
    return jnp.einsum("...f,...fh->...h", activate(h, "swiglu"), w_down, preferred_element_type=jnp.float32)


def reference(x, routed, shared):
    """token_ffn in plain JAX (also te_async.token_moe's)."""
    y = jnp.zeros(x.shape, jnp.float32)
    if routed is not None:
        e = routed.experts[0]
        y_k = _swiglu(jnp.broadcast_to(x, (e.shape[0], x.shape[1])), routed.w_fc1[e], routed.w_fc2[e])
        y = y + (routed.weights[0, :, None].astype(jnp.float32) * y_k).sum(axis=0, keepdims=True)
    if shared is not None:
        scale = 1.0 if shared.scale is None else shared.scale.reshape(()).astype(jnp.float32)
        y = y + scale * _swiglu(x, shared.w_gate_up, shared.w_down)
    return y.astype(x.dtype)


@jax.custom_vjp
def _token_ffn(x, routed, shared):
    # The kernel where the call is lowered for a GPU; elsewhere the reference.
    return jax.lax.platform_dependent(x, routed, shared, cuda=_kernel, default=reference)


def _token_ffn_fwd(*args):
    return _token_ffn(*args), args


def _token_ffn_bwd(args, dy):
    return jax.vjp(reference, *args)[1](dy)


_token_ffn.defvjp(_token_ffn_fwd, _token_ffn_bwd)
