"""MoE routing: router logits -> each token's top-k experts and weights, and the dispatch plan, the
stable sort of the T*k (token, choice) pairs by expert (group sizes, the row order, its inverse).

route() runs one CUDA kernel for all of it (csrc/cuda/moe_routing.cu) on the GPU where the kernel
applies (up to ROUTE_MAX_EXPERTS experts and ROUTE_MAX_CHOICES tokens x top_k: decode sizes), in
place of about ten XLA kernels, for either scoring; elsewhere, and as the kernel's reference, plain
JAX (route_reference, plan_dispatch). Both: softmax in float32; with n_group > 1, DeepSeek-V2's
group-limited top-k (keep the topk_group groups whose best expert scores highest, zero the rest);
jax.lax.top_k's order (larger first, the lower index on ties); the k weights renormalised to sum to
one when asked; then times `scaling`.

scoring="sigmoid" is DeepSeek-V3's router (transformers' DeepseekV3TopkRouter; Glm4MoeTopkRouter
is the same): scores sigmoid(logits); the experts are chosen by score + correction_bias (a learned
[E] load-balancing bias, DeepSeek's "noaux_tc"), with n_group > 1 among the topk_group groups whose
two best biased scores sum highest (two equal scores both count); the weights are the unbiased
scores of the chosen experts. The bias gets no gradient (a buffer the training updates by the
experts' load, not by backpropagation).

The order is stable: rows of one expert keep the (token, choice) order. The kernel computes exp
and the sums in its own order, so its weights may differ from the reference's in the last bits,
and a near-tie may go the other way. Gradients flow to the logits through the chosen experts'
weights, in both.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi, plan
from .manual_axes import vary_alike

ROUTE = "te_async_route"
KERNELS = ("auto", "te_async", "xla")


class Routing(NamedTuple):
    weights: jax.Array  # [T, k] float32
    experts: jax.Array  # [T, k] int32


class Dispatch(NamedTuple):
    group_sizes: jax.Array  # [E] int32: rows per expert, in expert order
    token_of_row: jax.Array  # [T*k] int32: which token each sorted row copies
    row_of_choice: jax.Array  # [T*k] int32: where each (token, choice), flat, landed among the rows
    choice_of_row: jax.Array  # [T*k] int32: the inverse, which flat (token, choice) each row holds


SCORINGS = ("softmax", "sigmoid")


def route_reference(logits: jax.Array, top_k: int, *, renormalize: bool, scaling: float = 1.0, n_group: int = 1,
                    topk_group: int = 1, scoring: str = "softmax", correction_bias=None) -> Routing:
    """The routing in plain JAX, logits [T, E] (any float dtype; computed in float32)."""
    logits = logits.astype(jnp.float32)
    scores = _scores(logits, scoring)
    if scoring == "softmax":
        choice, group_score, masked = scores, lambda g: g.max(axis=-1), 0.0
    else:
        choice = scores if correction_bias is None else scores + correction_bias.astype(jnp.float32)
        group_score, masked = lambda g: jax.lax.top_k(g, 2)[0].sum(axis=-1), -jnp.inf
    if n_group > 1:
        t, e = choice.shape
        _, groups = jax.lax.top_k(group_score(choice.reshape(t, n_group, e // n_group)), topk_group)
        kept = jnp.zeros((t, n_group), bool).at[jnp.arange(t)[:, None], groups].set(True)
        choice = jnp.where(jnp.repeat(kept, e // n_group, axis=1), choice, masked)
    _, experts = jax.lax.top_k(choice, top_k)
    return Routing(_chosen_weights(scores, experts, renormalize, scaling), experts.astype(jnp.int32))


def _scores(logits, scoring: str):
    return jax.nn.softmax(logits, axis=-1) if scoring == "softmax" else jax.nn.sigmoid(logits)


def _chosen_weights(scores, experts, renormalize: bool, scaling: float):
    """The chosen experts' scores, renormalised to sum to one when asked, times `scaling`."""
    weights = jnp.take_along_axis(scores, experts, axis=-1)
    if renormalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights * scaling


def plan_dispatch(experts: jax.Array, num_experts: int) -> Dispatch:
    """Sorts the T*k (token, choice) pairs by expert, stably, on the device (plain JAX)."""
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True).astype(jnp.int32)
    group_sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    row_of_choice = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=jnp.int32))
    return Dispatch(group_sizes, order // experts.shape[1], row_of_choice, order)


def dispatch_rows(x: jax.Array, dispatch: Dispatch) -> jax.Array:
    """x [T, H] -> its T*k rows in expert order (row r is x[token_of_row[r]]), the grouped GEMMs'
    input. Differentiable without a scatter: the gradient sums each token's k rows, gathered
    through row_of_choice, in float32 in choice order. JAX's own transpose of the gather is a
    scatter-add, which XLA's GPU backend runs with atomic adds in x's dtype: a bf16 gradient was
    rounded after every add, in an order that can change from run to run."""
    n = dispatch.row_of_choice.shape[0]
    if x.ndim != 2 or x.shape[0] == 0 or n % x.shape[0]:
        raise ValueError(f"dispatch_rows needs x [T, H] for a dispatch of T*k = {n} rows, got x {x.shape}")
    return _gather_rows(x.shape[0], *vary_alike(x, dispatch.token_of_row, dispatch.row_of_choice))


def _token_sums(tokens: int, rows: jax.Array, row_of_choice: jax.Array) -> jax.Array:
    """[T*k, H] rows -> [T, H]: each token's k rows summed in float32, in choice order."""
    return rows[row_of_choice].reshape(tokens, row_of_choice.shape[0] // tokens, -1).astype(jnp.float32).sum(axis=1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _gather_rows(tokens, x, token_of_row, row_of_choice):
    return x[token_of_row]


def _gather_rows_fwd(tokens, x, token_of_row, row_of_choice):
    return x[token_of_row], row_of_choice


def _gather_rows_bwd(tokens, row_of_choice, g):
    return _token_sums(tokens, g, row_of_choice).astype(g.dtype), None, None


_gather_rows.defvjp(_gather_rows_fwd, _gather_rows_bwd)


def sum_rows(rows: jax.Array, dispatch: Dispatch, tokens: int) -> jax.Array:
    """combine for rows that carry their router weights already (grouped_mlp's row_weights): each
    of `tokens` tokens' k rows summed in float32, in choice order, [T, H] float32. Its gradient is
    a gather of the tokens' gradients (dispatch_rows' forward) and keeps nothing but the order."""
    n = dispatch.row_of_choice.shape[0]
    if rows.ndim != 2 or rows.shape[0] != n or tokens <= 0 or n % tokens:
        raise ValueError(f"sum_rows needs rows [T*k, H] for a dispatch of T*k = {n} rows and T tokens, got rows "
                         f"{rows.shape} and T = {tokens}")
    return _sum_rows(tokens, rows.dtype, *vary_alike(rows, dispatch.token_of_row, dispatch.row_of_choice))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _sum_rows(tokens, dtype, rows, token_of_row, row_of_choice):
    return _token_sums(tokens, rows, row_of_choice)


def _sum_rows_fwd(tokens, dtype, rows, token_of_row, row_of_choice):
    return _token_sums(tokens, rows, row_of_choice), token_of_row


def _sum_rows_bwd(tokens, dtype, token_of_row, g):
    return g[token_of_row].astype(dtype), None, None


_sum_rows.defvjp(_sum_rows_fwd, _sum_rows_bwd)


def weights_by_row(weights: jax.Array, dispatch: Dispatch) -> jax.Array:
    """Router weights [T, k] -> [T*k] in row order (grouped_mlp's row_weights); its gradient
    gathers back through row_of_choice (JAX's transpose of the gather would be a scatter)."""
    if weights.ndim != 2 or weights.size != dispatch.choice_of_row.shape[0]:
        raise ValueError(f"weights_by_row needs weights [T, k] for a dispatch of T*k = "
                         f"{dispatch.choice_of_row.shape[0]} rows, got {weights.shape}")
    return _permute(weights.shape, *vary_alike(weights, dispatch.choice_of_row, dispatch.row_of_choice))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _permute(shape, weights, choice_of_row, row_of_choice):
    return weights.reshape(-1)[choice_of_row]


def _permute_fwd(shape, weights, choice_of_row, row_of_choice):
    return weights.reshape(-1)[choice_of_row], row_of_choice


def _permute_bwd(shape, row_of_choice, g):
    return g[row_of_choice].reshape(shape), None, None


_permute.defvjp(_permute_fwd, _permute_bwd)


def combine(y_rows: jax.Array, dispatch: Dispatch, weights: jax.Array) -> jax.Array:
    """Unpermutes the expert outputs and sums each token's k of them with its router weights, in
    float32. Its own gradient: the rows' is a gather through the inverse order (JAX's transpose
    of the unpermutation would scatter into zeros), and it keeps y_rows, not the float32 copy of
    the unpermuted rows that JAX's derivative of the weighted sum keeps (T*k*H*4 bytes a layer)."""
    n = dispatch.row_of_choice.shape[0]
    if weights.ndim != 2 or weights.size != n or y_rows.ndim != 2 or y_rows.shape[0] != n:
        raise ValueError(f"combine needs y_rows [T*k, H] and weights [T, k] for a dispatch of T*k = {n} rows, got "
                         f"y_rows {y_rows.shape} and weights {weights.shape}")
    return _combine(*vary_alike(y_rows, weights, dispatch.row_of_choice, dispatch.choice_of_row))


@jax.custom_vjp
def _combine(y_rows, weights, order, inverse):
    t, k = weights.shape
    y = y_rows[order].reshape(t, k, -1).astype(jnp.float32)
    return jnp.einsum("tkh,tk->th", y, weights).astype(y_rows.dtype)


def _combine_fwd(y_rows, weights, order, inverse):
    return _combine(y_rows, weights, order, inverse), (y_rows, weights, order, inverse)


def _combine_bwd(residuals, g):
    y_rows, weights, order, inverse = residuals
    t, k = weights.shape
    g = g.astype(jnp.float32)
    d_weights = jnp.einsum("tkh,th->tk", y_rows[order].reshape(t, k, -1).astype(jnp.float32), g)
    d_y = (g[:, None, :] * weights[:, :, None]).astype(y_rows.dtype).reshape(t * k, -1)
    return d_y[inverse], d_weights, None, None


_combine.defvjp(_combine_fwd, _combine_bwd)


def kernel_applies(tokens: int, num_experts: int, top_k: int, n_group: int = 1) -> bool:
    """Whether the CUDA kernel is built and takes these sizes (route() runs it where the call is
    lowered for a GPU)."""
    module = _ffi.cuda_module()
    return (module is not None and num_experts <= module.ROUTE_MAX_EXPERTS
            and tokens * top_k <= module.ROUTE_MAX_CHOICES and top_k <= 32 and n_group <= 32)


def _check(logits, top_k, n_group, topk_group, kernel, scoring, correction_bias):
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if logits.ndim != 2:
        raise ValueError(f"logits must be [T, E], got shape {logits.shape}")
    e = logits.shape[1]
    check_options(e, top_k, n_group, topk_group)
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    if correction_bias is not None and (scoring != "sigmoid" or jnp.shape(correction_bias) != (e,)):
        raise ValueError(f"correction_bias must be [E] = [{e}] with scoring='sigmoid', got shape "
                         f"{jnp.shape(correction_bias)} with scoring={scoring!r}")
    if scoring == "sigmoid" and n_group > 1 and e // n_group < 2:
        raise ValueError(f"scoring='sigmoid' ranks groups by their two best experts: n_group={n_group} leaves "
                         f"{e // n_group} expert per group")


def check_options(e: int, top_k: int, n_group: int, topk_group: int) -> None:
    """The routing options' errors for E experts (route(), te_async.token_moe)."""
    if not 1 <= top_k <= e:
        raise ValueError(f"top_k must be in [1, {e}] for {e} experts, got {top_k}")
    if n_group < 1 or e % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(f"n_group must divide the {e} experts and 1 <= topk_group <= n_group; got n_group={n_group}, "
                         f"topk_group={topk_group}")
    if n_group > 1 and topk_group * (e // n_group) < top_k:
        raise ValueError(f"topk_group={topk_group} groups of {e // n_group} experts hold fewer than top_k={top_k}")


def route(logits: jax.Array, top_k: int, *, renormalize: bool, scaling: float = 1.0, n_group: int = 1,
          topk_group: int = 1, scoring: str = "softmax", correction_bias=None, kernel: str = "auto") -> tuple:
    """logits [T, E] -> (Routing, Dispatch). kernel: "auto" (the CUDA kernel where the call is
    lowered for a GPU and the kernel takes the sizes, else plain JAX), "te_async"
    (the kernel; an error where it cannot run) or "xla" (plain JAX, the reference)."""
    _check(logits, top_k, n_group, topk_group, kernel, scoring, correction_bias)
    t, e = logits.shape
    logits = logits.astype(jnp.float32)
    if correction_bias is not None:
        correction_bias = jax.lax.stop_gradient(jnp.asarray(correction_bias, jnp.float32))
    opts = dict(renormalize=bool(renormalize), scaling=float(scaling), n_group=n_group, topk_group=topk_group)

    def reference(l):
        routing = route_reference(l, top_k, **opts, scoring=scoring, correction_bias=correction_bias)
        return routing, plan_dispatch(routing.experts, e)

    def with_kernel(l):
        return _route_kernel(l, correction_bias, top_k, **opts, scoring=scoring)

    applies = kernel_applies(t, e, top_k, n_group)
    if kernel == "xla" or (kernel == "auto" and not applies):
        return reference(logits)
    if kernel == "te_async":
        if not (applies and plan.on_gpu()):
            raise ValueError(f"kernel='te_async' needs a GPU and at most {_limits()} (got T={t}, E={e}, "
                             f"top_k={top_k}, n_group={n_group})")
        return with_kernel(logits)
    return jax.lax.platform_dependent(logits, cuda=with_kernel, default=reference)


def _route_kernel(logits, correction_bias, top_k, *, renormalize, scaling, n_group, topk_group, scoring):
    """correction_bias: float32 [E] without tangents, or None (the kernel takes [0])."""
    t, e = logits.shape
    n = t * top_k
    bias = jnp.zeros((0,), jnp.float32) if correction_bias is None else correction_bias
    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
    weights, experts, group_sizes, choice_of_row, row_of_choice = jax.ffi.ffi_call(
        ROUTE, (jax.ShapeDtypeStruct((t, top_k), jnp.float32), i32(t, top_k), i32(e), i32(n), i32(n)))(
            jax.lax.stop_gradient(logits), bias, top_k=top_k, n_group=n_group, topk_group=topk_group,
            renormalize=renormalize, scaling=np.float32(scaling), sigmoid=scoring == "sigmoid")
    weights = _differentiable_weights(logits, weights, experts, renormalize, scaling, scoring)
    return Routing(weights, experts), Dispatch(group_sizes, choice_of_row // top_k, row_of_choice, choice_of_row)


def _weights_of(logits, experts, renormalize: bool, scaling: float, scoring: str):
    """The chosen experts' weights as a function of the logits: the top-k choice is piecewise
    constant, so this is what gradients flow through (the reference's derivative too)."""
    return _chosen_weights(_scores(logits, scoring), experts, renormalize, scaling)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _differentiable_weights(logits, weights, experts, renormalize, scaling, scoring):
    """The kernel's weights, with _weights_of's gradient to the logits (the kernel itself only
    ever sees logits without tangents, so its integer outputs carry none)."""
    return weights


def _differentiable_weights_fwd(logits, weights, experts, renormalize, scaling, scoring):
    return weights, (logits, experts)


def _differentiable_weights_bwd(renormalize, scaling, scoring, residuals, cotangent):
    logits, experts = residuals
    d_logits = jax.vjp(lambda l: _weights_of(l, experts, renormalize, scaling, scoring), logits)[1](cotangent)[0]
    return d_logits, None, None


_differentiable_weights.defvjp(_differentiable_weights_fwd, _differentiable_weights_bwd)


def _limits() -> str:
    module = _ffi.cuda_module()
    if module is None:
        return "te_async's CUDA extension (not built)"
    return f"{module.ROUTE_MAX_EXPERTS} experts, {module.ROUTE_MAX_CHOICES} tokens x top_k, top_k and n_group <= 32"
