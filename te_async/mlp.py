"""grouped_mlp: a GroupedLayerNormMLP as one jax.custom_vjp, so users never handle the
group-sizes copy themselves (the reviewer's request in TE PR #2213).

y = fc2(act(fc1(norm(x)))) per group of rows, with grouped_gemm for fc1 and fc2.

Device mode (the default at decode sizes): 0 copies and 0 host waits, forward and backward; the
six GEMMs read group_sizes on the GPU, so the whole layer can live in one CUDA graph.

Copies and host waits per layer in async mode:
  forward:  1 copy_group_sizes (0 when the caller passes host_group_sizes), 2 GEMMs that each
            wait on that copy's event; 0 stream synchronisations.
  backward: 0 copies where the forward's pinned slot still holds its copy (keep_group_sizes
            makes the handle a residual, reuse_group_sizes finds it by its address or, under
            lax.scan, by the layers' order; host_size_stats()["reused"]), else 1 fresh copy
            (["reuse_misses"]: the slot was recycled, or the backward runs in another
            execution); 4 GEMMs (dgrad and wgrad of fc2 and fc1) that wait on that event; 0
            stream synchronisations.
Sync mode instead does 2 (forward) and 4 (backward) D2H copies, each with a
cudaStreamSynchronize. Under jax.checkpoint the forward runs again in the backward pass, with
its own copy, which the backward then reuses.

Residuals: x, the weights, the norm parameters, group_sizes, the async handle and the fc1
output h [M, F1]; h is saved because recomputing it would cost a grouped GEMM. With row_weights
(an MoE block's router weights in row order) the output is w * y and the weights' gradient is
computed from what the backward has anyway, sum(dy @ W2^T * act) per row, so y itself is kept by
nobody: te_async.moe's combine kept it for that gradient ([M, H] a layer, 100 MB at
DeepSeek-V2-Lite's 24576 rows). The norm output
and the activation are recomputed in the backward, which saves 169 MB a layer at
DeepSeek-V2-Lite's shapes and 24576 rows, and costs no time that we could measure: keeping them
instead (as TransformerEngine's LayerNormMLP does) changed the device-mode layer by -19 us of
2589 us GPU busy in one jit, where XLA merges the recomputation with the forward's own passes,
by +0.05 ms of 5.2 ms per layer under lax.scan, and by less than 1.5 %, either sign, per layer of
a 4-layer unrolled step (H200, 2026-12-02, docs/investigations.md).
"""

import functools
import logging
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from . import plan
from .gemm import grouped_gemm, outside_slice_fusion, vjp_shapes
from .group_sizes import (HostGroupSizes, async_handle, check_group_sizes, keep_group_sizes, resolve_group_sizes_mode,
                          reuse_group_sizes)
from .manual_axes import vary_alike
from .sharding import check_unsharded

logger = logging.getLogger("te_async")

NORMS = ("rmsnorm", "layernorm", None)
EPS = 1e-6  # grouped_mlp's default norm epsilon, which te_async.moe.moe_block uses
_gelu_tanh = functools.partial(jax.nn.gelu, approximate=True)
GATED_ACTIVATIONS = {"swiglu": jax.nn.silu, "geglu": _gelu_tanh}
PLAIN_ACTIVATIONS = {"silu": jax.nn.silu, "gelu": _gelu_tanh, "relu": jax.nn.relu}
ACTIVATIONS = tuple(GATED_ACTIVATIONS) + tuple(PLAIN_ACTIVATIONS)


class _Config(NamedTuple):
    norm: Optional[str]
    eps: float
    activation: str
    mode: str


def normalize(x, scale, bias, norm: Optional[str], eps: float):
    """RMSNorm or LayerNorm in float32, cast back to x.dtype."""
    if norm is None:
        return x
    xf = x.astype(jnp.float32)
    if norm == "layernorm":
        xf = xf - jnp.mean(xf, axis=-1, keepdims=True)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if scale is not None:
        y = y * scale.astype(jnp.float32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(x.dtype)


def activate(h, activation: str):
    """Gated activations split h as [gate | linear]: act(gate) * linear."""
    hf = h.astype(jnp.float32)
    if activation in GATED_ACTIVATIONS:
        gate, linear = jnp.split(hf, 2, axis=-1)
        return (GATED_ACTIVATIONS[activation](gate) * linear).astype(h.dtype)
    return PLAIN_ACTIVATIONS[activation](hf).astype(h.dtype)


def _check(x, group_sizes, w_fc1, w_fc2, norm_scale, norm_bias, norm, activation, row_weights):
    check_group_sizes(group_sizes)
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if x.ndim != 2 or w_fc1.ndim != 3 or w_fc2.ndim != 3:
        raise ValueError(f"need x [M,H], w_fc1 [G,H,F1], w_fc2 [G,F,H]; got {x.shape}, {w_fc1.shape}, {w_fc2.shape}")
    if not x.dtype == w_fc1.dtype == w_fc2.dtype:
        raise TypeError(f"x, w_fc1 and w_fc2 must share a dtype, got {x.dtype}, {w_fc1.dtype}, {w_fc2.dtype}")
    g, h = group_sizes.shape[0], x.shape[1]
    if w_fc1.shape[0] != g or w_fc2.shape[0] != g:
        raise ValueError(f"group counts differ: group_sizes {g}, w_fc1 {w_fc1.shape[0]}, w_fc2 {w_fc2.shape[0]}")
    if w_fc1.shape[1] != h or w_fc2.shape[2] != h:
        raise ValueError(f"hidden size {h} of x does not match w_fc1 {w_fc1.shape} / w_fc2 {w_fc2.shape}")
    f = w_fc2.shape[1]
    want = 2 * f if activation in GATED_ACTIVATIONS else f
    if w_fc1.shape[2] != want:
        kind = "gated" if activation in GATED_ACTIVATIONS else "plain"
        raise ValueError(f"{activation} is {kind}: w_fc1 must be [G,{h},{want}] for w_fc2 [G,{f},{h}], got {w_fc1.shape}")
    for name, p in (("norm_scale", norm_scale), ("norm_bias", norm_bias)):
        if p is None:
            continue
        if norm is None:
            raise ValueError(f"{name} given but norm is None")
        if p.shape != (h,):
            raise ValueError(f"{name} must be [{h}], got {p.shape}")
    if norm_bias is not None and norm == "rmsnorm":
        raise ValueError("rmsnorm takes no norm_bias")
    if row_weights is not None and (row_weights.shape != x.shape[:1] or not jnp.issubdtype(row_weights.dtype, jnp.floating)):
        raise ValueError(f"row_weights must be floating [{x.shape[0]}] (one weight a row of x), got "
                         f"{row_weights.dtype} {row_weights.shape}")


def gemm_shapes(groups: int, rows: int, hidden: int, fc1_n: int, ffn: int, dtype) -> tuple:
    """The six GEMMs of a layer, forward (fc1, fc2), dgrad (fc2, fc1) and wgrad (fc2, fc1): the
    default mode must suit all of them, not fc1's forward alone."""
    return vjp_shapes(groups, rows, hidden, fc1_n, dtype) + vjp_shapes(groups, rows, ffn, hidden, dtype)


def resolve_mlp_mode(group_sizes_mode, use_async_d2h_group_sizes, host_group_sizes, *, groups: int, rows: int,
                     w_fc1, w_fc2) -> str:
    """The group-sizes mode of a grouped_mlp call (or of an MoE block around one); see grouped_mlp."""
    shapes = lambda: gemm_shapes(groups, rows, w_fc1.shape[1], w_fc1.shape[2], w_fc2.shape[1], w_fc1.dtype)
    return resolve_group_sizes_mode(group_sizes_mode, use_async_d2h_group_sizes, host_group_sizes,
                                    lambda: plan.device_mode_is_fast(shapes()))


def _gemm(cfg: _Config, handle, lhs, rhs, group_sizes, **kw):
    return grouped_gemm(lhs, rhs, group_sizes, group_sizes_mode=cfg.mode, host_group_sizes=handle, **kw)


def _scaled(row_weights, rows, dtype):
    return (row_weights[:, None] * rows.astype(jnp.float32)).astype(dtype)


def _fwd(cfg: _Config, x, group_sizes, w_fc1, w_fc2, norm_scale, norm_bias, row_weights, handle):
    handle = async_handle(group_sizes, cfg.mode, handle)
    xn = normalize(x, norm_scale, norm_bias, cfg.norm, cfg.eps)
    h = outside_slice_fusion(_gemm(cfg, handle, xn, w_fc1, group_sizes))  # a residual: see outside_slice_fusion
    # Without row_weights, te_async.routing.combine keeps y: a residual too.
    y = outside_slice_fusion(_gemm(cfg, handle, activate(h, cfg.activation), w_fc2, group_sizes))
    y = y if row_weights is None else _scaled(row_weights, y, jnp.float32)
    return y, (x, group_sizes, w_fc1, w_fc2, norm_scale, norm_bias, row_weights, h, keep_group_sizes(handle, x))


def _bwd(cfg: _Config, residuals, dy):
    """With row_weights, dy is the unscaled cotangent of w * y: fc2's dgrad runs on it, its product
    with the activation gives the weights' gradient, and the weights scale the dgrad's output and
    the activation that fc2's wgrad reads (a^T (w dy) = (w a)^T dy), so no extra [M, H] operand."""
    x, group_sizes, w_fc1, w_fc2, norm_scale, norm_bias, row_weights, h, forward_handle = residuals
    handle = reuse_group_sizes(forward_handle) if cfg.mode == "async" else None
    gemm = functools.partial(_gemm, cfg, handle)
    xn, norm_vjp = jax.vjp(lambda x_, s_, b_: normalize(x_, s_, b_, cfg.norm, cfg.eps), x, norm_scale, norm_bias)
    a, act_vjp = jax.vjp(lambda h_: activate(h_, cfg.activation), h)
    dy = dy.astype(x.dtype)
    da = gemm(dy, w_fc2, group_sizes, transpose_rhs=True)
    d_row_weights = None
    if row_weights is not None:
        d_row_weights = jnp.sum(da.astype(jnp.float32) * a.astype(jnp.float32), axis=1).astype(row_weights.dtype)
        da, a = _scaled(row_weights, da, x.dtype), _scaled(row_weights, a, x.dtype)
    dw_fc2 = gemm(a, dy, group_sizes, ragged="k")
    (dh,) = act_vjp(da)
    dxn = gemm(dh, w_fc1, group_sizes, transpose_rhs=True)
    dw_fc1 = gemm(xn, dh, group_sizes, ragged="k")
    dx, dscale, dbias = norm_vjp(dxn)
    return dx, None, dw_fc1, dw_fc2, dscale, dbias, d_row_weights, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _grouped_mlp(cfg, x, group_sizes, w_fc1, w_fc2, norm_scale, norm_bias, row_weights, handle):
    return _fwd(cfg, x, group_sizes, w_fc1, w_fc2, norm_scale, norm_bias, row_weights, handle)[0]


_grouped_mlp.defvjp(_fwd, _bwd)


def grouped_mlp(
    x: jax.Array,
    group_sizes: jax.Array,
    w_fc1: jax.Array,
    w_fc2: jax.Array,
    *,
    norm_scale: Optional[jax.Array] = None,
    norm_bias: Optional[jax.Array] = None,
    norm: Optional[str] = "rmsnorm",
    eps: float = EPS,
    activation: str = "swiglu",
    group_sizes_mode: Optional[str] = None,
    use_async_d2h_group_sizes: bool = False,
    host_group_sizes: Optional[HostGroupSizes] = None,
    row_weights: Optional[jax.Array] = None,
) -> jax.Array:
    """GroupedLayerNormMLP: y[rows_g] = fc2_g(act(fc1_g(norm(x[rows_g])))), differentiable.

    x [M,H]; w_fc1 [G,H,2F] for gated activations (swiglu, geglu: [gate | linear]) or [G,H,F]
    (silu, gelu, relu); w_fc2 [G,F,H]. Rows past sum(group_sizes) give zeros. Gradients flow to
    x, norm_scale, norm_bias, w_fc1 and w_fc2. Pass `host_group_sizes` made by copy_group_sizes
    right after routing to start the copy before the token permutation (async mode).

    group_sizes_mode: None means "device" where it has a fast kernel for all six GEMMs of the layer
    (forward, dgrad and wgrad; on the GPU at decode sizes, M <= 512 rows, and on Hopper with the
    CUTLASS kernels built whenever the dimensions are multiples of 8; always on the CPU) unless
    `use_async_d2h_group_sizes` or `host_group_sizes` asks for "async", which is also the default
    elsewhere; see grouped_gemm for the modes and for bad sizes. The mode that runs is
    logged at debug level on the "te_async" logger.

    row_weights [M] (an MoE block's router weights, one a row): the result is float32 row_weights[:,
    None] * y, differentiable in row_weights too, and y is not kept for the backward (module
    docstring); sum each token's rows with te_async.routing.sum_rows.
    """
    x, group_sizes = jnp.asarray(x), jnp.asarray(group_sizes)
    row_weights = None if row_weights is None else jnp.asarray(row_weights)
    _check(x, group_sizes, w_fc1, w_fc2, norm_scale, norm_bias, norm, activation, row_weights)
    check_unsharded("te_async.grouped_mlp", x=x, group_sizes=group_sizes, w_fc1=w_fc1, w_fc2=w_fc2)
    mode = resolve_mlp_mode(group_sizes_mode, use_async_d2h_group_sizes, host_group_sizes, groups=group_sizes.shape[0],
                            rows=x.shape[0], w_fc1=w_fc1, w_fc2=w_fc2)
    logger.debug("grouped_mlp: group_sizes_mode=%s G=%d M=%d", mode, group_sizes.shape[0], x.shape[0])
    cfg = _Config(norm, float(eps), activation, mode)
    x, w_fc1, w_fc2, norm_scale, norm_bias, row_weights = vary_alike(x, w_fc1, w_fc2, norm_scale, norm_bias,
                                                                     row_weights)  # gradients typed as operands
    return _grouped_mlp(cfg, x, group_sizes, w_fc1, w_fc2, norm_scale, norm_bias, row_weights, host_group_sizes)
