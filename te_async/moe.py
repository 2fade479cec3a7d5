"""An MoE block on the public API: top-k router, token sort by expert with group sizes computed
on the device, grouped_mlp, then unpermute and combine with the router weights.

In async mode the block issues copy_group_sizes right after routing, before the permutation,
and hands the handle to grouped_mlp, so that the group-sizes copy overlaps the dispatch.
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from .group_sizes import copy_group_sizes
from .mlp import grouped_mlp, resolve_mlp_mode


class Routing(NamedTuple):
    weights: jax.Array  # [T, k] float32, renormalised over the chosen experts
    experts: jax.Array  # [T, k] int32


class Dispatch(NamedTuple):
    group_sizes: jax.Array  # [E] int32: rows per expert, in expert order
    token_of_row: jax.Array  # [T*k] int32: which token each sorted row copies
    row_of_choice: jax.Array  # [T*k] int32: where each (token, choice) landed among the rows


def route_top_k(x: jax.Array, router: jax.Array, top_k: int) -> Routing:
    """Softmax router in float32; the top-k weights are renormalised to sum to one."""
    probs = jax.nn.softmax(jnp.dot(x, router, preferred_element_type=jnp.float32), axis=-1)
    weights, experts = jax.lax.top_k(probs, top_k)
    return Routing(weights / jnp.sum(weights, axis=-1, keepdims=True), experts.astype(jnp.int32))


def plan_dispatch(experts: jax.Array, num_experts: int) -> Dispatch:
    """Sorts the T*k (token, choice) pairs by expert, stably, on the device."""
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True).astype(jnp.int32)
    group_sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    row_of_choice = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=jnp.int32))
    return Dispatch(group_sizes, order // experts.shape[1], row_of_choice)


def combine(y_rows: jax.Array, dispatch: Dispatch, weights: jax.Array) -> jax.Array:
    """Unpermutes the expert outputs and sums each token's k of them with its router weights."""
    t, k = weights.shape
    y = y_rows[dispatch.row_of_choice].reshape(t, k, -1).astype(jnp.float32)
    return jnp.einsum("tkh,tk->th", y, weights).astype(y_rows.dtype)


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
) -> jax.Array:
    """y = sum_k w_k * expert_k(norm(x)) for x [T, H]; router [H, E]; expert weights as grouped_mlp.

    early_copy=False leaves the async copy to grouped_mlp itself (issued after the permutation),
    which the benchmarks use to show what issuing it early buys.
    """
    routing = route_top_k(x, router, top_k)
    dispatch = plan_dispatch(routing.experts, router.shape[1])
    mode = resolve_mlp_mode(group_sizes_mode, use_async_d2h_group_sizes, None, groups=router.shape[1],
                            rows=x.shape[0] * top_k, w_fc1=w_fc1, w_fc2=w_fc2)
    handle = None
    if mode == "async" and early_copy:
        handle = copy_group_sizes(dispatch.group_sizes)
        # The barrier makes the permutation wait for the copy, so XLA cannot sink the copy down
        # to its first consumer: it is enqueued before the gather it should overlap.
        handle, x = jax.lax.optimization_barrier((handle, x))
    y_rows = grouped_mlp(
        x[dispatch.token_of_row],
        dispatch.group_sizes,
        w_fc1,
        w_fc2,
        norm_scale=norm_scale,
        norm=norm,
        activation=activation,
        group_sizes_mode=mode,
        host_group_sizes=handle,
    )
    return combine(y_rows, dispatch, routing.weights)
