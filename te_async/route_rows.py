"""A decode MoE block's routing in one kernel, with the norm before it and the row gather after it:
x [T, H] -> (rows, Routing, Dispatch), rows [T*k, H] being norm(x) in the expert order that the
grouped GEMMs take (csrc/cuda/route_rows.cu, te_async_route_rows).

At a few tokens per step the plumbing around an MoE layer's expert GEMMs is a row of small kernels,
each a few µs of fixed latency: te_async.moe.moe_block at T = 8 ran XLA's two fusions of the norm,
XLA's router GEMM, te_async.routing's kernel and XLA's row gather before fc1. Here they are one
kernel, a thread-block cluster of 8 blocks (compute capability 9.0 and up), each block a slice of
H: its columns of the norm, its rows of the router GEMM, its columns of the gathered rows; the
first block routes. Up to ROUTE_ROWS_MAX_TOKENS tokens, T * E <= ROUTE_ROWS_MAX_LOGITS, softmax
scoring (the routing options of te_async.routing otherwise); applies() says where.

The arithmetic is the unfused path's: the norm in float32 rounded to x's dtype (Norm.round_first:
transformers' rounding or te_async.mlp.normalize's, as in te_async.token_moe), the router logits in
float32 from x or from the rounded norm(x) (Router.reads_normed), te_async.routing's top-k and
stable order. The kernel adds in its own order, so values may differ from the reference in the last
bits and a near-tie in the router may go the other way. Gradients: those of the reference for the
routing the kernel chose (a jax.custom_vjp; the integer outputs have none).
"""

import functools
import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi, plan
from .routing import Dispatch, Routing, _weights_of, dispatch_rows, kernel_applies, plan_dispatch, route_reference
from .token_moe import Norm, Router, held, normalized

ROUTE_ROWS = "te_async_route_rows"
DTYPES = ("bfloat16", "float16")
HIDDEN_STEP = 64  # csrc/cuda/route_rows.cu: 8 blocks of whole 16-byte vectors
MAX_HIDDEN = 4096


def applies(x: jax.Array, norm: Norm, router: Router) -> bool:
    """Whether route_rows runs the kernel for these operands (else callers keep their own path)."""
    module = _ffi.cuda_module()
    if module is None or not plan.on_gpu() or x.ndim != 2 or router.weight.ndim != 2:
        return False
    (t, h), e = x.shape, router.weight.shape[1]
    return (x.dtype.name in DTYPES and 1 <= t <= module.ROUTE_ROWS_MAX_TOKENS and h % HIDDEN_STEP == 0
            and h <= MAX_HIDDEN and router.weight.shape[0] == h and e % 8 == 0 and t * e <= module.ROUTE_ROWS_MAX_LOGITS
            and router.weight.dtype in (x.dtype, jnp.float32) and norm.scale.shape == (h,)
            and norm.scale.dtype in (x.dtype, jnp.float32) and kernel_applies(t, e, router.top_k, router.n_group)
            and all(cc >= 90 for cc, _ in plan.local_gpu_kinds()))


def route_rows(x: jax.Array, norm: Norm, router: Router) -> tuple:
    """x [T, H] -> (rows [T*k, H] in x's dtype, Routing, Dispatch), where rows[r] =
    norm(x)[dispatch.token_of_row[r]] and the routing is te_async.routing.route's of the logits
    norm(x) @ router (router.reads_normed) or x @ router. Call it where applies() holds."""
    if x.ndim != 2 or router.weight.ndim != 2 or router.weight.shape[0] != x.shape[1]:
        raise ValueError(f"need x [T, H] and the router [H, E], got {x.shape} and {router.weight.shape}")
    s = _static(norm, router)
    rows, weights, experts, group_sizes, choice_of_row, row_of_choice = _route_rows(x, norm.scale, router.weight, s)
    return rows, Routing(weights, experts), Dispatch(group_sizes, choice_of_row // router.top_k, row_of_choice,
                                                     choice_of_row)


def reference(x: jax.Array, norm: Norm, router: Router) -> tuple:
    """route_rows in plain JAX."""
    rows, weights, experts, dispatch = _reference(x, norm.scale, router.weight, _static(norm, router))
    return rows, Routing(weights, experts), dispatch


def _static(norm: Norm, router: Router) -> tuple:
    """The options without the arrays, hashable: the custom_vjp's static argument."""
    return (Norm(None, float(norm.eps), bool(norm.round_first)),
            Router(None, int(router.top_k), bool(router.renormalize), float(router.scaling), int(router.n_group),
                   int(router.topk_group), bool(router.reads_normed)))


def _logits(x, xn, weight, router: Router):
    return jnp.dot(held(xn if router.reads_normed else x, x.dtype), weight.astype(jnp.float32))


def _reference(x, scale, weight, s):
    norm, router = s
    xn = normalized(x, scale, norm.eps, norm.round_first)
    routing = route_reference(_logits(x, xn, weight, router), router.top_k, renormalize=router.renormalize,
                              scaling=router.scaling, n_group=router.n_group, topk_group=router.topk_group)
    dispatch = plan_dispatch(routing.experts, weight.shape[1])
    return dispatch_rows(xn, dispatch), routing.weights, routing.experts, dispatch


def _reference_flat(x, scale, weight, s):
    rows, weights, experts, d = _reference(x, scale, weight, s)
    return rows, weights, experts, d.group_sizes, d.choice_of_row, d.row_of_choice


def _kernel(x, scale, weight, s):
    norm, router = s
    (t, h), e, k = x.shape, weight.shape[1], router.top_k
    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
    out = (jax.ShapeDtypeStruct((t * k, h), x.dtype), jax.ShapeDtypeStruct((t, k), jnp.float32), i32(t, k), i32(e),
           i32(t * k), i32(t * k))
    return jax.ffi.ffi_call(ROUTE_ROWS, out)(
        x, scale, weight, top_k=k, n_group=router.n_group, topk_group=router.topk_group,
        renormalize=router.renormalize, scaling=np.float32(router.scaling), eps=np.float32(norm.eps),
        round_first=norm.round_first, router_reads_normed=router.reads_normed)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _route_rows(x, scale, weight, s):
    # The kernel where the call is lowered for a GPU; elsewhere the reference.
    return jax.lax.platform_dependent(x, scale, weight, cuda=functools.partial(_kernel, s=s),
                                      default=functools.partial(_reference_flat, s=s))


def _route_rows_fwd(x, scale, weight, s):
    out = _route_rows(x, scale, weight, s)
    return out, (x, scale, weight, out[2], Dispatch(out[3], out[4] // s[1].top_k, out[5], out[4]))


def _route_rows_bwd(s, residuals, cotangents):
    (norm, router), (x, scale, weight, experts, dispatch) = s, residuals

    def differentiable(x, scale, weight):  # rows and weights for the routing the forward chose
        xn = normalized(x, scale, norm.eps, norm.round_first)
        weights = _weights_of(_logits(x, xn, weight, router), experts, router.renormalize, router.scaling, "softmax")
        return dispatch_rows(xn, dispatch), weights

    return jax.vjp(differentiable, x, scale, weight)[1](cotangents[:2])


_route_rows.defvjp(_route_rows_fwd, _route_rows_bwd)
