"""The MoE block of a decoder layer: route, sort the tokens by expert, run the routed experts
(te_async.grouped_mlp with the router weights on its rows, or jax.lax.ragged_dot and combine for
comparison), sum each token's rows, add the shared experts.

moe_sublayer is the decoder's whole MoE sub-layer, x + moe_block(rms_norm(x)). experts="te_async"
in device mode with one token per step runs all of it as te_async.token_moe (the norm, the router,
the routing and the routed and shared experts in one call of three kernels, where it applies: 16-bit,
H <= 4096, up to 256 experts, no shared-expert gate, softmax scoring), else moe_block runs the
routed and the shared experts in one kernel (te_async.token_ffn), else the routed experts fused
with the permutation and the combine (te_async.decode_moe.fuses); "te_async_unfused" never fuses,
for comparison. Routing is otherwise te_async.routing.route (one CUDA kernel at decode sizes).

Async mode issues te_async.copy_group_sizes right after routing, then the work that does not need
the sizes (the shared experts and the token permutation), then the grouped GEMMs, whose launch
waits for the copy: the GPU runs the shared experts while the host waits. Two
jax.lax.optimization_barrier calls hold that order in the compiled program: one on (handle, x),
so that the shared experts and the permutation read an x that exists only once the copy is
issued; one on (shared experts' output, permuted rows), so that the grouped GEMMs read rows that
exist only once the shared experts are enqueued. The handle goes to grouped_mlp as host_group_sizes.

To check the order: in the GPU's scheduled HLO, `jax.jit(f).lower(...).compile().as_text()`,
each layer's custom call `te_async_copy_group_sizes` comes first, then the instructions whose
metadata op_name contains `shared_experts` and `routed_experts/gather`, then the
`te_async_grouped_gemm` calls; a GPU profile (jax.profiler.trace) shows the same order of the
copy's memcpy and the kernels. XLA's GPU pipeline removes the barriers only after scheduling;
its CPU pipeline removes them before, so on the CPU check the jaxpr instead (tests/test_models.py).
"""

from typing import Optional

import jax
import jax.numpy as jnp

from .. import decode_moe, token_ffn, token_moe
from ..group_sizes import copy_group_sizes
from ..mlp import activate, grouped_mlp, resolve_mlp_mode
from ..routing import combine, dispatch_rows, sum_rows, weights_by_row
from .ffn import swiglu_mlp
from .norm import rms_norm
from .routing import route, top_k_options

EXPERTS = ("te_async", "te_async_unfused", "ragged_dot")


def check_experts(experts: str, group_sizes_mode: Optional[str]) -> None:
    if experts not in EXPERTS:
        raise ValueError(f"experts must be one of {EXPERTS}, got {experts!r}")
    if experts == "ragged_dot" and group_sizes_mode is not None:
        raise ValueError(f"group_sizes_mode={group_sizes_mode!r} applies to experts='te_async', not 'ragged_dot'")


def _ragged_dot_experts(x: jax.Array, group_sizes: jax.Array, w_fc1: jax.Array, w_fc2: jax.Array) -> jax.Array:
    """grouped_mlp's math (swiglu, float32 accumulation, x's dtype between GEMMs) in plain JAX."""
    h = jax.lax.ragged_dot(x, w_fc1, group_sizes, preferred_element_type=jnp.float32).astype(x.dtype)
    a = activate(h, "swiglu")
    return jax.lax.ragged_dot(a, w_fc2, group_sizes, preferred_element_type=jnp.float32).astype(x.dtype)


def moe_block(p: dict, cfg, x: jax.Array, *, group_sizes_mode: Optional[str], experts: str,
              return_routing: bool = False):
    """x [..., H], the post-attention RMSNorm's output, -> the block's output, same shape; with
    return_routing, (output, the experts each token chose: int32 [tokens, top_k])."""
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    with jax.named_scope("router"):
        routing, dispatch = route(x, p, cfg)
    handle = mode = None
    if experts != "ragged_dot":
        mode = _mode(p, cfg, x.shape[0], group_sizes_mode)
        if mode == "async":
            handle = copy_group_sizes(dispatch.group_sizes)
            handle, x = jax.lax.optimization_barrier((handle, x))
    gate = None
    if cfg.shared_expert_gate:
        with jax.named_scope("shared_experts"):
            gate = jax.nn.sigmoid(jnp.dot(x, p["shared_gate"], preferred_element_type=jnp.float32))
    if experts == "te_async" and mode == "device":
        routed = token_ffn.Routed(routing.experts, routing.weights, p["w_fc1"], p["w_fc2"])
        shared_weights = token_ffn.Shared(p["shared"]["w_gate_up"], p["shared"]["w_down"], gate) if "shared" in p else None
        if token_ffn.applies(x, routed, shared_weights):
            with jax.named_scope("token_ffn"):
                y = token_ffn.token_ffn(x, routed, shared_weights)
            return _finish(y, None, shape, routing, return_routing)
    shared = None
    if cfg.shared_intermediate_size:
        with jax.named_scope("shared_experts"):
            shared = swiglu_mlp(p["shared"], x)
            if gate is not None:
                shared = (gate * shared.astype(jnp.float32)).astype(x.dtype)
    with jax.named_scope("routed_experts"):
        if experts == "te_async" and decode_moe.fuses(x.shape[0], cfg.num_experts_per_tok, p["w_fc1"], p["w_fc2"],
                                                      mode=mode, activation="swiglu"):
            y = decode_moe.fused_experts(x, routing, dispatch, p["w_fc1"], p["w_fc2"])
            return _finish(y, shared, shape, routing, return_routing)
        rows = dispatch_rows(x, dispatch)
        if handle is not None and shared is not None:
            shared, rows = jax.lax.optimization_barrier((shared, rows))
        if experts != "ragged_dot":
            y_rows = grouped_mlp(rows, dispatch.group_sizes, p["w_fc1"], p["w_fc2"], norm=None, activation="swiglu",
                                 group_sizes_mode=mode, host_group_sizes=handle,
                                 row_weights=weights_by_row(routing.weights, dispatch))
            y = sum_rows(y_rows, dispatch, x.shape[0]).astype(x.dtype)
        else:
            y = combine(_ragged_dot_experts(rows, dispatch.group_sizes, p["w_fc1"], p["w_fc2"]), dispatch,
                        routing.weights)
    return _finish(y, shared, shape, routing, return_routing)


def _mode(p: dict, cfg, tokens: int, group_sizes_mode: Optional[str]) -> str:
    """The routed experts' group-sizes mode for a call on `tokens` tokens."""
    return resolve_mlp_mode(group_sizes_mode, False, None, groups=cfg.num_experts,
                            rows=tokens * cfg.num_experts_per_tok, w_fc1=p["w_fc1"], w_fc2=p["w_fc2"])


def moe_sublayer(p: dict, norm_weight: jax.Array, cfg, x: jax.Array, *, group_sizes_mode: Optional[str],
                 experts: str, return_routing: bool = False):
    """x [..., H], the residual stream, -> x + moe_block(rms_norm(x)), and with return_routing the
    experts each token chose. In device mode at one token, without a shared-expert gate and with
    softmax scoring, the whole sub-layer is te_async.token_moe (one call of three kernels) where it
    applies."""
    tokens = x.reshape(-1, x.shape[-1])
    fusable = not cfg.shared_expert_gate and cfg.scoring_func == "softmax"
    if experts == "te_async" and fusable and tokens.shape[0] == 1:
        mode = _mode(p, cfg, 1, group_sizes_mode)
        norm = token_moe.Norm(norm_weight, cfg.rms_norm_eps, round_first=True)
        router = token_moe.Router(p["router"], cfg.num_experts_per_tok, **top_k_options(cfg))
        shared = token_ffn.Shared(p["shared"]["w_gate_up"], p["shared"]["w_down"]) if "shared" in p else None
        if mode == "device" and token_moe.applies(tokens, norm, router, p["w_fc1"], p["w_fc2"], shared):
            with jax.named_scope("token_moe"):
                y, routing = token_moe.token_moe(tokens, norm, router, p["w_fc1"], p["w_fc2"], shared, residual=True)
            return (y.reshape(x.shape), routing.experts) if return_routing else y.reshape(x.shape)
    out = moe_block(p, cfg, rms_norm(x, norm_weight, cfg.rms_norm_eps), group_sizes_mode=group_sizes_mode,
                    experts=experts, return_routing=return_routing)
    return (x + out[0], out[1]) if return_routing else x + out


def _finish(y, shared, shape, routing, return_routing):
    if shared is not None:
        y = y + shared
    return (y.reshape(shape), routing.experts) if return_routing else y.reshape(shape)
