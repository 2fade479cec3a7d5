"""One token's MoE block in one call: moe(rmsnorm(x)), routing included, optionally plus the
residual x (csrc/cuda/token_ffn.cu, te_async_token_moe).

At decode batch 1 an MoE layer's plumbing costs as much as its experts: the norm, the router
GEMM, the routing kernel, the experts' kernel, the sum over its blocks and the residual add were
seven kernels, each a few µs of fixed latency. Here the norm, the router GEMM and the top-k are
one kernel (a thread-block cluster of 8 blocks, each a slice of the router's rows), and
te_async.token_ffn's kernel is launched behind it as a programmatic dependent launch (compute
capability 9.0 and up): it normalises x itself and runs the shared experts' blocks while the
routing runs, the routed blocks once it is done; token_ffn's second kernel sums the blocks'
partials and adds the residual. All three are one FFI call. Expert ids and weights stay on the
GPU, so a step stays one CUDA graph.

The arithmetic is the unfused path's: the norm in float32 (Norm.round_first says which rounding,
transformers' or te_async.mlp.normalize's), the router logits in float32 from the normalised x as
rounded to x's dtype, the routing of te_async.routing (softmax, group-limited top-k,
renormalisation, scaling), token_ffn's experts, the sum rounded to x's dtype, then x + y. The
kernels add in their own orders, so values may differ from the reference in the last bits and a
near-tie in the router may go the other way. Gradients, if asked for, are those of _reference (a
jax.custom_vjp): decode needs none.
"""

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from . import token_ffn
from .mlp import normalize
from .routing import Routing, check_options, kernel_applies, route_reference

TOKEN_MOE = "te_async_token_moe"


class Norm(NamedTuple):
    """The RMSNorm before the router and the experts."""
    scale: jax.Array  # [H], x's dtype or float32
    eps: float
    # True: transformers' RMSNorm (round the normalised x to x's dtype, then times the scale in
    # x's dtype); False: te_async.mlp.normalize (times the scale in float32, rounded once).
    round_first: bool


class Router(NamedTuple):
    weight: jax.Array  # [H, E], x's dtype or float32
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
    routed = token_ffn.Routed(None, None, w_fc1, w_fc2)  # applies() reads the weights alone
    e = router.weight.shape[-1]
    return (token_ffn.applies(x, routed, shared) and (shared is None or shared.scale is None)
            and router.weight.dtype in (x.dtype, jnp.float32) and router.weight.shape == (x.shape[1], e)
            and e % token_ffn.VEC == 0
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
    if norm.scale.shape != (x.shape[1],):
        raise ValueError(f"the norm scale must be [H] for H = {x.shape[1]}, got {norm.scale.shape}")
    if router.weight.ndim != 2 or router.weight.shape[0] != x.shape[1]:
        raise ValueError(f"the router must be [H, E] for H = {x.shape[1]}, got {router.weight.shape}")
    check_options(router.weight.shape[1], router.top_k, router.n_group, router.topk_group)
    static = _Static(float(norm.eps), bool(norm.round_first), int(router.top_k), bool(router.renormalize),
                     float(router.scaling), int(router.n_group), int(router.topk_group), bool(router.reads_normed),
                     bool(residual))
    y, weights, experts = _token_moe(x, norm.scale, router.weight, w_fc1, w_fc2, shared, static)
    return y, Routing(weights, experts)


def _normalize(x, scale, s: _Static):
    if s.round_first:  # transformers' RMSNorm (te_async.models.norm), each rounding held
        xf = x.astype(jnp.float32)
        y = _held(xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + s.eps), x.dtype)
        return (_held(scale, x.dtype) * y).astype(x.dtype)
    return normalize(x, scale, None, "rmsnorm", s.eps)


def _reference(x, scale, router, w_fc1, w_fc2, shared, s: _Static):
    xn = _normalize(x, scale, s)
    logits = jnp.dot(_held(xn if s.reads_normed else x, x.dtype), router.astype(jnp.float32))
    routing = route_reference(logits, s.top_k, renormalize=s.renormalize, scaling=s.scaling, n_group=s.n_group,
                              topk_group=s.topk_group)
    y = token_ffn.reference(xn, token_ffn.Routed(routing.experts, routing.weights, w_fc1, w_fc2), shared)
    return _finish(x, y, s.residual), routing.weights, routing.experts


def _finish(x, y, residual: bool):
    """The block's output y rounded to x's dtype, plus x where residual (rounded again, as x + y
    in x's dtype is)."""
    y = _held(y, x.dtype)
    return (x.astype(jnp.float32) + y if residual else y).astype(x.dtype)


def _held(a, dtype):
    """a's values as float32, rounded to dtype even where XLA kept a float32 value it computed in
    a dtype value's place (xla_allow_excess_precision, which would drop a rounding between two
    float32 operations): the kernels compute with the rounded values, as the model's arithmetic
    says."""
    info = jnp.finfo(dtype)
    return jax.lax.reduce_precision(a.astype(jnp.float32), info.nexp, info.nmant)


def _kernel(x, scale, router, w_fc1, w_fc2, shared, s: _Static):
    h = x.shape[1]
    w_gate_up, w_down = ((jnp.zeros((h, 0), x.dtype), jnp.zeros((0, h), x.dtype)) if shared is None
                         else (shared.w_gate_up, shared.w_down))
    attrs, out = token_ffn.plan_call(x, s.top_k, w_fc2.shape[1], w_down.shape[0])
    routing = (jax.ShapeDtypeStruct((1, s.top_k), jnp.float32), jax.ShapeDtypeStruct((1, s.top_k), jnp.int32))
    y, _, weights, experts = jax.ffi.ffi_call(TOKEN_MOE, out + routing)(
        x, scale, router, w_fc1, w_fc2, w_gate_up, w_down, **attrs, top_k=s.top_k, n_group=s.n_group,
        topk_group=s.topk_group, renormalize=s.renormalize, scaling=np.float32(s.scaling), eps=np.float32(s.eps),
        round_first=s.round_first, router_reads_normed=s.reads_normed, residual=s.residual)
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
