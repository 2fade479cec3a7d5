"""An MoE block on the public API: top-k router, the norm on the tokens, token sort by expert with
group sizes computed on the device, grouped_mlp with the router weights on its rows (row_weights:
its output is then not kept for the backward), then each token's rows summed (routing.sum_rows).

In async mode the block issues copy_group_sizes right after routing, before the permutation,
and hands the handle to grouped_mlp, so that the group-sizes copy overlaps the dispatch.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from . import decode_moe, token_ffn, token_moe
from .group_sizes import copy_group_sizes
from .mlp import EPS, grouped_mlp, normalize, resolve_mlp_mode
from .routing import (Dispatch, Routing, combine, dispatch_rows, plan_dispatch, route, route_reference,  # noqa: F401 (re-exported)
                      sum_rows, weights_by_row)


def route_top_k(x: jax.Array, router: jax.Array, top_k: int) -> Routing:
    """Softmax router in float32; the top-k weights are renormalised to sum to one (plain JAX)."""
    return route_reference(jnp.dot(x, router, preferred_element_type=jnp.float32), top_k, renormalize=True)


def moe_block(
    x: jax.Array,
    router: jax.Array,
    w_fc1: jax.Array,
    w_fc2: jax.Array,
    *,
    top_k: int,
    norm_scale: Optional[jax.Array] = None,
    norm: Optional[str] = "rmsnorm",
    activation: str = "swiglu",
    group_sizes_mode: Optional[str] = None,
    use_async_d2h_group_sizes: bool = False,
    early_copy: bool = True,
    fuse: bool = True,
    residual: bool = False,
) -> jax.Array:
    """y = sum_k w_k * expert_k(norm(x)) for x [T, H]; router [H, E]; expert weights as grouped_mlp.
    residual=True returns x + y (a decoder's residual connection; on the one-token path below XLA
    adds it in the fusion that converts token_moe's sum).

    early_copy=False leaves the async copy to grouped_mlp itself (issued after the permutation),
    which the benchmarks use to show what issuing it early buys. In device mode with one token per
    step the whole block runs as te_async.token_moe (the norm, the router, the routing, the experts
    and the residual in one call of three kernels, where it applies: 16-bit, RMSNorm, swiglu), else the
    routed experts in one kernel (te_async.token_ffn), else fused with the permutation
    (te_async.decode_moe.fuses); fuse=False keeps the unfused path, for comparison.
    """
    mode = resolve_mlp_mode(group_sizes_mode, use_async_d2h_group_sizes, None, groups=router.shape[1],
                            rows=x.shape[0] * top_k, w_fc1=w_fc1, w_fc2=w_fc2)
    fused = fuse and mode == "device" and activation == "swiglu"
    if fused and norm == "rmsnorm":
        scale = jnp.ones(x.shape[-1:], jnp.float32) if norm_scale is None else norm_scale
        block_norm = token_moe.Norm(scale, EPS, round_first=False)
        block_router = token_moe.Router(router, top_k, renormalize=True, reads_normed=False)
        if token_moe.applies(x, block_norm, block_router, w_fc1, w_fc2):
            return token_moe.token_moe(x, block_norm, block_router, w_fc1, w_fc2, residual=residual)[0]
    y = _routed_block(x, router, w_fc1, w_fc2, top_k, norm_scale, norm, activation, mode, early_copy, fused)
    return x + y if residual else y


def _routed_block(x, router, w_fc1, w_fc2, top_k, norm_scale, norm, activation, mode, early_copy, fused):
    routing, dispatch = route(jnp.dot(x, router, preferred_element_type=jnp.float32), top_k, renormalize=True)
    handle = None
    if mode == "async" and early_copy:  # never with `fused`, which is device mode's
        handle = copy_group_sizes(dispatch.group_sizes)
        # The barrier makes the norm and the permutation wait for the copy, so XLA cannot sink the
        # copy down to its first consumer: it is enqueued before the work it should overlap.
        handle, x = jax.lax.optimization_barrier((handle, x))
    # The norm is row-wise: it runs on the T tokens before their T * k rows are gathered, not on the rows.
    xn = normalize(x, norm_scale, None, norm, EPS)
    if fused:
        routed = token_ffn.Routed(routing.experts, routing.weights, w_fc1, w_fc2)
        if token_ffn.applies(xn, routed):
            return token_ffn.token_ffn(xn, routed)
        if decode_moe.fuses(x.shape[0], top_k, w_fc1, w_fc2, mode=mode, activation=activation):
            return decode_moe.fused_experts(xn, routing, dispatch, w_fc1, w_fc2)
    y_rows = grouped_mlp(
        dispatch_rows(xn, dispatch),
        dispatch.group_sizes,
        w_fc1,
        w_fc2,
        norm=None,
        activation=activation,
        group_sizes_mode=mode,
        host_group_sizes=handle,
        row_weights=weights_by_row(routing.weights, dispatch),
    )
    return sum_rows(y_rows, dispatch, x.shape[0]).astype(x.dtype)
