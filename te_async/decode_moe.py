"""The routed experts of a decode MoE block in two kernels, with the permutation fused in.

Unfused, device mode runs gather (x rows by expert), fc1, swiglu, fc2, then a gather back to
(token, choice) order and the weighted sum, each a kernel. Fused (csrc/cuda/expert_gemm.cc, on
the small_groups kernel): fc1 reads each sorted row straight from the token's row of x; fc2
applies swiglu to fc1's output as it loads it and writes each row, times its routing weight, to
its (token, choice) slot of a float32 [T*k, H] array; one XLA reduction sums the k slots. The rows
come from route()'s kernel (te_async/routing.py), so a decode MoE layer is the router GEMM, the
routing kernel, fc1, fc2 and the sum. Deterministic, no atomics.

It can run (can_fuse) in device mode where both GEMMs' plans choose small_groups (decode sizes; at
most 512 rows, the kernel's row table), on the GPU, for swiglu (the activation of every model in
te_async.models); elsewhere callers run the unfused path, which is also its reference. The default
(fuses) takes it for one token per step only, and the MoE blocks ask te_async.token_ffn first (one
kernel for the routed and shared experts; 16-bit, H <= 4096), so this path runs at one token only
where that one does not apply. It measured faster than unfused at one token: on an H200, DeepSeek-V2-Lite
decode per token (docs/benchmarks.md, table G1) 3.99 ms fused against 4.38 ms unfused at B=1, but
9.71 against 9.55 ms at B=8. Fused fc1 and fc2 are each a little slower than unfused (fc2
recomputes swiglu for every column tile it loads; 7.5 us more per layer at B=8 on an H200, 6 on an H100;
swiglu in fc1's epilogue instead took 4 us off fc2, added 2 to fc1, and still lost to unfused from 4 tokens
up: docs/internals.md, under table F); at B=1 the four
kernels fewer win, since that step is bound by launches (39 % against 47 % GPU idle). The sum is taken from fc2's float32 accumulators: the unfused
path rounds fc2's rows to the input dtype first, so the two differ by that rounding. Gradients, if
asked for, are the unfused path's (a jax.custom_vjp that recomputes it): decode needs none.
"""

import jax
import jax.numpy as jnp

from . import _ffi, plan
from .mlp import grouped_mlp
from .routing import Dispatch, Routing, combine, dispatch_rows

EXPERT_GEMM = "te_async_expert_gemm"
DTYPES = ("bfloat16", "float16", "float32")


FUSE_MAX_TOKENS = 1  # the default fuses up to this many tokens per step (see above)


def fuses(tokens: int, top_k: int, w_fc1: jax.Array, w_fc2: jax.Array, *, mode: str, activation: str) -> bool:
    """Whether the MoE blocks (te_async.moe, te_async.models) take the fused path by default."""
    return tokens <= FUSE_MAX_TOKENS and can_fuse(tokens, top_k, w_fc1, w_fc2, mode=mode, activation=activation)


def can_fuse(tokens: int, top_k: int, w_fc1: jax.Array, w_fc2: jax.Array, *, mode: str, activation: str) -> bool:
    """Whether fused_experts runs these sizes: both GEMMs' device-mode plans choose small_groups."""
    if mode != "device" or activation != "swiglu" or not plan.on_gpu() or jnp.dtype(w_fc1.dtype).name not in DTYPES:
        return False
    groups, hidden, ffn = w_fc2.shape[0], w_fc2.shape[2], w_fc2.shape[1]
    rows, dtype = tokens * top_k, jnp.dtype(w_fc1.dtype).name
    if rows > _ffi.cuda_module().FUSED_MAX_ROWS:  # TE_ASYNC_SMALL_GROUPS_MAX_ROWS may allow more
        return False
    shapes = (plan.GemmShape(groups, rows, hidden, 2 * ffn, dtype=dtype),
              plan.GemmShape(groups, rows, ffn, hidden, dtype=dtype, out_dtype="float32"))
    return all(plan.plan_device_gemm(s).kernel == "small_groups" for s in shapes)


def _expert_gemm(lhs, rhs, dispatch: Dispatch, weights, out_dtype, **attrs):
    rows = dispatch.choice_of_row.shape[0]
    out = jax.ShapeDtypeStruct((rows, rhs.shape[2]), out_dtype)
    return jax.ffi.ffi_call(EXPERT_GEMM, out)(lhs, rhs, dispatch.group_sizes, dispatch.choice_of_row,
                                              weights.reshape(-1).astype(jnp.float32), **attrs)


def _unfused(x, weights, dispatch: Dispatch, w_fc1, w_fc2):
    y_rows = grouped_mlp(dispatch_rows(x, dispatch), dispatch.group_sizes, w_fc1, w_fc2, norm=None, activation="swiglu",
                         group_sizes_mode="device")
    return combine(y_rows, dispatch, weights)


@jax.custom_vjp
def _fused(x, weights, dispatch: Dispatch, w_fc1, w_fc2):
    t, k = weights.shape
    h = _expert_gemm(x, w_fc1, dispatch, weights, x.dtype, gather_div=k, scatter=False, swiglu=False)
    y = _expert_gemm(h, w_fc2, dispatch, weights, jnp.float32, gather_div=0, scatter=True, swiglu=True)
    return y.reshape(t, k, -1).sum(axis=1).astype(x.dtype)


def _fused_fwd(*args):
    return _fused(*args), args


def _fused_bwd(args, dy):
    return jax.vjp(_unfused, *args)[1](dy)


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_experts(x: jax.Array, routing: Routing, dispatch: Dispatch, w_fc1: jax.Array, w_fc2: jax.Array) -> jax.Array:
    """x [T, H] (already normalised), the routing and dispatch of route(), w_fc1 [E, H, 2F] (swiglu's
    [gate | linear]), w_fc2 [E, F, H] -> sum_k weight_k * expert_k(x) [T, H], in x's dtype. Call it
    where can_fuse() holds."""
    if not x.dtype == w_fc1.dtype == w_fc2.dtype:
        raise TypeError(f"x, w_fc1 and w_fc2 must share a dtype, got {x.dtype}, {w_fc1.dtype}, {w_fc2.dtype}")
    if x.ndim != 2 or routing.weights.shape[0] != x.shape[0]:
        raise ValueError(f"x must be [T, H] with T = the routing's {routing.weights.shape[0]} tokens, got {x.shape}")
    if w_fc1.shape[1] != x.shape[1] or w_fc1.shape[2] != 2 * w_fc2.shape[1] or w_fc2.shape[2] != x.shape[1]:
        raise ValueError(f"need w_fc1 [E,H,2F], w_fc2 [E,F,H] for x {x.shape}; got {w_fc1.shape}, {w_fc2.shape}")
    # The fused kernels where the call is lowered for a GPU; elsewhere (arrays placed on the CPU of
    # a GPU machine, say) the unfused path, which every backend runs.
    return jax.lax.platform_dependent(x, routing.weights, dispatch, w_fc1, w_fc2, cuda=_fused, default=_unfused)
