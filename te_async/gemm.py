"""grouped_gemm: shape checks, group-sizes mode dispatch, the FFI call, and its VJP.

The handlers are in csrc/: csrc/cpu/grouped_gemm_cpu.cc on the CPU; on CUDA,
csrc/cuda/grouped_gemm_cublas.cc for the host-sized modes (one cuBLAS GEMM per non-empty group
over side streams; in async mode one grouped cuBLAS call where the groups are small) and
csrc/cuda/grouped_gemm_device.cc for device mode, whose plan (kernel, CUTLASS config, workspace)
te_async/plan.py makes here, at trace time.
"""

import functools
import logging
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from . import _ffi, plan
from .manual_axes import vary_alike
from .sharding import require_replicated
from .group_sizes import (HostGroupSizes, async_handle, check_group_sizes, host_sizes_operand, keep_group_sizes,
                          resolve_group_sizes_mode, reuse_group_sizes)

GEMM_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)
logger = logging.getLogger("te_async")
OPERANDS = ("lhs", "rhs", "group_sizes")  # names for the sharded-operand error


def grouped_gemm_output(lhs, rhs, group_sizes, *, ragged="m", transpose_rhs=False, preferred_element_type=None):
    """The output ShapeDtypeStruct, or a ValueError/TypeError naming what does not fit."""
    check_group_sizes(group_sizes)
    if ragged not in ("m", "k"):
        raise ValueError(f"ragged must be 'm' or 'k', got {ragged!r}")
    if lhs.dtype != rhs.dtype or lhs.dtype not in GEMM_DTYPES:
        raise TypeError(f"lhs and rhs must share one dtype of bf16/f16/f32, got {lhs.dtype} and {rhs.dtype}")
    out_dtype = jnp.dtype(preferred_element_type or lhs.dtype)
    if out_dtype not in (lhs.dtype, jnp.float32):
        raise TypeError(f"preferred_element_type must be {lhs.dtype} or float32, got {out_dtype}")
    if lhs.ndim != 2:
        raise ValueError(f"lhs must be [M, K], got shape {lhs.shape}")
    (m, k), g = lhs.shape, group_sizes.shape[0]
    if ragged == "m":
        if rhs.ndim != 3 or rhs.shape[0] != g:
            raise ValueError(f"rhs must be [G={g}, K, N] (or [G, N, K] transposed), got {rhs.shape}")
        rhs_k, n = (rhs.shape[2], rhs.shape[1]) if transpose_rhs else (rhs.shape[1], rhs.shape[2])
        if rhs_k != k:
            raise ValueError(f"contracting dims differ: lhs {lhs.shape}, rhs {rhs.shape}, transpose_rhs={transpose_rhs}")
        return jax.ShapeDtypeStruct((m, n), out_dtype)
    if transpose_rhs:
        raise ValueError("transpose_rhs applies to ragged='m' only")
    if rhs.ndim != 2 or rhs.shape[0] != m:
        raise ValueError(f"ragged='k' needs rhs [M={m}, N], got {rhs.shape}")
    return jax.ShapeDtypeStruct((g, k, rhs.shape[1]), out_dtype)


def gemm_shape(lhs, group_sizes, out_type, ragged: str, transpose_rhs: bool) -> plan.GemmShape:
    """The static shape a checked call plans with."""
    (m, k), g = lhs.shape, group_sizes.shape[0]
    return plan.GemmShape(g, m, k, out_type.shape[-1], ragged == "k", bool(transpose_rhs), jnp.dtype(lhs.dtype).name,
                          jnp.dtype(out_type.dtype).name)


def vjp_shapes(groups: int, rows: int, k: int, n: int, dtype, out_dtype: Optional[str] = None) -> tuple:
    """A ragged-m GEMM lhs [rows, k] @ rhs [groups, k, n] and the two GEMMs of its gradient, d lhs
    (rhs transposed) and d rhs (ragged k): a default mode for a differentiable call must suit all three."""
    d = jnp.dtype(dtype).name
    return (plan.GemmShape(groups, rows, k, n, dtype=d, out_dtype=out_dtype),
            plan.GemmShape(groups, rows, n, k, transpose_rhs=True, dtype=d),
            plan.GemmShape(groups, rows, k, n, ragged_k=True, dtype=d))


def grouped_gemm_call(lhs, rhs, group_sizes, out_type, shape: plan.GemmShape, mode: str,
                      host_group_sizes: Optional[HostGroupSizes] = None) -> jax.Array:
    """The FFI call of a checked grouped GEMM in a resolved mode."""
    form = dict(ragged_k=shape.ragged_k, transpose_rhs=shape.transpose_rhs)
    # Inside shard_map the operands vary alike, and so does the FFI result (vary_alike(out, lhs)).
    if mode == "device":
        lhs, rhs, group_sizes = vary_alike(lhs, rhs, group_sizes)
        device_plan = plan.plan_device_gemm(shape)
        logger.debug("grouped_gemm device mode: %s %s", device_plan.label, shape)
        workspace = jax.ShapeDtypeStruct((device_plan.workspace_bytes,), jnp.uint8)
        call = jax.ffi.ffi_call(_ffi.GROUPED_GEMM_DEVICE, (out_type, workspace), vmap_method="sequential")
        call = functools.partial(call, kernel=device_plan.kernel, cutlass_config=device_plan.config, **form)
        out, _ = require_replicated(call, "te_async.grouped_gemm", OPERANDS)(lhs, rhs, group_sizes)
        return vary_alike(out, lhs)[0]
    lhs, rhs, sizes = vary_alike(lhs, rhs, host_sizes_operand(group_sizes, mode, host_group_sizes))
    repair_flag = jax.ShapeDtypeStruct((1,), jnp.int32)  # device scratch of the GPU's check of pinned sizes
    call = jax.ffi.ffi_call(_ffi.GROUPED_GEMM, (out_type, repair_flag), vmap_method="sequential")
    call = functools.partial(call, async_host_sizes=mode == "async", **form)
    out, _ = require_replicated(call, "te_async.grouped_gemm", OPERANDS)(lhs, rhs, sizes)
    return vary_alike(out, lhs)[0]


class _Call(NamedTuple):
    """The static part of a checked call (hashable: custom_vjp's non-differentiable argument)."""

    shape: plan.GemmShape
    out_shape: tuple
    mode: str

    def out_type(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(self.out_shape, self.shape.out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _differentiable(call: _Call, lhs, rhs, group_sizes, host_group_sizes):
    return grouped_gemm_call(lhs, rhs, group_sizes, call.out_type(), call.shape, call.mode, host_group_sizes)


def outside_slice_fusion(out: jax.Array) -> jax.Array:
    """A forward GEMM's output that a backward also needs (its own, or a later op's: te_async.moe's
    combine keeps grouped_mlp's output for the router weights' gradient), behind an optimization
    barrier.

    Under lax.scan, JAX stacks such an output into a residual buffer with a dynamic-update-slice,
    and XLA's GPU dynamic-slice fusion then fuses that update into the custom call while its other
    users still need the plain result: XLA compiles the GEMM twice, and the second copy reads a
    materialised slice of the stacked weights. At DeepSeek-V2-Lite's training shapes that was an
    extra fc1 GEMM (405 us) and a 738 MB weight copy (592 us) in every layer's forward (H200,
    2026-12-02, docs/internals.md, Training), and, until the barrier went on grouped_mlp's output
    too, an extra fc2 GEMM and a 369 MB copy in every MoE layer of a model's scanned training step
    (jax 0.11.2's optimized HLO, 2026-12-05). Behind the barrier the update is a copy of the output
    alone, and the weights still reach the GEMM as an in-place slice."""
    return jax.lax.optimization_barrier(out)


def _differentiable_fwd(call: _Call, lhs, rhs, group_sizes, host_group_sizes):
    handle = async_handle(group_sizes, call.mode, host_group_sizes)
    out = _differentiable(call, lhs, rhs, group_sizes, handle)
    return outside_slice_fusion(out), (lhs, rhs, group_sizes, keep_group_sizes(handle, lhs))


def _differentiable_bwd(call: _Call, residuals, dout):
    """Both gradients are grouped GEMMs of the other two forms, in the forward's mode (async: on
    the forward's copy of the sizes where its slot still holds it, reuse_group_sizes), accumulated
    in float32 and written in the operands' dtype, as grouped_mlp's backward does (on Hopper that
    keeps them on the CUTLASS kernels, which write the input dtype). Rows past the groups get zero
    gradients."""
    lhs, rhs, group_sizes, forward_handle = residuals
    handle = reuse_group_sizes(forward_handle) if call.mode == "async" else None
    gemm = functools.partial(grouped_gemm, group_sizes=group_sizes, group_sizes_mode=call.mode,
                             host_group_sizes=handle)
    d = dout.astype(lhs.dtype)
    if call.shape.ragged_k:  # out[g] = lhs_g^T rhs_g
        dlhs, drhs = gemm(rhs, d, transpose_rhs=True), gemm(lhs, d)
    elif call.shape.transpose_rhs:  # out_g = lhs_g rhs[g]^T
        dlhs, drhs = gemm(d, rhs), gemm(d, lhs, ragged="k")
    else:  # out_g = lhs_g rhs[g]
        dlhs, drhs = gemm(d, rhs, transpose_rhs=True), gemm(lhs, d, ragged="k")
    return dlhs, drhs, None, None


_differentiable.defvjp(_differentiable_fwd, _differentiable_bwd)


def grouped_gemm(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    ragged: str = "m",
    transpose_rhs: bool = False,
    preferred_element_type=None,
    group_sizes_mode: Optional[str] = None,
    use_async_d2h_group_sizes: bool = False,
    host_group_sizes: Optional[HostGroupSizes] = None,
) -> jax.Array:
    """Grouped GEMM over the rows of `lhs`, grouped in order by `group_sizes`.

    ragged="m": out[rows_g] = lhs[rows_g] @ rhs[g]   (forward, dgrad); rows past the sum are 0.
    ragged="k": out[g] = lhs[rows_g].T @ rhs[rows_g] (wgrad); an empty group gives zeros.
    Accumulates in float32 whatever the input dtype.

    group_sizes_mode: "device" reads the sizes on the GPU: no copy, no host wait, CUDA-graph safe;
    it is the default wherever it has a fast kernel for the shape (te_async.plan.device_mode_is_fast),
    and "async" is the default elsewhere. "sync" reads the sizes to the host inside the call (TE's
    behaviour); "async" uses `host_group_sizes` (or makes one) and waits only on its copy's event;
    `use_async_d2h_group_sizes=True` is TE's spelling of it.
    A negative size or a sum past M raises in every mode on the CPU and in the host-sized modes on
    the GPU. Device mode on the GPU cannot raise from inside a CUDA graph: it counts a negative size
    as 0, cuts the groups at row M, and counts the call in te_async.size_errors()
    (TE_ASYNC_CHECK_DEVICE_SIZES=1 makes it raise instead, without command buffers).
    Under vmap the call runs sequentially, one GEMM per batch element.
    Differentiable in lhs and rhs (jax.custom_vjp): the gradients are grouped GEMMs in the same
    mode; the default mode is chosen from the forward's shape (te_async.ragged_dot, meant for
    training, chooses from the backward's shapes too).
    """
    lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
    out_type = grouped_gemm_output(
        lhs, rhs, group_sizes, ragged=ragged, transpose_rhs=transpose_rhs, preferred_element_type=preferred_element_type
    )
    shape = gemm_shape(lhs, group_sizes, out_type, ragged, transpose_rhs)
    mode = resolve_group_sizes_mode(group_sizes_mode, use_async_d2h_group_sizes, host_group_sizes,
                                    lambda: plan.device_mode_is_fast([shape]))
    lhs, rhs = vary_alike(lhs, rhs, group_sizes)[:2]  # each gradient typed as its operand (inside shard_map)
    return _differentiable(_Call(shape, out_type.shape, mode), lhs, rhs, group_sizes, host_group_sizes)
