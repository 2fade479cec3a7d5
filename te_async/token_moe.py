"""One token's whole MoE sub-layer in one call: x + moe(rmsnorm(x)), routing included
(csrc/cuda/token_ffn.cu, te_async_token_moe).

At decode batch 1 an MoE layer's plumbing costs as much as its experts: the norm, the router
GEMM, the routing kernel, the experts' kernel, the sum over its blocks and the residual add were
six kernels or more, each a few µs of fixed latency. Here they are two kernels in one FFI call:
a one-block kernel normalises x, runs the router GEMM and picks the top-k; te_async.token_ffn's
kernel, launched behind it as a programmatic dependent launch (compute capability 9.0 and up),
normalises x itself, runs the shared experts' blocks while the routing runs, the routed blocks
once it is done, and sums its blocks' partials (deterministically, in a fixed order) and adds
the residual inside the kernel. Expert ids and weights stay on the GPU, so a step stays one CUDA
graph.

The arithmetic is the unfused path's: the norm in float32 (Norm.round_first says which rounding,
transformers' or te_async.mlp.normalize's), the router logits in float32, the routing of
te_async.routing (softmax, group-limited top-k, renormalisation, scaling), token_ffn's experts,
the sum rounded to x's dtype, then x + y rounded again. The kernels add in their own orders, so
values may differ from the reference in the last bits and a near-tie in the router may go the
other way. Gradients, if asked for, are those of _reference (a jax.custom_vjp): decode needs none.
"""

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from . import token_ffn
from .mlp import normalize
from .routing import Routing, kernel_applies, route_reference

TOKEN_MOE = "te_async_token_moe"


class Norm(NamedTuple):
    """The RMSNorm before the router and the experts."""
    scale: jax.Array  # [H], x's dtype or float32
    eps: float
    # True: transformers' RMSNorm (round the normalised x to x's dtype, then times the scale in
    # x's dtype); False: te_async.mlp.normalize (times the scale in float32, rounded once).
    round_first: bool


class Router(NamedTuple):
    weight: jax.Array  # [H, E], x's dtype
    top_k: int
    renormalize: bool
    scaling: float = 1.0
    n_group: int = 1  # DeepSeek's group-limited top-k where > 1
    topk_group: int = 1
    reads_normed: bool = True  # the router reads norm(x) (the models), else x (te_async.moe.moe_block)


class _Static(NamedTuple):
    eps: float
    round_first: bool
    top_k: int
    renormalize: bool
    scaling: float
    n_group: int
    topk_group: int
    reads_normed: bool
    residual: bool


def applies(x: jax.Array, norm: Norm, router: Router, w_fc1: jax.Array, w_fc2: jax.Array,
            shared: Optional[token_ffn.Shared] = None) -> bool:
    """Whether token_moe runs the kernels for these operands (else callers keep their own path)."""
    routed = token_ffn.Routed(jnp.zeros((1, router.top_k), jnp.int32), jnp.zeros((1, router.top_k)), w_fc1, w_fc2)
    e = router.weight.shape[-1]
    return (token_ffn.applies(x, routed, shared) and (shared is None or shared.scale is None)
            and router.weight.dtype == x.dtype and router.weight.shape == (x.shape[1], e) and e % token_ffn.VEC == 0
            and kernel_applies(1, e, router.top_k, router.n_group) and norm.scale.shape == (x.shape[1],)
            and norm.scale.dtype in (x.dtype, jnp.float32))


def token_moe(x: jax.Array, norm: Norm, router: Router, w_fc1: jax.Array, w_fc2: jax.Array,
              shared: Optional[token_ffn.Shared] = None, *, residual: bool = False) -> tuple:
    """x [1, H] -> (y [1, H] in x's dtype, Routing of the token), where with xn = norm(x)
    y = (x if residual else 0) + sum_c weights[c] * expert_{experts[c]}(xn) + shared(xn), the
    experts and weights routed from xn (router.reads_normed) or x. Call it where applies() holds."""
    if x.ndim != 2 or x.shape[0] != 1:
        raise ValueError(f"x must be [1, H] (one token), got {x.shape}")
    if shared is not None and shared.scale is not None:
        raise ValueError("token_moe takes shared experts without a gate (Shared.scale must be None)")
    static = _Static(float(norm.eps), bool(norm.round_first), int(router.top_k), bool(router.renormalize),
                     float(router.scaling), int(router.n_group), int(router.topk_group), bool(router.reads_normed),
                     bool(residual))
    y, weights, experts = _token_moe(x, norm.scale, router.weight, w_fc1, w_fc2, shared, static)
    return y, Routing(weights, experts)


def _normalize(x, scale, s: _Static):
    if s.round_first:  # transformers' RMSNorm (te_async.models.norm)
        xf = x.astype(jnp.float32)
        y = (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + s.eps)).astype(x.dtype)
        return scale.astype(x.dtype) * y
    return normalize(x, scale, None, "rmsnorm", s.eps)


def _reference(x, scale, router, w_fc1, w_fc2, shared, s: _Static):
    xn = _normalize(x, scale, s)
    logits = jnp.dot(_held(xn if s.reads_normed else x).astype(jnp.float32), router.astype(jnp.float32))
    routing = route_reference(logits, s.top_k, renormalize=s.renormalize, scaling=s.scaling, n_group=s.n_group,
                              topk_group=s.topk_group)
    y = token_ffn.reference(xn, token_ffn.Routed(routing.experts, routing.weights, w_fc1, w_fc2), shared)
    return (x + _held(y) if s.residual else y), routing.weights, routing.experts


def _held(a):
    """a, rounded to its dtype where XLA would otherwise keep a float32 value it computed in its
    place (xla_allow_excess_precision): the kernels read the rounded values, as the unfused
    model's arithmetic says."""
    info = jnp.finfo(a.dtype)
    return jax.lax.reduce_precision(a, info.nexp, info.nmant)


def _kernel(x, scale, router, w_fc1, w_fc2, shared, s: _Static):
    h = x.shape[1]
    w_gate_up, w_down = ((jnp.zeros((h, 0), x.dtype), jnp.zeros((0, h), x.dtype)) if shared is None
                         else (shared.w_gate_up, shared.w_down))
    units, workspace, group_items = token_ffn.plan_call(x, s.top_k, w_fc2.shape[1], w_down.shape[0])
    out = (jax.ShapeDtypeStruct((1, h), x.dtype), jax.ShapeDtypeStruct((1, s.top_k), jnp.float32),
           jax.ShapeDtypeStruct((1, s.top_k), jnp.int32))
    # With the residual, y takes x's buffer (x + y in place, as a decoder's residual stream is
    # updated; XLA copies x first where it is still needed): every read of x precedes the one write
    # of y, by the last block of the second kernel.
    aliases = {0: 0} if s.residual else {}
    y, weights, experts, _, _ = jax.ffi.ffi_call(TOKEN_MOE, out + workspace, input_output_aliases=aliases)(
        x, scale, router, w_fc1, w_fc2, w_gate_up, w_down, units=units, group_items=group_items, top_k=s.top_k,
        n_group=s.n_group, topk_group=s.topk_group, renormalize=s.renormalize, scaling=np.float32(s.scaling),
        eps=np.float32(s.eps), round_first=s.round_first, router_reads_normed=s.reads_normed, residual=s.residual)
    return y, weights, experts


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _token_moe(x, scale, router, w_fc1, w_fc2, shared, s):
    # The kernels where the call is lowered for a GPU; elsewhere the reference.
    return jax.lax.platform_dependent(x, scale, router, w_fc1, w_fc2, shared, cuda=functools.partial(_kernel, s=s),
                                      default=functools.partial(_reference, s=s))


def _token_moe_fwd(x, scale, router, w_fc1, w_fc2, shared, s):
    return _token_moe(x, scale, router, w_fc1, w_fc2, shared, s), (x, scale, router, w_fc1, w_fc2, shared)


def _token_moe_bwd(s, args, cotangents):
    dy, d_weights, _ = cotangents
    value = lambda *a: _reference(*a, s)[:2]
    return jax.vjp(value, *args)[1]((dy, d_weights))


_token_moe.defvjp(_token_moe_fwd, _token_moe_bwd)
